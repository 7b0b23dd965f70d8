# SPDX-License-Identifier: Apache-2.0
"""Peer test: the causal-LM loss under torch.compile, against Inductor's generated code.

torchtitan compiles its loss when compile is on (torchtitan/components/loss.py,
build_cross_entropy_loss, since April 2025: the H200 and B200 runs of the published record):
`cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))` on bf16 logits. Inductor
(on CPU here; the partition and the fusion happen before code generation) makes one fused
kernel forward, reading the logits once for each row's max and log-sum-exp, and one backward,
reading them and writing their gradient in bf16; backward keeps the logits themselves and
two fp32 numbers a row; no fp32 tensor of the logits' size exists. A plan's
`training.compile_loss` must price exactly that: `simulate --program --json`'s root
forward and backward ops (memory_bound_bytes) move the bytes Inductor's kernels move where eager's five
kernels moved theirs, and the loss keeps the logits instead of fp32 log-probabilities.
"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402
import test_compiled_fusion_peer as fusion  # noqa: E402

torch = peer.require("torch")

SEQ = 96
VOCAB = 2048  # tiny-llama's
# The eager loss's kernels, bytes per logit in bf16 (the fp32 upcast, log_softmax reading
# its input twice; backward the gradient's fill, _log_softmax_backward_data and the cast
# back), as the step program prices them (docs/kernel-model.md).
EAGER_FWD, EAGER_BWD = 6 + 12, 4 + 12 + 6


def cross_entropy_loss(pred, labels):
    """torchtitan's (e7c0cae, torchtitan/components/loss.py)."""
    return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def inductor_loss():
    """[(kernels, bytes) forward, backward], and the bytes backward keeps."""
    import re
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    pred = torch.randn(1, SEQ, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (1, SEQ))
    compiled = torch.compile(cross_entropy_loss)
    _, codes = run_and_get_code(lambda: compiled(pred, labels).backward())
    assert len(codes) == 2, f"expected a forward and a backward graph, got {len(codes)}"
    kept = 0
    bwd = codes[1]
    names = re.search(r"^\s+(.*) = args$", bwd, re.M).group(1).split(", ")
    sizes = dict(re.findall(r"assert_size_stride\((\w+), \(([^)]*)\)", bwd))
    element = {"primals_1": 2, "primals_2": 8}  # the logits (bf16), the labels (int64)
    for n in names:
        if n.startswith("tangents"):
            continue
        kept += fusion.numel(sizes[n]) * element.get(n, 4)  # the rest: fp32 per row
    big_fp32 = [s for s in re.findall(r"empty_strided_cpu\(\(([^)]*)\), \([^)]*\), torch\.float32", "".join(codes))
                if fusion.numel(s) >= SEQ * VOCAB]
    return [fusion.fused_kernels(c) for c in codes], kept, big_fp32


def simulate(compile_loss, *extra, batch=1, seq=SEQ):
    """`simulate --json` (with `extra`) of tiny-llama's plan, batch x seq tokens."""
    plan = {"format": "shardscope.plan", "version": 1, "api": "fsdp2",
            "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
            "defaults": {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}},
            "mesh": {"shape": [8]},
            "training": {"micro_batch_size": batch, "seq_len": seq, "compile_loss": compile_loss}}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "plan.json")
        with open(path, "w") as f:
            json.dump(plan, f)
        return peer.shardscope("simulate", "-m", peer.sample("models", "tiny-llama", "config.json"),
                               "-p", path, "-c", peer.sample("clusters", "h200-sxm-1x8.json"),
                               "--json", *extra)


def root_ops(compile_loss):
    """The root unit's forward op after the layers (lm_head and the loss; the one before them
    is the embedding) and its first backward op, 1 x SEQ tokens."""
    ops = simulate(compile_loss, "--program")["ops"]
    root = [o for o in ops if o["unit"] == "" and o["kind"] in ("forward", "backward")]
    fwd = max((o for o in root if o["kind"] == "forward"), key=lambda o: o["memory_bound_bytes"])
    bwd = next(o for o in root if o["kind"] == "backward")
    return fwd, bwd


class CompiledLoss(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.kernels, cls.kept, cls.big_fp32 = inductor_loss()

    def test_inductor_makes_one_kernel_each_way_and_no_fp32_logits(self):
        (fk, fb), (bk, bb) = self.kernels
        logits = SEQ * VOCAB
        print(f"Inductor: forward {fk} kernel {fb} B ({fb / logits:.3f} B a logit), "
              f"backward {bk} kernel {bb} B ({bb / logits:.3f} B a logit); keeps {self.kept} B")
        self.assertEqual((fk, bk), (1, 1))
        self.assertEqual(self.big_fp32, [])
        # The logits once forward, twice backward (read, and their gradient written), in bf16;
        # the rest is a few numbers a row.
        self.assertAlmostEqual(fb / (2 * logits), 1.0, delta=0.02)
        self.assertAlmostEqual(bb / (4 * logits), 1.0, delta=0.02)
        self.assertAlmostEqual(self.kept / (2 * logits), 1.0, delta=0.02)

    def test_the_simulator_prices_what_inductor_runs(self):
        (_, fb), (_, bb) = self.kernels
        logits = SEQ * VOCAB
        ef, eb = root_ops(False)
        cf, cb = root_ops(True)
        # The simulator moves Inductor's bytes where eager moved EAGER_FWD/EAGER_BWD a logit
        # (Inductor's per-row numbers aside: within 24 B a row).
        self.assertAlmostEqual(ef["memory_bound_bytes"] - cf["memory_bound_bytes"], EAGER_FWD * logits - fb,
                               delta=24 * SEQ)
        self.assertAlmostEqual(eb["memory_bound_bytes"] - cb["memory_bound_bytes"], EAGER_BWD * logits - bb,
                               delta=24 * SEQ)

    def test_the_peak_keeps_the_logits_not_fp32_copies(self):
        # 16 x 512 tokens: the loss's moment is tiny-llama's peak. Eager holds the bf16 logits,
        # their fp32 upcast and the fp32 log-probabilities forward (10 B a logit), and
        # backward the log-probabilities with two fp32 gradients (12 B a logit); compiled,
        # the logits and their bf16 gradient (4 B a logit).
        logits = 16 * 512 * VOCAB
        eager = simulate(False, batch=16, seq=512)["peak_allocated_bytes"]
        compiled = simulate(True, batch=16, seq=512)["peak_allocated_bytes"]
        print(f"peak allocated: eager {eager} B, compiled loss {compiled} B "
              f"({(eager - compiled) / logits:.2f} B a logit less)")
        self.assertAlmostEqual((eager - compiled) / logits, 12 - 4, delta=0.5)

    def test_a_bad_compile_loss_is_named(self):
        plan = {"format": "shardscope.plan", "version": 1, "api": "fsdp2",
                "training": {"compile_loss": "yes"}}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.json")
            with open(path, "w") as f:
                json.dump(plan, f)
            r = peer.run("plan", "validate", "-m", peer.sample("models", "tiny-llama", "config.json"),
                         "-p", path)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("/training/compile_loss", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
