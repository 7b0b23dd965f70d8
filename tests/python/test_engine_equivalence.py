# SPDX-License-Identifier: Apache-2.0
"""The engine's FSDP runs are numerically the unsharded model, and that model is transformers'.

1. transformers is the oracle for the engine's Llama: the engine's unsharded reference
   (`shardscope-engine worker --reference 1`) trains three AdamW steps from the parameters
   it dumps before the first step; LlamaForCausalLM with torch.optim.AdamW (same
   hyper-parameters, same synthetic tokens from the same seeded generator) must give the
   same losses and parameters.
2. The sharded runs (`shardscope run`, real processes over Gloo) must give the same losses
   and final parameters as the unsharded reference replaying all ranks' data in one
   process, fp32, relative error <= 1e-5: world sizes 1, 2, 4 and HSDP 2x2; reshard True,
   False and 2; explicit forward/backward prefetch; gradient accumulation over 2
   micro-batches; full and selective activation checkpointing; CPU offload (all units, one
   unit, FSDP1); and the FSDP1 flavour (flat parameters with and
   without use_orig_params alignment, BACKWARD_PRE / BACKWARD_POST / NONE, forward_prefetch,
   SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD); and the Lightning fairscale strategy with and
   without flatten_parameters. Each run's recorded op order must equal the step program's.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

torch = peer.require("torch")
transformers = peer.require("transformers")

BIN, ENGINE = peer.require_engine()

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 40,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "attention_bias": False,
    "mlp_bias": False,
}
SEQ, BATCH, STEPS = 16, 2, 3
SEED = 1234
TOL = 1e-5


def plan(mesh, defaults=None, units=None, micro_batches=1, fsdp1=None, lightning=None, sync_every=False):
    p = {
        "format": "shardscope.plan",
        "version": 1,
        "name": "equivalence",
        "api": "fsdp2" if fsdp1 is None and lightning is None else "fsdp1" if lightning is None else "lightning",
        "mesh": {"shape": mesh},
        "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
        "defaults": defaults or {},
        "training": {"micro_batch_size": BATCH, "seq_len": SEQ},
    }
    if len(mesh) == 2:
        p["mesh"]["dim_names"] = ["replicate", "shard"]
    if units:
        p["units"] = units
    if fsdp1 is not None:
        p["fsdp1"] = fsdp1
    if lightning is not None:
        p["lightning"] = lightning
    if micro_batches > 1:
        p["gradient_accumulation"] = {"micro_batches": micro_batches}
        if sync_every:
            p["gradient_accumulation"]["sync_every_micro_batch"] = True
    return p


MATRIX = {
    "world1": plan([1]),
    "world2_reshard_true": plan([2], {"reshard_after_forward": True}),
    "world2_reshard_false": plan([2], {"reshard_after_forward": False}),
    "world4_reshard_2": plan([4], {"reshard_after_forward": 2}),
    "world4": plan([4]),
    "hsdp_2x2": plan([2, 2]),
    "world2_explicit_prefetch": plan(
        [2],
        units=[
            {"modules": ["model.layers.0"], "forward_prefetch": ["model.layers.1", "model.layers.2"]},
            {"modules": ["model.layers.2"], "backward_prefetch": ["model.layers.1", "model.layers.0"]},
        ],
    ),
    "world2_accumulate_2": plan([2], micro_batches=2),
    # Reduced after every micro-batch: each reduction is added to the sharded gradient
    # (FSDP2's foreach_reduce `+=`), none replaces it.
    "world2_accumulate_3_reduce_every": plan([2], micro_batches=3, sync_every=True),
    "fsdp1_world2_accumulate_3_reduce_every": plan([2], micro_batches=3, sync_every=True, fsdp1={}),
    "hsdp_2x2_accumulate_3_reduce_every": plan([2, 2], micro_batches=3, sync_every=True),
    "world2_cpu_offload_accumulate_3_reduce_every": plan(
        [2], {"offload": {"pin_memory": True}}, micro_batches=3, sync_every=True),
    # The root keeps no parameters (torchtitan's layout): it prefetches nothing before the
    # loss's backward (FSDPParamGroup.pre_backward belongs to a parameter group). World 1
    # so that a one-GPU machine runs it too.
    "world1_root_without_parameters": plan(
        [1], units=[{"modules": ["model.embed_tokens"]}, {"name": "norm+head", "modules": ["model.norm", "lm_head"]}]
    ),
    "world2_root_without_parameters": plan(
        [2], units=[{"modules": ["model.embed_tokens"]}, {"name": "norm+head", "modules": ["model.norm", "lm_head"]}]
    ),
    "fsdp1_world2_full_shard": plan([2], fsdp1={}),
    "fsdp1_world2_backward_post_forward_prefetch": plan(
        [2], fsdp1={"backward_prefetch": "BACKWARD_POST", "forward_prefetch": True}
    ),
    "fsdp1_world4_no_orig_params_no_prefetch": plan(
        [4], fsdp1={"use_orig_params": False, "backward_prefetch": "NONE"}
    ),
    "fsdp1_world2_shard_grad_op": plan([2], fsdp1={"sharding_strategy": "SHARD_GRAD_OP"}),
    "fsdp1_world2_no_shard": plan([2], fsdp1={"sharding_strategy": "NO_SHARD"}),
    "fsdp1_hybrid_2x2": plan([2, 2], fsdp1={"sharding_strategy": "HYBRID_SHARD"}),
    "lightning_fairscale_world2_flat": plan([2], lightning={"flatten_parameters": True}),
    "lightning_fairscale_world2_unflattened": plan([2], lightning={"flatten_parameters": False}),
    "world2_selective_checkpointing": plan([2], {"activation_checkpointing": "attention"}),
    "world2_cpu_offload": plan([2], {"offload": {"pin_memory": True}}),
    "world2_cpu_offload_one_unit": plan([2], units=[{"modules": ["model.layers.1"], "offload": {"pin_memory": True}}]),
    "fsdp1_world2_cpu_offload": plan([2], {"offload": {"pin_memory": True}}, fsdp1={}),
    # Full checkpointing on every unit, embed_tokens and a unit of two modules among them:
    # the embedding's lookup runs again in backward (it saved the ids), and norm and lm_head
    # are checkpointed one by one, as per-module checkpoint_wrapper does. World 1 so that a
    # one-GPU machine runs it too (on the H200 its lm_head once recomputed a dangling body).
    "world1_checkpointing_every_unit": plan(
        [1],
        {"activation_checkpointing": "full"},
        units=[{"modules": ["model.embed_tokens"]}, {"name": "norm+head", "modules": ["model.norm", "lm_head"]}],
    ),
    "world2_checkpointing": plan(
        [2], units=[{"modules": ["model.layers.%d" % i], "activation_checkpointing": "full"} for i in range(3)]
    ),
}


def train_hf(model, init, vocab):
    """Trains a transformers model from the engine's initial parameters (`--dump-initial`)
    as the engine's reference does (AdamW, the same synthetic tokens); its losses."""
    for name, t in model.named_parameters():
        t.data.copy_(torch.tensor(init[name], dtype=torch.float64).view(t.shape).float())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    gen = torch.Generator().manual_seed(SEED)
    data = torch.randint(0, vocab, (STEPS, 1, 1, BATCH, SEQ), generator=gen)
    losses = []
    for step in range(STEPS):
        tokens = data[step][0][0]
        loss = model(input_ids=tokens, labels=tokens).loss
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


def rel(a, b):
    a = torch.tensor(a, dtype=torch.float64)
    b = torch.tensor(b, dtype=torch.float64)
    return (a - b).norm().item() / max(b.norm().item(), 1e-30)


class EngineRuns(unittest.TestCase):
    """A temporary folder with the model config, plans written there, and the unsharded
    reference runs (one process replaying every rank's data), cached by world and
    micro-batches. DEVICE: the engine's --device for the references."""
    DEVICE = "cpu"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        cls.model = os.path.join(cls.dir, "config.json")
        with open(cls.model, "w") as f:
            json.dump(CONFIG, f)
        cls.refs = {}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def write_plan(self, name, p):
        path = os.path.join(self.dir, name + ".json")
        with open(path, "w") as f:
            json.dump(p, f)
        return path

    def reference(self, world, micro_batches, initial=None):
        key = (world, micro_batches)
        if key in self.refs and initial is None:
            return self.refs[key]
        path = self.write_plan("ref%d_%d" % key, plan([world], micro_batches=micro_batches))
        out = os.path.join(self.dir, "ref.json")
        params = os.path.join(self.dir, "ref_params.json")
        cmd = [ENGINE, "worker", "--model", self.model, "--plan", path, "--reference", str(world),
               "--device", self.DEVICE, "--steps", str(STEPS), "--warmup", "0", "--out", out,
               "--dump-params", params]
        if initial:
            cmd += ["--dump-initial", initial]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        with open(out) as f, open(params) as g:
            res = (json.load(f)["losses"], json.load(g))
        self.refs[key] = res
        return res


class EngineEquivalence(EngineRuns):

    def test_reference_is_transformers(self):
        initial = os.path.join(self.dir, "initial.json")
        losses, params = self.reference(1, 1, initial=initial)
        with open(initial) as f:
            init = json.load(f)
        cfg = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).float()
        self.assertEqual(set(n for n, _ in model.named_parameters()), set(init))
        hf_losses = train_hf(model, init, CONFIG["vocab_size"])
        for a, b in zip(losses, hf_losses):
            self.assertLess(abs(a - b) / abs(b), TOL, (losses, hf_losses))
        for name, t in model.named_parameters():
            self.assertLess(rel(params[name], t.detach().double().flatten().tolist()), TOL, name)
        print("engine reference vs transformers: losses", ["%.6f" % x for x in losses],
              "vs", ["%.6f" % x for x in hf_losses])

    def test_sliding_window_is_transformers(self):
        """Mistral past its sliding window (8 tokens at a sequence of 16): the engine's
        unsharded reference trains as transformers' MistralForCausalLM does (SDPA with a
        window mask), and a plain causal run would not (checked: it differs)."""
        cfg = {k: v for k, v in CONFIG.items() if k not in ("attention_bias", "mlp_bias")}
        cfg.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=8)
        model_path = os.path.join(self.dir, "mistral.json")
        with open(model_path, "w") as f:
            json.dump(cfg, f)
        path = self.write_plan("mistral_ref", plan([1]))
        out, params_path, initial = (os.path.join(self.dir, n) for n in ("m.json", "mp.json", "mi.json"))
        subprocess.run([ENGINE, "worker", "--model", model_path, "--plan", path, "--reference", "1",
                        "--device", self.DEVICE, "--steps", str(STEPS), "--warmup", "0", "--out", out,
                        "--dump-params", params_path, "--dump-initial", initial],
                       check=True, capture_output=True, text=True)
        with open(out) as f, open(params_path) as g, open(initial) as h:
            losses, params, init = json.load(f)["losses"], json.load(g), json.load(h)
        mcfg = transformers.MistralConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
        mcfg._attn_implementation = "sdpa"
        model = transformers.MistralForCausalLM(mcfg).float()
        hf_losses = train_hf(model, init, cfg["vocab_size"])
        for a, b in zip(losses, hf_losses):
            self.assertLess(abs(a - b) / abs(b), TOL, (losses, hf_losses))
        for name, t in model.named_parameters():
            self.assertLess(rel(params[name], t.detach().double().flatten().tolist()), TOL, name)
        # The window matters at this length: without it transformers trains otherwise.
        mcfg.sliding_window = None
        full = train_hf(transformers.MistralForCausalLM(mcfg).float(), init, cfg["vocab_size"])
        self.assertGreater(max(abs(a - b) / abs(b) for a, b in zip(full, hf_losses)), 10 * TOL)
        print("engine reference vs transformers, Mistral past its window: losses",
              ["%.6f" % x for x in losses], "vs", ["%.6f" % x for x in hf_losses],
              "(without the window:", ["%.6f" % x for x in full], ")")

    def test_proxy_model_is_sharded_like_any_other(self):
        """A model the engine does not build layer by layer (here GPT-2's graph) runs as a
        proxy sized from its graph; sharded it still equals its unsharded self."""
        gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 100, "n_positions": 64,
                "n_embd": 32, "n_layer": 2, "n_head": 2, "n_inner": None, "tie_word_embeddings": True}
        model = os.path.join(self.dir, "gpt2.json")
        with open(model, "w") as f:
            json.dump(gpt2, f)
        p = plan([2])
        p["wrap"] = {"policy": "module_class", "classes": ["GPT2Block"]}
        path = self.write_plan("gpt2_plan", p)
        params_path = os.path.join(self.dir, "gpt2_params.json")
        r = subprocess.run([BIN, "run", "-m", model, "-p", path, "--steps", str(STEPS), "--warmup", "0", "--json",
                            "--dump-params", params_path], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertTrue(out["op_order_matches_program"], out["op_order"])
        ref_plan = self.write_plan("gpt2_ref", dict(p, mesh={"shape": [2]}))
        ref_out, ref_params = os.path.join(self.dir, "gpt2_ref.json"), os.path.join(self.dir, "gpt2_ref_params.json")
        subprocess.run([ENGINE, "worker", "--model", model, "--plan", ref_plan, "--reference", "2", "--steps",
                        str(STEPS), "--warmup", "0", "--out", ref_out, "--dump-params", ref_params], check=True,
                       capture_output=True)
        with open(ref_out) as f, open(ref_params) as g, open(params_path) as h:
            ref_losses, ref, ours = json.load(f)["losses"], json.load(g), json.load(h)
        self.assertEqual(out["model_kind"], "proxy")
        worst_loss = max(abs(a - b) / abs(b) for a, b in zip(out["losses"], ref_losses))
        worst_param = max(rel(ours[k], ref[k]) for k in ref)
        print("proxy (GPT-2 graph) world 2: worst relative error loss %.2e, parameters %.2e" % (worst_loss, worst_param))
        self.assertLess(worst_loss, TOL)
        self.assertLess(worst_param, TOL)

    def test_fairscale_unflattened_pads_each_flat_parameter(self):
        """fairscale without flatten_parameters shards each parameter as a flat vector padded
        to a multiple of N, not by rows: with 42 MLP rows on 4 ranks the row split (11 rows,
        352 elements each) and the flat split (336 elements) differ, and both runs must
        still equal the unsharded model."""
        cfg = dict(CONFIG, intermediate_size=42, vocab_size=98)
        model = os.path.join(self.dir, "odd.json")
        with open(model, "w") as f:
            json.dump(cfg, f)
        results = {}
        for flat in (False, True):
            p = plan([4], lightning={"flatten_parameters": flat})
            path = self.write_plan("odd_%s" % flat, p)
            params_path = os.path.join(self.dir, "odd_%s_params.json" % flat)
            r = subprocess.run([BIN, "run", "-m", model, "-p", path, "--steps", str(STEPS), "--warmup", "0",
                                "--json", "--dump-params", params_path], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
            out = json.loads(r.stdout)
            self.assertTrue(out["op_order_matches_program"], out["op_order"])
            with open(params_path) as f:
                results[flat] = (out["losses"], json.load(f))
        ref_plan = self.write_plan("odd_ref", plan([4]))
        ref_out, ref_params = os.path.join(self.dir, "odd_ref.json"), os.path.join(self.dir, "odd_ref_params.json")
        subprocess.run([ENGINE, "worker", "--model", model, "--plan", ref_plan, "--reference", "4", "--steps",
                        str(STEPS), "--warmup", "0", "--out", ref_out, "--dump-params", ref_params], check=True,
                       capture_output=True)
        with open(ref_out) as f, open(ref_params) as g:
            ref_losses, ref = json.load(f)["losses"], json.load(g)
        for flat, (losses, params) in results.items():
            worst_loss = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
            worst_param = max(rel(params[k], ref[k]) for k in ref)
            print("fairscale flatten_parameters=%s world 4 (odd sizes): worst relative error loss %.2e, parameters %.2e"
                  % (flat, worst_loss, worst_param))
            self.assertLess(worst_loss, TOL)
            self.assertLess(worst_param, TOL)

    def test_matrix(self):
        for name, p in MATRIX.items():
            with self.subTest(name):
                world = math.prod(p["mesh"]["shape"])
                mbs = p.get("gradient_accumulation", {}).get("micro_batches", 1)
                path = self.write_plan(name, p)
                params_path = os.path.join(self.dir, name + "_params.json")
                r = subprocess.run(
                    [BIN, "run", "-m", self.model, "-p", path, "--steps", str(STEPS), "--warmup", "0",
                     "--json", "--dump-params", params_path, "--timeout-s", "60"],
                    capture_output=True, text=True, timeout=300)
                self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
                out = json.loads(r.stdout)
                self.assertTrue(out["op_order_matches_program"], out["op_order"])
                with open(params_path) as f:
                    params = json.load(f)
                ref_losses, ref_params = self.reference(world, mbs)
                worst_loss = max(abs(a - b) / abs(b) for a, b in zip(out["losses"], ref_losses))
                worst_param = max(rel(params[k], ref_params[k]) for k in ref_params)
                print("%-26s world %d: losses %s; worst relative error loss %.2e, parameters %.2e"
                      % (name, world, ["%.6f" % x for x in out["losses"]], worst_loss, worst_param))
                self.assertLess(worst_loss, TOL)
                self.assertLess(worst_param, TOL)
                self.assertEqual(set(params), set(ref_params))


if __name__ == "__main__":
    unittest.main(verbosity=2)
