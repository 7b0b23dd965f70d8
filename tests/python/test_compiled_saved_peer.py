# SPDX-License-Identifier: Apache-2.0
"""Peer test: what a decoder layer saves under torch.compile, against AOT autograd itself.

torch.compile traces each family's transformers decoder layer (bf16, SDPA, no mask) and AOT
autograd's min-cut partitioner (the one Inductor uses) splits it into forward and backward;
the backward graph's inputs other than the output gradients are what the forward saves.
Parameters and the rotary cos/sin (inputs every layer shares, saved once at the model's
rotary embedding) are left out; the rest must equal `shardscope model show --json`'s
compiled_saved_activation_bytes for the same layer, batch and sequence, at two sizes per
family. The families without a compiled rule (mixture of experts, multi-head latent
attention, Falcon's multi-query and ALiBi layouts) keep the eager figures and say so when a
plan compiles them. GPT-2's
LayerNorm keeps its mean and rstd in bf16 on the CPU, fp32 on a GPU (as modelled): 8 B a
token a layer, inside the tolerance.
"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import hf_layer  # noqa: E402
import peer  # noqa: E402

torch = peer.require("torch")
transformers = peer.require("transformers")

SEQ = 96  # no parameter has this dimension: a saved tensor with it is an activation
SIZES = (
    dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2, head_dim=64),
    dict(hidden_size=768, intermediate_size=2304, num_attention_heads=12, num_key_value_heads=4, head_dim=96),
)
FAMILIES = {
    "llama": {},
    "mistral": {},
    "qwen2": {},
    "qwen3": {},
    "olmo2": {},
    "phi3": {"pad_token_id": 0},
    "gemma2": {},
    "gemma3_text": {},
    # Residual dropout on (its masks are saved); attention dropout off: on a GPU it is the
    # flash kernel's own, on the CPU SDPA with dropout falls back to the math kernel.
    "gpt2": {"attn_pdrop": 0.0},
    # Falcon-40B/180B's layout: ln_attn and ln_mlp in parallel, grouped k and v broadcast to
    # every head before SDPA. (Falcon-7B's one-head multi-query SDPA runs the math kernel on
    # a CPU: no oracle here for the flash kernel a GPU runs.)
    # head_dim is FalconConfig's property (hidden / heads): None leaves it out.
    "falcon": {"new_decoder_architecture": True, "num_kv_heads": 2, "head_dim": None},
    # Dropout off, as for GPT-2's attention (Seed-OSS's residual dropout has no compiled rule).
    "seed_oss": {"attention_dropout": 0.0, "residual_dropout": 0.0, "pad_token_id": 0},
    "granite": {"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "logits_scaling": 16.0},
    "smollm3": {"pad_token_id": 0},
    "smollm3:no rope": {"pad_token_id": 0, "no_rope_layers": [0]},
    "olmo3": {"pad_token_id": 0},
    "exaone4": {},
    "exaone4:global, no rope": {"layer_types": ["full_attention"]},
    # OLMo (1) without clip_qkv (with it, the clamps' masks are left to eager figures).
    "olmo": {"pad_token_id": 0},
}


def partitioner_saved_bytes(model_type, over):
    """Bytes the compiled layer 0 saves for backward (activations only), and its config."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import min_cut_rematerialization_partition, make_boxed_func

    run, x, cfg = hf_layer.decoder_layer(model_type, over, SEQ)
    hidden = cfg.hidden_size
    saved = []

    def forward_compiler(gm, _):
        return make_boxed_func(gm)

    def backward_compiler(gm, _):
        for n in gm.graph.nodes:
            v = n.meta.get("val")
            if n.op != "placeholder" or n.name.startswith("tangents") or not isinstance(v, torch.Tensor):
                continue
            shape = tuple(v.shape)
            if SEQ not in shape:
                continue  # a parameter
            if n.name.startswith("primals") and len(shape) == 3 and shape[-1] != hidden:
                continue  # cos or sin
            saved.append(v.numel() * v.element_size())
        return make_boxed_func(gm)

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler,
                           partition_fn=min_cut_rematerialization_partition)

    torch.compile(run, backend=backend)(x).float().sum().backward()
    assert saved, "the backward graph had no saved activations"
    return sum(saved), cfg


def shardscope_compiled_bytes(cfg):
    return hf_layer.shardscope_layer(cfg, SEQ).get("compiled_saved_activation_bytes")


class CompiledSaved(unittest.TestCase):
    def test_each_family_at_two_sizes(self):
        rows = []
        for family, extra in FAMILIES.items():
            for size in SIZES:
                with self.subTest(family=family, hidden=size["hidden_size"]):
                    over = {k: v for k, v in {**size, **extra}.items() if v is not None}
                    truth, cfg = partitioner_saved_bytes(family.split(":")[0], over)
                    ours = shardscope_compiled_bytes(cfg)
                    self.assertIsNotNone(ours, f"{family}: no compiled_saved_activation_bytes")
                    rows.append((family, size["hidden_size"], truth, ours))
                    self.assertAlmostEqual(ours / truth, 1.0, delta=0.005,
                                           msg=f"{family} hidden {size['hidden_size']}: "
                                               f"partitioner {truth}, shardscope {ours}")
        for family, h, truth, ours in rows:
            print(f"{family:12s} hidden {h:4d}: partitioner {truth:10d} B, shardscope {ours:12.0f} B")

    def test_a_compiled_moe_plan_says_it_keeps_eager_figures(self):
        plan = {"format": "shardscope.plan", "version": 1, "api": "fsdp2",
                "wrap": {"policy": "module_class", "classes": ["MixtralDecoderLayer"]},
                "defaults": {"compile": "per_block"}}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.json")
            with open(path, "w") as f:
                json.dump(plan, f)
            r = peer.run("plan", "validate", "-m", peer.sample("models", "mixtral-8x7b", "config.json"),
                         "-p", path)
        self.assertIn("no compiled rule for this model's layers", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
