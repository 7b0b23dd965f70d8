# SPDX-License-Identifier: Apache-2.0
"""Peer test: Inductor's fused memory-bound kernels in a compiled decoder layer.

torch.compile (Inductor, on CPU) compiles each family's transformers decoder layer (bf16,
SDPA) forward and backward; its generated code calls one `cpp_fused_*` kernel per chain of
pointwise and reduction ops between the GEMMs and attention. Each kernel's bytes are its
arguments' storages, each once at the largest view the kernel takes (read or written once,
the way Inductor's own num_bytes_accessed counts a kernel), from the buffer shapes and the
kernel's C++ signature. The sums per direction and the kernel counts must equal `shardscope
model show --json`'s compiled_{fwd,bwd}_mem_bytes and _kernels for the layer, at two sizes
per family (the bytes within 3 %: the norms' weights and their gradients' partial sums,
per kernel rather than per token, are not counted). The families Inductor fuses differently
(OLMo-2's and Gemma's post-norms) have no compiled kernel figures and are priced as eager.
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import hf_layer  # noqa: E402
import peer  # noqa: E402

torch = peer.require("torch")
transformers = peer.require("transformers")

SEQ = 96
SIZES = (
    dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2, head_dim=64),
    dict(hidden_size=768, intermediate_size=2304, num_attention_heads=12, num_key_value_heads=4, head_dim=96),
)
FAMILIES = {"llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "phi3": {"pad_token_id": 0},
            # Llama's layer with q/k/v biases; with constant multipliers; SmolLM3's RoPE layer.
            "seed_oss": {"attention_dropout": 0.0, "residual_dropout": 0.0, "pad_token_id": 0},
            "granite": {"residual_multiplier": 0.22}, "smollm3": {"pad_token_id": 0}}
ELEMENT = {"at::BFloat16": 2, "at::Half": 2, "float": 4, "double": 8, "int64_t": 8, "int32_t": 4, "bool": 1}


def numel(shape):
    n = 1
    for d in shape.split(","):
        if d.strip():
            n *= int(d)
    return n


def fused_kernels(code):
    """(kernel count, bytes) of the cpp_fused kernels Inductor's `call` runs."""
    signature = {name: [a.strip().strip("'") for a in args.split(",") if a.strip()]
                 for name, args in re.findall(
                     r"^(cpp_fused_\w+) = async_compile\.cpp_pybinding\(\[([^\]]*)\]", code, re.M)}
    shape, base = {}, {}
    for n, s in re.findall(r"(\w+) = empty_strided_cpu\(\(([^)]*)\)", code):
        shape[n], base[n] = s, n
    for n, m, s in re.findall(r"(\w+) = reinterpret_tensor\((\w+), \(([^)]*)\)", code):
        shape[n], base[n] = s, base.get(m, m)
    for n, m in re.findall(r"^\s+(\w+) = (\w+); del \w+  # reuse", code, re.M):
        shape[n], base[n] = shape.get(m), base.get(m, m)
    for n, s in re.findall(r"assert_size_stride\((\w+), \(([^)]*)\)", code):
        shape.setdefault(n, s)
        base.setdefault(n, n)
    body = code[code.index("def call("):]
    count = total = 0
    for name, args in re.findall(r"^\s+(cpp_fused_\w+)\((.*)\)\s*$", body, re.M):
        count += 1
        storages = {}
        for kind, arg in zip(signature[name], [a.strip() for a in re.split(r",(?![^(]*\))", args)]):
            kind = kind.replace("const ", "").replace("*", "").strip()
            if kind not in ELEMENT:
                continue
            view = re.match(r"reinterpret_tensor\((\w+), \(([^)]*)\)", arg)
            b, s = (base.get(view.group(1), view.group(1)), view.group(2)) if view else (base.get(arg, arg), shape.get(arg))
            assert s is not None, f"no shape for {arg} in {name}"
            storages[b] = max(storages.get(b, 0), numel(s) * ELEMENT[kind])
        total += sum(storages.values())
    return count, total


def inductor_layer(model_type, over):
    from torch._inductor.utils import run_and_get_code

    run, x, cfg = hf_layer.decoder_layer(model_type, over, SEQ)
    compiled = torch.compile(run)
    grad = torch.ones(1, SEQ, cfg.hidden_size, dtype=torch.bfloat16)
    _, codes = run_and_get_code(lambda: compiled(x).backward(grad))
    assert len(codes) == 2, f"expected a forward and a backward graph, got {len(codes)}"
    return [fused_kernels(c) for c in codes], cfg


class CompiledFusion(unittest.TestCase):
    def test_each_family_at_two_sizes(self):
        rows = []
        for family, extra in FAMILIES.items():
            for size in SIZES:
                with self.subTest(family=family, hidden=size["hidden_size"]):
                    (fwd, bwd), cfg = inductor_layer(family, {**size, **extra})
                    ours = hf_layer.shardscope_layer(cfg, SEQ)
                    self.assertIn("compiled_fwd_mem_kernels", ours, family)
                    for phase, (kernels, nbytes) in (("fwd", fwd), ("bwd", bwd)):
                        got_k = ours[f"compiled_{phase}_mem_kernels"]
                        got_b = ours[f"compiled_{phase}_mem_bytes"]
                        rows.append((family, size["hidden_size"], phase, kernels, got_k, nbytes, got_b))
                        self.assertEqual(got_k, kernels, f"{family} {phase} kernels")
                        self.assertAlmostEqual(got_b / nbytes, 1.0, delta=0.03,
                                               msg=f"{family} {phase}: Inductor {nbytes} B, shardscope {got_b:.0f} B")
        for family, h, phase, k, gk, b, gb in rows:
            print(f"{family:8s} hidden {h:4d} {phase}: Inductor {k} kernels {b:9d} B, "
                  f"shardscope {gk} kernels {gb:11.0f} B ({100 * (gb / b - 1):+.1f} %)")


if __name__ == "__main__":
    unittest.main(verbosity=2)
