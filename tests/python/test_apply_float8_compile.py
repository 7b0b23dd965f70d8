# SPDX-License-Identifier: Apache-2.0
"""A plan's torch.compile and float8 options, exported and applied as torchtitan applies them
(samples/apply_plan.py), checked with the real torchao and torch.compile on CPU ranks of a
fake process group (no fp8 tensor cores here: torchao's emulation runs the float8 GEMMs):

- the layers torchao converts are the export's: every nn.Linear of a decoder layer with
  dimensions that are multiples of 16, lm_head not;
- with float8 all-gather, FSDP2 gathers those weights in one byte an element: a layer's
  all-gather carries its float8 weights at 1 byte and its norm at 4;
- precompute_float8_dynamic_scale_for_fsdp (after_optimizer_step) sets every converted
  weight's scale for the next all-gather;
- per-block compile compiles each decoder layer in place before fully_shard;
- bad combinations are refused naming the field, and the FSDP1 and Lightning exports name
  what they drop.
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
torchao = peer.require("torchao")
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

sys.path.insert(0, peer.sample())
from apply_plan import after_optimizer_step, apply_plan, compile_loss  # noqa: E402

CFG = peer.sample("models", "tiny-llama", "config.json")
LAYER_LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
FLOAT8 = {"recipe": "tensorwise", "fsdp_float8_all_gather": True, "precompute_scales": True}
CLUSTER = {"format": "shardscope.cluster", "version": 1, "name": "4 ranks", "nodes": 1,
           "device": {"name": "cpu", "kind": "cpu", "memory_bytes": 1 << 34, "peak_flops": {"float32": 1e11},
                      "hbm_bandwidth_bytes_per_s": 1e10},
           "node": {"devices_per_node": 4, "intra_bandwidth_bytes_per_s": 1e9, "intra_latency_ns": 1000},
           "network": {"nic_bandwidth_bytes_per_s": 1e9, "latency_ns": 1000},
           "host": {"link_bandwidth_bytes_per_s": 1e9}}


def plan(**defaults):
    return {"format": "shardscope.plan", "version": 1, "api": "fsdp2", "mesh": {"shape": [4]},
            "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
            "defaults": defaults, "training": {"micro_batch_size": 2, "seq_len": 16}}


class Float8AndCompile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        cls.tmp = tempfile.mkdtemp()

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()

    def export(self, p, fmt="fsdp2"):
        path = os.path.join(self.tmp, "plan.json")
        with open(path, "w") as f:
            json.dump(p, f)
        return peer.shardscope("plan", "export", "-m", CFG, "-p", path, "--format", fmt)

    def model(self):
        cfg = transformers.AutoConfig.from_pretrained(CFG)
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(cfg), cfg

    def test_export_lists_the_layers_torchtitan_converts(self):
        e = self.export(plan(float8=FLOAT8, compile="per_block"))
        [g] = e["float8"]
        want = [f"model.layers.{i}.{n}" for i in range(4) for n in LAYER_LINEARS]
        self.assertEqual(sorted(g["modules"]), sorted(want))
        self.assertTrue(g["enable_fsdp_float8_all_gather"])
        self.assertTrue(g["precompute_float8_dynamic_scale_for_fsdp"])
        self.assertEqual(e["compile"], {"per_block": [f"model.layers.{i}" for i in range(4)],
                                        "full": False})

    def test_applied_with_torchao_and_compile(self):
        from torchao.float8.float8_linear import Float8Linear
        e = self.export(plan(float8=FLOAT8, compile="per_block"))
        model, _ = self.model()
        apply_plan(model, e, device_type="cpu", float8_emulate=True)
        converted = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
        self.assertEqual(converted, sorted(e["float8"][0]["modules"]))
        self.assertNotIsInstance(model.lm_head, Float8Linear)
        for i in range(4):  # compiled in place: the module keeps its identity for fully_shard
            self.assertIsNotNone(model.model.layers[i]._compiled_call_impl, i)

    def test_a_compiled_loss_is_exported_and_applied(self):
        p = plan(compile="per_block")
        p["training"]["compile_loss"] = True
        e = self.export(p)
        self.assertTrue(e["compile"]["loss"])
        model, cfg = self.model()
        apply_plan(model, e, device_type="cpu")

        def loss_fn(logits, labels):
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))

        compiled = compile_loss(loss_fn, e)
        self.assertIsNot(compiled, loss_fn)
        logits = torch.randn(2, 16, cfg.vocab_size, requires_grad=True)
        labels = torch.randint(0, cfg.vocab_size, (2, 16))
        torch.testing.assert_close(compiled(logits, labels), loss_fn(logits, labels))
        self.assertIs(compile_loss(loss_fn, self.export(plan(compile="per_block"))), loss_fn)
        for fmt in ("fsdp1", "lightning-fsdp1"):
            settings = {d["setting"] for d in self.export(p, fmt)["dropped"]}
            self.assertIn("training.compile_loss", settings, fmt)

    def test_float8_all_gather_moves_one_byte_an_element(self):
        gathered = []
        orig = dist.all_gather_into_tensor

        def record(output_tensor, input_tensor, group=None, async_op=False):
            gathered.append((input_tensor.dtype, input_tensor.numel() * input_tensor.element_size()))
            return orig(output_tensor, input_tensor, group=group, async_op=async_op)

        e = self.export(plan(float8=FLOAT8))
        model, cfg = self.model()
        apply_plan(model, e, device_type="cpu", float8_emulate=True)
        dist.all_gather_into_tensor = record
        try:
            tokens = torch.randint(0, cfg.vocab_size, (2, 16))
            model(tokens).logits.float().sum().backward()
        finally:
            dist.all_gather_into_tensor = orig
        # A layer's shard per rank: its float8 weights at 1 byte, its two RMSNorm weights at 4.
        layer = model.model.layers[0]
        f8 = sum(getattr(layer, a).get_submodule(b).weight.numel() for a, b in (n.split(".") for n in LAYER_LINEARS))
        norms = 2 * cfg.hidden_size
        per_rank = (f8 + 4 * norms) // 4
        layer_gathers = [b for _, b in gathered if abs(b - per_rank) <= 64]
        print("all-gather inputs (dtype, bytes a rank):", sorted(set(gathered), key=str), "expected a layer's", per_rank)
        self.assertGreaterEqual(len(layer_gathers), 4, gathered)
        # The step program's all-gathers carry the same bytes, in the same order, collective
        # by collective (the output: 4 ranks' inputs).
        cluster = os.path.join(self.tmp, "cluster.json")
        with open(cluster, "w") as f:
            json.dump(CLUSTER, f)
        path = os.path.join(self.tmp, "plan.json")
        with open(path, "w") as f:
            json.dump(plan(float8=FLOAT8), f)
        prog = peer.shardscope("simulate", "-m", CFG, "-p", path, "-c", cluster, "--program", "--json")
        ours = [op["bytes"] for op in prog["ops"] if op["kind"] == "all_gather"]
        theirs = [4 * b for _, b in gathered]
        print("all-gather bytes, ours:", ours, "fully_shard's:", theirs)
        self.assertEqual(ours, theirs)
        # Precomputed scales: every converted weight carries its scale for the next all-gather.
        after_optimizer_step(model, e)
        for i in range(4):
            w = model.model.layers[i].self_attn.q_proj.weight
            self.assertIsNotNone(w._local_tensor._precomputed_scale, i)

    def test_bad_combinations_are_refused_naming_the_field(self):
        path = os.path.join(self.tmp, "bad.json")
        cases = [
            ({"float8": {"recipe": "rowwise", "fsdp_float8_all_gather": True}}, None,
             "/defaults/float8/fsdp_float8_all_gather", "tensorwise"),
            ({"float8": {"precompute_scales": True}}, None, "/defaults/float8/precompute_scales", "all-gather"),
            ({"float8": {"recipe": "tensorwise"}}, "a100-sxm-80gb", "/defaults/float8", "fp8 tensor cores"),
            ({"compile": "everything"}, None, "/defaults/compile", "per_block"),
        ]
        for defaults, cluster, pointer, words in cases:
            with self.subTest(defaults=defaults):
                with open(path, "w") as f:
                    json.dump(plan(**defaults), f)
                args = ["plan", "validate", "-m", CFG, "-p", path] + (["-c", cluster] if cluster else [])
                r = peer.run(*args)
                self.assertNotEqual(r.returncode, 0, r.stdout)
                out = r.stdout + r.stderr
                self.assertIn(pointer, out)
                self.assertIn(words, out)
        p = plan(float8={"fsdp_float8_all_gather": True})
        p["api"] = "fsdp1"
        del p["mesh"]
        with open(path, "w") as f:
            json.dump(p, f)
        r = peer.run("plan", "validate", "-m", CFG, "-p", path, "-c", "cpu-2core")
        self.assertIn("/defaults/float8/fsdp_float8_all_gather", r.stdout + r.stderr)

    def test_fsdp1_and_lightning_exports_name_what_they_drop(self):
        p = plan(float8={"recipe": "tensorwise"}, compile="per_block")
        for fmt in ("fsdp1", "lightning-fsdp1"):
            dropped = self.export(p, fmt)["dropped"]
            settings = {d["setting"] for d in dropped}
            self.assertIn("compile", settings, fmt)
            self.assertIn("float8 tensorwise", settings, fmt)


if __name__ == "__main__":
    unittest.main(verbosity=2)
