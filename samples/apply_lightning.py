#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Build Lightning's FSDPStrategy and Trainer arguments from a ShardScope Lightning export.

    import json, lightning.pytorch as pl
    from apply_lightning import lightning_strategy
    export = json.load(open("plan.lightning.json"))   # shardscope plan export --format lightning
    strategy, trainer_kwargs = lightning_strategy(export, model)   # model: to resolve class names
    trainer = pl.Trainer(strategy=strategy, **trainer_kwargs)

The export is JSON: this turns its class names into the module classes Lightning's
`auto_wrap_policy` and `activation_checkpointing_policy` take (found on `model`), the
FSDP1 keyword arguments Lightning passes through to FullyShardedDataParallel into their
enums and objects (samples/apply_fsdp1.py), and the trainer's precision and gradient
accumulation into Trainer arguments. Settings listed under "dropped" are what Lightning
cannot express of an FSDP2 plan; `shardscope plan export` warned about each.
Lightning's FSDPStrategy needs a CUDA accelerator to fit.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apply_fsdp1 import _classes, _dtype  # noqa: E402


def lightning_strategy(export, model):
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision

    if export.get("format") != "shardscope.export.lightning":
        raise ValueError(f"expected a shardscope.export.lightning file, got format {export.get('format')!r}")
    if export.get("strategy") != "FSDPStrategy":
        raise ValueError(f"this loader builds FSDPStrategy; the export asks for {export.get('strategy')!r}")
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
    trainer = export.get("trainer", {})
    trainer_kwargs = {"precision": trainer.get("precision", "32-true"),
                      "accumulate_grad_batches": int(trainer.get("accumulate_grad_batches", 1))}
    return FSDPStrategy(**args), trainer_kwargs
