# SPDX-License-Identifier: Apache-2.0
"""The simulator's kernel-level compute model against a real PyTorch profiler trace.

The simulator turns each unit's forward, backward and recompute into the kernels eager
PyTorch launches for it (docs/kernel-model.md). Here transformers' own LlamaForCausalLM,
built from the tiny-llama sample config, runs one training step (forward with labels=,
backward; the optimizer is a separate op) under torch.profiler with record_shapes on
this CPU. ShardScope's trace reader (`calibrate --from-trace --samples`) finds its GEMMs
and attention ops; the memory-bound kernels are the ops PyTorch's dispatcher gives a kernel
of their own (memory_bound_kernels below). `simulate --json` reports the kernels the model
launches for the same model, micro-batch and sequence. Per class (GEMM, attention,
memory-bound) the counts must agree within 5 %, GEMM FLOPs within 5 % (PyTorch's own FLOP
counter, with_flops, is the oracle for the trace's GEMM FLOPs), in fp32 and bf16. The
trace reader's attention FLOPs (from the SDPA ops' record_shapes, which calibrate fits
attention_efficiency with) must equal torch.utils.flop_counter's SDPA formulas.
"""
import collections
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

torch = peer.require("torch")
peer.require("transformers")

RECORD = r"""
import json, sys, torch
from torch.profiler import profile, ProfilerActivity, schedule
from transformers import LlamaConfig, LlamaForCausalLM
config_path, batch, seq, dtype, out, oracle = sys.argv[1:7]
batch, seq, dtype = int(batch), int(seq), getattr(torch, dtype)
torch.manual_seed(0)
torch.set_num_threads(2)
cfg = LlamaConfig.from_dict(json.load(open(config_path)))
cfg._attn_implementation = "sdpa"
model = LlamaForCausalLM(cfg).to(dtype)
model.config._attn_implementation = "sdpa"
ids = torch.randint(0, cfg.vocab_size, (batch, seq))
counted = []
def ready(p):
    p.export_chrome_trace(out)
    counted.extend({"name": e.name, "flops": e.flops} for e in p.events()
                   if e.name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"))
with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True,
             schedule=schedule(wait=0, warmup=1, active=1, repeat=1), on_trace_ready=ready) as p:
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        p.step()
# SDPA's FLOPs by PyTorch's own formulas (torch.utils.flop_counter; FlopCounterMode has no
# entry for the CPU kernel), every layer's forward and backward.
from torch.utils.flop_counter import sdpa_flop_count, sdpa_backward_flop_count
head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
shape = (batch, cfg.num_attention_heads, seq, head_dim)
sdpa = {"forward": cfg.num_hidden_layers * sdpa_flop_count(shape, shape, shape),
        "backward": cfg.num_hidden_layers * sdpa_backward_flop_count(shape, shape, shape, shape)}
json.dump({"gemms": counted, "sdpa": sdpa}, open(oracle, "w"))
"""

TOLERANCE = 0.05

# What counts as one kernel on a CPU trace, decided by PyTorch's own dispatcher: an aten op
# that has a kernel of its own (not CompositeImplicitAutograd, which only calls other ops),
# is not a view and moves data, and runs under no other such op (its children are its
# implementation: sum's fill_, clone's copy_). That is the op a GPU launches a kernel for.
NO_DATA = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
           "result_type", "_local_scalar_dense", "item", "detach", "detach_", "lift_fresh",
           "resize_", "set_", "_unsafe_view"}
GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "linear", "matmul"}


def composite(short):
    pk = getattr(torch.ops.aten, short, None)
    if pk is None:
        return False
    key = torch._C.DispatchKey.CompositeImplicitAutograd

    def has(o):
        try:
            return getattr(pk, o).has_kernel_for_dispatch_key(key)
        except RuntimeError:  # TorchScript-only overloads (aten::to.prim_Device)
            return True
    return all(has(o) for o in pk.overloads())


def is_view(short):
    pk = getattr(torch.ops.aten, short, None)
    return pk is not None and any(getattr(pk, o).is_view for o in pk.overloads())


def memory_bound_kernels(trace_path):
    """Memory-bound kernel ops in the first ProfilerStep of a CPU trace, by name."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    step = next(e for e in events if e.get("ph") == "X"
                and str(e.get("name", "")).startswith("ProfilerStep#"))
    lo, hi = step["ts"], step["ts"] + step["dur"]
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            by_thread[e["tid"]].append(e)
    cache = {}

    def kernel(name):
        if name not in cache:
            short = name[6:] if name.startswith("aten::") else None
            cache[name] = bool(short) and not composite(short) and not is_view(short) \
                and short not in NO_DATA
        return cache[name]
    counted = collections.Counter()
    for ops in by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # (event, is or runs under a kernel op)
        for e in ops:
            while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= e["ts"]:
                stack.pop()
            under = bool(stack) and stack[-1][1]
            k = kernel(e["name"])
            if k and not under and lo <= e["ts"] <= hi:
                short = e["name"][6:]
                if short not in GEMM_OPS and "attention" not in short:
                    counted[short] += 1
            stack.append((e, k or under))
    return counted


run = peer.run


read_csv = peer.read_csv


class DecoderKernels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="shardscope-kmodel-")
        cls.config = peer.sample("models", "tiny-llama", "config.json")
        cls.plan = peer.sample("plans", "tiny-llama-2rank.json")
        with open(cls.plan) as f:
            training = json.load(f)["training"]
        cls.batch, cls.seq = training["micro_batch_size"], training["seq_len"]

    def compare(self, dtype):
        trace = os.path.join(self.dir, f"llama-{dtype}.pt.trace.json")
        oracle = os.path.join(self.dir, f"oracle-{dtype}.json")
        r = subprocess.run([sys.executable, "-c", RECORD, self.config, str(self.batch),
                            str(self.seq), dtype, trace, oracle], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        with open(oracle) as f:
            o = json.load(f)
        counted = o["gemms"]
        sdpa_oracle = sum(o["sdpa"].values())
        samples = os.path.join(self.dir, f"samples-{dtype}.csv")
        r = run("calibrate", "--from-trace", trace, "-c",
                            peer.sample("clusters", "cpu-2core.json"),
                            "-o", os.path.join(self.dir, f"fit-{dtype}.json"),
                            "--samples", samples)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        rows = read_csv(samples)
        steps = sorted({int(x["step"]) for x in rows if int(x["step"]) >= 0})
        self.assertEqual(len(steps), 1, steps)
        rows = [x for x in rows if int(x["step"]) == steps[0]]
        trace_counts = {c: sum(x["class"] == c for x in rows) for c in ("gemm", "attention")}
        mem = memory_bound_kernels(trace)
        trace_counts["memory-bound"] = sum(mem.values())
        trace_gemm_flops = sum(float(x["flops"]) for x in rows if x["class"] == "gemm")
        oracle_flops = sum(c["flops"] for c in counted)
        # The trace reader's GEMM FLOPs are PyTorch's own.
        self.assertAlmostEqual(trace_gemm_flops / oracle_flops, 1.0, places=6)
        self.assertEqual(trace_counts["gemm"], len(counted))
        # Attention ops priced by their record_shapes FLOPs, as PyTorch's FLOP counter counts
        # SDPA forward and backward.
        attn_flops = sum(float(x["flops"]) for x in rows if x["class"] == "attention")
        print(f"  attention FLOPs: trace reader {attn_flops:.6g}, torch.utils.flop_counter "
              f"{sdpa_oracle:.6g}")
        self.assertGreater(sdpa_oracle, 0)
        self.assertAlmostEqual(attn_flops / sdpa_oracle, 1.0, places=6)
        with open(os.path.join(self.dir, f"fit-{dtype}.json")) as f:
            self.assertIn("attention_efficiency", json.load(f)["sim"])

        # The simulator, same model and micro-batch, in the same dtype.
        plan = os.path.join(self.dir, f"plan-{dtype}.json")
        with open(self.plan) as f:
            p = json.load(f)
        if dtype != "float32":
            p.setdefault("defaults", {})["mixed_precision"] = {"param_dtype": dtype,
                                                               "reduce_dtype": "float32"}
        with open(plan, "w") as f:
            json.dump(p, f)
        r = run("simulate", "-m", self.config, "-p", plan, "-c",
                            peer.sample("clusters", "cpu-2core.json"), "--json",
                            "--activation-dtype", dtype)
        self.assertEqual(r.returncode, 0, r.stderr)
        k = json.loads(r.stdout)["kernels"]
        ours = {"gemm": k["gemm"]["count"], "attention": k["attention"]["count"],
                "memory-bound": k["memory_bound"]["count"]}
        print(f"\n{dtype}: one training step of LlamaForCausalLM (tiny-llama, "
              f"{self.batch}x{self.seq}), kernels by class")
        print(f"  {'class':14s} {'trace':>8s} {'model':>8s} {'error':>8s}")
        for c in ("gemm", "attention", "memory-bound"):
            err = ours[c] / trace_counts[c] - 1
            print(f"  {c:14s} {trace_counts[c]:8d} {ours[c]:8d} {err:+8.1%}")
        flops_err = k["gemm"]["flops"] / oracle_flops - 1
        print(f"  GEMM FLOPs: trace (PyTorch's FLOP counter) {oracle_flops:.6g}, "
              f"model {k['gemm']['flops']:.6g} ({flops_err:+.2%})")
        print("  memory-bound kernels in the trace: " +
              ", ".join(f"{n} {c}" for n, c in mem.most_common()))
        for c in ("gemm", "attention", "memory-bound"):
            self.assertLessEqual(abs(ours[c] / trace_counts[c] - 1), TOLERANCE, c)
        self.assertLessEqual(abs(flops_err), TOLERANCE)

        # Each GEMM's shape (what gemm_efficiency_by_shape prices by): the simulator's list
        # equals the shapes of the aten::mm/addmm/bmm calls PyTorch made, forward, input and
        # weight gradients; the simulator gives RoPE's table (a batched outer product, k = 1)
        # no shape.
        traced = collections.Counter((int(x["m"]), int(x["n"]), int(x["k"]))
                                     for x in rows if x["class"] == "gemm")
        modelled = collections.Counter({(g["m"], g["n"], g["k"]): g["count"]
                                        for g in k["gemm"]["shapes"]})
        print(f"  GEMM shapes: trace {len(traced)} ({sum(traced.values())} calls), "
              f"model {len(modelled)} ({sum(modelled.values())} calls)")
        self.assertGreaterEqual(len(modelled), 6)
        self.assertEqual(modelled, collections.Counter(
            {s: c for s, c in traced.items() if s[2] != 1}))
        self.assertTrue(all(s[2] == 1 for s in traced if s not in modelled), traced)

    def test_float32(self):
        self.compare("float32")

    def test_bfloat16(self):
        self.compare("bfloat16")


CHECKPOINTED = r"""
import functools, json, sys, torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint
from transformers import LlamaConfig, LlamaForCausalLM
config_path, batch, seq, out, mode = sys.argv[1:6]
batch, seq, reentrant = int(batch), int(seq), mode == "1"
torch.manual_seed(0)
cfg = LlamaConfig.from_dict(json.load(open(config_path)))
cfg._attn_implementation = "sdpa"
cfg.use_cache = False  # training under checkpointing (a cache would grow in the recompute)
model = LlamaForCausalLM(cfg)
model.config._attn_implementation = "sdpa"
# As samples/apply_plan.py (and torchtitan, checkpoint_wrapper) checkpoint a module: its
# forward under non-reentrant torch.utils.checkpoint, every decoder layer and the lm_head.
def wrap(module):
    forward = module.forward
    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        if reentrant:  # takes no keyword arguments: they ride in a closure
            return checkpoint(lambda *a: forward(*a, **kwargs), *args, use_reentrant=True)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    module.forward = checkpointed
if mode == "attention":  # the attention submodules, as samples/apply_plan.py applies "attention"
    sys.path.insert(0, sys.argv[6])
    from apply_plan import _checkpoint
    for layer in model.model.layers:
        _checkpoint(layer, "attention")
else:
    for layer in model.model.layers:
        wrap(layer)
    wrap(model.lm_head)
ids = torch.randint(0, cfg.vocab_size, (batch, seq))
if reentrant:  # a reentrant checkpoint recomputes only for inputs that require grad
    model.model.embed_tokens.weight.requires_grad_(True)
class Gemms(TorchDispatchMode):
    # Below autograd: the GEMMs that really run (a recompute stopped early never gets here).
    def __init__(self):
        super().__init__()
        self.calls, self.flops = 0, 0.0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm", "baddbmm"):
            a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
            self.calls += 1
            self.flops += 2.0 * a.numel() * b.shape[-1]
        return func(*args, **(kwargs or {}))
with Gemms() as g:
    model(input_ids=ids, labels=ids).loss.backward()
json.dump({"calls": g.calls, "flops": g.flops}, open(out, "w"))
"""


class CheckpointedKernels(unittest.TestCase):
    def test_full_checkpointing_recomputes_up_to_the_last_saved_tensor(self):
        """Full checkpointing's recompute, against PyTorch's own: transformers' tiny Llama with
        every decoder layer and the lm_head under non-reentrant torch.utils.checkpoint, one
        training step, its GEMMs counted below autograd (a TorchDispatchMode sees what runs).
        The recompute stops once every saved tensor is remade, before each layer's down_proj
        and the lm_head run again. The simulator's GEMM count and FLOPs for the same plan must
        equal PyTorch's; recomputing all of forward would be 5 GEMMs too many here (one per
        layer and the lm_head)."""
        d = tempfile.mkdtemp(prefix="shardscope-ac-")
        config = peer.sample("models", "tiny-llama", "config.json")
        with open(config) as f:
            layers = json.load(f)["num_hidden_layers"]
        batch, seq = 2, 128
        def torch_run(reentrant):
            out = os.path.join(d, f"gemms-{reentrant}.json")
            r = subprocess.run([sys.executable, "-c", CHECKPOINTED, config, str(batch), str(seq), out,
                                "1" if reentrant else "0"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            with open(out) as f:
                return json.load(f)
        torch_gemms = torch_run(False)
        plan = os.path.join(d, "plan.json")
        with open(plan, "w") as f:
            json.dump({"format": "shardscope.plan", "version": 1, "api": "fsdp2",
                       "mesh": {"shape": [2]},
                       "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
                       "defaults": {"activation_checkpointing": "full"},
                       "units": [{"modules": ["lm_head"]}],
                       "training": {"micro_batch_size": batch, "seq_len": seq}}, f)
        r = run("simulate", "-m", config, "-p", plan, "-c", peer.sample("clusters", "cpu-2core.json"),
                "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        ours = json.loads(r.stdout)["kernels"]["gemm"]
        print(f"\nfull checkpointing, tiny Llama ({layers} layers, {batch}x{seq}): PyTorch ran "
              f"{torch_gemms['calls']} GEMMs, {torch_gemms['flops']:.6g} FLOP; simulated "
              f"{ours['count']}, {ours['flops']:.6g}")
        self.assertEqual(ours["count"], torch_gemms["calls"])
        self.assertLess(abs(ours["flops"] / torch_gemms["flops"] - 1), 1e-5)
        # use_reentrant=True (and our engine's checkpoint) recomputes all of forward:
        # `simulate --reentrant-checkpointing` against PyTorch run that way.
        torch_full = torch_run(True)
        r = run("simulate", "-m", config, "-p", plan, "-c", peer.sample("clusters", "cpu-2core.json"),
                "--reentrant-checkpointing", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        full = json.loads(r.stdout)["kernels"]["gemm"]
        print(f"reentrant: PyTorch ran {torch_full['calls']} GEMMs, {torch_full['flops']:.6g} FLOP; "
              f"simulated {full['count']}, {full['flops']:.6g}")
        self.assertEqual(full["count"], torch_full["calls"])
        self.assertEqual(full["count"], ours["count"] + layers + 1)
        self.assertLess(abs(full["flops"] / torch_full["flops"] - 1), 1e-5)

    def test_attention_checkpointing_recomputes_the_attention_module(self):
        """"attention" as samples/apply_plan.py applies it (each decoder layer's self_attn under
        non-reentrant checkpoint) on transformers' tiny Llama, its GEMMs counted below autograd:
        q, k and v run again, o_proj does not (its input is the last tensor saved). The
        simulator's count and FLOPs for the same plan must equal PyTorch's (recomputing only
        SDPA, as it did before, was 3 GEMMs a layer too few)."""
        d = tempfile.mkdtemp(prefix="shardscope-ac-")
        config = peer.sample("models", "tiny-llama", "config.json")
        batch, seq = 2, 128
        out = os.path.join(d, "gemms.json")
        r = subprocess.run([sys.executable, "-c", CHECKPOINTED, config, str(batch), str(seq), out, "attention",
                            os.path.join(peer.SOURCE, "samples")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        with open(out) as f:
            torch_gemms = json.load(f)
        plan = os.path.join(d, "plan.json")
        with open(plan, "w") as f:
            json.dump({"format": "shardscope.plan", "version": 1, "api": "fsdp2", "mesh": {"shape": [2]},
                       "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
                       "defaults": {"activation_checkpointing": "attention"},
                       "training": {"micro_batch_size": batch, "seq_len": seq}}, f)
        r = run("simulate", "-m", config, "-p", plan, "-c", peer.sample("clusters", "cpu-2core.json"), "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        ours = json.loads(r.stdout)["kernels"]["gemm"]
        print(f"\nattention checkpointing, tiny Llama ({batch}x{seq}): PyTorch ran {torch_gemms['calls']} GEMMs, "
              f"{torch_gemms['flops']:.6g} FLOP; simulated {ours['count']}, {ours['flops']:.6g}")
        self.assertEqual(ours["count"], torch_gemms["calls"])
        self.assertLess(abs(ours["flops"] / torch_gemms["flops"] - 1), 1e-5)


if __name__ == "__main__":
    unittest.main()
