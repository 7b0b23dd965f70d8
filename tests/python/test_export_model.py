# SPDX-License-Identifier: Apache-2.0
"""Peer test: scripts/export_model.py on a small model defined here, read back by the C++
loader (`shardscope model show --json`), must give the counts PyTorch gives directly:
the module tree, parameters (tied once), and FLOPs and saved-activation bytes measured
independently on real tensors at the exported size, at 2x (the fit) and 3x the sequence
length (extrapolation through the fitted per_token/per_token_seq terms).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

torch = peer.require("torch")
nn = torch.nn
F = torch.nn.functional

VOCAB, DIM, HEADS, BLOCKS = 96, 32, 4, 2


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, DIM))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.frozen = nn.Linear(DIM, DIM)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x) + self.frozen(x)


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.bn = nn.BatchNorm1d(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("scale", torch.ones(1), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        x = self.bn(x.transpose(1, 2)).transpose(1, 2)
        return self.head(x) * self.scale


def build():
    return TinyLM()


def reference(batch, seq):
    """FLOPs (forward, backward) and saved bytes measured by PyTorch on real tensors."""
    torch.manual_seed(0)
    model = build()
    return measured(model, torch.randint(0, VOCAB, (batch, seq)))


def measured(model, tokens, logits=lambda out: out):
    """One forward and backward of `model` on real tensors: forward FLOPs, backward FLOPs
    (torch.utils.flop_counter) and the bytes autograd saves (each storage once, parameters
    and buffers left out). `logits` picks the tensor to reduce from the model's output."""
    from torch.utils.flop_counter import FlopCounterMode
    # FlopCounterMode has formulas for the CUDA SDPA kernels only; the exporter registers
    # PyTorch's own SDPA formula for the CPU kernel, and so must the reference.
    sys.path.insert(0, os.path.join(peer.SOURCE, "scripts"))
    import export_model
    export_model.register_cpu_sdpa_flops()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    params |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    saved = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    fc = FlopCounterMode(display=False)
    with fc:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = logits(model(tokens))
        fwd = fc.get_total_flops()
        out.float().sum().backward()
    return fwd, fc.get_total_flops() - fwd, sum(saved.values())


class ExportModel(unittest.TestCase):
    def test_exported_counts_equal_pytorch(self):
        batch, seq = 2, 16
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "tiny.json")
            env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
            subprocess.run([sys.executable, os.path.join(peer.SOURCE, "scripts", "export_model.py"),
                            "--factory", "test_export_model:build", "--input", f"tokens:{VOCAB}",
                            "--batch", str(batch), "--seq", str(seq), "-o", out], check=True, env=env)
            model = build()
            ours = peer.shardscope("model", "show", "--model", out, "--depth", "99", "--no-fold", "--json",
                                   "--batch", str(batch), "--seq", str(seq))
            self.assertEqual(ours["total_params"], sum(p.numel() for p in model.parameters()))
            self.assertEqual(ours["trainable_params"],
                             sum(p.numel() for p in model.parameters() if p.requires_grad))
            self.assertEqual([(m["name"], m["class"]) for m in ours["modules"]],
                             [(n, type(m).__name__) for n, m in model.named_modules()])
            self.assertEqual(ours["tied_params"][0]["owners"], ["embed.weight", "head.weight"])
            bn = next(m for m in ours["modules"] if m["name"] == "bn")
            doc = json.load(open(out))
            bn_doc = next(m for m in doc["modules"] if m["name"] == "bn")
            self.assertIn("_BatchNorm", bn_doc["bases"])
            self.assertEqual({b["name"]: b["persistent"] for b in bn_doc["buffers"]},
                             {"running_mean": True, "running_var": True, "num_batches_tracked": True})
            self.assertEqual(bn["params"], 2 * DIM)
            # What a checkpoint of a module keeps is its input: the embedding's int64 token
            # ids (bytes per token in a fixed dtype), a block's fp32 hidden state.
            cost = {m["name"]: m.get("cost", {}) for m in doc["modules"]}
            self.assertEqual(cost["embed"]["input_bytes"], [0.0, 0.0, 8.0])
            self.assertEqual(cost["blocks.0"]["input_bytes"], [4.0 * DIM, 0.0])
            for s in (seq, 2 * seq, 3 * seq):
                fwd, bwd, saved = reference(batch, s)
                at = peer.shardscope("model", "show", "--model", out, "--depth", "0", "--json",
                                     "--batch", str(batch), "--seq", str(s))["modules"][0]
                print(f"seq {s}: fwd {at['fwd_flops']:.0f} vs {fwd}, bwd {at['bwd_flops']:.0f} vs {bwd}, "
                      f"saved {at['saved_activation_bytes']:.0f} vs {saved}")
                self.assertAlmostEqual(at["fwd_flops"], fwd, delta=1e-6 * fwd)
                self.assertAlmostEqual(at["bwd_flops"], bwd, delta=1e-6 * bwd)
                # The reference dedups saved storages by address on real tensors, which can
                # differ by a small tensor from the exporter's fake-storage identity (seen:
                # 256 of 266,240 bytes at seq 32); FLOPs must match exactly.
                self.assertAlmostEqual(at["saved_activation_bytes"], saved, delta=2e-3 * saved)

    def test_moe_routing_is_balanced_and_totals_equal_pytorch(self):
        # Mixture-of-experts layers pick each expert's tokens with nonzero/where, whose size
        # fake tensors cannot know. The exporter routes them as a balanced router would;
        # whatever the routing, every token reaches top_k experts, so the model's FLOP and
        # saved-byte totals equal those of transformers' own model on real tensors (routed by
        # its random router), and each expert carries top_k/experts of the tokens.
        transformers = peer.require("transformers")
        configs = {
            # shared expert with a sigmoid gate, norm_topk_prob false, a dense layer
            "qwen2_moe": transformers.Qwen2MoeConfig(
                vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                shared_expert_intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1]),
            # sort-based dispatch: per-expert token counts read as numbers (`if n == 0`,
            # slices by them), complex RoPE
            "deepseek_v2": transformers.DeepseekV2Config(
                vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=16,
                num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, v_head_dim=16,
                qk_nope_head_dim=16),
            # group-limited top-k (scatter into a group mask), MLA, a dense first layer
            "deepseek_v3": transformers.DeepseekV3Config(
                vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=16,
                num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                n_group=2, topk_group=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                v_head_dim=16, qk_nope_head_dim=16),
        }
        batch, seq = 2, 16
        for kind, cfg in configs.items():
            with self.subTest(model=kind), tempfile.TemporaryDirectory() as d:
                cfg.save_pretrained(d)
                out = os.path.join(d, "model.json")
                subprocess.run([sys.executable, os.path.join(peer.SOURCE, "scripts", "export_model.py"),
                                "--hf-config", os.path.join(d, "config.json"), "--batch", str(batch),
                                "--seq", str(seq), "-o", out], check=True)
                doc = json.load(open(out))
                experts = [m for m in doc["modules"] if ".mlp.experts." in m["name"]
                           and m["name"].endswith("gate_proj")]
                self.assertTrue(experts)
                top_k, n = cfg.num_experts_per_tok, getattr(cfg, "num_experts", None) or cfg.n_routed_experts
                for m in experts:
                    per_token = 2 * cfg.hidden_size * cfg.moe_intermediate_size * top_k / n
                    self.assertEqual(m["cost"]["fwd_flops"], [per_token, 0.0], m["name"])
                torch.manual_seed(0)
                model = transformers.AutoModelForCausalLM.from_config(cfg).train()
                fwd, bwd, saved = measured(model, torch.randint(0, cfg.vocab_size, (batch, seq)),
                                           logits=lambda out: out.logits)
                at = peer.shardscope("model", "show", "--model", out, "--depth", "0", "--json",
                                     "--batch", str(batch), "--seq", str(seq))["modules"][0]
                print(f"{kind}: fwd {at['fwd_flops']:.0f} vs {fwd}, bwd {at['bwd_flops']:.0f} vs {bwd}, "
                      f"saved {at['saved_activation_bytes']:.0f} vs {saved}")
                self.assertAlmostEqual(at["fwd_flops"], fwd, delta=1e-6 * fwd)
                self.assertAlmostEqual(at["bwd_flops"], bwd, delta=1e-6 * bwd)
                self.assertAlmostEqual(at["saved_activation_bytes"], saved, delta=1e-2 * saved)

    def test_unfollowed_data_dependent_op_is_refused_by_name(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "masked.py"), "w") as f:
                f.write("import torch\n"
                        "class Masked(torch.nn.Module):\n"
                        "    def __init__(self):\n"
                        "        super().__init__()\n"
                        "        self.proj = torch.nn.Linear(8, 8)\n"
                        "    def forward(self, x):\n"
                        "        y = self.proj(x)\n"
                        "        return y[y > 0]\n")
            r = subprocess.run([sys.executable, os.path.join(peer.SOURCE, "scripts", "export_model.py"),
                                "--factory", "masked:Masked", "--input", "features:8", "--seq", "4",
                                "-o", os.path.join(d, "out.json")],
                               env=dict(os.environ, PYTHONPATH=d), capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("aten.index.Tensor", r.stderr)
            self.assertIn("depends on tensor values", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "out.json")))

    def export_hf(self, d, name, over, *extra):
        """Exports a small transformers model of `over` (its config.json written in `d`)."""
        transformers = peer.require("transformers")
        cfg = transformers.AutoConfig.for_model(**over)
        path = os.path.join(d, name + ".config.json")
        cfg.to_json_file(path)
        out = os.path.join(d, name + ".json")
        subprocess.run([sys.executable, os.path.join(peer.SOURCE, "scripts", "export_model.py"),
                        "--hf-config", path, "--batch", "2", "--seq", "16", "-o", out, *extra],
                       check=True, capture_output=True)
        return cfg, out

    def test_backward_flops_land_on_the_module_that_ran_them(self):
        # PyTorch's FlopCounterMode on real tensors, forward and backward told apart, per
        # nn.Linear (a leaf: its own mm calls, no attribution question) against the exported
        # figures at the same size. A linear on 3-D input is an mm inside a view: its backward
        # FLOPs belong to it, not to the root.
        transformers = peer.require("transformers")
        from torch.utils.flop_counter import FlopCounterMode
        with tempfile.TemporaryDirectory() as d:
            cfg, out = self.export_hf(d, "llama", dict(model_type="llama", vocab_size=256, hidden_size=64,
                                                       intermediate_size=160, num_hidden_layers=3,
                                                       num_attention_heads=4, num_key_value_heads=2))
            shown = peer.shardscope("model", "show", "--model", out, "--depth", "99", "--no-fold",
                                    "--json", "--batch", "2", "--seq", "16")
            with open(out) as fh:
                root_self = next(m for m in json.load(fh)["modules"] if m["name"] == "")
        ours = {m["name"]: m for m in shown["modules"]}
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        tokens = torch.randint(0, 256, (2, 16))
        counter = FlopCounterMode(display=False)
        prefix = type(model).__name__ + "."

        def per_module():
            return {k[len(prefix):]: sum(v.values()) for k, v in counter.get_flop_counts().items()
                    if k.startswith(prefix)}
        with counter:  # one mode: its module hooks are set in forward
            logits = model(tokens).logits
            f = per_module()
            logits.float().sum().backward()
        b = {k: v - f.get(k, 0) for k, v in per_module().items()}
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        self.assertGreater(len(linears), 10)
        # FlopCounterMode tells a module's backward by the module hooks around it, which
        # overlap for siblings reading one input (q/k/v, gate/up): its per-module figure is
        # exact only for a linear whose input is its own (o_proj, down_proj, lm_head).
        own_input = [n for n in linears if n.endswith(("o_proj", "down_proj", "lm_head"))]
        self.assertEqual(len(own_input), 2 * cfg.num_hidden_layers + 1)
        for n in own_input:
            self.assertAlmostEqual(ours[n]["fwd_flops"], f[n], delta=1e-6 * f[n], msg=n)
            self.assertAlmostEqual(ours[n]["bwd_flops"], b[n], delta=1e-6 * b[n], msg=n)
        # Every linear's backward is its input and weight gradients, twice its forward; the
        # ones that share an input together as PyTorch counts their parent.
        for n in linears:
            self.assertAlmostEqual(ours[n]["bwd_flops"], 2 * ours[n]["fwd_flops"],
                                   delta=1e-6 * ours[n]["bwd_flops"], msg=n)
        for i in range(cfg.num_hidden_layers):
            mlp = f"model.layers.{i}.mlp"
            self.assertAlmostEqual(sum(ours[f"{mlp}.{p}"]["bwd_flops"] for p in ("gate_proj", "up_proj", "down_proj")),
                                   b[mlp], delta=1e-6 * b[mlp], msg=mlp)
        # The root's own backward (the loss's): per token, no GEMM left there.
        root_bwd = root_self.get("cost", {}).get("bwd_flops", [0.0, 0.0])
        self.assertLess(root_bwd[0] * 2 * 16, 0.01 * sum(b[n] for n in own_input),
                        "backward FLOPs left at the root")

    def test_layers_measured_once_a_kind_give_every_layer_the_same_figures(self):
        # One or two layers of each kind measured (Gemma-3's sliding and full layers,
        # Qwen2-MoE's sparse and dense ones) against all of them measured: the same file.
        cases = {
            "gemma3": dict(model_type="gemma3_text", vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           sliding_window=8),
            "qwen2_moe": dict(model_type="qwen2_moe", vocab_size=256, hidden_size=64, intermediate_size=128,
                              moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
                              num_experts_per_tok=2, num_hidden_layers=5, num_attention_heads=4,
                              num_key_value_heads=2, mlp_only_layers=[1, 3]),
        }
        with tempfile.TemporaryDirectory() as d:
            for name, over in cases.items():
                with self.subTest(model=name):
                    _, few = self.export_hf(d, name, over)
                    _, every = self.export_hf(d, name + "-every", over, "--every-layer")
                    a, b = json.load(open(few)), json.load(open(every))
                    self.assertEqual(a["modules"], b["modules"])
                    self.assertEqual(a["total_params"], b["total_params"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
