#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's own memory accounting for a full-size model and plan, next to ShardScope's.

    python tests/oracles/memory_oracle.py --model samples/models/llama3.1-8b/config.json \\
        --plan samples/plans/llama-per-block.json [--world 8] [--batch 2 --seq 8192] \\
        [--micro-batches 4 [--sync-every-micro-batch]] [--json]

What it runs: the real Hugging Face model built from its config.json under FakeTensorMode
(nothing is allocated: an 8B or 70B model at seq 8192 costs seconds and no memory), sharded
with the real `fully_shard` exactly as `shardscope plan export --format fsdp2` says, applied
by samples/apply_plan.py (the same code a user's training script runs), on a fake process
group of the plan's world size (FakeStore). Two training steps run (forward with the Hugging
Face `labels=` loss, backward, AdamW step, zero_grad) under PyTorch's FSDPMemTracker; the
second step's peak is reported (it has optimizer state, like a steady-state step), with the
tracker's categories, next to `shardscope simulate --json` on the same model and plan.

The tracker runs on the CPU device: PyTorch picks the CPU flash-attention kernel for SDPA,
which saves what the CUDA flash kernel saves (output and fp32 logsumexp). It counts tensor
bytes (no allocator rounding), which is also what the simulator's peak allocated counts
after its own 512-byte rounding.
"""
import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_record  # noqa: E402
GIB = 1024.0**3

# FSDPMemTracker's categories -> the simulator's (memory_at_peak keys).
CATEGORIES = [
    ("Sharded Param", "sharded_params"),
    ("Unsharded Param", "unsharded_params"),
    ("All Gather", "all_gather_buffers"),
    ("Buffer", None),
    ("Sharded Grad", None),
    ("Unsharded Grad", "gradients"),
    ("Reduce Scatter", "reduce_scatter_buffers"),
    ("Activation", "activations"),
    ("Temp", "temporaries"),
    ("OptState", "optimizer_state"),
    ("Inputs", None),
]


def shardscope_bin():
    return os.environ.get("SHARDSCOPE_BIN") or os.path.join(ROOT, "build", "engine", "shardscope")


def run_shardscope(*args):
    r = subprocess.run([shardscope_bin(), *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"shardscope {' '.join(args)} exited {r.returncode}:\n{r.stderr}{r.stdout}")
    return r.stdout


def plan_with_shape(plan_path, batch, seq, world, tmp, micro_batches=None, sync_every=None):
    """The plan file with the batch shape, world and gradient accumulation overridden (a
    copy; the input is kept)."""
    with open(plan_path) as f:
        plan = json.load(f)
    if micro_batches:
        plan.setdefault("gradient_accumulation", {})["micro_batches"] = micro_batches
    if sync_every is not None:
        plan.setdefault("gradient_accumulation", {})["sync_every_micro_batch"] = sync_every
    training = plan.setdefault("training", {})
    if batch:
        training["micro_batch_size"] = batch
    if seq:
        training["seq_len"] = seq
    if world and not plan.get("mesh"):
        plan["mesh"] = {"shape": [world]}
    out = os.path.join(tmp, "plan.json")
    with open(out, "w") as f:
        json.dump(plan, f)
    return out, plan


def gpu_cluster(world, tmp):
    """samples/clusters/h100-sxm-8x8.json resized to `world` GPUs (8 a node); the simulator
    reports its peak whether or not it fits."""
    with open(os.path.join(ROOT, "samples", "clusters", "h100-sxm-8x8.json")) as f:
        c = json.load(f)
    c.pop("sources", None)
    c["nodes"] = max(1, world // 8)
    c["node"]["devices_per_node"] = min(8, world)
    c["name"] = f"{world} x H100 (memory oracle)"
    path = os.path.join(tmp, "cluster.json")
    with open(path, "w") as f:
        json.dump(c, f)
    return path


def ours(model, plan, cluster, extra):
    return json.loads(run_shardscope("simulate", "--model", model, "--plan", plan, "--cluster", cluster, "--json", *extra))



def balanced_moe_routing():
    """The sparse MoE blocks of Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, Granite-MoE, gpt-oss,
    DeepSeek-V2, DeepSeek-V3, GLM-4.5 and Ernie-4.5 with tokens routed evenly over the
    experts.

    Hugging Face's loop picks each expert's tokens with `torch.where` on the router's choice,
    whose output size depends on the values, which fake tensors do not have. This forward
    runs the same operators (router, softmax in fp32, top-k, the renormalisation where the
    block does it: always for Mixtral, with norm_topk_prob for Qwen, per-expert index, expert
    MLP, weighting, index_add_, and Qwen2-MoE's sigmoid-gated shared expert) with each expert
    given exactly tokens x top_k / experts token slots, the balanced routing a load-balanced
    router aims for and what ShardScope assumes. The saved activations are then those of a
    balanced step.
    """
    import torch
    import torch.nn.functional as F
    from transformers.models.deepseek_v2 import modeling_deepseek_v2
    from transformers.models.deepseek_v3 import modeling_deepseek_v3
    from transformers.models.ernie4_5_moe import modeling_ernie4_5_moe
    from transformers.models.glm4_moe import modeling_glm4_moe
    from transformers.models.gpt_oss import modeling_gpt_oss
    from transformers.models.granitemoe import modeling_granitemoe
    from transformers.models.mixtral import modeling_mixtral
    from transformers.models.olmoe import modeling_olmoe
    from transformers.models.qwen2_moe import modeling_qwen2_moe
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hs = hidden_states.view(-1, hidden_dim)
        tokens = hs.shape[0]
        router_logits = self.gate(hs)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, _ = torch.topk(routing_weights, self.top_k, dim=-1)
        if getattr(self, "norm_topk_prob", True):
            routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hs.dtype)
        final = torch.zeros((tokens, hidden_dim), dtype=hs.dtype, device=hs.device)
        per_expert = tokens * self.top_k // self.num_experts
        for e in range(self.num_experts):
            slots = torch.arange(e * per_expert, (e + 1) * per_expert, device=hs.device)
            top_x, idx = slots % tokens, slots // tokens
            current = hs[None, top_x].reshape(-1, hidden_dim)
            out = self.experts[e](current) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, out.to(hs.dtype))
        if hasattr(self, "shared_expert"):
            # transformers' order: the shared expert, then its gate (the order matters to
            # op-level checkpointing, which keeps every second mm as it comes).
            shared = self.shared_expert(hs)
            final = final + F.sigmoid(self.shared_expert_gate(hs)) * shared
        return final.reshape(batch_size, sequence_length, hidden_dim), router_logits

    def granite_forward(self, layer_input):
        # GraniteMoeMoE and its router's operators, the slots sorted by a balanced expert
        # choice (slot s to expert s // per_expert) instead of the router's, and the experts'
        # sizes known without reading a tensor (the router's .tolist()).
        bsz, length, emb_size = layer_input.size()
        layer_input = layer_input.reshape(-1, emb_size)
        router = self.router
        logits = router.layer(layer_input).float()
        top_k_logits, top_k_indices = logits.topk(router.top_k, dim=1)
        top_k_gates = torch.softmax(top_k_logits, dim=1).type_as(layer_input)
        slots = layer_input.shape[0] * router.top_k
        per_expert = slots // router.num_experts
        expert_size = [per_expert] * router.num_experts
        choice = torch.arange(slots, device=layer_input.device) // per_expert
        _, index_sorted_experts = choice.sort(0)
        batch_index = index_sorted_experts.div(router.top_k, rounding_mode="trunc")
        batch_gates = top_k_gates.flatten()[index_sorted_experts]
        expert_inputs = layer_input[batch_index]
        hidden_states = self.input_linear(expert_inputs, expert_size)
        chunked_hidden_states = hidden_states.chunk(2, dim=-1)
        hidden_states = self.activation(chunked_hidden_states[0]) * chunked_hidden_states[1]
        expert_outputs = self.output_linear(hidden_states, expert_size)
        expert_outputs = expert_outputs * batch_gates[:, None]
        zeros = torch.zeros((bsz * length, self.input_size), dtype=expert_outputs.dtype,
                            device=expert_outputs.device)
        layer_output = zeros.index_add(0, batch_index, expert_outputs)
        return layer_output.view(bsz, length, self.input_size), logits

    def slot_pairs(e, per_expert, tokens, device):
        # Expert e's (token, k) slots [e x per_expert, (e + 1) x per_expert) as the columns of
        # one (n, 2) int64 tensor, as torch.where's nonzero makes them: (k, token) order.
        slots = torch.arange(e * per_expert, (e + 1) * per_expert, device=device)
        return torch.stack([slots // tokens, slots % tokens], dim=1)

    def gpt_oss_experts_forward(self, hidden_states, router_indices=None, routing_weights=None):
        # GptOssExperts' training loop (its operators, in order), expert e given the slots
        # [e x per_expert, (e + 1) x per_expert); the token index is a column of an
        # (n, 2) int64 tensor, as torch.where's nonzero makes it.
        batch_size = hidden_states.shape[0]
        hidden_states = hidden_states.reshape(-1, self.hidden_size)
        num_experts = routing_weights.shape[1]
        tokens = hidden_states.shape[0]
        next_states = torch.zeros_like(hidden_states, dtype=hidden_states.dtype, device=hidden_states.device)
        with torch.no_grad():
            expert_mask = F.one_hot(router_indices, num_classes=num_experts + 1).permute(2, 1, 0)
        per_expert = tokens * router_indices.shape[1] // num_experts
        for e in range(num_experts):
            with torch.no_grad():
                token_idx = slot_pairs(e, per_expert, tokens, hidden_states.device)[:, 1]
            current_state = hidden_states[token_idx]
            gate_up = current_state @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            gate = gate.clamp(min=None, max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            glu = gate * torch.sigmoid(gate * self.alpha)
            gated_output = (up + 1) * glu
            out = gated_output @ self.down_proj[e] + self.down_proj_bias[e]
            weighted_output = out * routing_weights[token_idx, e, None]
            next_states.index_add_(0, token_idx, weighted_output.to(hidden_states.dtype))
        del expert_mask
        return next_states.view(batch_size, -1, self.hidden_size)

    def deepseek_moe(self, hidden_states, topk_indices, topk_weights):
        # DeepseekV3MoE.moe and Glm4MoeMoE.moe (their operators, in order), expert e given
        # the (token, k) slots [e x per_expert, (e + 1) x per_expert); the token and weight
        # indices are the columns of one (n, 2) int64 tensor, as torch.where's nonzero makes.
        final_hidden_states = torch.zeros_like(hidden_states, dtype=topk_weights.dtype)
        expert_mask = F.one_hot(topk_indices, num_classes=len(self.experts)).permute(2, 0, 1)
        tokens, top_k = topk_indices.shape
        per_expert = tokens * top_k // len(self.experts)
        for e, expert in enumerate(self.experts):
            pairs = slot_pairs(e, per_expert, tokens, hidden_states.device)
            token_indices, weight_indices = pairs[:, 1], pairs[:, 0]
            expert_weights = topk_weights[token_indices, weight_indices]
            expert_input = hidden_states[token_indices]
            expert_output = expert(expert_input)
            weighted_output = expert_output * expert_weights.unsqueeze(-1)
            final_hidden_states.index_add_(0, token_indices, weighted_output)
        del expert_mask
        return final_hidden_states.type(hidden_states.dtype)

    def deepseek_v2_moe(self, hidden_states, topk_ids, topk_weight):
        # DeepseekV2MoE.moe (its operators, in order): the token slots sorted by expert, each
        # expert given per_expert consecutive sorted slots (its count is a tensor read back
        # in transformers' loop), one cat, the scatter back and the weighted sum.
        cnts = topk_ids.new_zeros((topk_ids.shape[0], len(self.experts)))
        cnts.scatter_(1, topk_ids, 1)
        cnts.sum(dim=0)
        indices = topk_ids.view(-1).argsort()
        sorted_tokens = hidden_states[indices // topk_ids.shape[1]]
        per_expert = indices.shape[0] // len(self.experts)
        outs = torch.cat([expert(sorted_tokens[i * per_expert:(i + 1) * per_expert])
                          for i, expert in enumerate(self.experts)], dim=0)
        new_x = torch.empty_like(outs)
        new_x[indices] = outs
        return (new_x.view(*topk_ids.shape, -1).type(topk_weight.dtype).mul_(topk_weight.unsqueeze(dim=-1))
                .sum(dim=1).type(new_x.dtype))

    def ernie_forward(self, hidden_states):
        # Ernie4_5_MoeSparseMoeBlock.forward (its operators, in order): the shared experts,
        # the fp32 router with autocast off (gate on hidden_states.float(), softmax, the
        # correction bias before the top k, gather, the clamped renormalisation, the cast
        # back), then every expert with the (k, token) slots [e x per_expert, (e + 1) x
        # per_expert) as two int64 index tensors, as torch.where makes them.
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        tokens = hidden_states.shape[0]
        if self.shared_experts is not None:
            shared_output = self.shared_experts(hidden_states)
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            router_logits = self.gate(hidden_states.float())
            routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
            _, selected_experts = torch.topk(self.moe_statics(routing_weights), self.top_k, dim=-1)
            routing_weights = torch.gather(routing_weights, dim=-1, index=selected_experts)
            routing_weights = routing_weights / torch.clamp(
                routing_weights.sum(dim=-1, keepdim=True), min=self.norm_min)
            routing_weights = routing_weights.to(hidden_states.dtype)
        final_hidden_states = torch.zeros((tokens, hidden_dim), dtype=hidden_states.dtype,
                                          device=hidden_states.device)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        per_expert = tokens * self.top_k // self.num_experts
        for e in range(self.num_experts):
            pairs = slot_pairs(e, per_expert, tokens, hidden_states.device)
            idx, top_x = pairs[:, 0], pairs[:, 1]
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current_hidden_states = self.experts[e](current_state) * routing_weights[top_x, idx, None]
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))
        del expert_mask
        if self.shared_experts is not None:
            final_hidden_states = final_hidden_states + shared_output
        return final_hidden_states.reshape(batch_size, sequence_length, hidden_dim), router_logits

    modeling_ernie4_5_moe.Ernie4_5_MoeSparseMoeBlock.forward = ernie_forward
    modeling_mixtral.MixtralSparseMoeBlock.forward = forward
    modeling_qwen2_moe.Qwen2MoeSparseMoeBlock.forward = forward
    modeling_qwen3_moe.Qwen3MoeSparseMoeBlock.forward = forward
    modeling_olmoe.OlmoeSparseMoeBlock.forward = forward
    modeling_granitemoe.GraniteMoeMoE.forward = granite_forward
    modeling_gpt_oss.GptOssExperts.forward = gpt_oss_experts_forward
    modeling_deepseek_v2.DeepseekV2MoE.moe = deepseek_v2_moe
    modeling_deepseek_v3.DeepseekV3MoE.moe = deepseek_moe
    modeling_glm4_moe.Glm4MoeMoE.moe = deepseek_moe


def gpu_like_sdpa_for_unequal_head_sizes():
    """SDPA with a value head size other than the query's (DeepSeek's multi-head latent
    attention: q and k 192, v 128), as a GPU runs it.

    On the CPU, SDPA takes its math kernel for unequal head sizes, which keeps the s x s
    attention weights; on a GPU the flash kernel refuses them and the memory-efficient one
    runs, keeping q, k, v, its output (allocated (b, s, heads, d_v) and returned transposed,
    so merging the heads back is a view) and an fp32 logsumexp of (b, heads, s), and making
    gradients of q, k and v in backward. Under fake tensors only those allocations matter:
    this op makes them and nothing else. Calls with equal head sizes, or with a mask, go to
    PyTorch's own SDPA."""
    import torch
    import torch.nn.functional as F

    if getattr(F.scaled_dot_product_attention, "_shardscope_gpu_like", False):
        return
    sdpa = F.scaled_dot_product_attention

    class EfficientAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            b, heads, s, _ = q.shape
            out = q.new_empty((b, s, heads, v.shape[-1])).transpose(1, 2)
            lse = torch.empty((b, heads, s), dtype=torch.float32, device=q.device)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, _, _ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def patched(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *args, **kwargs):
        if query.shape[-1] != value.shape[-1] and attn_mask is None:
            return EfficientAttention.apply(query, key, value)
        return sdpa(query, key, value, attn_mask, dropout_p, is_causal, *args, **kwargs)

    patched._shardscope_gpu_like = True
    F.scaled_dot_product_attention = patched


def hide_dtensor_shape_propagation():
    """DTensor works out an op's output shape by running it on full-size (global-shape)
    tensors it makes "in fake tensor mode so that it avoids materializing memory"
    (torch/distributed/tensor/_sharding_prop.py, `_propagate_tensor_meta_non_cached`): on a
    GPU they cost nothing. Under this oracle the fake mode it finds is ours, so
    FSDPMemTracker, stacked above it, counted them: on an uncached op of AdamW's step on
    DTensor parameters (the first steps of a process, e.g. state init's zeros_like on a
    128256 x 4096 embedding) it reported 6.84 GiB of "OptState" for 0.93 GiB of state
    (Llama-3.1-8B on 64 ranks), and a smaller figure once an earlier case in the same process
    had filled DTensor's propagation cache. The tracker now ignores tensors made there."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    if getattr(ShardingPropagator, "_shardscope_hidden", False):
        return
    depth = [0]
    propagate, track = ShardingPropagator._propagate_tensor_meta_non_cached, MemTracker._track

    def propagate_hidden(self, *args, **kwargs):
        depth[0] += 1
        try:
            return propagate(self, *args, **kwargs)
        finally:
            depth[0] -= 1

    def track_unless_hidden(self, *args, **kwargs):
        if depth[0] == 0:
            return track(self, *args, **kwargs)

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate_hidden
    MemTracker._track = track_unless_hidden
    ShardingPropagator._shardscope_hidden = True


def keep_fsdp_group_hooks():
    """FSDPMemTracker swaps each FSDP state's forward hooks for its own, one pair per module
    (torch/distributed/_tools/fsdp2_mem_tracker.py, `_instrument_fsdp_module`). For a unit
    of several modules, `fully_shard([model.norm, lm_head])` as torchtitan and our exports
    write it, FSDP2 has one group hook pair: pre-forward on the first module to run,
    post-forward on the last (`_register_group_forward_hooks` in
    torch/distributed/fsdp/_fully_shard/_fsdp_state.py). Under the tracker the unit was
    all-gathered and resharded once per module in forward, got one pre-backward per module
    (a second all-gather of the whole unit while the first reduce-scatter's buffer is still
    held), and the first module's swapped hooks were never removed, so they stacked from
    step to step. Llama-3.1-8B on 64 ranks peaked at that second all-gather, 0.98 GiB above
    what FSDP2 itself runs. The tracker is instrumented here with FSDP2's own group hooks
    around its wrappers, one pair per state; its accounting is unchanged."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _SavedFSDPMethods
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_state import _register_group_forward_hooks

    if getattr(FSDPMemTracker, "_shardscope_group_hooks", False):
        return

    def states(tracker):
        seen = {}
        for module in tracker._root_mod.modules():
            if isinstance(module, FSDPModule):
                st = module._get_fsdp_state()
                if st._fsdp_param_group is not None and id(st) not in seen:
                    seen[id(st)] = st
        return list(seen.values())

    def hook(st, pre, post, always_call):
        if len(st._modules) == 1:
            m = st._modules[0]
            st._pre_forward_hook_handle = m.register_forward_pre_hook(pre, prepend=True, with_kwargs=True)
            st._post_forward_hook_handle = m.register_forward_hook(post, prepend=False, always_call=always_call)
        else:
            st._pre_forward_hook_handle = st._post_forward_hook_handle = _register_group_forward_hooks(
                st._modules, pre, post, st._modules_to_run_forward)

    def instrument(self):
        for st in states(self):
            st._pre_forward_hook_handle.remove()
            st._post_forward_hook_handle.remove()
            group, first = st._fsdp_param_group, st._modules[0]
            self._instrument_fsdp_sharded_params_grads(group)
            hook(st, self._fsdp_state_pre_forward(first, st._pre_forward),
                 self._fsdp_state_post_forward(first, st._post_forward), True)
            self._fsdp_mod_to_saved_methods[first] = _SavedFSDPMethods(group.pre_backward, group.post_backward)
            group.pre_backward = self._fsdp_param_group_pre_backward(first, group.pre_backward)
            group.post_backward = self._fsdp_param_group_post_backward(first, group.post_backward)

    deregister = FSDPMemTracker._deregister_module_and_optimizer_hooks

    def uninstrument(self):
        for first, saved in self._fsdp_mod_to_saved_methods.items():
            st = first._get_fsdp_state()
            st._pre_forward_hook_handle.remove()
            st._post_forward_hook_handle.remove()
            hook(st, st._pre_forward, st._post_forward, False)  # as fully_shard registers them
            st._fsdp_param_group.pre_backward = saved.pre_backward
            st._fsdp_param_group.post_backward = saved.post_backward
        self._fsdp_mod_to_saved_methods.clear()
        deregister(self)  # the optimizer hooks (the loop above left it no modules)

    FSDPMemTracker._instrument_fsdp_module = instrument
    FSDPMemTracker._deregister_module_and_optimizer_hooks = uninstrument
    FSDPMemTracker._shardscope_group_hooks = True


def post_forward_mesh_outside_fake_mode():
    """`fully_shard(reshard_after_forward=k)` builds its post-forward mesh from the mesh's
    rank tensor (`_get_post_forward_mesh_info` in torch/distributed/fsdp/_fully_shard/
    _fsdp_init.py: `mesh.mesh.view(-1, k)`), a real tensor, which FakeTensorMode refuses to
    view. It is built with the fake mode set aside, as the mesh itself is."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.fsdp._fully_shard import _fsdp_init, _fully_shard

    if getattr(_fsdp_init, "_shardscope_outside_fake", False):
        return
    build = _fsdp_init._get_post_forward_mesh_info

    def outside(*args, **kwargs):
        with unset_fake_temporarily():
            return build(*args, **kwargs)

    _fsdp_init._get_post_forward_mesh_info = outside
    _fully_shard._get_post_forward_mesh_info = outside
    _fsdp_init._shardscope_outside_fake = True


def print_module_peaks(tracker, names):
    """The tracker's per-module snapshots (SHARDSCOPE_ORACLE_MODULES=fqn,fqn): at each
    state it records (pre/post forward and backward, peaks), the categories above 50 MiB."""
    gib = 1024.0**3
    for stats in tracker.memory_tracking.values():
        if stats.mod_fqn.split(".", 1)[-1] not in names and stats.mod_fqn not in names:
            continue
        print("module", stats.mod_fqn)
        for state, snaps in stats.snapshots.items():
            for snap in snaps[-1:]:
                dev = next(iter(snap.values()))
                cats = {str(getattr(k, "value", k)): round(v / gib, 2) for k, v in dev.items() if v > (50 << 20)}
                print("   ", getattr(state, "value", state), cats)


def oracle(model_path, plan_path, world, batch, seq, steps=2, track=True):
    """FSDPMemTracker's peak snapshot (bytes per category) for rank 0 of `world`.
    track=False runs the same steps without the tracker (and returns {}): the tests compare
    what FSDP2 runs with and without it. Each step runs the export's gradient_accumulation:
    that many forward/backward passes before the optimizer step, gradients reduced on the
    last only (set_requires_gradient_sync(False) before the others) unless
    sync_every_micro_batch."""
    import torch
    import torch.distributed as dist
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    sys.path.insert(0, os.path.join(ROOT, "samples"))
    from apply_plan import apply_plan, prepare_micro_batch

    export = json.loads(run_shardscope("plan", "export", "--model", model_path, "--plan", plan_path,
                                       "--format", "fsdp2"))
    micro_batches = int(export.get("gradient_accumulation", {}).get("micro_batches", 1))
    cfg = transformers.AutoConfig.from_pretrained(model_path)
    cfg.use_cache = False  # training (and required with checkpointing)
    # SDPA as transformers picks it by default on a GPU; eager attention would save the s x s
    # probabilities, which no FSDP user at seq 8192 runs. gpt-oss has no SDPA path: eager,
    # as its fine-tuning recipes run it (its sinks need a kernel of their own otherwise); MPT's
    # attention is always eager in transformers (its ALiBi bias added to the scores).
    cfg._attn_implementation = "eager" if cfg.model_type in ("gpt_oss", "mpt") else "sdpa"
    # transformers 4.5x, training without a KV cache, reads "packed sequences" from the
    # position ids and then builds a (b, 1, s, s) mask, which also turns GQA inside SDPA into
    # repeated keys and values; with a mask the CPU picks another SDPA kernel than CUDA would.
    # The oracle runs causal SDPA without a mask, as torchtitan and Hugging Face with a cache
    # do, and as ShardScope models attention.
    import transformers.masking_utils as masking_utils
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    if cfg.model_type in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "gpt_oss",
                          "deepseek_v2", "deepseek_v3", "glm4_moe", "ernie4_5_moe"):
        balanced_moe_routing()
    if cfg.model_type in ("deepseek_v2", "deepseek_v3"):
        gpu_like_sdpa_for_unequal_head_sizes()
    hide_dtensor_shape_propagation()
    keep_fsdp_group_hooks()
    post_forward_mesh_outside_fake_mode()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        # The mesh is made outside fake mode (it reads its rank layout back as a tensor).
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", tuple(export["mesh"]["shape"]),
                                mesh_dim_names=tuple(export["mesh"]["dim_names"]))
        with FakeTensorMode():
            torch.manual_seed(0)
            net = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
            net.train()
            apply_plan(net, export, device_type="cpu", mesh=mesh)
            # foreach=True: what AdamW picks by default on a GPU (every parameter a DTensor on
            # CUDA; _default_to_fused_or_foreach), which the simulator's GPU clusters model.
            # Its sqrt of exp_avg_sq for all parameters at once can be the step's peak; on an
            # H200 it was (35.88 GiB real, 35.82 GiB this tracker, docs/memory-fidelity.md).
            optim = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)
            tokens = torch.randint(0, cfg.vocab_size, (batch, seq))
            tracker = FSDPMemTracker(net, optim) if track else None
            if tracker:
                tracker.track_inputs((tokens,))
            # Entering the tracker resets its peak to what is live then: step 0 makes the
            # optimizer state, the last step's peak is the steady state's.
            for _ in range(steps):
                with tracker or contextlib.nullcontext():
                    # The logits go before backward, as the Hugging Face Trainer
                    # (compute_loss returns the loss alone) and torchtitan (del pred) do.
                    for mb in range(micro_batches):
                        if micro_batches > 1:
                            # What a user's loop calls (samples/apply_plan.py): gradient
                            # sync on the last micro-batch, or on each with
                            # sync_every_micro_batch, as the export says.
                            prepare_micro_batch(net, export, mb)
                        if tracker and mb > 0:
                            # The tracker refuses a second forward of the root in one
                            # iteration; its module stats go, its peak stays.
                            tracker.reset_mod_stats()
                        loss = net(input_ids=tokens, labels=tokens).loss
                        loss.backward()
                        del loss
                    optim.step()
                    optim.zero_grad()
                if not tracker:
                    continue
                if os.environ.get("SHARDSCOPE_ORACLE_MODULES"):
                    print_module_peaks(tracker, os.environ["SHARDSCOPE_ORACLE_MODULES"].split(","))
                tracker.reset_mod_stats()  # the tracker follows one iteration at a time
            snap = tracker.get_tracker_snapshot("peak") if tracker else {"cpu": {}}
    finally:
        dist.destroy_process_group()
    dev = next(iter(snap.values()))
    return {str(k.value if hasattr(k, "value") else k): int(v) for k, v in dev.items()}


def oracle_key_parts(model_path, plan_path, world, batch, seq, steps=2):
    """What FSDPMemTracker's figures for a case depend on (tests/oracles/oracle_record.py
    keys its record by them): the model's config, the FSDP2 export PyTorch applies, the
    shape, this script and samples/apply_plan.py, and the torch and transformers versions."""
    import torch
    import transformers
    export = json.loads(run_shardscope("plan", "export", "--model", model_path, "--plan", plan_path,
                                       "--format", "fsdp2"))

    def sha(path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    return {"model": sha(model_path),
            "export": hashlib.sha256(json.dumps(export, sort_keys=True).encode()).hexdigest(),
            "world": world, "batch": batch, "seq": seq, "steps": steps, "oracle": sha(__file__),
            "apply_plan": sha(os.path.join(ROOT, "samples", "apply_plan.py")),
            "torch": torch.__version__, "transformers": transformers.__version__}


def compare(model, plan, world=None, batch=None, seq=None, extra=(), micro_batches=None, sync_every=None):
    tmp = tempfile.mkdtemp(prefix="shardscope-oracle-")
    plan2, p = plan_with_shape(plan, batch, seq, world, tmp, micro_batches, sync_every)
    shape = (p.get("mesh") or {}).get("shape") or [world or 8]
    w = 1
    for d in shape:
        w *= d
    b = p["training"].get("micro_batch_size", 1)
    s = p["training"].get("seq_len", 2048)
    sim = ours(model, plan2, gpu_cluster(w, tmp), list(extra))
    acc = p.get("gradient_accumulation") or {}
    t0 = time.time()
    label = f"{os.path.basename(os.path.dirname(model))}, world {w}, {b} x {s}"
    theirs, how = oracle_record.recorded("fsdp_mem_tracker", oracle_key_parts(model, plan2, w, b, s), label,
                                         lambda: oracle(model, plan2, w, b, s))
    return {"oracle": how, "model": model, "plan": plan, "world": w, "batch": b, "seq": s,
            "micro_batches": acc.get("micro_batches", 1),
            "sync_every_micro_batch": bool(acc.get("sync_every_micro_batch", False)),
            "shardscope": {"peak_allocated_bytes": sim["peak_allocated_bytes"], "at_peak": sim["memory_at_peak"]},
            "fsdp_mem_tracker": theirs, "oracle_seconds": round(time.time() - t0, 1),
            "error": (sim["peak_allocated_bytes"] - theirs["Total"]) / theirs["Total"]}


def print_table(r):
    print(f"{os.path.basename(os.path.dirname(r['model']))} | {os.path.basename(r['plan'])} | world {r['world']}, "
          f"micro-batch {r['batch']} x {r['seq']}"
          + (f" x {r['micro_batches']} micro-batches ({'reduced every one' if r['sync_every_micro_batch'] else 'reduced on the last'})"
             if r.get("micro_batches", 1) > 1 else "")
          + (f" (oracle {r['oracle_seconds']} s)" if r.get("oracle", "live") == "live"
             else " (FSDPMemTracker's recorded figures: tests/data/oracle)"))
    print(f"  {'category':<18}{'FSDPMemTracker':>16}{'ShardScope':>14}")
    at = r["shardscope"]["at_peak"]
    for theirs_key, ours_key in CATEGORIES:
        t = r["fsdp_mem_tracker"].get(theirs_key, 0)
        o = at.get(ours_key, 0) if ours_key else None
        if not t and not o:
            continue
        print(f"  {theirs_key:<18}{t / GIB:>12.2f} GiB{'' if o is None else f'{o / GIB:>10.2f} GiB'}")
    rest = sum(v for k, v in at.items() if k not in {c[1] for c in CATEGORIES if c[1]})
    if rest:
        print(f"  {'(other, ours)':<18}{'':>16}{rest / GIB:>10.2f} GiB")
    print(f"  {'peak (Total)':<18}{r['fsdp_mem_tracker']['Total'] / GIB:>12.2f} GiB"
          f"{r['shardscope']['peak_allocated_bytes'] / GIB:>10.2f} GiB   error {100 * r['error']:+.2f}%")
    print("  (each column: the categories at that tool's own peak)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face config.json")
    ap.add_argument("--plan", required=True, help="a ShardScope FSDP2 plan")
    ap.add_argument("--world", type=int, help="fake ranks when the plan has no mesh [8]")
    ap.add_argument("--batch", type=int, help="micro-batch size (overrides the plan's)")
    ap.add_argument("--seq", type=int, help="sequence length (overrides the plan's)")
    ap.add_argument("--micro-batches", type=int, help="gradient accumulation steps (overrides the plan's)")
    ap.add_argument("--sync-every-micro-batch", action="store_true", default=None,
                    help="reduce gradients after every micro-batch (default: the plan's, else the last only)")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    a = ap.parse_args()
    r = compare(a.model, a.plan, a.world or 8, a.batch, a.seq, micro_batches=a.micro_batches,
                sync_every=a.sync_every_micro_batch)
    if a.json:
        print(json.dumps(r, indent=2))
    else:
        print_table(r)


if __name__ == "__main__":
    main()
