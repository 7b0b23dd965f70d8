# SPDX-License-Identifier: Apache-2.0
"""`shardscope recommend` keeps to what the user has fixed: by default the reduce-scatter
stays fp32 (a bf16 one changes the numerics of training; torchtitan keeps fp32), or the
--current plan's precision; --fix reduce_dtype, api, activation_checkpointing and
micro_batch each hold in the plan it returns; --no-offload never proposes CPU offload; and
no two Pareto rows print the same description.
"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

MODEL = peer.sample("models", "llama3-8b", "config.json")


def recommend(*args, check=True):
    r = peer.run("recommend", "-m", MODEL, "-c", "h100-sxm-80gb", "--json", *args)
    if check:
        assert r.returncode in (0, 1), r.stderr
        return json.loads(r.stdout)
    return r


def reduce_dtype(plan):
    return plan["defaults"]["mixed_precision"]["reduce_dtype"]


class RecommendFixes(unittest.TestCase):
    def test_default_keeps_an_fp32_reduce_and_rows_differ(self):
        d = recommend()
        self.assertEqual(reduce_dtype(d["best"]["plan"]), "float32")
        rows = [p["summary"] for p in d["pareto"]]
        for p in d["pareto"]:
            self.assertEqual(reduce_dtype(p["plan"]), "float32", p["summary"])
        self.assertEqual(len(rows), len(set(rows)), [r for r in rows if rows.count(r) > 1])
        print(f"{len(rows)} Pareto rows, all distinct; best: {d['best']['summary']}")

    def test_each_fix_holds(self):
        d = recommend("--fix", "reduce_dtype=bfloat16")
        self.assertEqual(reduce_dtype(d["best"]["plan"]), "bfloat16")
        for ac in ("full", "none"):
            d = recommend("--fix", f"activation_checkpointing={ac}")
            plan = d["best"]["plan"]
            blocks = [u for u in plan.get("units", []) if any(".layers." in m for m in u["modules"])]
            modes = {u.get("activation_checkpointing", plan["defaults"].get("activation_checkpointing", "none"))
                     for u in blocks} or {plan["defaults"].get("activation_checkpointing", "none")}
            self.assertEqual(modes, {ac}, d["best"]["summary"])
        d = recommend("--fix", "micro_batch=2,reduce_dtype=float32")
        self.assertEqual(d["best"]["plan"]["training"]["micro_batch_size"], 2)
        self.assertEqual(reduce_dtype(d["best"]["plan"]), "float32")
        d = recommend("--fix", "api=fsdp1")
        self.assertEqual(d["export"]["format"], "shardscope.export.fsdp1")

    def test_the_current_plans_precision_is_kept(self):
        plan = {"format": "shardscope.plan", "version": 1, "api": "fsdp2",
                "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
                "defaults": {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"}},
                "training": {"micro_batch_size": 1, "seq_len": 8192}}
        path = os.path.join(tempfile.mkdtemp(), "current.json")
        with open(path, "w") as f:
            json.dump(plan, f)
        d = recommend("--current", path)
        # FSDP2 normalises a reduce dtype equal to the param dtype to None: bf16 either way.
        self.assertIn(reduce_dtype(d["best"]["plan"]), ("bfloat16", None))

    def test_no_offload_is_never_proposed(self):
        r = peer.run("recommend", "-m", peer.sample("models", "llama3-70b", "config.json"), "-c", "h100-sxm-80gb",
                     "--json", "--no-offload", "--seq", "8192")
        d = json.loads(r.stdout)
        for c in [d.get("best"), d.get("closest")] + d["pareto"]:
            if c:
                self.assertNotIn("offload", c["plan"]["defaults"], c["summary"])

    def test_allow_compile_searches_it_and_says_what_it_buys(self):
        def compiled(plan):
            default = plan.get("defaults", {}).get("compile", False)
            return {u.get("compile", default) for u in plan.get("units", [])} | {default}

        eager = recommend()
        self.assertNotIn("best_eager", eager)
        self.assertEqual(compiled(eager["export"]) - {False, None, "false"}, set())
        r = recommend("--allow", "compile")
        self.assertIn("compiled per block", r["best"]["summary"])
        self.assertIn("per_block", compiled(r["export"]))
        self.assertNotIn("compiled", r["best_eager"]["summary"])
        # The fastest eager plan is the one the search without --allow compile finds.
        self.assertEqual(r["best_eager"]["step_time_ns"], eager["best"]["step_time_ns"])
        self.assertLess(r["best"]["step_time_ns"], r["best_eager"]["step_time_ns"])
        text = peer.run("recommend", "-m", MODEL, "-c", "h100-sxm-80gb", "--allow", "compile").stdout
        self.assertIn("torch.compile per block buys +", text)

    def test_allow_float8_searches_it_and_says_what_it_buys(self):
        r = recommend("--allow", "float8")
        self.assertIn("float8 (tensorwise, float8 all-gather)", r["best"]["summary"])
        f8 = r["export"]["defaults"]["float8"]
        self.assertEqual((f8["recipe"], f8["fsdp_float8_all_gather"], f8["precompute_scales"]),
                         ("tensorwise", True, True))
        self.assertNotIn("float8", r["best_without_float8"]["summary"])
        self.assertLess(r["best"]["step_time_ns"], r["best_without_float8"]["step_time_ns"])
        text = peer.run("recommend", "-m", MODEL, "-c", "h100-sxm-80gb", "--allow", "float8").stdout
        self.assertIn("torchao float8 (tensorwise, float8 all-gather) buys +", text)

    def test_a_bad_fix_is_named(self):
        for fix, words in (("reduce=float32", "unknown choice \"reduce\""),
                           ("reduce_dtype=float16", "float32 or bfloat16"),
                           ("micro_batch=0", "a positive integer"),
                           ("micro_batch=3", "a divisor of the per-GPU batch"),
                           ("activation_checkpointing", "KEY=VALUE")):
            r = recommend("--fix", fix, check=False)
            self.assertEqual(r.returncode, 2, fix)
            self.assertIn(words, r.stderr, fix)
        r = recommend("--allow", "compiled", check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("did you mean", r.stderr.lower())
        r = peer.run("recommend", "-m", MODEL, "-c", "a100-sxm-80gb", "--allow", "float8")
        self.assertEqual(r.returncode, 2)
        self.assertIn("has no fp8 tensor cores", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
