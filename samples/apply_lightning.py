#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Build Lightning's strategy and Trainer arguments from a ShardScope Lightning export.

    import json, lightning.pytorch as pl
    from apply_lightning import lightning_strategy, configure_model
    export = json.load(open("plan.lightning.json"))   # shardscope plan export --format lightning
    strategy, trainer_kwargs = lightning_strategy(export, model)   # model: to resolve class names
    trainer = pl.Trainer(strategy=strategy, **trainer_kwargs)

An FSDP2 plan exports as ModelParallelStrategy (Lightning's FSDP2 strategy) carrying the
plan's fsdp2 export unchanged; apply it in your LightningModule's configure_model hook:

    class MyModule(pl.LightningModule):
        def configure_model(self):
            configure_model(self, self.model, export)   # fully_shard as the plan says

trainer_kwargs then holds a callback that sets gradient sync and resharding before each
micro-batch as the plan says (reduce on the last micro-batch of an accumulation only; Lightning
alone would reduce on every one under this strategy), samples/apply_plan.py's
prepare_micro_batch.

An FSDP1 plan (or an FSDP2 plan exported with --format lightning-fsdp1) exports as
FSDPStrategy: this turns its class names into the module classes Lightning's
`auto_wrap_policy` and `activation_checkpointing_policy` take (found on `model`), the
FSDP1 keyword arguments Lightning passes through to FullyShardedDataParallel into their
enums and objects (samples/apply_fsdp1.py), and the trainer's precision and gradient
accumulation into Trainer arguments. Settings listed under "dropped" are what FSDPStrategy
cannot express of an FSDP2 plan; `shardscope plan export` warned about each.
Lightning's FSDPStrategy needs a CUDA accelerator to fit; ModelParallelStrategy also fits on
CPU (Gloo). A fairscale plan's DDPFullyShardedStrategy exists only in pytorch_lightning 1.x.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apply_fsdp1 import _classes, _dtype  # noqa: E402


def _trainer_kwargs(export):
    trainer = export.get("trainer", {})
    return {"precision": trainer.get("precision", "32-true"),
            "accumulate_grad_batches": int(trainer.get("accumulate_grad_batches", 1))}


def configure_model(module, model, export, device_type=None):
    """Call from the LightningModule's configure_model under ModelParallelStrategy: shards
    `model` (the module the plan's names are relative to, e.g. a Hugging Face model held by
    the LightningModule) with the export's fsdp2 plan on the strategy's data-parallel mesh.
    An HSDP plan ([replicate, shard]) gets its own 2-D mesh over the same ranks."""
    import torch
    from apply_plan import apply_plan
    from torch.distributed.device_mesh import init_device_mesh

    plan = export["fsdp2"]
    mesh = module.device_mesh
    if mesh["tensor_parallel"].size() != 1:
        raise ValueError("the plan is data parallel only: build ModelParallelStrategy with tensor_parallel_size=1")
    shape = tuple(plan["mesh"]["shape"])
    dp = mesh["data_parallel"]
    if dp.size() != torch.Size(shape).numel():
        raise ValueError(f"the strategy has {dp.size()} data-parallel ranks; the plan's mesh {list(shape)} "
                         f"needs {torch.Size(shape).numel()}")
    if device_type is None:
        device_type = dp.device_type
    if len(shape) > 1:
        dp = init_device_mesh(device_type, shape, mesh_dim_names=tuple(plan["mesh"]["dim_names"]))
    apply_plan(model, plan, device_type=device_type, mesh=dp)
    module._shardscope_plan = (model, plan)
    return model


def _micro_batch_callback():
    import lightning.pytorch as pl

    class PlanMicroBatches(pl.Callback):
        """Before each micro-batch: gradient sync and resharding as the plan says
        (apply_plan.prepare_micro_batch); the accumulation is Lightning's."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            from apply_plan import prepare_micro_batch
            if not hasattr(pl_module, "_shardscope_plan"):
                raise RuntimeError("configure_model(self, model, export) was not called in the "
                                   "LightningModule's configure_model hook")
            model, plan = pl_module._shardscope_plan
            prepare_micro_batch(model, plan, batch_idx % trainer.accumulate_grad_batches)

    return PlanMicroBatches()


def lightning_strategy(export, model):
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision

    if export.get("format") != "shardscope.export.lightning":
        raise ValueError(f"expected a shardscope.export.lightning file, got format {export.get('format')!r}")
    if export.get("strategy") == "ModelParallelStrategy":
        from lightning.pytorch.strategies import ModelParallelStrategy
        kw = export["kwargs"]
        strategy = ModelParallelStrategy(data_parallel_size=int(kw["data_parallel_size"]),
                                         tensor_parallel_size=int(kw["tensor_parallel_size"]))
        return strategy, dict(_trainer_kwargs(export), callbacks=[_micro_batch_callback()])
    if export.get("strategy") == "DDPFullyShardedStrategy":
        raise ValueError("the export asks for DDPFullyShardedStrategy, which needs " + export.get(
            "requires", "pytorch_lightning 1.x with fairscale") + "; this loader builds Lightning 2 strategies")
    if export.get("strategy") != "FSDPStrategy":
        raise ValueError(f"this loader builds FSDPStrategy and ModelParallelStrategy; the export asks for "
                         f"{export.get('strategy')!r}")
    kw = dict(export["kwargs"])
    policy = kw.pop("auto_wrap_policy", None)
    args = {"sharding_strategy": kw.pop("sharding_strategy"),
            "cpu_offload": bool(kw.pop("cpu_offload", False))}
    if policy:
        if policy["type"] == "ModuleWrapPolicy":
            args["auto_wrap_policy"] = _classes(model, policy["module_classes"])
        else:
            from apply_fsdp1 import auto_wrap_policy
            args["auto_wrap_policy"] = auto_wrap_policy(model, policy)
    ac = kw.pop("activation_checkpointing_policy", [])
    if ac:
        args["activation_checkpointing_policy"] = _classes(model, ac)
    mp = kw.pop("mixed_precision", None)
    if mp:
        args["mixed_precision"] = MixedPrecision(param_dtype=_dtype(mp.get("param_dtype")),
                                                 reduce_dtype=_dtype(mp.get("reduce_dtype")),
                                                 buffer_dtype=_dtype(mp.get("buffer_dtype")),
                                                 cast_forward_inputs=bool(mp.get("cast_forward_inputs", False)))
    if "device_mesh" in kw:
        args["device_mesh"] = tuple(kw.pop("device_mesh"))
    # Passed through to FullyShardedDataParallel.
    bp = kw.pop("backward_prefetch", None)
    args["backward_prefetch"] = BackwardPrefetch[bp] if bp else None
    for k in ("forward_prefetch", "limit_all_gathers", "use_orig_params"):
        if k in kw:
            args[k] = bool(kw.pop(k))
    ignored = kw.pop("ignored_states", [])
    if ignored:
        args["ignored_states"] = [model.get_parameter(n) for n in ignored]
    if kw:
        raise ValueError(f"the export has Lightning kwargs this loader does not know: {sorted(kw)}")
    return FSDPStrategy(**args), _trainer_kwargs(export)
