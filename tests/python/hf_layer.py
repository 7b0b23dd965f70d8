# SPDX-License-Identifier: Apache-2.0
"""One transformers decoder layer in bf16 with the inputs its model would give it: what the
compile peers (test_compiled_saved_peer, test_compiled_fusion_peer) trace."""
import inspect
import os
import tempfile

import torch
import transformers

import peer


def decoder_layer(model_type, over, seq):
    """(run, x, cfg): `run(x)` calls layer 0 of a one-layer `model_type` model built from
    `over` (SDPA, no mask) with its rotary cos/sin, and x is a (1, seq, hidden) bf16 input
    that requires grad."""
    torch._dynamo.reset()
    cfg = transformers.AutoConfig.for_model(model_type, num_hidden_layers=1, vocab_size=256, **over)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    body = model.model if hasattr(model, "model") else model.transformer  # GPT-2, Falcon: transformer.h
    layer = body.layers[0] if hasattr(body, "layers") else body.h[0]
    x = torch.randn(1, seq, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(seq)[None]
    params = inspect.signature(layer.forward).parameters
    kwargs = {"attention_mask": None}
    if "position_ids" in params:
        kwargs["position_ids"] = pos
    if "alibi" in params:
        kwargs["alibi"] = None  # Falcon with rotary
    if "position_embeddings_global" in params:
        kwargs["position_embeddings_global"] = body.rotary_emb(x, pos)  # Gemma-3
        kwargs["position_embeddings_local"] = body.rotary_emb_local(x, pos)
    elif hasattr(body, "rotary_emb"):
        kwargs["position_embeddings"] = body.rotary_emb(x, pos)
    elif hasattr(body, "rotary_embs"):  # OLMo-3: one per attention type
        kwargs["position_embeddings"] = body.rotary_embs[cfg.layer_types[0]](x, pos)

    def run(x):
        out = layer(x, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    return run, x, cfg


def shardscope_layer(cfg, seq):
    """`shardscope model show --json`'s row for layer 0 of `cfg` at 1 x seq tokens, bf16."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        cfg.to_json_file(path)
        shown = peer.shardscope("model", "show", "-m", path, "--json", "--no-fold", "--depth", "3",
                                "--batch", "1", "--seq", str(seq), "--param-dtype", "bfloat16",
                                "--activation-dtype", "bfloat16")
    return next(m for m in shown["modules"] if m["name"] in ("model.layers.0", "transformer.h.0"))
