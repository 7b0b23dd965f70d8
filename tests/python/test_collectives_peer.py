# SPDX-License-Identifier: Apache-2.0
"""Peer test: the collectives our step program issues equal those PyTorch's fully_shard
issues for the same model and plan (kind, group size, bytes, order).

The plan is exported (`shardscope plan export --format fsdp2`), applied with the real
fully_shard (samples/apply_plan.py, as a user applies it) on a fake process group of 4 ranks on CPU, and one training step runs
(forward, backward; micro-batches with set_requires_gradient_sync(False) before the last).
Every all_gather_into_tensor / reduce_scatter_tensor / all_reduce FSDP calls is recorded
and compared, in order, with `shardscope simulate --program --json`.
"""
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

sys.path.insert(0, peer.sample(""))
from apply_plan import apply_plan  # noqa: E402

RECORDED = []


def install_recorder():
    def record(kind, tensor, group):
        RECORDED.append((kind, tensor.numel() * tensor.element_size(), dist.get_world_size(group)))

    orig_ag, orig_rs, orig_ar = dist.all_gather_into_tensor, dist.reduce_scatter_tensor, dist.all_reduce

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        record("all_gather", output_tensor, group)
        return orig_ag(output_tensor, input_tensor, group=group, async_op=async_op)

    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        record("reduce_scatter", input, group)
        return orig_rs(output, input, op=op, group=group, async_op=async_op)

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        record("all_reduce", tensor, group)
        return orig_ar(tensor, op=op, group=group, async_op=async_op)

    dist.all_gather_into_tensor = all_gather_into_tensor
    dist.reduce_scatter_tensor = reduce_scatter_tensor
    dist.all_reduce = all_reduce


CFG = peer.sample("models", "tiny-llama", "config.json")
CLUSTER = {"format": "shardscope.cluster", "version": 1, "name": "4 ranks", "nodes": 1,
           "device": {"name": "cpu", "kind": "cpu", "memory_bytes": 1 << 34, "peak_flops": {"float32": 1e11},
                      "hbm_bandwidth_bytes_per_s": 1e10},
           "node": {"devices_per_node": 4, "intra_bandwidth_bytes_per_s": 1e9, "intra_latency_ns": 1000},
           "network": {"nic_bandwidth_bytes_per_s": 1e9, "latency_ns": 1000},
           "host": {"link_bandwidth_bytes_per_s": 1e9}}
LAYERS = {"policy": "module_class", "classes": ["LlamaDecoderLayer"]}
BATCH, SEQ = 2, 16


class CollectivesPeer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        install_recorder()
        cls.tmp = tempfile.mkdtemp()
        cls.cluster = os.path.join(cls.tmp, "cluster.json")
        with open(cls.cluster, "w") as f:
            json.dump(CLUSTER, f)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()

    def ours(self, plan_path):
        prog = peer.shardscope("simulate", "--model", CFG, "--plan", plan_path, "--cluster", self.cluster,
                               "--program", "--json")
        return [(op["kind"], op["bytes"], op["group_size"]) for op in prog["ops"]
                if op["kind"] in ("all_gather", "reduce_scatter", "all_reduce")]

    def theirs(self, plan_path, plan):
        export = peer.shardscope("plan", "export", "--model", CFG, "--plan", plan_path, "--format", "fsdp2")
        cfg = transformers.AutoConfig.from_pretrained(CFG)
        torch.manual_seed(0)
        # As a user applies it: samples/apply_plan.py (ignored parameters, prefetch lists).
        model = apply_plan(transformers.AutoModelForCausalLM.from_config(cfg), export, device_type="cpu")
        RECORDED.clear()
        micro = plan.get("gradient_accumulation", {}).get("micro_batches", 1)
        for mb in range(micro):
            model.set_requires_gradient_sync(mb == micro - 1)
            tokens = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
            model(tokens).logits.float().sum().backward()
        return list(RECORDED)

    def check(self, label, plan):
        plan = {"format": "shardscope.plan", "version": 1, "api": "fsdp2", "mesh": {"shape": [4]}, "wrap": LAYERS,
                "training": {"micro_batch_size": BATCH, "seq_len": SEQ}, **plan}
        path = os.path.join(self.tmp, label.replace(" ", "_") + ".json")
        with open(path, "w") as f:
            json.dump(plan, f)
        ours, theirs = self.ours(path), self.theirs(path, plan)
        if ours != theirs:
            for i in range(max(len(ours), len(theirs))):
                a = ours[i] if i < len(ours) else None
                b = theirs[i] if i < len(theirs) else None
                print(f"  {i:3d} {'==' if a == b else '!='} ours {a}  torch {b}")
        self.assertEqual(ours, theirs, label)
        print(f"{label}: {len(ours)} collectives equal to fully_shard's")

    def test_reshard_true_false_int(self):
        self.check("per-block reshard True", {})
        self.check("reshard False", {"defaults": {"reshard_after_forward": False}})
        self.check("reshard int 2", {"defaults": {"reshard_after_forward": 2}})

    def test_explicit_prefetch(self):
        self.check("explicit prefetch", {"units": [
            {"modules": ["model.layers.0"], "forward_prefetch": ["model.layers.1", "model.layers.2"]},
            {"modules": ["model.layers.3"], "backward_prefetch": ["model.layers.1"]}]})

    def test_hsdp(self):
        self.check("HSDP 2x2", {"mesh": {"shape": [2, 2]}})

    def test_mixed_precision(self):
        self.check("bf16 params fp32 reduce", {"defaults": {"mixed_precision": {"param_dtype": "bfloat16",
                                                                                 "reduce_dtype": "float32"}}})

    def test_gradient_accumulation(self):
        self.check("2 micro-batches", {"gradient_accumulation": {"micro_batches": 2}})

    def test_units_without_parameters(self):
        # FSDP2 makes no parameter group for a module without parameters to manage: it
        # gathers and reduces nothing for it, in FSDP and in HSDP.
        every = [{"modules": ["model.embed_tokens"]}, {"name": "norm+head", "modules": ["model.norm", "lm_head"]}]
        self.check("parameterless root", {"units": every})
        self.check("parameterless root, HSDP 2x2", {"mesh": {"shape": [2, 2]}, "units": every})
        self.check("rotary_emb a unit", {"units": [{"modules": ["model.rotary_emb"]}]})
        ignored = [n for n in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                               "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")]
        self.check("a unit whose parameters are all ignored",
                   {"ignored_params": ["model.layers.2." + n for n in ignored]})

    def test_hsdp_with_a_group_of_one(self):
        # A shard group of one reduces by a copy (foreach_reduce's world_size == 1 path):
        # no reduce-scatter, only the replicate group's all-reduce.
        self.check("HSDP 4x1", {"mesh": {"shape": [4, 1]}})
        self.check("HSDP 1x4", {"mesh": {"shape": [1, 4]}})


if __name__ == "__main__":
    unittest.main(verbosity=2)
