# SPDX-License-Identifier: Apache-2.0
"""Peer test: our Hugging Face config loader against transformers itself.

For every sample config, transformers builds the model on the meta device (no memory, no
weights) and we compare, module by module, the names, classes, parameter names and shapes
that FSDP would see, and the total parameter count.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

torch = peer.require("torch")
transformers = peer.require("transformers")

MODELS = ["llama3-8b", "llama3.1-8b", "llama3-70b", "llama2-7b", "mistral-7b-v0.1", "qwen2-0.5b",
          "qwen2-7b", "qwen3-8b", "olmo2-7b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen2-57b-a14b",
          "qwen3-30b-a3b", "deepseek-v3", "deepseek-v2-lite", "moonlight-16b-a3b", "gemma2-9b", "gemma3-1b", "falcon-7b", "falcon-40b", "falcon-rw-1b", "phi3-mini-4k", "phi4", "gpt2",
          "seed-oss-36b", "granite-3.1-8b", "smollm3-3b", "olmo3-7b", "exaone4-32b", "olmo-1.7-7b", "olmoe-1b-7b", "granite-3.1-1b-a400m", "starcoder2-7b", "phi-2", "pythia-6.9b", "command-r7b", "glm-4.5-air",
          "gpt-oss-20b", "gpt-oss-120b", "llama4-scout-17b-16e", "llama4-maverick-17b-128e", "ernie-4.5-21b-a3b",
          "ernie-4.5-300b-a47b", "mpt-7b", "mpt-30b", "tiny-llama"]


def hf_model(name):
    cfg = transformers.AutoConfig.from_pretrained(peer.sample("models", name, "config.json"))
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


class HfModules(unittest.TestCase):
    def test_module_tree_matches_transformers(self):
        for name in MODELS:
            with self.subTest(model=name):
                model = hf_model(name)
                ours = peer.shardscope("model", "show", "--model", peer.sample("models", name, "config.json"),
                                       "--depth", "99", "--no-fold", "--json")
                self.assertEqual(ours["total_params"], sum(p.numel() for p in model.parameters()))
                theirs_modules = [(n, type(m).__name__) for n, m in model.named_modules()]
                our_modules = [(m["name"], m["class"]) for m in ours["modules"]]
                # The root's class is the *ForCausalLM class.
                self.assertEqual(our_modules, theirs_modules)
                theirs_params = {n: list(p.shape) for n, p in model.named_parameters()}
                our_params = {}
                for m in ours["modules"]:
                    for p in m["direct_params"]:
                        if "tied_to" in p and p["tied_to"] != (m["name"] + "." + p["name"]).lstrip("."):
                            continue  # named_parameters() lists a tied parameter once
                        our_params[(m["name"] + "." + p["name"]).lstrip(".")] = p["shape"]
                self.assertEqual(our_params, theirs_params)
                # Tied embeddings exactly when transformers ties them.
                tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
                self.assertEqual(bool(ours["tied_params"]), tied)

    def test_every_family_at_its_default_config(self):
        # The second size of each family: transformers' own default configuration (the
        # bundled samples are published checkpoints'). Totals equal transformers' on the meta
        # device, for every family `shardscope model families` lists, each of which bundles
        # at least one published config.
        import tempfile
        families = peer.shardscope("model", "families", "--json")["families"]
        self.assertGreaterEqual(len(families), 20)
        for f in families:
            with self.subTest(model_type=f["model_type"]):
                self.assertTrue(f["samples"], "no bundled config")
                cfg = transformers.AutoConfig.for_model(f["model_type"])
                if f["model_type"] == "deepseek_v2":
                    # Its default num_experts_per_tok is null, which its router cannot run
                    # (ShardScope refuses it, naming the field): V2-Lite's 6.
                    cfg.num_experts_per_tok = 6
                with torch.device("meta"):
                    model = transformers.AutoModelForCausalLM.from_config(cfg)
                self.assertEqual(type(model).__name__, f["class"])
                with tempfile.TemporaryDirectory() as d:
                    path = os.path.join(d, "config.json")
                    cfg.to_json_file(path)
                    ours = peer.shardscope("model", "show", "--model", path, "--json")
                theirs = sum(p.numel() for p in model.parameters())
                print("%-12s default config %18s parameters; %s" % (
                    f["model_type"], format(theirs, ","),
                    ", ".join("%s %s" % (s["name"], format(s["total_params"], ",")) for s in f["samples"])))
                self.assertEqual(ours["total_params"], theirs)

    def test_sliding_window_layers_are_transformers(self):
        # The layers whose SDPA gets a sliding-window mask (and so keeps it, and repeated K
        # and V, from seq_len == window on): config.layer_types where the family has it,
        # every layer where the model builds one mask from config.sliding_window (Mistral,
        # Mixtral, Phi-3, Qwen3-MoE), as transformers' configuration classes decide them
        # (defaults, Gemma-3's pattern, Qwen's use_sliding_window and max_window_layers).
        for name in MODELS:
            with self.subTest(model=name):
                cfg = transformers.AutoConfig.from_pretrained(peer.sample("models", name, "config.json"))
                window = getattr(cfg, "sliding_window", None)
                types = getattr(cfg, "layer_types", None)
                layers = cfg.num_hidden_layers if hasattr(cfg, "num_hidden_layers") else cfg.n_layer
                if cfg.model_type == "llama4_text":
                    # Chunked attention: from attention_chunk_size on, the chunked layers'
                    # SDPA gets a mask, as a sliding window's does.
                    window = cfg.attention_chunk_size
                    theirs = {i for i, t in enumerate(types) if t == "chunked_attention"}
                elif not window or cfg.model_type == "gpt_oss":
                    # gpt-oss runs eager attention: its window changes the additive mask,
                    # which nothing saves, and every s x s score is computed either way.
                    theirs = set()
                elif types is not None:
                    theirs = {i for i, t in enumerate(types) if t == "sliding_attention"}
                else:
                    theirs = set(range(layers))
                ours = peer.shardscope("model", "show", "--model", peer.sample("models", name, "config.json"),
                                       "--depth", "4", "--no-fold", "--json")
                self.assertEqual(ours["sliding_window"], window or 0)
                masked = {int(m["name"].split(".")[2]) for m in ours["modules"]
                          if m.get("window_saved_bytes", 0) > 0 and m["name"].endswith("self_attn")}
                self.assertEqual(masked, theirs)
                if theirs:
                    print("%s: window %d on %d of %d layers" % (name, window, len(theirs), layers))


if __name__ == "__main__":
    unittest.main(verbosity=2)
