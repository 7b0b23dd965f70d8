# SPDX-License-Identifier: Apache-2.0
"""Lightning itself builds the strategy our Lightning export describes.

`shardscope plan export --format lightning` of FSDP1-style plans (module-class wrapping with
checkpointing and bf16 mixed precision; a hybrid mesh) is turned into Lightning's
FSDPStrategy and Trainer arguments by samples/apply_lightning.py, with Lightning (installed
from PyPI into our environment) as the judge: the strategy must accept them and hold the
plan's wrap classes, checkpointing classes, sharding strategy, prefetch and precision, and a
Trainer must accept the precision and accumulation. Lightning's FSDPStrategy refuses a CPU
accelerator, so fitting is checked only where a GPU exists (skipped here with the reason).

An FSDP2 plan exports as ModelParallelStrategy with the fsdp2 export inside: a tiny Llama is
fitted for real on 2 CPU ranks (Gloo) under Lightning's ModelParallelStrategy, the plan applied
in configure_model, and every unit's settings, the prefetch lists, the checkpointing, gradient
sync per micro-batch and resharding at each step's end are compared with the plan.
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
pl = peer.require("lightning.pytorch")

sys.path.insert(0, peer.sample())
from apply_lightning import lightning_strategy  # noqa: E402

MODEL = peer.sample("models", "tiny-llama", "config.json")


class ApplyLightning(unittest.TestCase):
    def export(self, plan):
        tmp = tempfile.mkdtemp()
        plan_path, out = os.path.join(tmp, "plan.json"), os.path.join(tmp, "plan.lightning.json")
        with open(plan_path, "w") as f:
            json.dump(plan, f)
        peer.shardscope("plan", "export", "--model", MODEL, "--plan", plan_path, "--format", "lightning", "-o", out)
        with open(out) as f:
            return json.load(f)

    def test_lightning_builds_the_strategy_the_export_describes(self):
        from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        import lightning.pytorch as lp
        plan = {"format": "shardscope.plan", "version": 1, "name": "lightning", "api": "fsdp1",
                "mesh": {"shape": [4]}, "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
                "defaults": {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
                             "activation_checkpointing": "full"},
                "gradient_accumulation": {"micro_batches": 4},
                "training": {"micro_batch_size": 1, "seq_len": 16}}
        export = self.export(plan)
        self.assertEqual(export["dropped"], [])
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(MODEL))
        strategy, trainer_kwargs = lightning_strategy(export, model)
        self.assertIsInstance(strategy, lp.strategies.FSDPStrategy)
        self.assertEqual(strategy.sharding_strategy, ShardingStrategy.FULL_SHARD)
        self.assertEqual(strategy.kwargs["auto_wrap_policy"]._module_classes, {LlamaDecoderLayer})
        self.assertEqual(strategy.kwargs["backward_prefetch"], BackwardPrefetch.BACKWARD_PRE)
        self.assertTrue(strategy.kwargs["use_orig_params"])
        self.assertEqual(strategy.mixed_precision.param_dtype, torch.bfloat16)
        self.assertEqual(strategy.mixed_precision.reduce_dtype, torch.float32)
        self.assertIsNone(strategy.mixed_precision.buffer_dtype)
        self.assertIsNotNone(strategy._activation_checkpointing_kwargs)
        self.assertEqual(trainer_kwargs, {"precision": "bf16-mixed", "accumulate_grad_batches": 4})
        # A Trainer accepts the precision and accumulation (the strategy needs CUDA to fit).
        trainer = lp.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False,
                             enable_checkpointing=False, **trainer_kwargs)
        self.assertEqual(trainer.accumulate_grad_batches, 4)
        if not torch.cuda.is_available():
            print("SKIP part: fitting with FSDPStrategy needs a CUDA device (Lightning refuses accelerator='cpu')")

    def test_hybrid_mesh_reaches_the_strategy(self):
        from torch.distributed.fsdp import ShardingStrategy
        plan = {"format": "shardscope.plan", "version": 1, "name": "hybrid", "api": "fsdp1",
                "mesh": {"shape": [2, 2], "dim_names": ["replicate", "shard"]},
                "fsdp1": {"sharding_strategy": "HYBRID_SHARD"},
                "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
                "training": {"micro_batch_size": 1, "seq_len": 16}}
        export = self.export(plan)
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(MODEL))
        strategy, _ = lightning_strategy(export, model)
        self.assertEqual(strategy.sharding_strategy, ShardingStrategy.HYBRID_SHARD)
        self.assertEqual(tuple(strategy.kwargs["device_mesh"]), (2, 2))


    def test_model_parallel_strategy_fits_the_fsdp2_plan_on_two_cpu_ranks(self):
        plan = {"format": "shardscope.plan", "version": 1, "name": "fsdp2-lightning", "api": "fsdp2",
                "mesh": {"shape": [2]}, "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
                "defaults": {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
                             "activation_checkpointing": "selective_op"},
                "units": [{"modules": ["model.layers.0"], "reshard_after_forward": False,
                           "forward_prefetch": ["model.layers.1"]},
                          {"name": "norm+head", "modules": ["model.norm", "lm_head"]}],
                "gradient_accumulation": {"micro_batches": 2},
                "training": {"micro_batch_size": 1, "seq_len": 16}}
        export = self.export(plan)
        self.assertEqual(export["strategy"], "ModelParallelStrategy")
        self.assertEqual(export["kwargs"], {"data_parallel_size": 2, "tensor_parallel_size": 1})
        self.assertEqual(export["dropped"], [])  # the norm+head group and prefetch list survive
        tmp = tempfile.mkdtemp()
        export_path = os.path.join(tmp, "plan.lightning.json")
        with open(export_path, "w") as f:
            json.dump(export, f)
        script = os.path.join(tmp, "fit.py")
        with open(script, "w") as f:
            f.write(FIT)
        env = dict(os.environ, SHARDSCOPE_SAMPLES=peer.sample(), SHARDSCOPE_EXPORT=export_path,
                   SHARDSCOPE_MODEL=MODEL, SHARDSCOPE_OUT=tmp)
        import subprocess
        r = subprocess.run([sys.executable, script], cwd=tmp, env=env, capture_output=True, text=True,
                           timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        fsdp2 = export["fsdp2"]
        for rank in range(2):
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                seen = json.load(f)
            self.assertEqual(seen["global_step"], 2)
            self.assertEqual(seen["world_size"], 2)
            # One FSDP2 unit per fully_shard call, each with the export's reshard setting.
            self.assertEqual(sorted(seen["units"]), sorted(",".join(c["modules"]) for c in fsdp2["fully_shard"]))
            for call in fsdp2["fully_shard"]:
                self.assertEqual(seen["units"][",".join(call["modules"])],
                                 call["kwargs"]["reshard_after_forward"], call["modules"])
            self.assertEqual(seen["param_dtype"], "torch.bfloat16")
            self.assertEqual(seen["forward_prefetch"], fsdp2["forward_prefetch"])
            self.assertEqual(sorted(seen["checkpointed"]), sorted(fsdp2["activation_checkpointing"]))
            # Reduce on the second micro-batch of each step only; every unit sharded at a
            # step's end.
            self.assertEqual(seen["reduce_grads"], [False, True, False, True])
            self.assertEqual(seen["sharded_at_step_end"], [True, True])


# Run by the test above as its own script: Lightning's launcher starts rank 1 by running it again.
FIT = r"""
import json, os, sys
import torch, transformers
import lightning.pytorch as pl
sys.path.insert(0, os.environ["SHARDSCOPE_SAMPLES"])
from apply_lightning import configure_model, lightning_strategy
from torch.distributed.fsdp import FSDPModule

export = json.load(open(os.environ["SHARDSCOPE_EXPORT"]))
config = transformers.AutoConfig.from_pretrained(os.environ["SHARDSCOPE_MODEL"])


class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = transformers.AutoModelForCausalLM.from_config(config)
        self.seen = {"reduce_grads": [], "sharded_at_step_end": []}

    def configure_model(self):
        configure_model(self, self.model, export)

    def groups(self):
        return {n: m._get_fsdp_state()._fsdp_param_group for n, m in self.model.named_modules()
                if isinstance(m, FSDPModule)}

    def training_step(self, batch, batch_idx):
        self.seen["reduce_grads"].append(self.groups()[""].reduce_grads)
        return self.model(batch, use_cache=False).logits.float().mean()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if (batch_idx + 1) % self.trainer.accumulate_grad_batches == 0:
            self.seen["sharded_at_step_end"].append(
                all(g.is_sharded for g in self.groups().values() if g is not None))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        return torch.utils.data.DataLoader([torch.randint(0, config.vocab_size, (16,), generator=g)
                                            for _ in range(8)], batch_size=1)


module = Module()
strategy, trainer_kwargs = lightning_strategy(export, module.model)
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=2, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     **trainer_kwargs)
trainer.fit(module)
units, prefetch, checkpointed, param_dtype = {}, {}, [], None
names = {id(m): n for n, m in module.model.named_modules()}
for name, m in module.model.named_modules():
    # apply_plan wraps a checkpointed module's forward in its own function on the instance.
    own = m.__dict__.get("forward")
    if own is not None and getattr(own, "__code__", None) and own.__code__.co_name == "checkpointed":
        checkpointed.append(name)
    if isinstance(m, FSDPModule) and m._get_fsdp_state()._modules[0] is m:
        st = m._get_fsdp_state()
        g = st._fsdp_param_group
        key = ",".join(names[id(x)] for x in st._modules)
        units[key] = g.post_forward_mesh_info is not None
        if g.mp_policy.param_dtype is not None:
            param_dtype = str(g.mp_policy.param_dtype)
        if st._states_to_forward_prefetch:
            prefetch[key] = [names[id(s._modules[0])] for s in st._states_to_forward_prefetch]
seen = dict(module.seen, units=units, forward_prefetch=prefetch, checkpointed=checkpointed,
            param_dtype=param_dtype, global_step=trainer.global_step, world_size=trainer.world_size)
with open(os.path.join(os.environ["SHARDSCOPE_OUT"], "rank%d.json" % trainer.global_rank), "w") as f:
    json.dump(seen, f)
"""

if __name__ == "__main__":
    unittest.main(verbosity=2)
