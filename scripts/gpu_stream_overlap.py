#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Does a bulk copy on one CUDA stream hold back kernels queued on another?

FSDP2 over one GPU reduces a unit's gradients by a device-to-device copy on its
reduce-scatter stream; on the H200 traces the compute stream's next kernel started as that
copy ended. This probe queues, three times each, a copy on a side stream (872 MB: a Llama-8B
layer's fp32 gradients) and then, on the default stream, a bf16-to-fp32 cast of a 14336 x
4096 weight, an 8192^3 bf16 GEMM, or the cast after the same bytes copied by an elementwise
kernel instead of cudaMemcpyAsync, and prints each group's device intervals by stream
(from torch.profiler). Needs a CUDA device.

    python3 scripts/gpu_stream_overlap.py [--out DIR]
"""
import argparse
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--out", default=None, help="folder for overlap.json (the profiler trace)")
out = ap.parse_args().out or tempfile.mkdtemp()
if not torch.cuda.is_available():
    raise SystemExit("needs a CUDA device")
side = torch.cuda.Stream()
a = torch.empty(872448000 // 4, dtype=torch.float32, device="cuda")  # a layer's fp32 grads
b = torch.empty_like(a)
x = torch.randn(58720256, device="cuda", dtype=torch.bfloat16)  # a 14336 x 4096 weight
y = torch.empty(x.numel(), dtype=torch.float32, device="cuda")
w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
z = torch.empty_like(a)
for _ in range(3):
    b.copy_(a); y.copy_(x); torch.mm(w, w); z.copy_(a * 1.0)
torch.cuda.synchronize()
cases = ("cast", "gemm", "cast_after_kernel_copy")
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
    for case in cases:
        for _ in range(3):
            torch.cuda.synchronize()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                if case == "cast_after_kernel_copy":
                    torch.mul(a, 1.0, out=b)  # the same bytes by an elementwise kernel
                else:
                    b.copy_(a)  # cudaMemcpyAsync DtoD
            # queue the compute stream's work while the copy runs
            if case == "gemm":
                torch.mm(w, w)
            else:
                y.copy_(x)
            torch.cuda.synchronize()
p.export_chrome_trace(os.path.join(out, "overlap.json"))
ev = json.load(open(os.path.join(out, "overlap.json")))["traceEvents"]
dev = sorted([e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy")], key=lambda e: e["ts"])
groups, cur = [], []
for e in dev:
    if cur and e["ts"] - max(c["ts"] + c["dur"] for c in cur) > 200:
        groups.append(cur); cur = []
    cur.append(e)
groups.append(cur)
for g in groups:
    t0 = g[0]["ts"]
    print("  ".join("[s%s %s %.3f-%.3f]" % (e["args"].get("stream"), e["name"][:28], (e["ts"] - t0) / 1e3,
                                           (e["ts"] + e["dur"] - t0) / 1e3) for e in g))
print(torch.cuda.get_device_name())
