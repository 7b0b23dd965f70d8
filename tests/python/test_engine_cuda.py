# SPDX-License-Identifier: Apache-2.0
"""The engine's CUDA/NCCL path (`shardscope run --device cuda`), where a CUDA device exists.

The equivalence matrix of test_engine_equivalence.py, each plan whose world fits on this
machine's GPUs: the sharded run over NCCL must give the same losses and final parameters as
the unsharded reference in one process on cuda:0 (fp32, relative error <= 1e-5), and its
recorded op order must equal the step program's. One run also writes its trace: the GPU
work CUPTI recorded must be there (kernels on their streams, NCCL kernels, each labelled
with the FSDP op that launched it), and peak reserved memory must be reported.

Without a CUDA device it exits 77 (skipped) and says so.
"""
import json
import math
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

torch = peer.require("torch")
if not torch.cuda.is_available():
    print("skipped: needs a CUDA device (torch.cuda.is_available() is False)")
    sys.exit(77)
BIN, ENGINE = peer.require_engine()

import test_engine_equivalence as eq  # noqa: E402

DEVICES = torch.cuda.device_count()


class EngineCuda(eq.EngineRuns):
    DEVICE = "cuda"

    def test_matrix_on_gpus(self):
        ran = 0
        for name, p in eq.MATRIX.items():
            world = math.prod(p["mesh"]["shape"])
            if world > DEVICES:
                print("%-26s needs %d GPUs, this machine has %d: not run" % (name, world, DEVICES))
                continue
            with self.subTest(name):
                mbs = p.get("gradient_accumulation", {}).get("micro_batches", 1)
                path = self.write_plan(name, p)
                params_path = os.path.join(self.dir, name + "_params.json")
                r = subprocess.run([BIN, "run", "-m", self.model, "-p", path, "--device", "cuda", "--steps",
                                    str(eq.STEPS), "--warmup", "0", "--json", "--dump-params", params_path],
                                   capture_output=True, text=True, timeout=600)
                self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
                out = json.loads(r.stdout)
                self.assertEqual(out["device"], "cuda")
                self.assertTrue(out["op_order_matches_program"], out["op_order"])
                with open(params_path) as f:
                    params = json.load(f)
                ref_losses, ref_params = self.reference(world, mbs)
                worst_loss = max(abs(a - b) / abs(b) for a, b in zip(out["losses"], ref_losses))
                worst_param = max(eq.rel(params[k], ref_params[k]) for k in ref_params)
                print("%-26s world %d on cuda (NCCL): worst relative error loss %.2e, parameters %.2e, "
                      "peak allocated %d B, reserved %d B" % (name, world, worst_loss, worst_param,
                                                             out["peak_allocated_bytes"], out["peak_reserved_bytes"]))
                self.assertLess(worst_loss, eq.TOL)
                self.assertLess(worst_param, eq.TOL)
                ran += 1
        self.assertGreater(ran, 0)

    def test_trace_has_the_gpu_work(self):
        world = min(2, DEVICES)
        path = self.write_plan("traced", eq.plan([world]))
        trace = os.path.join(self.dir, "trace.json")
        r = subprocess.run([BIN, "run", "-m", self.model, "-p", path, "--device", "cuda", "--steps", "2",
                            "--trace", trace], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        self.assertNotIn("no device trace", r.stderr)
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
        kernels = [e for e in events if e.get("cat") == "kernel"]
        self.assertTrue(kernels)
        labelled = [e for e in kernels if "fsdp_op" in e.get("args", {})]
        self.assertGreater(len(labelled), len(kernels) // 2)
        if world > 1:
            nccl = [e for e in kernels if e["name"].lower().startswith("nccl")]
            self.assertTrue(nccl)
            self.assertTrue(any(e["args"].get("fsdp_op") in ("all_gather", "reduce_scatter") for e in nccl))
        flows = [e for e in events if e.get("cat") == "ac2g"]
        self.assertTrue(flows)
        print("CUDA trace: %d kernels (%d labelled with their FSDP op), %d flow points"
              % (len(kernels), len(labelled), len(flows)))


if __name__ == "__main__":
    unittest.main(verbosity=2)
