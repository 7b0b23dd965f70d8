# SPDX-License-Identifier: Apache-2.0
"""Peer test: the activation formulas for Hugging Face configs against what autograd saves.

transformers' LlamaForCausalLM (the tiny sample config, fp32, SDPA attention, no padding
mask) runs one forward with labels under torch.autograd.graph.saved_tensors_hooks; every
storage autograd saves is counted once, parameters excluded. `shardscope model show --json`
gives the formulas' saved bytes for the same batch and sequence. They must agree within 1%,
for the whole model and for one decoder layer; and a GQA config (4 KV heads for 8 query
heads) is covered by the sample itself.
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

SOURCE = os.environ.get("SHARDSCOPE_SOURCE", os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIG = os.path.join(SOURCE, "samples", "models", "tiny-llama", "config.json")
BATCH, SEQ = 2, 128


def measured_saved_bytes(model, ids, labels, layer=None):
    """Bytes of the storages autograd saves during one forward (each storage once)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}
    per_layer = {}
    current = [None]

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen[ptr] = t.untyped_storage().nbytes()
            per_layer[ptr] = current[0]
        return t

    hooks = []
    if layer is not None:
        hooks.append(layer.register_forward_pre_hook(lambda *a: current.__setitem__(0, "layer")))
        hooks.append(layer.register_forward_hook(lambda *a: current.__setitem__(0, None)))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=labels)
    for h in hooks:
        h.remove()
    del out
    total = sum(seen.values())
    in_layer = sum(b for p, b in seen.items() if per_layer[p] == "layer")
    return total, in_layer


def saved_bytes_by_module(model, ids):
    """Bytes of the storages autograd saves in one forward with labels, each storage once,
    by the innermost module running when it was first saved."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    names = {m: n for n, m in model.named_modules()}
    stack, seen, per = [""], set(), {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            per[stack[-1]] = per.get(stack[-1], 0) + t.untyped_storage().nbytes()
        return t

    hooks = [m.register_forward_pre_hook(lambda m, a: stack.append(names[m])) for m in names]
    hooks += [m.register_forward_hook(lambda m, a, o: (stack.pop(), None)[1]) for m in names]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=ids)
    finally:
        for h in hooks:
            h.remove()
    return per


def self_values(show, key):
    """A module's own value (children excluded) from `model show --json --no-fold`."""
    total = {m["name"]: m[key] for m in show["modules"]}
    own = dict(total)
    for name, v in total.items():
        if name:
            parent = name.rsplit(".", 1)[0] if "." in name else ""
            own[parent] -= v
    return own


class SavedActivationsPeer(unittest.TestCase):
    def test_formulas_match_autograd(self):
        with open(CONFIG) as f:
            cfg = json.load(f)
        config = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if not k.startswith("_")})
        config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).float().train()
        ids = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ))
        total, layer1 = measured_saved_bytes(model, ids, ids, layer=model.model.layers[1])

        show = peer.shardscope("model", "show", "--model", CONFIG, "--batch", str(BATCH), "--seq", str(SEQ),
                               "--json")
        mods = {m["name"]: m for m in show["modules"]}
        ours_total = mods[""]["saved_activation_bytes"]
        ours_layer = mods["model.layers.1"]["saved_activation_bytes"]
        print("saved activations, %d x %d tokens: formulas %d B, autograd %d B (%+.2f%%); one decoder layer: "
              "formulas %d B, autograd %d B (%+.2f%%)"
              % (BATCH, SEQ, ours_total, total, 100.0 * (ours_total - total) / total, ours_layer, layer1,
                 100.0 * (ours_layer - layer1) / layer1))
        self.assertLess(abs(ours_total - total), 0.01 * total)
        self.assertLess(abs(ours_layer - layer1), 0.01 * layer1)

    def test_mixtral_moe_block_matches_autograd(self):
        # A small Mixtral (8 experts, top 2) in bf16 with tokens routed evenly over the
        # experts (the oracle's balanced routing: transformers' operators, data-independent
        # token choice). One sparse-MoE block's saved bytes, formulas against autograd.
        sys.path.insert(0, os.path.join(peer.SOURCE, "tests", "oracles"))
        import memory_oracle
        memory_oracle.balanced_moe_routing()
        cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 128,
               "hidden_size": 64, "intermediate_size": 224, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8,
               "num_experts_per_tok": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
               "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
        path = os.path.join(tempfile.mkdtemp(), "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        config = transformers.MixtralConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
        config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        model = transformers.MixtralForCausalLM(config).to(torch.bfloat16).train()
        ids = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ))
        _, moe = measured_saved_bytes(model, ids, ids, layer=model.model.layers[1].block_sparse_moe)
        show = peer.shardscope("model", "show", "--model", path, "--batch", str(BATCH), "--seq", str(SEQ),
                               "--param-dtype", "bfloat16", "--activation-dtype", "bfloat16", "--no-fold",
                               "--depth", "8", "--json")
        mods = {m["name"]: m for m in show["modules"]}
        ours = mods["model.layers.1.block_sparse_moe"]["saved_activation_bytes"]
        print("one sparse-MoE block, %d x %d tokens: formulas %d B, autograd %d B (%+.2f%%)"
              % (BATCH, SEQ, ours, moe, 100.0 * (ours - moe) / moe))
        self.assertLess(abs(ours - moe), 0.01 * moe)

    def small_family_matches_autograd(self, model_type, config_class, model_class, extra, layer_norms=0,
                                      attn_implementation="sdpa", keep_fp32=()):
        """A small model of a family: one decoder layer's and the whole model's saved bytes
        against autograd, and FLOPs against torch.utils.flop_counter, in fp32 and bf16.
        `layer_norms`: nn.LayerNorms a decoder layer has (and one final one). In bf16 the CPU
        keeps their mean and rstd in bf16 where a GPU keeps fp32 (as modelled): autograd's
        figure is raised by that difference, 4 B a token a norm. `keep_fp32`: names of the modules
        transformers keeps in fp32 in any dtype (_keep_in_fp32_modules_strict), as
        from_pretrained(torch_dtype=bf16) leaves them; Module.to(dtype) would cast them."""
        cfg = {"model_type": model_type, "vocab_size": 256, "hidden_size": 64, "intermediate_size": 192,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
               "attention_bias": False, **extra}
        path = os.path.join(tempfile.mkdtemp(), "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
            with self.subTest(dtype=name):
                config = config_class(**{k: v for k, v in cfg.items() if k != "model_type"})
                config._attn_implementation = attn_implementation
                # Training without a KV cache, as the memory oracle runs it: transformers then
                # reads "packed sequences" from the position ids and builds a (b, 1, s, s)
                # mask; the oracle and the formulas run causal SDPA without one
                # (tests/oracles/memory_oracle.py says why).
                config.use_cache = False
                import transformers.masking_utils as masking_utils
                masking_utils.find_packed_sequence_indices = lambda position_ids: None
                torch.manual_seed(0)
                model = model_class(config).to(dtype).train()
                for fqn, m in model.named_modules():
                    if fqn.rsplit(".", 1)[-1] in keep_fp32:
                        m.float()
                ids = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ))
                body = model.model if hasattr(model, "model") else model.gpt_neox
                total, layer = measured_saved_bytes(model, ids, ids, layer=body.layers[1])
                layer_name = next(n for n, m in model.named_modules() if m is body.layers[1])
                if dtype == torch.bfloat16 and layer_norms:
                    layer += 4 * BATCH * SEQ * layer_norms
                    total += 4 * BATCH * SEQ * (layer_norms * cfg["num_hidden_layers"] + 1)
                show = peer.shardscope("model", "show", "--model", path, "--batch", str(BATCH), "--seq",
                                       str(SEQ), "--param-dtype", name, "--activation-dtype", name, "--json")
                mods = {m["name"]: m for m in show["modules"]}
                ours_total = mods[""]["saved_activation_bytes"]
                ours_layer = mods[layer_name]["saved_activation_bytes"]
                print("%s %s: decoder layer formulas %d B, autograd %d B (%+.2f%%); model %d B, %d B (%+.2f%%)"
                      % (model_type, name, ours_layer, layer, 100.0 * (ours_layer - layer) / layer, ours_total,
                         total, 100.0 * (ours_total - total) / total))
                self.assertLess(abs(ours_layer - layer), 0.01 * layer)
                self.assertLess(abs(ours_total - total), 0.01 * total)
                # FLOPs as torch.utils.flop_counter counts them: its mode for the matmuls,
                # its SDPA formulas for attention (the mode has no entry for the CPU kernel);
                # eager attention's matmuls are in the mode's count.
                from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count
                with FlopCounterMode(display=False) as fc:
                    model(input_ids=ids, labels=ids).loss.backward()
                shape = (BATCH, cfg["num_attention_heads"], SEQ, head_dim)
                theirs = fc.get_total_flops()
                if attn_implementation == "sdpa":
                    theirs += cfg["num_hidden_layers"] * (
                        sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(shape, shape, shape, shape))
                ours_flops = mods[""]["fwd_flops"] + mods[""]["bwd_flops"]
                # The formulas leave out RoPE's inv_freq @ position_ids (a few thousand FLOPs).
                self.assertAlmostEqual(ours_flops, theirs, delta=1e-4 * theirs)

    def test_qwen3_matches_autograd(self):
        # q_norm and k_norm: RMSNorm of each head over head_dim; an explicit head_dim.
        self.small_family_matches_autograd("qwen3", transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                                           {"head_dim": 32})

    def test_olmo2_matches_autograd(self):
        # q_norm and k_norm over whole projections, norms after attention and the MLP, the
        # norm's weight applied in fp32 (its multiply keeps the fp32 normalized input).
        self.small_family_matches_autograd("olmo2", transformers.Olmo2Config, transformers.Olmo2ForCausalLM, {})
    def test_qwen3_moe_matches_autograd(self):
        # Qwen3's attention, a sparse block (router, 4 experts of moe_intermediate_size, top 2
        # renormalised) in layer 1 and a dense MLP in layer 0 (mlp_only_layers). transformers
        # routes with its random router here: whatever the routing, each token reaches
        # top_k experts, so the saved bytes and FLOPs of the layer and the model are those of
        # the balanced routing the formulas assume.
        self.small_family_matches_autograd(
            "qwen3_moe", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
            {"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
             "norm_topk_prob": True, "mlp_only_layers": [0]})

    def test_qwen2_moe_matches_autograd(self):
        # Qwen2-MoE: q/k/v biases, the SDPA attention class that copies K and V to every
        # query head (repeat_kv, GQA here), a shared expert scaled by a sigmoid gate, no
        # renormalisation of the top-k weights; a dense layer 0.
        self.small_family_matches_autograd(
            "qwen2_moe", transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
            {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
             "shared_expert_intermediate_size": 96, "norm_topk_prob": False, "mlp_only_layers": [0]})

    def test_phi3_matches_autograd(self):
        # Fused qkv_proj (v a view of its output, kept by SDPA) and gate_up_proj (chunked),
        # partial rotary embedding (Phi-4-mini's 0.75), GQA.
        self.small_family_matches_autograd(
            "phi3", transformers.Phi3Config, transformers.Phi3ForCausalLM,
            {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "sliding_window": None,
             "partial_rotary_factor": 0.75})

    def test_gemma2_matches_autograd(self):
        # Four norms per layer computing (1 + weight) in fp32 (the multiply keeps the fp32
        # normalized input), a GELU-tanh MLP, the embedding scaled by sqrt(hidden), the final
        # logits capped by tanh (which keeps its vocabulary-sized output). Attention
        # softcapping is dropped by SDPA (flash-attention 2 applies it, keeping no scores).
        self.small_family_matches_autograd(
            "gemma2", transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
            {"head_dim": 16, "query_pre_attn_scalar": 16, "hidden_activation": "gelu_pytorch_tanh",
             "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "sliding_window": 4096})

    def test_gemma3_text_matches_autograd(self):
        # Gemma-3's text model: Gemma-2's layer with q_norm/k_norm per head ((1 + weight) in
        # fp32), the scaled embedding module, a second rotary embedding for the local layers,
        # no softcapping.
        self.small_family_matches_autograd(
            "gemma3_text", transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
            {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4096, "sliding_window_pattern": 2})

    def test_seed_oss_matches_autograd(self):
        # q/k/v biases without o_proj's (attention_out_bias). Dropout off: on the CPU, SDPA
        # with attention dropout falls back to the math kernel (a GPU's flash kernel keeps
        # only its random state) and residual dropout saves its mask in the input's dtype
        # (CUDA's fused kernel: bool, as modelled).
        self.small_family_matches_autograd(
            "seed_oss", transformers.SeedOssConfig, transformers.SeedOssForCausalLM,
            {"head_dim": 16, "attention_bias": True, "attention_out_bias": False, "attention_dropout": 0.0,
             "residual_dropout": 0.0})

    def test_granite_matches_autograd(self):
        # The embedding, both residual branches and the logits scaled by constants: extra
        # multiplies that save nothing.
        self.small_family_matches_autograd(
            "granite", transformers.GraniteConfig, transformers.GraniteForCausalLM,
            {"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0078125,
             "logits_scaling": 16.0})

    def test_smollm3_matches_autograd(self):
        # Layer 1 (the one checked) skips RoPE: SDPA keeps q and k as the projections made them.
        self.small_family_matches_autograd(
            "smollm3", transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM,
            {"no_rope_layers": [1, 0], "pad_token_id": 0})

    def test_olmo3_matches_autograd(self):
        # OLMo-2's layer with sliding-window layers and a rotary embedding per attention
        # type, both kept: layers 0 and 1 slide (the first saves their cos and sin), layer 2
        # attends fully.
        self.small_family_matches_autograd(
            "olmo3", transformers.Olmo3Config, transformers.Olmo3ForCausalLM,
            {"sliding_window": 4096, "num_hidden_layers": 3,
             "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]})

    def test_olmo_matches_autograd(self):
        # OLMo (1): LayerNorms without parameters in fp32, and OLMo-1.7's clip_qkv (clamp_ in
        # place: autograd keeps each projection's unclamped output).
        for clip in (None, 8.0):
            with self.subTest(clip_qkv=clip):
                self.small_family_matches_autograd("olmo", transformers.OlmoConfig, transformers.OlmoForCausalLM,
                                                   {"clip_qkv": clip, "pad_token_id": 0})

    def test_olmoe_matches_autograd(self):
        # OLMoE: q/k norms over whole projections, the legacy SDPA attention (repeat_kv copies
        # K and V to every query head), every layer sparse (4 experts of intermediate_size, top
        # 2, not renormalised); transformers' own routing (each token fills top_k slots).
        self.small_family_matches_autograd(
            "olmoe", transformers.OlmoeConfig, transformers.OlmoeForCausalLM,
            {"num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48, "pad_token_id": 0})

    def test_granitemoe_matches_autograd(self):
        # Granite-MoE: Granite's multipliers and a GraniteMoeMoE block in every layer (4 experts
        # of intermediate_size in two [E, out, in] parameters, top 2, softmax over the top k);
        # transformers' own routing (each token fills top_k slots whatever it picks).
        self.small_family_matches_autograd(
            "granitemoe", transformers.GraniteMoeConfig, transformers.GraniteMoeForCausalLM,
            {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48, "embedding_multiplier": 12.0,
             "residual_multiplier": 0.22, "logits_scaling": 6.0})

    def test_llama4_matches_autograd(self):
        # Llama-4's text model: layers 1 and 3 Llama4TextMoe (4 experts, every one run on
        # every token, and the shared expert), 0 and 2 a dense MLP of intermediate_size_mlp;
        # complex RoPE and the L2 q/k norm on layers 0-2, NoPE with the temperature on layer 3;
        # chunks of 64 < seq 128, so the RoPE layers' SDPA gets a mask (and repeated k and v).
        self.small_family_matches_autograd(
            "llama4_text", transformers.Llama4TextConfig, transformers.Llama4ForCausalLM,
            {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 1, "intermediate_size": 48,
             "intermediate_size_mlp": 192, "interleave_moe_layer_step": 2, "num_hidden_layers": 4,
             "attention_chunk_size": 64, "rope_scaling": None})

    def test_ernie4_5_moe_matches_autograd(self):
        # Ernie-4.5-MoE: biases everywhere (use_bias), RoPE in fp32 on interleaved pairs, layer 0
        # dense and layer 1 an MoE block (4 experts, top 2, renormalised through a clamp, two
        # shared experts) whose router runs in fp32: its gate is an fp32 Linear in any dtype, fed
        # hidden_states.float() (in bf16 a new fp32 tensor the gate keeps).
        cfg = {"moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 48, "moe_num_shared_experts": 2,
               "moe_layer_start_index": 1, "use_bias": True, "head_dim": 16}
        self.small_family_matches_autograd(
            "ernie4_5_moe", transformers.Ernie4_5_MoeConfig, transformers.Ernie4_5_MoeForCausalLM, cfg,
            keep_fp32=("gate", "moe_statics"))
        # Without shared experts the gate keeps the block's input itself in fp32 (its fp32 copy
        # below).
        self.small_family_matches_autograd(
            "ernie4_5_moe", transformers.Ernie4_5_MoeConfig, transformers.Ernie4_5_MoeForCausalLM,
            {**cfg, "moe_num_shared_experts": 0, "use_bias": False}, keep_fp32=("gate", "moe_statics"))

    def test_mpt_matches_autograd(self):
        # MPT as transformers trains it: eager attention with the fp32 ALiBi bias, which
        # promotes the scores to fp32 below fp32 (the fp32 probabilities, and in bf16 their cast
        # back, are kept a head a key position), matmul's copies of q, k and v, the causal mask
        # kept once; LayerNorms without bias (two a block, one final: in bf16 the CPU keeps
        # their mean and rstd in bf16 where a GPU keeps fp32, as for the other LayerNorm
        # families); with and without clip_qkv.
        for clip in (None, 6.0):
            cfg = {"model_type": "mpt", "vocab_size": 256, "d_model": 64, "n_layers": 2, "n_heads": 4,
                   "max_seq_len": 256, "attn_config": {"clip_qkv": clip}}
            path = os.path.join(tempfile.mkdtemp(), "config.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
                with self.subTest(clip_qkv=clip, dtype=name):
                    config = transformers.MptConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
                    torch.manual_seed(0)
                    model = transformers.MptForCausalLM(config).to(dtype).train()
                    ids = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ))
                    total, layer = measured_saved_bytes(model, ids, ids, layer=model.transformer.blocks[1])
                    if dtype == torch.bfloat16:
                        layer += 4 * BATCH * SEQ * 2
                        total += 4 * BATCH * SEQ * (2 * cfg["n_layers"] + 1)
                    show = peer.shardscope("model", "show", "--model", path, "--batch", str(BATCH), "--seq",
                                           str(SEQ), "--param-dtype", name, "--activation-dtype", name, "--json")
                    mods = {m["name"]: m for m in show["modules"]}
                    ours_total = mods[""]["saved_activation_bytes"]
                    ours_layer = mods["transformer.blocks.1"]["saved_activation_bytes"]
                    print("mpt clip_qkv=%s %s: block formulas %d B, autograd %d B (%+.2f%%); model %d B, %d B (%+.2f%%)"
                          % (clip, name, ours_layer, layer, 100.0 * (ours_layer - layer) / layer, ours_total, total,
                             100.0 * (ours_total - total) / total))
                    self.assertLess(abs(ours_layer - layer), 0.01 * layer)
                    self.assertLess(abs(ours_total - total), 0.01 * total)
                    from torch.utils.flop_counter import FlopCounterMode
                    with FlopCounterMode(display=False) as fc:
                        model(input_ids=ids, labels=ids).loss.backward()
                    theirs = fc.get_total_flops()
                    self.assertAlmostEqual(mods[""]["fwd_flops"] + mods[""]["bwd_flops"], theirs, delta=1e-4 * theirs)

    def test_gpt_oss_matches_autograd(self):
        # gpt-oss on transformers' eager attention (it has no SDPA path): sinks, q/k/v/o
        # biases, a sliding window shorter than the sequence on layer 0, the s x (s + 1)
        # probabilities saved; GptOssMLP's biased router and its experts looped over (4 of
        # intermediate_size, top 2); transformers' own routing (each token fills top_k slots).
        self.small_family_matches_autograd(
            "gpt_oss", transformers.GptOssConfig, transformers.GptOssForCausalLM,
            {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48,
             "sliding_window": 8, "rope_scaling": None}, attn_implementation="eager")

    def test_starcoder2_matches_autograd(self):
        # LayerNorms with biases, biases on every projection, a GELU-tanh MLP (c_fc, c_proj);
        # dropout off on the CPU (see Seed-OSS), with and without a sliding window past the
        # sequence.
        for window in (None, 64):
            with self.subTest(sliding_window=window):
                self.small_family_matches_autograd(
                    "starcoder2", transformers.Starcoder2Config, transformers.Starcoder2ForCausalLM,
                    {"use_bias": True, "residual_dropout": 0.0, "embedding_dropout": 0.0, "attention_dropout": 0.0,
                     "sliding_window": window}, layer_norms=2)

    def test_phi_matches_autograd(self):
        # Phi-2's parallel block under one LayerNorm, RoPE on part of each head through a cat
        # (dense saves a copy of SDPA's output), the unfused tanh GELU, lm_head's bias;
        # residual dropout off on the CPU (see Seed-OSS).
        self.small_family_matches_autograd(
            "phi", transformers.PhiConfig, transformers.PhiForCausalLM,
            {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "partial_rotary_factor": 0.4}, layer_norms=1)

    def test_gpt_neox_matches_autograd(self):
        # GPT-NeoX's parallel residual (both LayerNorms read the layer input) and sequential
        # one, the fused query_key_value split per head (v a view of its output, kept by
        # SDPA whole), partial RoPE through a cat (dense saves a copy), the exact GELU.
        for parallel in (True, False):
            with self.subTest(use_parallel_residual=parallel):
                self.small_family_matches_autograd(
                    "gpt_neox", transformers.GPTNeoXConfig, transformers.GPTNeoXForCausalLM,
                    {"num_key_value_heads": None, "use_parallel_residual": parallel, "rotary_pct": 0.25},
                    layer_norms=2)

    def test_cohere2_matches_autograd(self):
        # Cohere2: its fp32 LayerNorm written out (three fp32 hidden-sized tensors saved), a
        # parallel attention and MLP under it, RoPE in fp32 on the sliding layer 0 only (the
        # checked layer 1 is global, without RoPE), the logits scaled.
        self.small_family_matches_autograd(
            "cohere2", transformers.Cohere2Config, transformers.Cohere2ForCausalLM,
            {"pad_token_id": 0, "sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention"],
             "logit_scale": 0.25})

    def test_glm4_moe_matches_autograd(self):
        # GLM-4.5: q/k/v biases, RoPE on half of each head through a cat (o_proj saves a copy
        # of SDPA's output), with and without per-head q/k norms, a dense layer 0 and
        # DeepSeek-V3's mixture in layer 1 (8 experts in 2 groups, top 2, a shared expert);
        # transformers' own routing (each token fills top_k slots).
        for qk_norm in (False, True):
            with self.subTest(use_qk_norm=qk_norm):
                self.small_family_matches_autograd(
                    "glm4_moe", transformers.Glm4MoeConfig, transformers.Glm4MoeForCausalLM,
                    {"head_dim": 16, "attention_bias": True, "partial_rotary_factor": 0.5, "n_routed_experts": 8,
                     "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
                     "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1, "use_qk_norm": qk_norm})

    def test_exaone4_matches_autograd(self):
        # Post-norms, per-head q/k norms, and RoPE on the sliding layer 0 only: layer 1 (the
        # one checked) is global and has none.
        self.small_family_matches_autograd(
            "exaone4", transformers.Exaone4Config, transformers.Exaone4ForCausalLM,
            {"head_dim": 16, "sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention"]})

    def test_sliding_window_layers_past_the_window_match_autograd(self):
        # From seq_len == window on transformers gives each sliding-window layer's SDPA a
        # (b, 1, s, s) mask: SDPA keeps a copy of it in the query's dtype, and with a mask
        # transformers repeats K and V to every query head (repeat_kv) instead of SDPA's
        # GQA, so the repeated copies are saved (ModuleCost::windowSavedBytes). Window 64,
        # sequence 128; the checked layer 1 is a sliding one, except in Gemma-2 and Gemma-3
        # at pattern 2, where layer 0 is (its mask and copies are 4-7% of the model total,
        # which must agree within 1%). Measured: every layer within 0.1%.
        cases = [
            ("gemma2", transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
             {"head_dim": 16, "query_pre_attn_scalar": 16, "hidden_activation": "gelu_pytorch_tanh",
              "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "sliding_window": 64}),
            ("gemma3_text", transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
             {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 64, "sliding_window_pattern": 2}),
            ("mistral", transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": 64}),
            # One key/value head: repeat_kv's expand and reshape stay a view, nothing copied.
            ("mistral", transformers.MistralConfig, transformers.MistralForCausalLM,
             {"sliding_window": 64, "num_key_value_heads": 1}),
            ("phi3", transformers.Phi3Config, transformers.Phi3ForCausalLM,
             {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "sliding_window": 64}),
            ("qwen3", transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
             {"head_dim": 32, "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 1}),
        ]
        for model_type, config_class, model_class, extra in cases:
            with self.subTest(model_type=model_type):
                self.small_family_matches_autograd(model_type, config_class, model_class, extra)

    def test_falcon_matches_autograd(self):
        # Falcon with rotary positions and parallel attention: Falcon-7B's multi-query block
        # (one norm, one key/value head) and Falcon-40B's new_decoder_architecture (ln_attn
        # and ln_mlp, key/value groups broadcast to every head before SDPA). One block's saved
        # bytes against autograd, module by module. For multi-query, SDPA's own set is left
        # out: transformers' SDPA call passes one key/value head without enable_gqa, which the
        # flash and memory-efficient kernels refuse, so it runs the math kernel and keeps the
        # s x s probabilities (flash-attention 2, as Falcon is trained, keeps what the
        # formulas count) and dense then saves a copy of its input.
        # falcon-rw's block: sequential (input_layernorm, attention, residual,
        # post_attention_layernorm, MLP, residual), linear biases, ALiBi instead of RoPE: one
        # (b, heads, s, s) bias for all layers, which layer 0's SDPA saves first (checked in
        # the model's total).
        variants = {"multi_query": {"new_decoder_architecture": False, "multi_query": True},
                    "new_decoder_architecture": {"new_decoder_architecture": True, "num_kv_heads": 2},
                    "rw": {"new_decoder_architecture": False, "multi_query": False, "parallel_attn": False,
                           "alibi": True, "bias": True}}
        for variant, extra in variants.items():
            cfg = {"model_type": "falcon", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "parallel_attn": True, "bias": False, "alibi": False, **extra}
            path = os.path.join(tempfile.mkdtemp(), "config.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
                with self.subTest(variant=variant, dtype=name):
                    config = transformers.FalconConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
                    config._attn_implementation = "sdpa"
                    config.use_cache = False
                    torch.manual_seed(0)
                    model = transformers.FalconForCausalLM(config).to(dtype).train()
                    ids = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ))
                    theirs = saved_bytes_by_module(model, ids)
                    show = peer.shardscope("model", "show", "--model", path, "--batch", str(BATCH), "--seq",
                                           str(SEQ), "--param-dtype", name, "--activation-dtype", name, "--json",
                                           "--no-fold", "--depth", "99")
                    ours = self_values(show, "saved_activation_bytes")
                    block, attn = "transformer.h.1", "transformer.h.1.self_attention"
                    skip = (attn, attn + ".dense") if variant == "multi_query" else ()
                    part = lambda d: sum(v for n, v in d.items()  # noqa: E731
                                         if n.startswith(block) and n not in skip)
                    print("falcon %s %s: block formulas %d B, autograd %d B (%+.2f%%)"
                          % (variant, name, part(ours), part(theirs), 100.0 * (part(ours) - part(theirs)) / part(theirs)))
                    self.assertLess(abs(part(ours) - part(theirs)), 0.01 * part(theirs))
                    if variant == "rw":
                        total, their_total = sum(ours.values()), sum(theirs.values())
                        print("falcon rw %s: model formulas %d B, autograd %d B (%+.2f%%)"
                              % (name, total, their_total, 100.0 * (total - their_total) / their_total))
                        self.assertLess(abs(total - their_total), 0.01 * their_total)
                    if variant in ("new_decoder_architecture", "rw"):
                        # FLOPs as torch.utils.flop_counter counts them (its SDPA formulas for
                        # the CPU flash kernel, which its mode does not see).
                        from torch.utils.flop_counter import (FlopCounterMode, sdpa_backward_flop_count,
                                                              sdpa_flop_count)
                        with FlopCounterMode(display=False) as fc:
                            model(input_ids=ids, labels=ids).loss.backward()
                        shape = (BATCH, cfg["num_attention_heads"], SEQ, 16)
                        flops = fc.get_total_flops() + cfg["num_hidden_layers"] * (
                            sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(shape, shape, shape, shape))
                        root = next(m for m in show["modules"] if m["name"] == "")
                        self.assertAlmostEqual(root["fwd_flops"] + root["bwd_flops"], flops, delta=1e-4 * flops)

    def test_deepseek_v3_matches_autograd(self):
        # Multi-head latent attention (a q bottleneck, the kv latent and its shared rotary
        # key, interleaved RoPE), a dense layer 0 and a DeepseekV3MoE layer 1: 8 routed
        # experts in 2 groups, top 2, a shared expert, the fp32 router and fp32 weighted sum.
        # Compared with autograd module by module: everything in the MoE layer but SDPA's own
        # saved set, and the attention's projections and norms one by one. SDPA's set depends
        # on the kernel: on this CPU, flash attention with q and k made by cat returns its
        # output in q's (b, h, s, d) layout, so o_proj's input is a copy, and v is copied;
        # CUDA's memory-efficient kernel (DeepSeek's q·k and v head sizes differ, which
        # flash does not take) returns (b, s, h, d) and takes the v view as it is, which is
        # what the formulas count; there is no GPU here to check that part.
        self.deepseek_matches_autograd("deepseek_v3", transformers.DeepseekV3Config,
                                       transformers.DeepseekV3ForCausalLM,
                                       {"n_shared_experts": 1, "n_group": 2, "topk_group": 1, "q_lora_rank": 48},
                                       ("q_a_proj", "q_a_layernorm", "q_b_proj"))

    def test_deepseek_v2_matches_autograd(self):
        # DeepSeek-V2(-Lite): the same attention without the q bottleneck (q_lora_rank null,
        # as V2-Lite), the softmax DeepseekV2MoEGate, two shared experts, and the routed
        # outputs combined by sorting the slots, a cat, a scatter and an in-place fp32
        # multiply by the weights (which keeps a clone of its input), complex RoPE.
        self.deepseek_matches_autograd("deepseek_v2", transformers.DeepseekV2Config,
                                       transformers.DeepseekV2ForCausalLM,
                                       {"n_shared_experts": 2, "q_lora_rank": None, "topk_method": "greedy"},
                                       ("q_proj",))

    def deepseek_matches_autograd(self, model_type, config_class, model_class, extra, q_modules):
        # transformers' own routing: whatever it picks, each token fills top_k slots, so the
        # layer's saved bytes are those of the balanced routing the formulas assume.
        cfg = {"model_type": model_type, "vocab_size": 256, "hidden_size": 64, "intermediate_size": 192,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
               "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
               "n_routed_experts": 8, "num_experts_per_tok": 2,
               "moe_intermediate_size": 32, "first_k_dense_replace": 1,
               "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16,
               "v_head_dim": 32, **extra}
        path = os.path.join(tempfile.mkdtemp(), "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
            with self.subTest(dtype=name):
                config = config_class(**{k: v for k, v in cfg.items() if k != "model_type"})
                config._attn_implementation = "sdpa"
                torch.manual_seed(0)
                model = model_class(config).to(dtype).train()
                ids = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ))
                theirs = saved_bytes_by_module(model, ids)
                show = peer.shardscope("model", "show", "--model", path, "--batch", str(BATCH), "--seq", str(SEQ),
                                       "--param-dtype", name, "--activation-dtype", name, "--json", "--no-fold",
                                       "--depth", "99")
                ours = self_values(show, "saved_activation_bytes")
                layer = "model.layers.1"
                attn = layer + ".self_attn"
                rest = lambda d: sum(v for n, v in d.items()  # noqa: E731
                                     if n.startswith(layer + ".") and not n.startswith(attn))
                print("%s %s: MoE layer without attention: formulas %d B, autograd %d B (%+.2f%%)"
                      % (model_type, name, rest(ours), rest(theirs), 100.0 * (rest(ours) - rest(theirs)) / rest(theirs)))
                self.assertLess(abs(rest(ours) - rest(theirs)), 0.01 * rest(theirs))
                for m in (*q_modules, "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj"):
                    self.assertEqual(ours.get(f"{attn}.{m}", 0), theirs.get(f"{attn}.{m}", 0), m)

    def test_mla_attention_flops_are_pytorchs_sdpa_formulas(self):
        # DeepSeek-V3's attention: q·k over 192 dims, v of 128; the attention module's own
        # FLOPs against torch.utils.flop_counter's SDPA formulas at that shape.
        from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count
        show = peer.shardscope("model", "show", "--model", peer.sample("models", "deepseek-v3", "config.json"),
                               "--batch", "1", "--seq", "4096", "--json", "--no-fold", "--depth", "5")
        fwd, bwd = self_values(show, "fwd_flops"), self_values(show, "bwd_flops")
        qk, v = (1, 128, 4096, 192), (1, 128, 4096, 128)
        self.assertAlmostEqual(fwd["model.layers.0.self_attn"], sdpa_flop_count(qk, qk, v), delta=1e-9 * fwd["model.layers.0.self_attn"])
        self.assertAlmostEqual(bwd["model.layers.0.self_attn"], sdpa_backward_flop_count(v, qk, qk, v),
                               delta=1e-9 * bwd["model.layers.0.self_attn"])

if __name__ == "__main__":
    unittest.main(verbosity=2)
