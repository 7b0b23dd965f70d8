# SPDX-License-Identifier: Apache-2.0
"""Every export format of every plan shape, judged by the frameworks themselves.

Seven FSDP2 plans of the tiny Llama (one unit per block; a grouped norm+head unit; int
reshard_after_forward; CPU offload; HSDP 2x2; explicit prefetch lists; 2 micro-batches) are
exported in each format:

- fsdp2: applied by samples/apply_plan.py with PyTorch's real fully_shard on a fake 4-rank
  group; the applied state is read back from FSDP's own objects, unit by unit, and compared
  with the plan: which modules are units (a group shares one FSDP state), the post-forward
  mesh (None: reshard False; the shard group: True; a group of k ranks: int k), the CPU
  offload policy, the HSDP mesh, the prefetch lists, and gradient sync per micro-batch;
- lightning: ModelParallelStrategy carries that same fsdp2 export, nothing dropped;
- fsdp1, lightning-fsdp1: what FSDP1 cannot express is named under "dropped" (int reshard,
  explicit prefetch lists, a unit of several modules), and nothing else is dropped; real
  FSDP1 applies the plans it expresses whole, and Lightning builds both of its strategies
  (FSDPStrategy fits only on CUDA, so its construction is what is checked here).
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

sys.path.insert(0, peer.sample())
from apply_plan import apply_plan, prepare_micro_batch  # noqa: E402

MODEL = peer.sample("models", "tiny-llama", "config.json")
LAYERS = ["model.layers.%d" % i for i in range(4)]


def plan(name, mesh=(4,), defaults=None, units=None, micro_batches=1):
    p = {"format": "shardscope.plan", "version": 1, "name": name, "api": "fsdp2",
         "mesh": {"shape": list(mesh)}, "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
         "defaults": dict(defaults or {}), "units": list(units or []),
         "training": {"micro_batch_size": 1, "seq_len": 16}}
    if len(mesh) == 2:
        p["mesh"]["dim_names"] = ["replicate", "shard"]
    if micro_batches > 1:
        p["gradient_accumulation"] = {"micro_batches": micro_batches}
    return p


PLANS = {
    "per_block": plan("per_block"),
    "grouped": plan("grouped", units=[{"name": "norm+head", "modules": ["model.norm", "lm_head"]}]),
    "int_reshard": plan("int_reshard", defaults={"reshard_after_forward": 2}),
    "offload": plan("offload", defaults={"offload": {"pin_memory": False}}),
    "hsdp_2x2": plan("hsdp_2x2", mesh=(2, 2)),
    "prefetch": plan("prefetch", units=[{"modules": ["model.layers.0"], "forward_prefetch": ["model.layers.1"]},
                                        {"modules": ["model.layers.3"], "backward_prefetch": ["model.layers.2"]}]),
    "micro_batches_2": plan("micro_batches_2", micro_batches=2),
}

# What FSDP1 (and Lightning's FSDPStrategy) cannot express, by plan: the export must name it.
FSDP1_DROPS = {"int_reshard": "reshard_after_forward 2", "prefetch": "explicit prefetch lists",
               "grouped": "a unit of 2 modules"}


def export(p, fmt):
    tmp = tempfile.mkdtemp()
    path, out = os.path.join(tmp, "plan.json"), os.path.join(tmp, "out.json")
    with open(path, "w") as f:
        json.dump(p, f)
    peer.shardscope("plan", "export", "--model", MODEL, "--plan", path, "--format", fmt, "-o", out)
    with open(out) as f:
        return json.load(f)


class ExportMatrix(unittest.TestCase):
    def applied(self, name, p):
        """The tiny Llama sharded by the plan's fsdp2 export; returns (model, export)."""
        from torch.distributed.device_mesh import init_device_mesh
        ex = export(p, "fsdp2")
        cfg = transformers.AutoConfig.from_pretrained(MODEL)
        cfg.use_cache = False
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        mesh = init_device_mesh("cpu", tuple(ex["mesh"]["shape"]), mesh_dim_names=tuple(ex["mesh"]["dim_names"]))
        apply_plan(model, ex, device_type="cpu", mesh=mesh)
        return model, ex

    def test_fsdp2_export_applied_by_fully_shard_equals_the_plan(self):
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_api import OffloadPolicy
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        try:
            for name, p in PLANS.items():
                with self.subTest(plan=name):
                    model, ex = self.applied(name, p)
                    group = lambda n: model.get_submodule(n)._get_fsdp_state()._fsdp_param_group  # noqa: E731
                    units = {n for n, m in model.named_modules() if isinstance(m, FSDPModule)}
                    expected = {"", *LAYERS} | ({"model.norm", "lm_head"} if name == "grouped" else set())
                    self.assertEqual(units, expected)
                    if name == "grouped":  # one unit: one FSDP state for both modules
                        self.assertIs(model.get_submodule("model.norm")._get_fsdp_state(),
                                      model.get_submodule("lm_head")._get_fsdp_state())
                    for layer in LAYERS:
                        g = group(layer)
                        # reshard_after_forward: True -> the shard group, int k -> k ranks.
                        post = g.post_forward_mesh_info
                        want = 2 if name == "int_reshard" else g.mesh_info.shard_mesh_size
                        self.assertIsNotNone(post, layer)
                        self.assertEqual(post.shard_mesh_size, want, layer)
                        self.assertEqual(isinstance(g.offload_policy, CPUOffloadPolicy), name == "offload", layer)
                        if name != "offload":
                            self.assertIs(type(g.offload_policy), OffloadPolicy)
                        if name == "hsdp_2x2":
                            self.assertEqual((g.mesh_info.replicate_mesh_size, g.mesh_info.shard_mesh_size), (2, 2))
                        else:
                            self.assertEqual(g.mesh_info.shard_mesh_size, 4)
                    # The root: False unless the plan's defaults say otherwise (an explicit
                    # value reaches the root, as fully_shard keeps it past lazy init).
                    root = model._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info
                    if name == "int_reshard":
                        self.assertEqual(root.shard_mesh_size, 2)
                    else:
                        self.assertIsNone(root)
                    state = lambda n: model.get_submodule(n)._get_fsdp_state()  # noqa: E731
                    fwd = state("model.layers.0")._states_to_forward_prefetch
                    bwd = state("model.layers.3")._states_to_backward_prefetch
                    if name == "prefetch":
                        self.assertEqual(fwd, [state("model.layers.1")])
                        self.assertEqual(bwd, [state("model.layers.2")])
                    else:
                        self.assertEqual((fwd, bwd), ([], []))
                    # Gradient sync: on the last micro-batch only.
                    n = ex.get("gradient_accumulation", {}).get("micro_batches", 1)
                    self.assertEqual(n, 2 if name == "micro_batches_2" else 1)
                    syncs = []
                    for mb in range(n):
                        prepare_micro_batch(model, ex, mb)
                        syncs.append(group("model.layers.0").reduce_grads)
                    self.assertEqual(syncs, [False, True] if n == 2 else [True])
        finally:
            dist.destroy_process_group()

    def test_lightning_carries_the_fsdp2_export_and_fsdp1_names_what_it_drops(self):
        for name, p in PLANS.items():
            with self.subTest(plan=name):
                fsdp2 = export(p, "fsdp2")
                light = export(p, "lightning")
                self.assertEqual(light["dropped"], [])
                self.assertEqual(light["strategy"], "ModelParallelStrategy")
                self.assertEqual(light["kwargs"]["data_parallel_size"], 4)
                self.assertEqual(light["trainer"]["accumulate_grad_batches"],
                                 2 if name == "micro_batches_2" else 1)
                inner = light["fsdp2"]
                self.assertEqual(inner["fully_shard"], fsdp2["fully_shard"])
                self.assertEqual(inner["mesh"], fsdp2["mesh"])
                for key in ("forward_prefetch", "backward_prefetch", "gradient_accumulation"):
                    self.assertEqual(inner.get(key), fsdp2.get(key), key)
                for fmt in ("fsdp1", "lightning-fsdp1"):
                    dropped = [d["setting"] for d in export(p, fmt)["dropped"]]
                    self.assertEqual(dropped, [FSDP1_DROPS[name]] if name in FSDP1_DROPS else [], fmt)
                # Lightning builds both strategies from the exports (FSDPStrategy fits only
                # on CUDA; its construction is checked here).
                from apply_lightning import lightning_strategy
                from torch.distributed.fsdp import ShardingStrategy
                import lightning.pytorch as lp
                model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(MODEL))
                strategy, trainer = lightning_strategy(light, model)
                self.assertIsInstance(strategy, lp.strategies.ModelParallelStrategy)
                self.assertEqual(trainer["accumulate_grad_batches"], 2 if name == "micro_batches_2" else 1)
                strategy, trainer = lightning_strategy(export(p, "lightning-fsdp1"), model)
                self.assertIsInstance(strategy, lp.strategies.FSDPStrategy)
                self.assertEqual(strategy.sharding_strategy, ShardingStrategy.HYBRID_SHARD if name == "hsdp_2x2"
                                 else ShardingStrategy.FULL_SHARD)
                self.assertEqual(strategy.cpu_offload.offload_params, name == "offload")
                self.assertEqual(trainer["accumulate_grad_batches"], 2 if name == "micro_batches_2" else 1)

    def test_fsdp1_export_applied_by_real_fsdp1_equals_the_plan(self):
        # The plans FSDP1 expresses whole: real FullyShardedDataParallel wraps the same units
        # with the sharding strategy, CPU offload and accumulation the plan says.
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from apply_fsdp1 import apply_fsdp1
        for name in ("per_block", "offload", "hsdp_2x2", "micro_batches_2"):
            with self.subTest(plan=name):
                ex = export(PLANS[name], "fsdp1")
                self.assertEqual(ex["dropped"], [])
                dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
                try:
                    cfg = transformers.AutoConfig.from_pretrained(MODEL)
                    torch.manual_seed(0)
                    wrapped = apply_fsdp1(transformers.AutoModelForCausalLM.from_config(cfg), ex,
                                          device_id=torch.device("cpu"))
                    units = [m for m in wrapped.modules() if isinstance(m, FSDP)]
                    self.assertEqual(len(units), 1 + len(LAYERS))
                    for u in units:
                        self.assertEqual(u.sharding_strategy, ShardingStrategy.HYBRID_SHARD if name == "hsdp_2x2"
                                         else ShardingStrategy.FULL_SHARD)
                        self.assertEqual(u.cpu_offload.offload_params, name == "offload")
                    n = ex["gradient_accumulation"]["micro_batches"]
                    self.assertEqual(n, 2 if name == "micro_batches_2" else 1)
                    # Gradients reduced on the last micro-batch only.
                    from apply_fsdp1 import micro_batch_context
                    syncs = []
                    for mb in range(n):
                        with micro_batch_context(wrapped, ex, mb):
                            syncs.append(all(u._sync_gradients for u in units))
                    self.assertEqual(syncs, [False, True] if n == 2 else [True])
                finally:
                    dist.destroy_process_group()


if __name__ == "__main__":
    unittest.main(verbosity=2)
