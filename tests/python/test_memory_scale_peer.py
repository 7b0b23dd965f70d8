# SPDX-License-Identifier: Apache-2.0
"""Peer test at full size: the simulator's peak allocated memory against PyTorch's own
accounting (FSDPMemTracker under FakeTensorMode, 8 fake ranks) for Llama-3.1-8B,
Qwen2-7B, Qwen3-8B, OLMo-2-7B, Phi-4, Gemma-2-9B, Mixtral-8x7B and Qwen1.5-MoE-A2.7B at micro-batch 2 x 8192, bf16 parameters with fp32 reduce, one unit per decoder
layer, the Hugging Face `labels=` loss, through tests/oracles/memory_oracle.py (which shards with
samples/apply_plan.py, as a user's script does). Nothing is allocated: each case takes
about 15 s on a 2-core machine.

Checkpointing: full, every second block, torchtitan's op-level selective checkpointing and
attention-only.
Also: under a mixed-precision plan the prediction does not depend on --activation-dtype
(activations follow the compute dtype; fp32 stays fp32 where PyTorch keeps it).
"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

peer.require("torch")
peer.require("transformers")
sys.path.insert(0, os.path.join(peer.SOURCE, "tests", "oracles"))
import bench_memory  # noqa: E402
import memory_oracle  # noqa: E402

GOAL = 0.03


class MemoryAtScale(unittest.TestCase):
    def run_plan(self, model, p):
        """The oracle and the simulator on plan `p` (a dict) for a sample model."""
        tmp = tempfile.mkdtemp()
        plan = os.path.join(tmp, "plan.json")
        with open(plan, "w") as f:
            json.dump(p, f)
        r = memory_oracle.compare(bench_memory.model_config(model, tmp), plan)
        memory_oracle.print_table(r)
        return r

    def case(self, model, ac="none", reshard=True, precision="bf16", world=8, batch=2, seq=8192):
        p = bench_memory.plan_for(model, "full" if ac == "attention" else ac, reshard, precision, batch, seq, world)
        if ac == "attention":  # not in the benchmark's matrix
            p["defaults"]["activation_checkpointing"] = "attention"
        return self.run_plan(model, p)

    def test_llama31_8b_bf16(self):
        r = self.case("llama3.1-8b")
        self.assertLess(abs(r["error"]), GOAL)
        # Category by category at the peak (start of the loss's backward): equal layouts.
        theirs, ours = r["fsdp_mem_tracker"], r["shardscope"]["at_peak"]
        for t, o in (("Sharded Param", "sharded_params"), ("OptState", "optimizer_state"),
                     ("Activation", "activations"), ("Temp", "temporaries")):
            self.assertAlmostEqual(ours.get(o, 0), theirs[t], delta=0.01 * theirs["Total"], msg=t)

    def test_llama31_8b_every_checkpointing_mode(self):
        # full, torchtitan's every-2nd-block, op-level selective (its default preset) and
        # attention-only (each self_attn checkpointed), applied by samples/apply_plan.py
        # exactly as the FSDP2 export says.
        for ac in ("full", "every2", "selective_op", "attention"):
            with self.subTest(ac=ac):
                self.assertLess(abs(self.case("llama3.1-8b", ac=ac)["error"]), GOAL)

    def test_published_8b_selective_fits_96_gb(self):
        # The published-style run: per-layer units, bf16/fp32, 2 x 8192, selective AC
        # on 8 GPUs of 96 GB fits (it was predicted as a 104 GiB out-of-memory peak).
        r = self.case("llama3.1-8b", ac="selective_op")
        self.assertLess(r["shardscope"]["peak_allocated_bytes"], 96e9)
        self.assertLess(r["fsdp_mem_tracker"]["Total"], 96e9)

    def test_qwen2_7b_bf16(self):
        self.assertLess(abs(self.case("qwen2-7b")["error"]), GOAL)

    def test_qwen3_8b_bf16(self):
        # Qwen3's per-head q_norm and k_norm (native loader since 2026-11-25).
        self.assertLess(abs(self.case("qwen3-8b")["error"]), GOAL)
        self.assertLess(abs(self.case("qwen3-8b", ac="selective_op")["error"]), GOAL)

    def test_olmo2_7b_bf16(self):
        # OLMo-2's post-norms and fp32 weight multiply; its positions stop at 4096.
        self.assertLess(abs(self.case("olmo2-7b", seq=4096)["error"]), GOAL)

    def test_mixtral_8x7b_bf16(self):
        # Mixtral's experts under balanced routing (memory_oracle.balanced_moe_routing: the
        # same operators as transformers' block, each expert given tokens x top_k / experts
        # slots). Before counting the expert output kept by the routing multiply and the
        # weighted output kept by index_add_, ours was -5.3%. Under op-level selective
        # checkpointing it was +3.01% (full +2.42%) before the expert loop's recomputed
        # activations and gradients stopped being counted as all alive at once
        # (ModuleRun::loopSaved).
        for ac in ("none", "selective_op"):
            with self.subTest(ac=ac):
                self.assertLess(abs(self.case("mixtral-8x7b", ac=ac)["error"]), GOAL)

    def test_gemma2_9b(self):
        # Gemma-2 (native loader): tied embeddings, so the root holds lm_head and the loss;
        # tanh keeps the softcapped logits. In fp32 the tracker peaks at the loss's backward,
        # not when lm_head's weight gradient is made, since the loss's log-probabilities and
        # the tanh output are freed by then (ModuleRun::firstGradSavedAfter): +2.48% before
        # that was counted. At 2048, below its 4096 sliding window (past it:
        # test_past_the_sliding_window and bench memory's Gemma rows at 8192).
        for precision, batch in (("bf16", 2), ("fp32", 1)):
            with self.subTest(precision=precision):
                r = self.case("gemma2-9b", precision=precision, batch=batch, seq=2048)
                self.assertLess(abs(r["error"]), 0.01)

    def test_past_the_sliding_window(self):
        # From seq_len == window on, each sliding-window layer's SDPA keeps a (b, 1, s, s)
        # mask in the compute dtype, and transformers repeats K and V to every query head
        # (ModuleCost::windowSavedBytes). Before they were counted: Mistral-7B-v0.1 at
        # 2 x 8192 (window 4096 on all 32 layers) -10.89%, Gemma-3-1B at 2 x 2048 (window 512
        # on 22 of 26 layers; one key/value head, whose repeat is a view) -1.33%.
        for model, seq in (("mistral-7b-v0.1", 8192), ("gemma3-1b", 2048)):
            with self.subTest(model=model):
                self.assertLess(abs(self.case(model, seq=seq)["error"]), 0.01)

    def test_falcon_rw_alibi(self):
        # falcon-rw-1b: the sequential block and ALiBi, one (b, heads, s, s) bias in the
        # compute dtype that every layer's SDPA keeps (8 GiB at 2 x 8192), held to the end
        # of backward with and without checkpointing. Refused before; measured +0.01%.
        for ac in ("none", "full"):
            with self.subTest(ac=ac):
                self.assertLess(abs(self.case("falcon-rw-1b", ac=ac)["error"]), 0.01)

    def test_phi4_bf16(self):
        # Phi-3's architecture (native loader since 2026-11-25): fused qkv_proj and
        # gate_up_proj, o_proj registered before qkv_proj (op-level checkpointing keeps every
        # second mm in execution order), RoPE through a cat (o_proj saves a copy).
        for ac in ("none", "selective_op"):
            with self.subTest(ac=ac):
                self.assertLess(abs(self.case("phi4", ac=ac)["error"]), GOAL)

    def test_more_dense_families(self):
        # Seed-OSS-36B (q/k/v biases; dropout off, see bench_memory.MODELS), Granite-3.1-8B
        # (multipliers, tied), SmolLM3-3B (no RoPE every 4th layer, tied), OLMo-3-7B (OLMo-2
        # with 4096 windows on 3 layers in 4: past the window at 8192), EXAONE-4.0-32B
        # (post-norms, per-head q/k norms, windows and RoPE on 3 layers in 4) and
        # OLMo-1.7-7B (parameterless fp32 LayerNorms, clip_qkv; 4096 positions) and
        # StarCoder2-7B (LayerNorms, biases, GELU MLP, a 4096 window on every layer), phi-2
        # (the parallel block, partial RoPE, the unfused GELU; 2048 positions), dropout off,
        # Pythia-6.9B (GPT-NeoX: parallel residual, fused query_key_value; 2048) and Command
        # R7B (Cohere2: parallel block under an fp32 LayerNorm, a 256k vocabulary).
        for model in ("seed-oss-36b", "granite-3.1-8b", "smollm3-3b", "olmo3-7b", "exaone4-32b", "olmo-1.7-7b",
                      "starcoder2-7b", "phi-2", "pythia-6.9b", "command-r7b"):
            with self.subTest(model=model):
                seq = min(8192, bench_memory.max_seq(model))
                self.assertLess(abs(self.case(model, seq=seq)["error"]), GOAL)

    def test_more_moe_families(self):
        # OLMoE-1B-7B (64 experts of which 8 per token, q/k norms, K and V repeated before
        # SDPA; 4096 positions) and Granite-3.1-1B-A400M (32 experts of which 8, in two 3-D
        # parameters a layer; multipliers, tied), balanced routing in the oracle.
        for model in ("olmoe-1b-7b", "granite-3.1-1b-a400m"):
            with self.subTest(model=model):
                seq = min(8192, bench_memory.max_seq(model))
                self.assertLess(abs(self.case(model, seq=seq)["error"]), GOAL)

    def test_gpt_oss_eager_attention(self):
        # gpt-oss-20b on eager attention (transformers has no SDPA path for its sinks): every
        # layer keeps its (b, heads, s, s + 1) probabilities (about 1 GiB a layer at 2 x 2048,
        # the length its fine-tuning recipes use); 32 experts of which 4 under balanced
        # routing. Without checkpointing +0.00 %. With full checkpointing the tracker peaks in
        # a layer's backward, where the eager attention's s x s gradients are counted two at
        # a time beside its probabilities: -2.2 % (about one s x s tensor short).
        for ac in ("none", "full"):
            with self.subTest(ac=ac):
                self.assertLess(abs(self.case("gpt-oss-20b", ac=ac, seq=2048)["error"]), GOAL)

    def cut_case(self, model, config, cases):
        """A bundled model with its config changed (`config`: cut to a few layers), each
        (checkpointing, micro-batch, seq) of `cases` on 8 ranks in bf16 with an fp32 reduce,
        within GOAL of FSDPMemTracker."""
        tmp = tempfile.mkdtemp()
        with open(peer.sample("models", model, "config.json")) as f:
            cfg = json.load(f)
        cfg.update(config)
        path = os.path.join(tmp, model, "config.json")
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as f:
            json.dump(cfg, f)
        for ac, batch, seq in cases:
            with self.subTest(model=model, ac=ac, batch=batch, seq=seq):
                plan = os.path.join(tmp, "plan-%s-%d-%d.json" % (ac, batch, seq))
                with open(plan, "w") as f:
                    json.dump(bench_memory.plan_for(model, ac, True, "bf16", batch, seq, 8, path), f)
                r = memory_oracle.compare(path, plan)
                memory_oracle.print_table(r)
                self.assertLess(abs(r["error"]), GOAL)

    def test_glm45_air_deepseek_experts(self):
        # GLM-4.5-Air: DeepSeek-V3's block (a group-limited sigmoid router with its correction
        # bias, a shared expert, transformers' per-expert torch.where loop; 128 experts of
        # which 8) under balanced routing, partial RoPE and q/k biases, cut to four layers
        # (the first dense, as first_k_dense_replace says) so that the tracker, which hooks
        # every expert, takes a minute. The tracker peaks in a MoE layer's backward, where
        # each expert's activations go as its gradients appear: +6.0 % before that was
        # modelled, +2.75 % after.
        self.cut_case("glm-4.5-air", {"num_hidden_layers": 4}, [("none", 2, 4096)])

    def test_llama4_scout_every_expert_on_every_token(self):
        # Llama-4 Scout's text model cut to four layers (three RoPE layers with chunked
        # attention and the L2 q/k norm, one NoPE layer; every layer Llama4TextMoe, whose 16
        # experts each run every token as transformers 4.57 trains it, beside the shared
        # expert). No checkpointing at 2 x 4096 and at 2 x 8192, where the chunked layers'
        # SDPA gets a mask: +0.00 % both. Full checkpointing at 2 x 4096: -2.1 % (the
        # tracker peaks in a MoE layer's backward, whose experts' gradients at 2I a token
        # each outgrow the two output-sized tensors the step program holds).
        self.cut_case("llama4-scout-17b-16e",
                      {"num_hidden_layers": 4, "moe_layers": [0, 1, 2, 3], "no_rope_layers": [1, 1, 1, 0]},
                      [("none", 2, 4096), ("none", 2, 8192), ("full", 2, 4096)])

    def test_deepseek_v3_latent_attention(self):
        # DeepSeek-V3's multi-head latent attention (q and k 192 wide a head, v 128) and its
        # mixture of experts (group-limited sigmoid router, shared expert, the per-expert
        # torch.where loop under balanced routing): Moonlight-16B-A3B (q_proj, 64 experts of
        # which 6) cut to four layers, the first dense; DeepSeek-V3 (q through its LoRA
        # bottleneck, 256 experts of which 8) cut to four, the last a MoE layer. The CPU's
        # SDPA keeps the s x s weights for unequal head sizes where a GPU's efficient kernel
        # does not: the oracle runs SDPA's allocations as a GPU does
        # (memory_oracle.gpu_like_sdpa_for_unequal_head_sizes).
        self.cut_case("moonlight-16b-a3b", {"num_hidden_layers": 4}, [("none", 2, 4096), ("full", 2, 4096)])
        self.cut_case("deepseek-v3", {"num_hidden_layers": 4}, [("none", 1, 4096)])

    def test_deepseek_v2_lite(self):
        # DeepSeek-V2's block: the latent attention (no q LoRA in V2-Lite), a softmax router
        # without renormalisation, two shared experts, and the routed outputs combined by
        # sorting the token slots, one cat and a scatter (balanced routing in the oracle); cut
        # to four layers, the first dense.
        self.cut_case("deepseek-v2-lite", {"num_hidden_layers": 4}, [("none", 2, 4096)])

    def test_ernie45_fp32_router(self):
        # Ernie-4.5-21B-A3B cut to four layers (the first dense): Qwen's expert loop (64
        # experts of which 6) under balanced routing, two shared experts, and the router's
        # gate, an fp32 Linear fed hidden_states.float(), a unit of its own in fp32 in each
        # MoE layer (bf16 FSDP2 fails in its forward otherwise); RoPE in fp32 with each layer's
        # own cos and sin.
        self.cut_case("ernie-4.5-21b-a3b", {"num_hidden_layers": 4, "moe_layer_end_index": 3},
                      [("none", 2, 4096), ("full", 2, 4096)])

    def test_mpt_7b_eager_alibi_attention(self):
        # MPT-7B (MosaicML's published FSDP runs' family) as transformers trains it: eager
        # attention with the fp32 ALiBi bias, so each layer keeps its fp32 probabilities and
        # their bf16 cast (6 B a head a key position: 1.5 GiB a layer at 2 x 2048), matmul's
        # copies of q, k and v, and the causal mask once: +0.00 % at 2 x 2048. With full
        # checkpointing (measured, not in the suite) -6.5 %: the tracker peaks in a recomputed
        # layer's backward, beside its s x s gradients, which the step program does not hold
        # there (docs/memory-fidelity.md).
        self.assertLess(abs(self.case("mpt-7b", seq=2048)["error"]), GOAL)

    def test_qwen15_moe_a27b_bf16(self):
        # Qwen2-MoE (native loader since 2026-11-25): 60 experts of which 4 per token, the
        # sigmoid-gated shared expert, no renormalisation; balanced routing in the oracle.
        # About 100 s: FSDPMemTracker hooks each of its 1,440 experts.
        self.assertLess(abs(self.case("qwen1.5-moe-a2.7b")["error"]), GOAL)

    def blocks_per_unit(self, model, n, layers, batch, seq, ac="full"):
        """Units of n decoder layers each (as `recommend` proposes), embedding and norm+head
        units of their own, the checkpointing mode on every unit."""
        p = bench_memory.plan_for("llama3.1-8b", "none", True, "bf16", batch, seq, 8)
        p["wrap"] = {"policy": "none"}
        p["units"] = [{"modules": ["model.layers.%d" % j for j in range(i, i + n)]} for i in range(0, layers, n)]
        p["units"] += [{"modules": ["model.embed_tokens"]}, {"name": "norm+head", "modules": ["model.norm", "lm_head"]}]
        p["defaults"]["activation_checkpointing"] = ac
        return self.run_plan(model, p)

    def test_units_of_several_blocks(self):
        # Each of a unit's modules is its own checkpoint (the export's per-module
        # activation_checkpointing): each keeps its input, and backward recomputes one at a
        # time. Before 2026-11-27 a unit was one checkpoint: Llama-3.1-8B with 2 layers a
        # unit -4.9 % (Llama-3-70B on 64 ranks, the plan recommend picked, -15.5 %: out of
        # memory in truth), Llama-2-7B with 4 layers a unit at 1 x 4096 +10.1 %.
        self.assertLess(abs(self.blocks_per_unit("llama3.1-8b", 2, 32, 2, 8192)["error"]), GOAL)
        self.assertLess(abs(self.blocks_per_unit("llama2-7b", 4, 32, 1, 4096)["error"]), GOAL)
        self.assertLess(abs(self.blocks_per_unit("llama3.1-8b", 2, 32, 2, 8192, ac="selective_op")["error"]), GOAL)

    def test_int_reshard(self):
        # reshard_after_forward=4 keeps a quarter of each unit after forward, gathered back
        # over 4 ranks in backward (what recommend proposes as "reshard 8" on 64 GPUs). The
        # oracle builds FSDP2's post-forward mesh outside fake mode
        # (memory_oracle.post_forward_mesh_outside_fake_mode); seen -0.00 %.
        r = self.case("llama3.1-8b", ac="full", reshard=4, batch=1, seq=4096)
        self.assertLess(abs(r["error"]), GOAL)

    def test_activation_dtype_flag_does_not_matter_under_mixed_precision(self):
        model = os.path.join(peer.SOURCE, "samples", "models", "llama3.1-8b", "config.json")
        tmp = tempfile.mkdtemp()
        plan = os.path.join(tmp, "plan.json")
        with open(plan, "w") as f:
            json.dump(bench_memory.plan_for("llama3.1-8b", "none", True, "bf16", 2, 8192, 8), f)
        cluster = memory_oracle.gpu_cluster(8, tmp)
        peaks = {d: memory_oracle.ours(model, plan, cluster, ["--activation-dtype", d])["peak_allocated_bytes"]
                 for d in ("float32", "bfloat16", "float16")}
        print("peak by --activation-dtype:", peaks)
        self.assertEqual(len(set(peaks.values())), 1, peaks)

    def collectives(self, plan, track):
        """The all-gathers and reduce-scatters FSDP2 issues in the oracle's second step, as
        (unit, kind) in order: with FSDPMemTracker as the oracle instruments it, or without
        any tracker."""
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
        group = pg.FSDPParamGroup
        calls, saved = [], (pg.foreach_all_gather, pg.foreach_reduce, group.unshard, group.post_backward)
        current = [None]

        def in_unit(method):
            def run(self, *a, **k):
                current[0] = self._module_fqn
                return method(self, *a, **k)
            return run

        group.unshard, group.post_backward = in_unit(saved[2]), in_unit(saved[3])
        pg.foreach_all_gather = lambda *a, **k: calls.append((current[0], "AG")) or saved[0](*a, **k)
        pg.foreach_reduce = lambda *a, **k: calls.append((current[0], "RS")) or saved[1](*a, **k)
        try:
            memory_oracle.oracle(os.path.join(peer.SOURCE, "samples", "models", "llama3.1-8b", "config.json"),
                                 plan, 64, 1, 256, steps=2, track=track)
        finally:
            pg.foreach_all_gather, pg.foreach_reduce, group.unshard, group.post_backward = saved
        return calls[len(calls) // 2:]

    def test_the_oracle_runs_what_fsdp2_runs(self):
        # FSDPMemTracker swaps FSDP2's forward hooks for one pair per module; for the
        # `fully_shard([model.norm, lm_head])` unit that made FSDP2 all-gather it twice in
        # forward and twice in backward (memory_oracle.keep_fsdp_group_hooks). As the oracle
        # instruments it, the tracker must leave FSDP2's collectives exactly as they are
        # without it.
        tmp = tempfile.mkdtemp()
        plan = os.path.join(tmp, "plan.json")
        with open(plan, "w") as f:
            json.dump(bench_memory.plan_for("llama3.1-8b", "full", True, "bf16", 1, 256, 64), f)
        bare, tracked = self.collectives(plan, False), self.collectives(plan, True)
        self.assertEqual(sum(1 for c in bare if c[1] == "AG"), 2 * 32 + 2 + 2, bare)
        self.assertEqual(tracked, bare)

    def test_64_ranks_micro_batch_1x2048(self):
        # The issue's 64-GPU rows. Before the oracle kept FSDP2's group hooks (above) and
        # stopped counting DTensor's shape-propagation tensors as optimizer state
        # (memory_oracle.hide_dtensor_shape_propagation), these were -3.8% and -6.1%, or
        # -28.9% when DTensor's propagation cache was cold.
        r = self.case("llama3.1-8b", world=64, batch=1, seq=2048)
        self.assertLess(abs(r["error"]), GOAL)
        r = self.case("llama3.1-8b", ac="full", world=64, batch=1, seq=2048)
        self.assertLess(abs(r["error"]), 0.05)
        # AdamW's state is two fp32 copies of the parameter shard, whatever ran before.
        self.assertAlmostEqual(r["fsdp_mem_tracker"]["OptState"], 2 * r["fsdp_mem_tracker"]["Sharded Param"],
                               delta=0.01 * r["fsdp_mem_tracker"]["OptState"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
