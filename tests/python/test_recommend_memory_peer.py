# SPDX-License-Identifier: Apache-2.0
"""Peer test: the plan `shardscope recommend` picks, run by PyTorch, holds the memory we said.

`recommend` searches thousands of plans by the simulator's peak; the plan it exports
(`-o`, ShardScope format) is then built as the real Hugging Face model under FakeTensorMode,
sharded with the real `fully_shard` as its FSDP2 export says, and trained two steps with its
micro-batches and gradient sync under FSDPMemTracker (tests/oracles/memory_oracle.py). Its peak
must be the one the search ranked it by, within 3 %.

Llama-3.1-8B on 8 H100s (the sample cluster's node):
- seq 2048, 32 sequences a step: attention and MLP as their own units, reshard False,
  explicit forward prefetch of the next two, bf16 reduce, 2 x 2 reduced after each (seen:
  60.43 GiB both, +0.00 %);
- seq 8192, 64 sequences a step: op-level selective checkpointing, prefetch two each way,
  8 micro-batches reduced on the last (seen: 57.49 GiB both, -0.00 %).
About 30 s and 100 s on 2 cores.

Llama-3-70B on the 64 H100s of samples/clusters/h100-sxm-8x8.json at seq 8192 and the
default 4Mi-token batch (8 sequences a rank), the issue's own case: one layer a unit,
reshard 8, full checkpointing, 1 x 8 reduced after each (seen: 58.28 GiB both). Before
2026-11-27 the search picked 2 layers a unit there, whose true peak (64.33 GiB allocated)
was 15.5 % over the one it was ranked by. About 7 minutes.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

peer.require("torch")
peer.require("transformers")
sys.path.insert(0, os.path.join(peer.SOURCE, "tests", "oracles"))
import memory_oracle  # noqa: E402

GOAL = 0.03
MODEL = os.path.join(peer.SOURCE, "samples", "models", "llama3.1-8b", "config.json")


class RecommendedPlanMemory(unittest.TestCase):
    def recommended(self, seq, global_batch, model=MODEL, cluster=None):
        tmp = tempfile.mkdtemp()
        cluster = cluster or memory_oracle.gpu_cluster(8, tmp)
        plan = os.path.join(tmp, "recommended.json")
        cmd = [memory_oracle.shardscope_bin(), "recommend", "-m", model, "-c", cluster, "-o", plan, "--json"]
        cmd += ["--seq", str(seq)] + (["--global-batch", str(global_batch)] if global_batch else [])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        report = json.loads(r.stdout)
        with open(plan) as f:
            p = json.load(f)
        print("plan:", p["name"])
        return report, plan

    def check(self, seq, global_batch, model=MODEL, cluster=None):
        report, plan = self.recommended(seq, global_batch, model, cluster)
        r = memory_oracle.compare(model, plan)
        memory_oracle.print_table(r)
        self.assertLess(abs(r["error"]), GOAL)
        # PyTorch's peak fits the budget the search held the plan to (reserved >= allocated).
        self.assertLess(r["fsdp_mem_tracker"]["Total"], report["memory_budget_bytes"])
        return r

    def test_seq_2048_two_micro_batches(self):
        self.check(2048, 32)

    def test_seq_8192_eight_micro_batches(self):
        r = self.check(8192, 64)
        self.assertEqual(r["micro_batches"], 8)

    def test_llama3_70b_on_64_h100s(self):
        r = self.check(8192, None, os.path.join(peer.SOURCE, "samples", "models", "llama3-70b", "config.json"),
                       os.path.join(peer.SOURCE, "samples", "clusters", "h100-sxm-8x8.json"))
        self.assertEqual(r["world"], 64)


if __name__ == "__main__":
    unittest.main(verbosity=2)
