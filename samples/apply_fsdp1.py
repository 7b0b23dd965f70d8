#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Apply a ShardScope FSDP1 plan export with torch's FullyShardedDataParallel.

    import json, torch
    from apply_fsdp1 import apply_fsdp1
    export = json.load(open("plan.fsdp1.json"))      # shardscope plan export --format fsdp1
    model = apply_fsdp1(build_my_model(), export)      # wraps, checkpoints, returns the FSDP root
    for mb, batch in enumerate(micro_batches):          # export["gradient_accumulation"]
        with micro_batch_context(model, export, mb):     # no_sync() but on the last
            loss_fn(model(batch)).backward()

The export's kwargs are JSON: this turns them into what FullyShardedDataParallel takes
(the sharding strategy and backward prefetch enums, the auto-wrap policy object from its
type and classes or module names, MixedPrecision and CPUOffload, ignored parameters from
their names, a DeviceMesh for the hybrid strategies) and applies activation checkpointing
to the listed classes as torch's apply_activation_checkpointing does (non-reentrant).
Settings the export lists under "dropped" are what FSDP1 cannot express of an FSDP2 plan;
`shardscope plan export` warned about each.

Run under torchrun (or any launcher that initialises the default process group);
`device_id` defaults to the current CUDA device when there is one, else the CPU.
"""
import contextlib
import functools
import re

import torch
from torch.distributed.fsdp import (BackwardPrefetch, CPUOffload, FullyShardedDataParallel, MixedPrecision,
                                    ShardingStrategy)
from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy, lambda_auto_wrap_policy, size_based_auto_wrap_policy

_DTYPES = {"torch.float32": torch.float32, "torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16,
           "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name):
    if name is None:
        return None
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r} in the export")
    return _DTYPES[name]


def _classes(model, names):
    """The module classes of `model` with these names (the wrap policy takes classes)."""
    found = {}
    for m in model.modules():
        found.setdefault(type(m).__name__, type(m))
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"the export names module classes the model does not have: {missing}")
    return {found[n] for n in names}


def auto_wrap_policy(model, policy):
    """FullyShardedDataParallel's auto_wrap_policy from the export's description of it."""
    if policy is None:
        return None
    kind = policy["type"]
    if kind == "ModuleWrapPolicy":
        return ModuleWrapPolicy(_classes(model, policy["module_classes"]))
    if kind == "size_based_auto_wrap_policy":
        return functools.partial(size_based_auto_wrap_policy, min_num_params=int(policy["min_num_params"]),
                                 force_leaf_modules=_classes(model, [c for c in policy.get("force_leaf_modules", [])
                                                                     if any(type(m).__name__ == c for m in model.modules())]),
                                 exclude_wrap_modules=_classes(model, [c for c in policy.get("exclude_wrap_modules", [])
                                                                       if any(type(m).__name__ == c for m in model.modules())]))
    names = {id(m): n for n, m in model.named_modules()}
    if kind == "CustomPolicy":
        wanted = set(policy["module_names"])
        return CustomPolicy(lambda m: names.get(id(m)) in wanted)
    if kind == "lambda_auto_wrap_policy":
        patterns = [re.compile(p) for p in policy["module_name_patterns"]]
        return functools.partial(lambda_auto_wrap_policy,
                                 lambda_fn=lambda m: any(p.fullmatch(names.get(id(m), "")) for p in patterns))
    raise ValueError(f"unknown auto-wrap policy type {kind!r} in the export")


def fsdp1_kwargs(model, export, device_id=None):
    """The export's kwargs as FullyShardedDataParallel takes them."""
    if export.get("format") != "shardscope.export.fsdp1":
        raise ValueError(f"expected a shardscope.export.fsdp1 file, got format {export.get('format')!r}")
    kw = export["kwargs"]
    out = {"sharding_strategy": ShardingStrategy[kw["sharding_strategy"]],
           "auto_wrap_policy": auto_wrap_policy(model, kw.get("auto_wrap_policy")),
           "backward_prefetch": BackwardPrefetch[kw["backward_prefetch"]] if kw.get("backward_prefetch") else None,
           "forward_prefetch": bool(kw.get("forward_prefetch", False)),
           "limit_all_gathers": bool(kw.get("limit_all_gathers", True)),
           "use_orig_params": bool(kw.get("use_orig_params", True)),
           "cpu_offload": CPUOffload(offload_params=bool(kw.get("cpu_offload", {}).get("offload_params", False)))}
    mp = kw.get("mixed_precision")
    if mp:
        out["mixed_precision"] = MixedPrecision(param_dtype=_dtype(mp.get("param_dtype")),
                                                reduce_dtype=_dtype(mp.get("reduce_dtype")),
                                                buffer_dtype=_dtype(mp.get("buffer_dtype")),
                                                cast_forward_inputs=bool(mp.get("cast_forward_inputs", False)))
    ignored = kw.get("ignored_states") or []
    if ignored:
        out["ignored_states"] = [model.get_parameter(n) for n in ignored]
    if device_id is None:
        device_id = torch.cuda.current_device() if torch.cuda.is_available() else torch.device("cpu")
    out["device_id"] = device_id
    if kw["sharding_strategy"] in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        from torch.distributed.device_mesh import init_device_mesh
        mesh = export["device_mesh"]
        out["device_mesh"] = init_device_mesh("cuda" if torch.cuda.is_available() else "cpu",
                                              tuple(mesh["shape"]), mesh_dim_names=tuple(mesh["dim_names"]))
    return out


def apply_fsdp1(model, export, device_id=None):
    """Wraps `model` with FullyShardedDataParallel as the export says and checkpoints the listed
    classes; returns the wrapped root."""
    classes = export.get("activation_checkpointing_classes") or []
    wrapped = FullyShardedDataParallel(model, **fsdp1_kwargs(model, export, device_id))
    if classes:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl,
                                                                                 apply_activation_checkpointing,
                                                                                 checkpoint_wrapper)
        types = _classes(wrapped, classes)
        apply_activation_checkpointing(
            wrapped, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                             checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, tuple(types)))
    return wrapped


def micro_batch_context(model, export, micro_batch):
    """The context for one micro-batch's forward and backward: FSDP1 reduces gradients on
    the last of the export's micro-batches only (model.no_sync() before it), or on every one
    with "sync_every_micro_batch"."""
    acc = export.get("gradient_accumulation", {})
    n = int(acc.get("micro_batches", 1))
    if micro_batch < n - 1 and not acc.get("sync_every_micro_batch", False):
        return model.no_sync()
    return contextlib.nullcontext()
