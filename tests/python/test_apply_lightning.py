# SPDX-License-Identifier: Apache-2.0
"""Lightning itself builds the strategy our Lightning export describes.

`shardscope plan export --format lightning` of FSDP1-style plans (module-class wrapping with
checkpointing and bf16 mixed precision; a hybrid mesh) is turned into Lightning's
FSDPStrategy and Trainer arguments by samples/apply_lightning.py, with Lightning (installed
from PyPI into our environment) as the judge: the strategy must accept them and hold the
plan's wrap classes, checkpointing classes, sharding strategy, prefetch and precision, and a
Trainer must accept the precision and accumulation. Lightning's FSDPStrategy refuses a CPU
accelerator, so fitting is checked only where a GPU exists (skipped here with the reason).
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
