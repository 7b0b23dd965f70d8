#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Apply a ShardScope FSDP2 plan export to a torch.nn.Module with fully_shard.

    import json
    from apply_plan import apply_plan, prepare_micro_batch
    export = json.load(open("plan.fsdp2.json"))
    model = build_my_model()                      # on the meta device or the real one
    model = apply_plan(model, export)             # mesh, fully_shard calls, prefetch, checkpointing
    micro_batches = export["gradient_accumulation"]["micro_batches"]
    for step in range(steps):
        for mb in range(micro_batches):
            prepare_micro_batch(model, export, mb)  # gradient sync and resharding, as planned
            loss_fn(model(batch[mb])).backward()  # loss_fn = compile_loss(loss_fn, export)
        optim.step(); optim.zero_grad()
        after_optimizer_step(model, export)       # float8 scales, when the plan precomputes them

The export comes from `shardscope plan export --format fsdp2` or `shardscope recommend
--format fsdp2`. It lists the fully_shard calls in application order (children before the
root) with their kwargs, the mesh ([shard] or [replicate, shard] for HSDP), explicit
prefetch lists, torchao float8 conversion of listed nn.Linear layers and torch.compile of
listed blocks, and per-module activation checkpointing (all applied before sharding, in
torchtitan's order: float8, checkpointing, compile, fully_shard; checkpointing: "full" recomputes the module, "selective_op" is torchtitan's op-level
selective checkpointing (keeps mm and SDPA outputs, every second mm recomputed),
{"mode": "selective_op", "save": [...]} keeps the listed ops' outputs, "attention" checkpoints
the module's attention submodules (their projections and SDPA run again); Hugging Face models
must then run with use_cache=False, as their own
gradient checkpointing requires, or the KV cache grows during recomputation). Run under torchrun (or any launcher that initialises the default
process group); `device_type` defaults to "cuda" when available, else "cpu".
"""
import dataclasses
import functools
import json
import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard


def _dtype(name):
    if name is None:
        return None
    return getattr(torch, name.split(".")[-1])


# Ops a selective_op save list may name, as torch ops (those this PyTorch has).
_SAVE_OPS = {
    "mm": ["aten.mm.default"],
    "addmm": ["aten.addmm.default"],
    "bmm": ["aten.bmm.default"],
    # Every SDPA backend: CUDA flash, memory-efficient and cuDNN, and the CPU's flash.
    "sdpa": ["aten._scaled_dot_product_flash_attention.default",
             "aten._scaled_dot_product_efficient_attention.default",
             "aten._scaled_dot_product_cudnn_attention.default",
             "aten._scaled_dot_product_flash_attention_for_cpu.default"],
    "reduce_scatter": ["_c10d_functional.reduce_scatter_tensor.default"],
    "max": ["aten.max.default"],
}


def _save_ops(names):
    ops = set()
    for name in names:
        for path in _SAVE_OPS[name]:
            namespace, packet, overload = path.split(".")
            ns = getattr(torch.ops, namespace)
            if hasattr(ns, packet):
                ops.add(getattr(getattr(ns, packet), overload))
    return ops


# torchtitan's default op-level selective checkpointing (distributed/activation_checkpoint.py):
# keep the outputs of mm, SDPA, reduce_scatter and max; recompute every second mm and the rest.
TORCHTITAN_SAVE = ["mm", "sdpa", "reduce_scatter", "max"]


def _policy(mode):
    """The selective checkpointing policy of a mode (None for full checkpointing)."""
    from torch.utils.checkpoint import CheckpointPolicy
    if isinstance(mode, dict):
        keep, alternate = _save_ops(mode["save"]), False
    elif mode == "selective_op":
        keep, alternate = _save_ops(TORCHTITAN_SAVE), True
    else:
        return None
    mm = torch.ops.aten.mm.default

    def make():
        count = {}  # per checkpointed call, shared by its forward and its recompute (torchtitan's meta)

        def policy(ctx, op, *args, **kwargs):
            if op == mm and alternate:
                key = "recompute" if ctx.is_recompute else "forward"
                count[key] = count.get(key, 0) + 1
                if count[key] % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE
        return policy

    return make


def _checkpoint(module, mode):
    """Wraps module.forward in non-reentrant activation checkpointing: "full", "selective_op"
    (torchtitan's preset), {"mode": "selective_op", "save": [...]} or "attention"."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    if mode == "none":
        return
    if isinstance(mode, dict) and mode.get("mode") == "full":
        mode = "full"
    if mode == "attention":
        # Each attention submodule under plain checkpointing, as ShardScope's engine runs it
        # and its simulator prices it. (A selective policy that keeps every op's output but
        # SDPA's holds more than no checkpointing: an H200 run of Llama-3.1-8B with 4 layers at
        # 2 x 4096 peaked at 49.93 GiB that way.)
        attention = [m for m in module.modules() if type(m).__name__.endswith("Attention")]
        if not attention:
            return
        for m in attention:
            _checkpoint(m, "full")
        return
    forward = module.forward
    make = _policy(mode)

    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        if make is None:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False,
                          context_fn=functools.partial(create_selective_checkpoint_contexts, make()), **kwargs)

    module.forward = checkpointed


def _submodule(model, name):
    return model.get_submodule(name) if name else model


def apply_plan(model, export, device_type=None, mesh=None, float8_emulate=False):
    """Shards `model` as the export says; returns the model (fully_shard works in place).

    `mesh`: a DeviceMesh of the export's shape to use instead of making one (a training
    script that already has its mesh, or one made outside FakeTensorMode).
    `float8_emulate`: float8 GEMMs in high precision (a device without fp8 tensor cores)."""
    if isinstance(export, str):
        with open(export) as f:
            export = json.load(f)
    if export.get("format") != "shardscope.export.fsdp2":
        raise ValueError(f"expected a shardscope.export.fsdp2 file, got format {export.get('format')!r}")
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    shape = tuple(export["mesh"]["shape"])
    if mesh is None:
        # No names (an empty list, or none given): an unnamed mesh, as init_device_mesh takes it.
        names = tuple(export["mesh"].get("dim_names") or ()) or None
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
    elif tuple(mesh.shape) != shape:
        raise ValueError(f"the mesh given has shape {tuple(mesh.shape)}; the export needs {shape}")
    # As torchtitan orders them: float8 conversion, checkpointing, compile, then FSDP.
    convert_float8(model, export, emulate=float8_emulate)
    for name, mode in export.get("activation_checkpointing", {}).items():
        _checkpoint(_submodule(model, name), mode)
    compile_modules(model, export)
    ignored = {model.get_parameter(n) for n in export.get("ignored_params", [])}
    for call in export["fully_shard"]:
        modules = [_submodule(model, m) for m in call["modules"]]
        kwargs = dict(call["kwargs"])
        if "mp_policy" in kwargs:
            mp = kwargs.pop("mp_policy")
            kwargs["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=_dtype(mp.get("param_dtype")), reduce_dtype=_dtype(mp.get("reduce_dtype")),
                output_dtype=_dtype(mp.get("output_dtype")), cast_forward_inputs=mp.get("cast_forward_inputs", True))
        if "offload_policy" in kwargs:
            kwargs["offload_policy"] = CPUOffloadPolicy(**kwargs.pop("offload_policy"))
        if ignored:
            kwargs["ignored_params"] = ignored
        fully_shard(modules if len(modules) > 1 else modules[0], mesh=mesh, **kwargs)
        if call.get("reshard_after_backward") is False:
            # This unit only: with recurse (the default) the root's call would reach every
            # unit inside it.
            modules[0].set_reshard_after_backward(False, recurse=False)
    for unit, targets in export.get("forward_prefetch", {}).items():
        _submodule(model, unit).set_modules_to_forward_prefetch([_submodule(model, t) for t in targets])
    for unit, targets in export.get("backward_prefetch", {}).items():
        _submodule(model, unit).set_modules_to_backward_prefetch([_submodule(model, t) for t in targets])
    if export.get("gradient_divide_factor"):
        # The setter acts on the module it is called on only: every unit gets it.
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(export["gradient_divide_factor"])
    return model


def convert_float8(model, export, emulate=False):
    """torchao's float8 training on the export's nn.Linear layers, one call per config
    (torchao.float8.convert_to_float8_training with Float8LinearConfig from its recipe and
    enable_fsdp_float8_all_gather). `emulate` runs the float8 GEMMs in high precision, for a
    device without fp8 tensor cores (a CPU test). Returns how many layers were converted."""
    groups = export.get("float8") or []
    if not groups:
        return 0
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    n = 0
    for g in groups:
        config = Float8LinearConfig.from_recipe_name(g["recipe"])
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=g["enable_fsdp_float8_all_gather"],
                                     emulate=emulate)
        wanted = set(g["modules"])
        convert_to_float8_training(model, config=config, module_filter_fn=lambda mod, fqn: fqn in wanted)
        n += len(wanted)
    return n


def compile_modules(model, export):
    """torch.compile as the export says: each listed block compiled in place (torchtitan's
    per-block compile), or the whole model."""
    c = export.get("compile") or {}
    for name in c.get("per_block", []):
        _submodule(model, name).compile()
    if c.get("full"):
        model.compile()


def compile_loss(loss_fn, export):
    """The training loop's loss function, compiled when the plan says so (training.compile_loss:
    torchtitan compiles its cross-entropy with the model): Inductor keeps no fp32 copy of the
    logits."""
    if (export.get("compile") or {}).get("loss"):
        return torch.compile(loss_fn)
    return loss_fn


def after_optimizer_step(model, export):
    """Call after each optimizer step: with precomputed float8 scales, torchao computes the
    weights' scales for the next float8 all-gather in one all-reduce
    (precompute_float8_dynamic_scale_for_fsdp), as torchtitan does."""
    if any(g.get("precompute_float8_dynamic_scale_for_fsdp") for g in export.get("float8") or []):
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
        precompute_float8_dynamic_scale_for_fsdp(model)


def prepare_micro_batch(model, export, micro_batch):
    """Call before each micro-batch's forward: gradient sync and resharding as the plan says.

    Gradients are reduced on the last micro-batch only (or on every one with
    "sync_every_micro_batch"). Units exported with reshard_after_backward False keep their
    parameters unsharded between micro-batches, and reshard after the last one's backward,
    so that every step starts sharded, as ShardScope simulates it (without this the next
    step's forward would run on the unsharded copy of the previous weights)."""
    acc = export.get("gradient_accumulation", {})
    n = int(acc.get("micro_batches", 1))
    last = micro_batch == n - 1
    if n > 1:
        model.set_requires_gradient_sync(last or bool(acc.get("sync_every_micro_batch", False)))
    for call in export["fully_shard"]:
        if call.get("reshard_after_backward") is False:
            _submodule(model, call["modules"][0]).set_reshard_after_backward(last, recurse=False)


if __name__ == "__main__":
    print(__doc__)
    sys.exit(0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2)
