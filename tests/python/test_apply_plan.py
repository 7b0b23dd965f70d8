# SPDX-License-Identifier: Apache-2.0
"""Peer test: a plan from `shardscope recommend --format fsdp2` applies to a real model with
samples/apply_plan.py (PyTorch's fully_shard on a fake 4-rank group, CPU) and trains: one
optimizer step of the recommended micro-batches runs forward and backward, with as many
FSDP units as the export lists and checkpointing where it says."""
import json
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
from apply_plan import apply_plan, prepare_micro_batch  # noqa: E402

from test_collectives_peer import CFG, CLUSTER  # noqa: E402


class ApplyPlan(unittest.TestCase):
    def test_recommended_plan_applies_and_trains(self):
        tmp = tempfile.mkdtemp()
        cluster = os.path.join(tmp, "cluster.json")
        c = dict(CLUSTER, device=dict(CLUSTER["device"], memory_bytes=64 << 20))  # tight: forces choices
        json.dump(c, open(cluster, "w"))
        out = os.path.join(tmp, "plan.fsdp2.json")
        report = peer.shardscope("recommend", "--model", CFG, "--cluster", cluster, "--seq", "64",
                                 "--global-batch", "16", "--format", "fsdp2", "--output", out, "--json")
        self.assertIn("best", report, "no plan fits the 64 MiB test device")
        export = json.load(open(out))
        print("recommended:", report["best"]["summary"])
        # The recommended plan also validates as a ShardScope plan.
        plan_path = os.path.join(tmp, "plan.json")
        json.dump(report["best"]["plan"], open(plan_path, "w"))
        self.assertIn("valid", peer.shardscope("plan", "validate", "--model", CFG, "--plan", plan_path,
                                               "--cluster", cluster))

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        try:
            cfg = transformers.AutoConfig.from_pretrained(CFG)
            model = apply_plan(transformers.AutoModelForCausalLM.from_config(cfg), out, device_type="cpu")
            from torch.distributed.fsdp import FSDPModule
            states = {id(m._get_fsdp_state()) for m in model.modules() if isinstance(m, FSDPModule)}
            self.assertEqual(len(states), len(export["fully_shard"]))
            for name, mode in export["activation_checkpointing"].items():
                self.assertEqual(model.get_submodule(name).forward.__name__, "forward", mode)
                self.assertTrue(hasattr(model.get_submodule(name).forward, "__wrapped__"))
            ga = export["gradient_accumulation"]
            optim = torch.optim.AdamW(model.parameters())
            micro = report["best"]["plan"]["training"]["micro_batch_size"]
            for mb in range(ga["micro_batches"]):
                prepare_micro_batch(model, export, mb)
                tokens = torch.randint(0, cfg.vocab_size, (micro, 64))
                model(tokens, use_cache=False).logits.float().mean().backward()
            optim.step()
        finally:
            dist.destroy_process_group()

    def test_per_unit_settings_reach_every_unit_and_steps_end_sharded(self):
        # The export's per-unit reshard_after_backward, the divide factor, and 2 micro-batches
        # with reshard_after_backward False on one unit: prepare_micro_batch keeps that unit
        # unsharded between micro-batches and reshards it after the last, so the next step
        # starts sharded (as the simulator models every step).
        plan = {"format": "shardscope.plan", "version": 1, "name": "per-unit", "api": "fsdp2",
                "mesh": {"shape": [4]}, "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
                "defaults": {"reshard_after_backward": False},
                "units": [{"modules": ["model.layers.1"], "reshard_after_backward": True}],
                "gradient_accumulation": {"micro_batches": 2}, "gradient_divide_factor": 2.0,
                "training": {"micro_batch_size": 1, "seq_len": 32}}
        tmp = tempfile.mkdtemp()
        plan_path, out = os.path.join(tmp, "plan.json"), os.path.join(tmp, "plan.fsdp2.json")
        json.dump(plan, open(plan_path, "w"))
        peer.shardscope("plan", "export", "--model", CFG, "--plan", plan_path, "--format", "fsdp2", "-o", out)
        export = json.load(open(out))
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        try:
            from torch.distributed.fsdp import FSDPModule
            cfg = transformers.AutoConfig.from_pretrained(CFG)
            model = apply_plan(transformers.AutoModelForCausalLM.from_config(cfg), export, device_type="cpu")
            units = [m for m in model.modules() if isinstance(m, FSDPModule)]
            groups = {m: m._get_fsdp_state()._fsdp_param_group for m in units}
            # The divide factor on every unit, not only the root.
            for m, g in groups.items():
                if g is not None:
                    self.assertEqual(g.gradient_divide_factor, 2.0, type(m).__name__)
            layer0 = model.get_submodule("model.layers.0")
            layer1 = model.get_submodule("model.layers.1")
            self.assertFalse(groups[layer0].reshard_after_backward)
            # The root's False (from the defaults) did not overwrite the unit inside it that
            # says True.
            self.assertTrue(groups[layer1].reshard_after_backward)
            optim = torch.optim.AdamW(model.parameters())
            for step in range(2):
                for mb in range(2):
                    prepare_micro_batch(model, export, mb)
                    tokens = torch.randint(0, cfg.vocab_size, (1, 32))
                    model(tokens, use_cache=False).logits.float().mean().backward()
                    if mb == 0:  # kept unsharded between micro-batches
                        self.assertTrue(groups[layer0].is_unsharded)
                # Every unit is sharded when the step ends.
                for m, g in groups.items():
                    if g is not None:
                        self.assertTrue(g.is_sharded, type(m).__name__)
                optim.step()
                optim.zero_grad()
        finally:
            dist.destroy_process_group()

    def test_dtype_flow_warning_matches_real_fsdp2(self):
        # GPT-2 with bf16 blocks and an fp32 root: the last block's bf16 output reaches the
        # root's ln_f (fp32 weights) with nothing casting it. `plan validate` warns, and real
        # FSDP2 fails in forward; with one policy for every unit it warns of nothing and runs.
        cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 96, "n_positions": 64,
               "n_embd": 32, "n_layer": 2, "n_head": 4, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
        tmp = tempfile.mkdtemp()
        model_path = os.path.join(tmp, "config.json")
        with open(model_path, "w") as f:
            json.dump(cfg, f)
        base = {"format": "shardscope.plan", "version": 1, "name": "gpt2", "api": "fsdp2", "mesh": {"shape": [4]},
                "wrap": {"policy": "module_class", "classes": ["GPT2Block"]},
                "training": {"micro_batch_size": 1, "seq_len": 16}}
        bf16 = {"param_dtype": "bfloat16"}
        cases = {"mixed": dict(base, units=[{"modules": [f"transformer.h.{i}"], "mixed_precision": bf16}
                                            for i in range(2)]),
                 "uniform": dict(base, defaults={"mixed_precision": bf16})}
        for name, plan in cases.items():
            with self.subTest(plan=name):
                plan_path, out = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".fsdp2.json")
                with open(plan_path, "w") as f:
                    json.dump(plan, f)
                report = peer.shardscope("plan", "validate", "--model", model_path, "--plan", plan_path, "--json")
                warned = [p for p in report["problems"] if "nothing casts it" in p["message"]]
                peer.shardscope("plan", "export", "--model", model_path, "--plan", plan_path, "--format", "fsdp2",
                                "-o", out)
                dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
                try:
                    config = transformers.AutoConfig.from_pretrained(model_path)
                    model = apply_plan(transformers.AutoModelForCausalLM.from_config(config), out,
                                       device_type="cpu")
                    tokens = torch.randint(0, 96, (1, 16))
                    try:
                        model(tokens, use_cache=False)
                        failed = None
                    except RuntimeError as e:
                        failed = str(e)
                finally:
                    dist.destroy_process_group()
                if name == "mixed":
                    self.assertTrue(any("transformer.ln_f" in p["message"] for p in warned), report["problems"])
                    self.assertIsNotNone(failed, "real FSDP2 ran the plan the validator warns about")
                    self.assertIn("dtype", failed.lower() + " " + str(failed))
                else:
                    self.assertEqual(warned, [])
                    self.assertIsNone(failed, failed)

    def test_fp32_router_gates_need_fp32_units_in_real_fsdp2(self):
        # A small ERNIE-4.5 MoE: its router gate computes in fp32. With every layer a bf16 unit
        # `plan validate` refuses the plan and real FSDP2 fails in the gate's forward; the plan
        # `recommend` exports (each gate an fp32 unit) validates, applies unchanged and trains
        # a step on real fully_shard with a bf16 param_dtype.
        cfg = {"architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "vocab_size": 96,
               "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
               "num_key_value_heads": 2, "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 16,
               "moe_num_shared_experts": 1, "max_position_embeddings": 64}
        tmp = tempfile.mkdtemp()
        model_path = os.path.join(tmp, "config.json")
        with open(model_path, "w") as f:
            json.dump(cfg, f)
        cluster = os.path.join(tmp, "cluster.json")
        with open(cluster, "w") as f:
            json.dump(dict(CLUSTER, device=dict(CLUSTER["device"], memory_bytes=1 << 30)), f)
        plain = {"format": "shardscope.plan", "version": 1, "name": "ernie", "api": "fsdp2", "mesh": {"shape": [4]},
                 "wrap": {"policy": "module_class", "classes": ["Ernie4_5_MoeDecoderLayer"]},
                 "defaults": {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}},
                 "training": {"micro_batch_size": 1, "seq_len": 16}}
        plain_path = os.path.join(tmp, "plain.json")
        with open(plain_path, "w") as f:
            json.dump(plain, f)
        report = peer.shardscope("plan", "validate", "--model", model_path, "--plan", plain_path, "--json",
                                 check=False)
        refused = [p for p in report["problems"] if "computes in fp32" in p["message"]]
        self.assertTrue(refused and refused[0]["severity"] == "error", report["problems"])
        recommended = os.path.join(tmp, "recommended.fsdp2.json")
        rec = peer.shardscope("recommend", "--model", model_path, "--cluster", cluster, "--seq", "16",
                              "--global-batch", "4", "--format", "fsdp2", "--output", recommended, "--json")
        rec_plan = os.path.join(tmp, "recommended.json")
        with open(rec_plan, "w") as f:
            json.dump(rec["best"]["plan"], f)
        self.assertIn("valid", peer.shardscope("plan", "validate", "--model", model_path, "--plan", rec_plan,
                                               "--cluster", cluster))
        # The plain plan as fully_shard calls: the recommended export without the gates' own
        # calls (each layer's bf16 unit then holds its gate), as a user would write it.
        with open(recommended) as f:
            export = json.load(f)
        plain_export = dict(export)
        plain_export["fully_shard"] = [c for c in plain_export["fully_shard"]
                                       if not c["modules"][0].endswith(".mlp.gate")]
        for name, export in (("plain", plain_export), ("recommended", export)):
            with self.subTest(plan=name):
                dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
                try:
                    config = transformers.AutoConfig.from_pretrained(model_path)
                    model = apply_plan(transformers.AutoModelForCausalLM.from_config(config), export,
                                       device_type="cpu")
                    tokens = torch.randint(0, 96, (1, 16))
                    try:
                        model(tokens, use_cache=False).logits.float().mean().backward()
                        failed = None
                    except RuntimeError as e:
                        failed = str(e)
                finally:
                    dist.destroy_process_group()
                if name == "plain":
                    self.assertIsNotNone(failed, "real FSDP2 ran the plan the validator refuses")
                    self.assertIn("same dtype", failed)
                else:
                    self.assertIsNone(failed, failed)


if __name__ == "__main__":
    unittest.main(verbosity=2)
