#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Export any torch.nn.Module as a ShardScope model JSON ("format": "shardscope.model").

The module is built under FakeTensorMode (tensors with shapes and dtypes but no memory), so a
70B model exports in seconds on a laptop. Recorded:
  * the module tree as named_modules() yields it, with class names and base classes
    (for isinstance-style wrap policies such as _BatchNorm or ModuleList);
  * parameters (shape, dtype, requires_grad), tied parameters once with every owner, and
    buffers (persistent or not);
  * per module, measured for one forward and backward on meta tensors:
      - FLOPs with torch.utils.flop_counter's formulas (FlopCounterMode's), forward and
        backward apart; backward ops charged to the module whose forward created them,
      - bytes saved for backward via torch.autograd.graph.saved_tensors_hooks, each storage
        counted once and attributed to the innermost module running when it was first
        saved; parameters and buffers are not activations,
      - bytes read and written by operators FlopCounterMode does not count (memory-bound
        work), forward only; backward memory traffic is taken as twice that,
      - output bytes of the module's forward.
    Costs are measured at sequence lengths S and 2S and fitted to
    value = per_token·(B·S) + per_token_seq·(B·S)·S, which separates attention's
    quadratic term. Self costs exclude children.
  * of the model's layer list (model.layers, transformer.h), only the first two layers of
    each kind are measured (kind: module tree, shapes and plain attributes such as a sliding
    window); the others take the second one's figures, equal to measuring them
    (--every-layer measures all). The two lengths are measured at once on two cores.

Examples:
  scripts/export_model.py --factory mypkg.models:build_model --kwargs '{"depth": 12}' \\
      --input tokens:50000 --batch 2 --seq 512 -o model.json
  scripts/export_model.py --hf-config samples/models/gpt2/config.json --input tokens --seq 256 -o gpt2.json
  scripts/export_model.py --factory torchvision.models:resnet18 --input image:3x224x224 -o resnet18.json
"""
import argparse
import importlib
import json
import os
import sys
import time
import tempfile


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("Examples:")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--factory", help="MODULE:CALLABLE returning an nn.Module (a class or a function)")
    src.add_argument("--hf-config", help="a Hugging Face config.json (needs transformers)")
    p.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for the factory")
    p.add_argument("--input", default="tokens",
                   help="input kind: tokens[:VOCAB] (int64 [B,S]), features:F (float [B,S,F]), "
                        "image:CxHxW (float [B,C,H,W], no sequence)")
    p.add_argument("--batch", type=int, default=2, help="micro-batch size to measure at [2]")
    p.add_argument("--seq", type=int, default=128, help="sequence length to measure at (and twice it) [128]")
    p.add_argument("--dtype", default="float32", help="parameter and activation dtype [float32]")
    p.add_argument("--name", help="model name to record [the class name]")
    p.add_argument("--every-layer", action="store_true",
                   help="measure every layer of the model's layer list, not one or two of each kind "
                        "(the costs are the same; it is slower)")
    p.add_argument("-o", "--output", required=True, help="output file (written atomically)")
    return p.parse_args(argv)


def build_module(args, torch, fake_mode):
    kwargs = json.loads(args.kwargs)
    if args.hf_config:
        import transformers
        cfg = transformers.AutoConfig.from_pretrained(args.hf_config)
        # Built in the dtype: converting fake parameters afterwards (Module.to) fails where
        # transformers keeps weak references to them.
        kwargs.setdefault("dtype", getattr(torch, args.dtype))
        with fake_mode:
            return transformers.AutoModelForCausalLM.from_config(cfg, **kwargs)
    mod_name, _, attr = args.factory.partition(":")
    if not attr:
        raise SystemExit(f"--factory: expected MODULE:CALLABLE, got {args.factory!r}")
    factory = getattr(importlib.import_module(mod_name), attr)
    with fake_mode:
        return factory(**kwargs)


def make_input(args, model, seq, torch, fake_mode):
    kind, _, spec = args.input.partition(":")
    with fake_mode:
        if kind == "tokens":
            vocab = int(spec) if spec else getattr(getattr(model, "config", None), "vocab_size", 1000)
            return torch.randint(0, vocab, (args.batch, seq))
        if kind == "features":
            return torch.empty(args.batch, seq, int(spec), dtype=getattr(torch, args.dtype))
        if kind == "image":
            dims = [int(x) for x in spec.split("x")]
            return torch.empty(args.batch, *dims, dtype=getattr(torch, args.dtype))
    raise SystemExit(f"--input: unknown kind {kind!r} (tokens, features or image)")


def scalar_loss(out, torch):
    """Reduces a model output to a scalar to run backward (HF outputs: logits)."""
    if hasattr(out, "logits"):
        out = out.logits
    if isinstance(out, (tuple, list)):
        out = out[0]
    if isinstance(out, dict):
        out = next(iter(out.values()))
    return out.float().sum()


class BalancedRouting:
    """Data-dependent routing under fake tensors, as a load-balanced router would route.

    A mixture-of-experts layer picks each expert's tokens with `torch.where`/`nonzero` on a
    mask made from the router's top-k choice. The size of that op's output depends on tensor
    values, which fake tensors do not have, so FakeTensorMode refuses it. This tracker
    follows, op by op, what fraction of a tensor's elements is expected to be non-zero when
    every category (expert) receives the same share of the top-k choices, the routing a
    load-balancing loss aims for and the one ShardScope's native MoE loaders assume:

      * topk's indices are a choice among `size(dim)` categories;
      * `eq` against an arange of n values (how one_hot decomposes) or a choice compared
        with a scalar is non-zero 1/n of the time; `scatter` of ones into zeros along a dim
        fills index.size(dim)/size(dim) of it;
      * views, permutes, selects, copies and casts keep the fraction; a sum turns it into an
        expected count per output element, and `> 0` of a count of at least 1 is all true;
      * `nonzero` then returns round(numel x fraction) indices, spread evenly, as a real
        tensor, so loops over the experts hit and `numel() > 0` tests see concrete values;
      * a count read as a number (`.item()`, `if n == 0`, slicing by it: DeepSeek-V2's
        tokens_per_expert) is its expected value, the elements of a vector of counts
        splitting its total exactly (so the slices add up to the tokens routed).

    Any other data-dependent op stops the export with a message naming the op and module.
    """

    KEEP = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "squeeze", "unsqueeze", "select",
            "slice", "alias", "clone", "contiguous", "_to_copy", "to", "expand", "detach", "lift_fresh",
            "index", "flatten", "unbind"}
    COUNT_TESTS = {"gt", "greater", "ne", "ge"}

    def __init__(self, torch):
        from torch.utils.weak import WeakTensorKeyDictionary
        self.torch = torch
        self.fraction = WeakTensorKeyDictionary()  # expected non-zero fraction
        self.count = WeakTensorKeyDictionary()     # expected value of each element (a count)
        self.choice = WeakTensorKeyDictionary()    # indices choosing among n categories
        self.arange = WeakTensorKeyDictionary()    # an arange of n values
        self.routed = 0                            # nonzero calls answered

    def dispatch(self, func, args, kwargs, module):
        """Returns the op's result when it is a data-dependent routing op, else None."""
        name = func._overloadpacket.__name__
        if name in ("nonzero", "argwhere"):
            x = args[0]
            frac = self.fraction.get(x)
            if frac is None:
                raise SystemExit(
                    f"export_model.py: module '{module or '<root>'}': aten.{name} on a {tuple(x.shape)} tensor: "
                    "its output size depends on tensor values, which fake tensors do not have, and its input "
                    "is not a routing mask this script follows (a one-hot of top-k choices, or a scatter of "
                    "them). Export a variant whose routing does not depend on values, or report the model.")
            n = int(round(x.numel() * frac))
            flat = [(j * x.numel()) // n for j in range(n)] if n else []
            idx = self.torch.tensor(flat, dtype=self.torch.int64)
            coords = []
            for size in reversed(x.shape):
                coords.append(idx % size)
                idx = idx // size
            self.routed += 1
            return self.torch.stack(list(reversed(coords)), dim=1) if coords else idx.reshape(n, 0)
        if name == "_local_scalar_dense":
            x = args[0]
            value = self.count.get(x, self.fraction.get(x))
            if value is None:
                return None  # fake tensors refuse it; the caller names the op
            self.routed += 1
            if x.dtype == self.torch.bool:
                return bool(round(value))
            return float(value) if x.dtype.is_floating_point else int(round(value))
        return None

    def note(self, func, args, kwargs, out):
        """Carries the fractions to the op's output."""
        torch = self.torch
        name = func._overloadpacket.__name__
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name == "topk" and isinstance(out, tuple):
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            self.choice[out[1]] = first.shape[dim]
        elif name == "arange" and isinstance(out, torch.Tensor) and out.dim() == 1:
            self.arange[out] = out.numel()
        elif name in ("eq", "ne") and isinstance(out, torch.Tensor) and args[0] in self.count and (
                not isinstance(args[1], torch.Tensor)):
            same = round(self.count[args[0]]) == args[1]
            self.count[out] = 1.0 if same == (name == "eq") else 0.0
        elif name in ("add", "sub") and isinstance(out, torch.Tensor) and (
                any(isinstance(a, torch.Tensor) and a in self.count for a in args[:2])):
            a, b = (self.count.get(x, x) if isinstance(x, torch.Tensor) else x for x in args[:2])
            if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
                self.count[out] = a + b if name == "add" else a - b
        elif name == "eq" and isinstance(out, torch.Tensor):
            a, b = args[0], args[1]
            for x, y in ((a, b), (b, a)):
                if isinstance(y, torch.Tensor) and y in self.arange and y.numel() > 0:
                    self.fraction[out] = 1.0 / y.numel()
                elif isinstance(x, torch.Tensor) and x in self.choice and (
                        not isinstance(y, torch.Tensor) or y.dim() == 0):
                    self.fraction[out] = 1.0 / self.choice[x]
        elif name in ("scatter", "scatter_") and isinstance(out, torch.Tensor) and len(args) > 2:
            dim, index = args[1], args[2]
            if isinstance(index, torch.Tensor) and out.shape[dim] > 0:
                self.fraction[out] = min(1.0, index.shape[dim] / out.shape[dim])
        elif name == "sum" and first is not None and isinstance(out, torch.Tensor) and out.numel() > 0:
            frac = self.fraction.get(first)
            if frac is not None:
                self.count[out] = frac * first.numel() / out.numel()
        elif name in self.COUNT_TESTS and first is not None and isinstance(out, torch.Tensor):
            c = self.count.get(first)
            if c is not None:
                self.fraction[out] = 1.0 if c >= 1 else c
        elif name in ("unbind", "select") and first is not None and first in self.count and first.dim() == 1:
            # The elements of a vector of counts split its total exactly: element j gets
            # floor((j + 1) x total / n) - floor(j x total / n).
            n, total = first.shape[0], round(self.count[first] * first.shape[0])

            def share(j):
                return (j + 1) * total // n - j * total // n
            if name == "unbind":
                for j, t in enumerate(out):
                    self.count[t] = float(share(j))
            else:
                j = args[2] if len(args) > 2 else kwargs.get("index", 0)
                self.count[out] = float(share(j % n))
        elif name in self.KEEP and first is not None:
            for src in (self.fraction, self.count, self.choice):
                if first in src:
                    for t in (out if isinstance(out, (tuple, list)) else [out]):
                        if isinstance(t, torch.Tensor):
                            src[t] = src[first]


# Attributes that number a layer without changing what it computes.
INDEX_ATTRIBUTES = {"layer_idx", "layer_id", "layer_index", "idx", "training"}


def layer_list(model, torch):
    """(name, ModuleList) of the model's repeated layers: the shallowest list of three or more
    modules of one class at most two levels down (model.layers, transformer.h,
    model.decoder.layers; a mixture's experts, deeper in a layer and picked by routing,
    never), the longest of those; or (None, None)."""
    best, depth = (None, None), None
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.ModuleList) or len(m) < 3 or len({type(c) for c in m}) != 1:
            continue
        d = name.count(".")
        if d > 2:
            continue
        if best[1] is None or d < depth or (d == depth and len(m) > len(best[1])):
            best, depth = (name, m), d
    return best


def layer_signature(layer):
    """What a layer's costs depend on: its module tree, parameter and buffer shapes and
    dtypes, and every plain attribute of its modules (sliding window, attention type, RoPE
    or not...) except the ones that only number it."""
    sig = []
    for name, m in layer.named_modules():
        attrs = tuple(sorted((k, v) for k, v in vars(m).items()
                             if k not in INDEX_ATTRIBUTES and not k.startswith("_")
                             and isinstance(v, (int, float, bool, str, type(None)))))
        params = tuple((k, tuple(p.shape), str(p.dtype), p.requires_grad)
                       for k, p in m._parameters.items() if p is not None)
        bufs = tuple((k, tuple(b.shape), str(b.dtype)) for k, b in m._buffers.items() if b is not None)
        sig.append((name, type(m).__name__, attrs, params, bufs))
    return tuple(sig)


def measured_layers(layers):
    """The layers to measure: the first two of each kind (the second stands for the rest: the
    first may save what all layers share, such as the rotary cos and sin). Returns their
    indices, in order, and for each layer the index of the one measured for it."""
    first, second, stand_in = {}, {}, []
    sigs = [layer_signature(l) for l in layers]
    for i, s in enumerate(sigs):
        if s not in first:
            first[s] = i
        elif s not in second:
            second[s] = i
    for i, s in enumerate(sigs):
        stand_in.append(i if first[s] == i else second[s])
    keep = sorted(set(first.values()) | set(second.values()))
    return keep, stand_in


def measure(model, inp, torch):
    """One forward and backward on fake tensors; per-module self costs.

    FLOPs use FlopCounterMode's formulas (torch.utils.flop_counter.flop_registry). In
    forward, an operator's cost goes to the innermost module running. In backward,
    FlopCounterMode's own module attribution is approximate (it can charge one op to
    several modules), so instead every autograd node is tagged in forward with the module
    that created it (the nodes inside a composite function too), and a backward op is
    charged to the module of the node executing it (torch._C._current_autograd_node()).
    Untagged nodes (the loss) go to the root.
    """
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    import torch.utils._pytree as pytree

    names = {m: n for n, m in model.named_modules()}
    routing = BalancedRouting(torch)
    zero = lambda: {n: 0 for n in names.values()}  # noqa: E731
    fwd_flops, bwd_flops, saved, out_bytes, mem = zero(), zero(), zero(), zero(), zero()
    in_float, in_int = zero(), zero()  # the forward's tensor inputs, floating and integer
    stack = [""]
    node_module = {}
    param_storages = {p.untyped_storage()._cdata for p in model.parameters()}
    param_storages |= {b.untyped_storage()._cdata for b in model.buffers()}
    seen = set()
    no_traffic = {"view", "_unsafe_view", "t", "transpose", "expand", "permute", "unsqueeze", "squeeze",
                  "detach", "slice", "select", "alias", "reshape", "split", "split_with_sizes", "as_strided",
                  "_reshape_alias", "unbind", "chunk", "narrow", "lift_fresh"}

    def pre(mod, args):
        stack.append(names[mod])
        for t in pytree.tree_leaves(args):
            if isinstance(t, torch.Tensor):
                into = in_float if t.is_floating_point() else in_int
                into[names[mod]] += t.numel() * t.element_size()

    def post(mod, _, out):
        stack.pop()
        flat = [out.logits] if hasattr(out, "logits") else pytree.tree_leaves(out)
        out_bytes[names[mod]] += sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))

    hooks = [m.register_forward_pre_hook(pre) for m in names] + [m.register_forward_hook(post) for m in names]

    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in seen and key not in param_storages:
            seen.add(key)
            saved[stack[-1]] += t.untyped_storage().nbytes()
        return t

    class TagNodes(TorchFunctionMode):
        # Every node a function made is tagged: its output's and the ones inside it (a
        # linear on 3-D input is a view of an mm, whose MmBackward0 runs the FLOPs), back to
        # the nodes of its inputs, which their own functions tagged.
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            todo = [t.grad_fn for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
            while todo:
                fn = todo.pop()
                if fn is None or fn in node_module:
                    continue
                node_module[fn] = stack[-1]
                todo.extend(nxt for nxt, _ in fn.next_functions)
            return out

    class Costs(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = routing.dispatch(func, args, kwargs, stack[-1])
            if out is not None:
                return out
            try:
                out = func(*args, **kwargs)
            except (DynamicOutputShapeException, DataDependentOutputException) as e:
                raise SystemExit(
                    f"export_model.py: module '{stack[-1] or '<root>'}': {func}: its result depends on tensor "
                    f"values, which fake tensors do not have ({type(e).__name__}). Data-dependent routing made "
                    "with one_hot/eq/scatter and nonzero/where is followed (BalancedRouting); this op is not. "
                    "Export a variant whose control flow does not depend on values, or report the model.")
            routing.note(func, args, kwargs, out)
            packet = func._overloadpacket
            node = torch._C._current_autograd_node()
            if packet in flop_registry:
                flops = flop_registry[packet](*args, **kwargs, out_val=out)
                if node is None:
                    fwd_flops[stack[-1]] += flops
                else:
                    bwd_flops[node_module.get(node, "")] += flops
            elif node is None and packet.__name__ not in no_traffic:
                tensors = [a for a in pytree.tree_leaves((args, kwargs, out)) if isinstance(a, torch.Tensor)]
                mem[stack[-1]] += sum(a.numel() * a.element_size() for a in tensors)
            return out

    try:
        with Costs():
            with TagNodes(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = model(inp)
            loss = scalar_loss(out, torch)
            loss.backward()
    finally:
        for h in hooks:
            h.remove()
    return fwd_flops, bwd_flops, saved, out_bytes, mem, in_float, in_int


def register_cpu_sdpa_flops():
    """FlopCounterMode counts the CUDA SDPA kernels but not the CPU flash variant that fake
    CPU tensors dispatch to; count it with PyTorch's own SDPA formulas so an export made on
    a CPU machine counts attention as a GPU run does."""
    import torch
    from torch.utils import flop_counter as fc
    aten = torch.ops.aten

    def gqa(q, k, v):
        # enable_gqa: K/V heads broadcast over the query heads; the work is that of H heads.
        return (q[0], q[1], k[2], k[3]), (q[0], q[1], v[2], v[3])

    fwd_op = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd_op = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd_op is not None and fwd_op not in fc.flop_registry:
        @fc.register_flop_formula(fwd_op)
        def _fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
            return fc.sdpa_flop_count(query_shape, *gqa(query_shape, key_shape, value_shape))
    if bwd_op is not None and bwd_op not in fc.flop_registry:
        @fc.register_flop_formula(bwd_op)
        def _bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
            return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, *gqa(query_shape, key_shape, value_shape))


def fit(v1, v2, batch, seq):
    """Solve v(s) = a·B·s + c·B·s² from v(seq) = v1 and v(2·seq) = v2."""
    c = (v2 - 2 * v1) / (2 * batch * seq * seq)
    if c < 1e-9 * max(abs(v1), 1):  # numerical noise or strictly linear
        c = 0.0
    a = (v1 - c * batch * seq * seq) / (batch * seq)
    return [max(a, 0.0), max(c, 0.0)]


def measure_all(args, model, seqs, torch, fake_mode, progress):
    """measure() at each sequence length. On a machine of two cores or more the second runs in
    a forked copy of this process at the same time (fake tensors, one thread each: nothing
    is shared but the built model, copied on write); its figures come back through a pipe."""
    def one(i, s):
        progress(f"measuring forward and backward at {args.batch} x {s} ({i + 1} of {len(seqs)})")
        r = measure(model, make_input(args, model, s, torch, fake_mode), torch)
        model.zero_grad(set_to_none=True)
        return r
    if len(seqs) < 2 or (os.cpu_count() or 1) < 2 or not hasattr(os, "fork"):
        return [one(i, s) for i, s in enumerate(seqs)]
    import pickle
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: the second length, its figures to the pipe, and out
        code = 0
        try:
            os.close(read)
            data = pickle.dumps(one(1, seqs[1]))
            with os.fdopen(write, "wb") as w:
                w.write(data)
        except BaseException as e:  # said, and the parent reports the failure
            print(f"export_model.py: measuring at {args.batch} x {seqs[1]} failed: {e}", file=sys.stderr)
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    try:
        first = one(0, seqs[0])
    except BaseException:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise
    with os.fdopen(read, "rb") as r:
        data = r.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise SystemExit(f"export_model.py: measuring at {args.batch} x {seqs[1]} failed (see above)")
    return [first, pickle.loads(data)]


def export(args):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    torch.manual_seed(0)
    torch.set_num_threads(1)  # fake tensors need no threads, and measure_all forks
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    register_cpu_sdpa_flops()
    t0 = time.monotonic()

    def progress(what):
        # Stage lines on stderr: a large model takes minutes, and the caller shows them.
        print(f"  [{time.monotonic() - t0:6.1f} s] {what}", file=sys.stderr, flush=True)

    progress("building the model under FakeTensorMode")
    model = build_module(args, torch, fake_mode)
    if args.dtype != "float32" and not args.hf_config:
        model = model.to(dtype=getattr(torch, args.dtype))
    model.train()
    has_seq = not args.input.startswith("image")
    seqs = [args.seq, 2 * args.seq] if has_seq else [1, 1]
    # Layers alike cost alike: one or two of each kind are measured and the others take their
    # figures (module names mapped from the measured list's positions to every layer's).
    list_name, layers = (None, None) if args.every_layer else layer_list(model, torch)
    rename = lambda name: name  # noqa: E731  a module of the model -> its measured stand-in
    restore = None
    if layers is not None:
        keep, stand_in = measured_layers(list(layers))
        if len(keep) < len(layers):
            parent_name, _, attr = list_name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            full = layers
            setattr(parent, attr, torch.nn.ModuleList([full[i] for i in keep]))
            restore = lambda: setattr(parent, attr, full)  # noqa: E731
            position = {i: k for k, i in enumerate(keep)}
            prefix = list_name + "."

            def rename(name):
                if not name.startswith(prefix):
                    return name
                index, _, rest = name[len(prefix):].partition(".")
                if not index.isdigit():
                    return name
                mapped = f"{prefix}{position[stand_in[int(index)]]}"
                return mapped + ("." + rest if rest else "")
            progress(f"measuring {len(keep)} of the {len(full)} layers of {list_name} "
                     "(each of the others costs what one of them does)")
    runs = []
    try:
        runs = measure_all(args, model, seqs, torch, fake_mode, progress)
    finally:
        if restore:
            restore()
    progress("writing the model JSON")

    canonical = {}
    for n, p in model.named_parameters():
        canonical.setdefault(id(p), n)
    modules = []
    b = args.batch
    for name, m in model.named_modules():
        mro = [c.__name__ for c in type(m).__mro__[1:] if c not in (torch.nn.Module, object)]
        entry = {"name": name, "class": type(m).__name__}
        if mro:
            entry["bases"] = mro
        params, tied = [], []
        for local, p in m._parameters.items():
            if p is None:
                continue
            full = f"{name}.{local}" if name else local
            if canonical[id(p)] == full:
                params.append({"name": local, "shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
                               "requires_grad": p.requires_grad})
            else:
                tied.append({"name": local, "same_as": canonical[id(p)]})
        if params:
            entry["params"] = params
        if tied:
            entry["tied_params"] = tied
        bufs = [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", ""),
                 "persistent": k not in m._non_persistent_buffers_set}
                for k, v in m._buffers.items() if v is not None]
        if bufs:
            entry["buffers"] = bufs
        cost = {}
        for key, idx in (("fwd_flops", 0), ("bwd_flops", 1), ("saved_bytes", 2), ("output_bytes", 3),
                         ("fwd_mem_bytes", 4)):
            v1, v2 = runs[0][idx][rename(name)], runs[1][idx][rename(name)]
            if has_seq:
                val = fit(float(v1), float(v2), b, args.seq)
            else:
                val = [float(v1) / b, 0.0]
            if val != [0.0, 0.0]:
                cost[key] = val
        if "fwd_mem_bytes" in cost:
            cost["bwd_mem_bytes"] = [2 * x for x in cost["fwd_mem_bytes"]]
        # What a checkpoint of the module keeps: its floating inputs scale with the
        # activation dtype, integer ones (an embedding's token ids) are per token as they are.
        ints = float(runs[0][6][rename(name)]) / (b * (args.seq if has_seq else 1))
        v1, v2 = runs[0][5][rename(name)], runs[1][5][rename(name)]
        floats = fit(float(v1), float(v2), b, args.seq) if has_seq else [float(v1) / b, 0.0]
        if floats != [0.0, 0.0] or ints:
            cost["input_bytes"] = floats + [ints] if ints else floats
        if cost:
            entry["cost"] = cost
        modules.append(entry)
    doc = {
        "format": "shardscope.model", "version": 1,
        "name": args.name or type(model).__name__,
        "source": "scripts/export_model.py (torch %s, FakeTensorMode, flop_counter formulas, saved_tensors_hooks)"
                  % torch.__version__,
        "activation_dtype": args.dtype,
        "measured_at": {"batch": b, "seq": args.seq if has_seq else 1},
        "total_params": sum(p.numel() for p in model.parameters()),
        "modules": modules,
    }
    out_dir = os.path.dirname(os.path.abspath(args.output))
    fd, tmp = tempfile.mkstemp(prefix=".export-", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, args.output)
    print(f"wrote {args.output}: {len(modules)} modules, {doc['total_params']:,} parameters", file=sys.stderr)


if __name__ == "__main__":
    export(parse_args(sys.argv[1:]))
