# SPDX-License-Identifier: Apache-2.0
"""A config.json whose model_type has no native loader works in one command.

`shardscope model show / simulate / recommend -m config.json` for families ShardScope has
no loader for (BLOOM, StableLM, GPT-J here, small) builds the model JSON through
scripts/export_model.py with transformers, says so in one line, caches it by the config's
content (the second command loads it at once and says so) and goes on. The totals equal
transformers' own parameter count (the oracle). --no-export refuses as before; a config
transformers cannot build fails with a message naming the config.
"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

torch = peer.require("torch")
transformers = peer.require("transformers")

CONFIGS = {
    "bloom": dict(hidden_size=256, n_head=4, n_layer=2, vocab_size=1000),
    "stablelm": dict(hidden_size=256, intermediate_size=688, num_attention_heads=4, num_key_value_heads=2,
                     num_hidden_layers=2, vocab_size=1000),
    "gptj": dict(n_embd=256, n_head=4, n_layer=2, rotary_dim=32, vocab_size=1000),
}


class AutoExport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.env = dict(os.environ, SHARDSCOPE_CACHE=os.path.join(cls.tmp.name, "cache"))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_cli(self, *args):
        import subprocess
        return subprocess.run([peer.BIN, *args], capture_output=True, text=True, env=self.env, cwd=peer.SOURCE)

    def config(self, model_type):
        cfg = transformers.AutoConfig.for_model(model_type, **CONFIGS[model_type])
        path = os.path.join(self.tmp.name, model_type, "config.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        cfg.to_json_file(path)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
        body = getattr(model, "model", None) or getattr(model, "gpt_neox", None) or model.transformer
        layers = body.layers if hasattr(body, "layers") else body.h
        return path, sum(p.numel() for p in model.parameters()), type(layers[0]).__name__

    def test_each_family_in_one_command_then_from_the_cache(self):
        for model_type in CONFIGS:
            with self.subTest(model_type=model_type):
                path, total, layer_class = self.config(model_type)
                first = self.run_cli("model", "show", "-m", path, "--json", "--depth", "0")
                self.assertEqual(first.returncode, 0, first.stderr)
                self.assertIn(f'model_type "{model_type}" has no native loader: building', first.stderr)
                self.assertEqual(json.loads(first.stdout)["total_params"], total)
                again = self.run_cli("model", "show", "-m", path, "--json", "--depth", "0")
                self.assertEqual(again.returncode, 0, again.stderr)
                self.assertIn("using its exported model JSON", again.stderr)
                self.assertNotIn("building", again.stderr)
                plan = os.path.join(self.tmp.name, model_type, "plan.json")
                with open(plan, "w") as f:
                    json.dump({"format": "shardscope.plan", "version": 1, "api": "fsdp2",
                               "wrap": {"policy": "module_class", "classes": [layer_class]},
                               "training": {"micro_batch_size": 1, "seq_len": 256}}, f)
                sim = self.run_cli("simulate", "-m", path, "-p", plan, "-c", "h100-sxm-80gb", "--json")
                self.assertEqual(sim.returncode, 0, sim.stderr)
                self.assertGreater(json.loads(sim.stdout)["step_time_ns"], 0)
                rec = self.run_cli("recommend", "-m", path, "-c", "h100-sxm-80gb", "--seq", "256", "--json")
                self.assertEqual(rec.returncode, 0, rec.stderr)
                self.assertIn("best", json.loads(rec.stdout))

    def test_hybrid_linear_attention_is_exported_with_its_caveat(self):
        # Qwen3-Next (Gated DeltaNet layers, 3 in 4) has no native loader by decision: its
        # recurrent layers run fused kernels in training that have no CPU oracle here. It is
        # exported (its total equal to transformers') and says what its figures stand for.
        cfg = transformers.AutoConfig.for_model(
            "qwen3_next", num_hidden_layers=4, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
            shared_expert_intermediate_size=128, num_experts=8, num_experts_per_tok=2, vocab_size=1000,
            num_attention_heads=4, num_key_value_heads=2, linear_num_value_heads=4, linear_num_key_heads=2,
            head_dim=64)
        path = os.path.join(self.tmp.name, "qwen3_next", "config.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        cfg.to_json_file(path)
        with torch.device("meta"):
            total = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
        r = self.run_cli("model", "show", "-m", path, "--json", "--depth", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["total_params"], total)
        self.assertIn("Gated DeltaNet) are priced as transformers' PyTorch fallback", r.stderr)
        self.assertIn("upper bounds", r.stderr)

    def test_no_export_refuses_and_a_bad_config_is_named(self):
        path, _, _ = self.config("bloom")
        r = self.run_cli("model", "show", "-m", path, "--no-export")
        self.assertEqual(r.returncode, 2)
        self.assertIn('unsupported model_type "bloom"', r.stderr)
        bad = os.path.join(self.tmp.name, "bad", "config.json")
        os.makedirs(os.path.dirname(bad), exist_ok=True)
        with open(bad, "w") as f:
            json.dump({"model_type": "no_such_family", "hidden_size": 8}, f)
        r = self.run_cli("model", "show", "-m", bad)
        self.assertEqual(r.returncode, 2)
        self.assertIn(f'{bad}: exporting model_type "no_such_family"', r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
