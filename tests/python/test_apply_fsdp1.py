# SPDX-License-Identifier: Apache-2.0
"""PyTorch's FullyShardedDataParallel is the oracle for the FSDP1 export and its loader.

`shardscope plan export --format fsdp1` of FSDP1 plans (module-class, size-based and
hand-listed units, mixed precision, checkpointing) is applied by samples/apply_fsdp1.py to
the tiny Llama (transformers) on a fake 4-rank process group. The FSDP instances real FSDP1
creates must be the plan's units (`plan show --json`), each with the parameter count the plan
resolves, and one forward and backward must run.
"""
import json
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

torch = peer.require("torch")
transformers = peer.require("transformers")
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

sys.path.insert(0, peer.sample())
from apply_fsdp1 import apply_fsdp1  # noqa: E402

MODEL = peer.sample("models", "tiny-llama", "config.json")


def plan(name, wrap, **kw):
    p = {"format": "shardscope.plan", "version": 1, "name": name, "api": "fsdp1", "mesh": {"shape": [4]},
         "wrap": wrap, "training": {"micro_batch_size": 1, "seq_len": 16}}
    p.update(kw)
    return p


CASES = {
    "module_class": plan("module_class", {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
                         defaults={"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
                                   "activation_checkpointing": "full"}),
    "size_based": plan("size_based", {"policy": "size", "min_num_params": 300000}),
    "listed": plan("listed", {"policy": "none"},
                   units=[{"modules": ["model.layers.1"]}, {"modules": ["lm_head"]}]),
}


class ApplyFsdp1(unittest.TestCase):
    def test_real_fsdp1_wraps_the_units_the_plan_resolves(self):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        tmp = tempfile.mkdtemp()
        for name, p in CASES.items():
            with self.subTest(plan=name):
                plan_path, out = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".fsdp1.json")
                with open(plan_path, "w") as f:
                    json.dump(p, f)
                shown = peer.shardscope("plan", "show", "--model", MODEL, "--plan", plan_path, "--json")
                expected = {("" if u["is_root"] else u["modules"][0]): u["numel"] for u in shown["units"]}
                peer.shardscope("plan", "export", "--model", MODEL, "--plan", plan_path, "--format", "fsdp1",
                                "-o", out)
                with open(out) as f:
                    export = json.load(f)
                self.assertEqual(export["dropped"], [])
                dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
                try:
                    cfg = transformers.AutoConfig.from_pretrained(MODEL)
                    torch.manual_seed(0)
                    wrapped = apply_fsdp1(transformers.AutoModelForCausalLM.from_config(cfg), export,
                                          device_id=torch.device("cpu"))
                    got = {}
                    for fqn, m in wrapped.named_modules():
                        if isinstance(m, FSDP):
                            clean = fqn.replace("_fsdp_wrapped_module.", "").replace(
                                "_checkpoint_wrapped_module.", "").rstrip(".")
                            clean = clean.replace("._fsdp_wrapped_module", "").replace("_fsdp_wrapped_module", "")
                            handle = m._handle
                            got[clean] = handle.flat_param._unpadded_unsharded_size.numel() if handle else 0
                    self.assertEqual(sorted(got), sorted(expected))
                    for unit, numel in expected.items():
                        self.assertEqual(got[unit], numel, unit)
                    tokens = torch.randint(0, cfg.vocab_size, (1, 16))
                    wrapped(tokens, use_cache=False).logits.float().mean().backward()
                finally:
                    dist.destroy_process_group()

    def test_tied_weight_split_across_units_fails_in_real_fsdp1_as_validate_says(self):
        # GPT-2's tied wte/lm_head weight with a size policy that wraps wte alone: real FSDP1
        # puts the weight in the wte unit (the first wrapped) and lm_head then sees its shard,
        # so the forward fails; `plan validate` says so (an error), and `plan show` gives the
        # weight to the wte unit as real FSDP1 does.
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 96, "n_positions": 64,
               "n_embd": 32, "n_layer": 2, "n_head": 4, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
               "tie_word_embeddings": True}
        tmp = tempfile.mkdtemp()
        model_path, plan_path = os.path.join(tmp, "config.json"), os.path.join(tmp, "plan.json")
        with open(model_path, "w") as f:
            json.dump(cfg, f)
        with open(plan_path, "w") as f:
            json.dump(plan("gpt2", {"policy": "size", "min_num_params": 3000}), f)
        shown = peer.shardscope("plan", "show", "--model", model_path, "--plan", plan_path, "--json")
        numel = {u["modules"][0]: u["numel"] for u in shown["units"] if not u["is_root"]}
        self.assertEqual(numel["transformer.wte"], 96 * 32)
        errors = [p["message"] for p in shown["problems"] if p["severity"] == "error"]
        self.assertTrue(any("fails with a size mismatch" in e for e in errors), shown["problems"])
        # The export still writes (plan export refuses plans with errors; the kwargs are FSDP1's
        # own): build them from a copy of the plan without the check, as a user would run it.
        export = {"format": "shardscope.export.fsdp1", "kwargs": {
            "sharding_strategy": "FULL_SHARD", "backward_prefetch": "BACKWARD_PRE",
            "auto_wrap_policy": {"type": "size_based_auto_wrap_policy", "min_num_params": 3000,
                                 "force_leaf_modules": [], "exclude_wrap_modules": []}}}
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        try:
            config = transformers.AutoConfig.from_pretrained(model_path)
            wrapped = apply_fsdp1(transformers.AutoModelForCausalLM.from_config(config), export,
                                  device_id=torch.device("cpu"))
            held = {}
            for fqn, m in wrapped.named_modules():
                if isinstance(m, FSDP) and m._handle:
                    name = fqn.replace("_fsdp_wrapped_module.", "").replace("._fsdp_wrapped_module", "")
                    held[name] = m._handle.flat_param._unpadded_unsharded_size.numel()
            self.assertEqual(held.get("transformer.wte"), 96 * 32)
            with self.assertRaises(RuntimeError) as e:
                wrapped(torch.randint(0, 96, (1, 16))).logits.sum().backward()
            self.assertIn("size mismatch", str(e.exception))
        finally:
            dist.destroy_process_group()

    def test_no_shard_where_real_fsdp1_switches_to_it(self):
        """FSDP1 runs NO_SHARD whenever its process group, the shard group, has one rank
        (_init_core_state), which on an HSDP mesh [N, 1] leaves the N replicas' gradients
        unsynchronized (pytorch/pytorch#154888). Real FSDP1 on a fake process group decides
        for six meshes and strategies; `plan validate` must warn exactly where it switched."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        tmp = tempfile.mkdtemp()
        for shape, strategy in (([1], "FULL_SHARD"), ([1], "SHARD_GRAD_OP"), ([2, 1], "HYBRID_SHARD"),
                                ([2], "FULL_SHARD"), ([1, 2], "HYBRID_SHARD"), ([1], "NO_SHARD")):
            with self.subTest(mesh=shape, strategy=strategy):
                dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=math.prod(shape))
                try:
                    kw = {}
                    if len(shape) == 2:
                        kw["device_mesh"] = init_device_mesh("cpu", tuple(shape), mesh_dim_names=("replicate", "shard"))
                    real = FSDP(torch.nn.Linear(4, 4), sharding_strategy=ShardingStrategy[strategy],
                                device_id=torch.device("cpu"), **kw).sharding_strategy
                finally:
                    dist.destroy_process_group()
                switched = real == ShardingStrategy.NO_SHARD and strategy != "NO_SHARD"
                path = os.path.join(tmp, "clamp.json")
                with open(path, "w") as f:
                    json.dump(plan("clamp", {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
                                   mesh={"shape": shape}, fsdp1={"sharding_strategy": strategy}), f)
                r = peer.run("plan", "validate", "--model", MODEL, "--plan", path)
                self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
                said = r.stdout + r.stderr
                print(shape, strategy, "-> real FSDP1:", real.name, "| warned:", "NO_SHARD" in said)
                self.assertEqual("NO_SHARD" in said, switched, said)
                if len(shape) == 2 and switched:
                    self.assertIn("never synchronize", said)


if __name__ == "__main__":
    unittest.main(verbosity=2)
