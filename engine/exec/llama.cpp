// SPDX-License-Identifier: Apache-2.0
#include "engine/exec/llama.h"

#include <stdexcept>

namespace shardscope::exec {

namespace {

int64_t need(const nlohmann::json& j, const std::string& file, const char* key) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0)
        throw std::runtime_error(file + ":/" + key + ": expected a positive integer" +
                                 (j.contains(key) ? ", got " + j[key].dump() : " (missing)"));
    return j[key].get<int64_t>();
}

double number(const nlohmann::json& j, const std::string& file, const char* key, double dflt) {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    if (!j[key].is_number())
        throw std::runtime_error(file + ":/" + key + ": expected a number, got " + j[key].dump());
    return j[key].get<double>();
}

at::Tensor rotateHalf(const at::Tensor& x) {
    const int64_t h = x.size(-1) / 2;
    return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

}  // namespace

LlamaConfig llamaConfigFromHf(const nlohmann::json& j, const std::string& file) {
    const std::string type = j.value("model_type", "");
    if (type != "llama" && type != "mistral" && type != "qwen2")
        throw std::runtime_error(file +
                                 ":/model_type: the engine runs llama, mistral and qwen2 "
                                 "decoders; got \"" +
                                 type + "\"");
    LlamaConfig c;
    c.vocab = need(j, file, "vocab_size");
    c.hidden = need(j, file, "hidden_size");
    c.intermediate = need(j, file, "intermediate_size");
    c.layers = need(j, file, "num_hidden_layers");
    c.heads = need(j, file, "num_attention_heads");
    c.kvHeads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                    ? need(j, file, "num_key_value_heads")
                    : c.heads;
    c.headDim = j.contains("head_dim") && !j["head_dim"].is_null() ? need(j, file, "head_dim")
                                                                   : c.hidden / c.heads;
    if (c.heads % c.kvHeads != 0)
        throw std::runtime_error(file + ":/num_key_value_heads: must divide num_attention_heads");
    c.eps = number(j, file, "rms_norm_eps", 1e-6);
    c.theta = number(j, file, "rope_theta", 10000.0);
    c.tied = j.value("tie_word_embeddings", false);
    return c;
}

LlamaModel::LlamaModel(LlamaConfig cfg, const ModelGraph& graph, FsdpRuntime& runtime)
    : c(cfg), g(graph), rt(runtime) {
    model = mod("model");
    embed = mod("model.embed_tokens");
    norm = mod("model.norm");
    head = mod("lm_head");
    embedW = par("model.embed_tokens.weight");
    normW = par("model.norm.weight");
    headW = par("lm_head.weight");
    for (int64_t i = 0; i < c.layers; ++i) {
        const std::string p = "model.layers." + std::to_string(i) + ".";
        Layer l;
        l.module = mod(p.substr(0, p.size() - 1));
        l.inNorm = mod(p + "input_layernorm");
        l.postNorm = mod(p + "post_attention_layernorm");
        l.attn = mod(p + "self_attn");
        l.mlp = mod(p + "mlp");
        l.q = mod(p + "self_attn.q_proj");
        l.k = mod(p + "self_attn.k_proj");
        l.v = mod(p + "self_attn.v_proj");
        l.o = mod(p + "self_attn.o_proj");
        l.gate = mod(p + "mlp.gate_proj");
        l.up = mod(p + "mlp.up_proj");
        l.down = mod(p + "mlp.down_proj");
        l.inNormW = par(p + "input_layernorm.weight");
        l.postNormW = par(p + "post_attention_layernorm.weight");
        l.qW = par(p + "self_attn.q_proj.weight");
        l.kW = par(p + "self_attn.k_proj.weight");
        l.vW = par(p + "self_attn.v_proj.weight");
        l.oW = par(p + "self_attn.o_proj.weight");
        l.gateW = par(p + "mlp.gate_proj.weight");
        l.upW = par(p + "mlp.up_proj.weight");
        l.downW = par(p + "mlp.down_proj.weight");
        l.qB = par(p + "self_attn.q_proj.bias", false);
        l.kB = par(p + "self_attn.k_proj.bias", false);
        l.vB = par(p + "self_attn.v_proj.bias", false);
        // The graph marks a sliding-window layer's attention by what its window makes SDPA
        // keep (ModuleCost::windowSavedBytes), by transformers' rules per family.
        l.sliding = g.slidingWindow > 0 && !g.module(l.attn).cost.windowSavedBytes.isZero();
        layers.push_back(l);
    }
}

ModuleId LlamaModel::mod(const std::string& name) const {
    auto m = g.findModule(name);
    if (!m)
        throw std::runtime_error("model graph " + g.name + ": no module \"" + name +
                                 "\" (the engine expects transformers' Llama module names)");
    return *m;
}

ParamId LlamaModel::par(const std::string& name, bool required) const {
    auto p = g.findParam(name);
    if (!p && required)
        throw std::runtime_error("model graph " + g.name + ": no parameter \"" + name + "\"");
    return p ? *p : ParamId();
}

at::Tensor LlamaModel::linear(ModuleId m, ParamId w, ParamId b, const at::Tensor& x) {
    // By value: a checkpointed module's body runs again in backward, after this returns.
    return rt.callModule(m, x, [this, w, b](const at::Tensor& in) {
        rt.noteCompute();
        return at::linear(in, rt.param(w), b.valid() ? rt.param(b) : at::Tensor());
    });
}

at::Tensor LlamaModel::rmsNorm(ModuleId m, ParamId w, const at::Tensor& x) {
    return rt.callModule(m, x, [this, w](const at::Tensor& in) {
        rt.noteCompute();
        at::Tensor h = in.to(at::kFloat);
        h = h * at::rsqrt(h.pow(2).mean({-1}, true) + c.eps);
        return rt.param(w) * h.to(in.scalar_type());
    });
}

at::Tensor LlamaModel::attention(const Layer& l, const at::Tensor& h) {
    return rt.callModule(l.attn, h, [&](const at::Tensor& x) {
        const int64_t b = x.size(0), s = x.size(1);
        at::Tensor q = linear(l.q, l.qW, l.qB, x).view({b, s, c.heads, c.headDim}).transpose(1, 2);
        at::Tensor k =
            linear(l.k, l.kW, l.kB, x).view({b, s, c.kvHeads, c.headDim}).transpose(1, 2);
        at::Tensor v =
            linear(l.v, l.vW, l.vB, x).view({b, s, c.kvHeads, c.headDim}).transpose(1, 2);
        rt.noteCompute();
        const at::Tensor cs = cos.to(q.scalar_type()), sn = sin.to(q.scalar_type());
        q = q * cs + rotateHalf(q) * sn;
        k = k * cs + rotateHalf(k) * sn;
        at::Tensor o;
        if (l.sliding && s >= g.slidingWindow) {
            // A sliding-window layer from the window's length on, as transformers runs it
            // with SDPA: a boolean (b, 1, s, s) mask (key j is seen by query i when
            // i - window < j <= i), and keys and values repeated to every query head
            // (repeat_kv), since transformers uses SDPA's own GQA only without a mask.
            const auto idx = at::arange(s, at::TensorOptions(at::kLong).device(q.device()));
            const at::Tensor i = idx.unsqueeze(1), j = idx.unsqueeze(0);
            const at::Tensor mask =
                ((j <= i) & (j > i - g.slidingWindow)).view({1, 1, s, s}).expand({b, 1, s, s});
            const int64_t rep = c.heads / c.kvHeads;
            auto repeatKv = [&](const at::Tensor& t) {
                return rep == 1 ? t
                                : t.unsqueeze(2)
                                      .expand({b, c.kvHeads, rep, s, c.headDim})
                                      .reshape({b, c.heads, s, c.headDim});
            };
            o = at::scaled_dot_product_attention(q, repeatKv(k), repeatKv(v), mask, 0.0, false);
        } else {
            // Grouped-query attention inside SDPA (enable_gqa), as transformers calls it
            // without a padding mask: each key/value head serves heads/kv_heads queries, and
            // autograd saves k and v at their own width instead of repeated copies.
            o = at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, true, std::nullopt,
                                                 c.kvHeads != c.heads);
        }
        o = o.transpose(1, 2).reshape({b, s, c.heads * c.headDim});
        return linear(l.o, l.oW, ParamId(), o);
    });
}

at::Tensor LlamaModel::layer(const Layer& l, const at::Tensor& in) {
    return rt.callModule(l.module, in, [&](const at::Tensor& x0) {
        at::Tensor x = x0 + attention(l, rmsNorm(l.inNorm, l.inNormW, x0));
        const at::Tensor h = rmsNorm(l.postNorm, l.postNormW, x);
        const at::Tensor m = rt.callModule(l.mlp, h, [&](const at::Tensor& y) {
            at::Tensor a = at::silu(linear(l.gate, l.gateW, ParamId(), y));
            at::Tensor u = linear(l.up, l.upW, ParamId(), y);
            rt.noteCompute();
            return linear(l.down, l.downW, ParamId(), a * u);
        });
        rt.noteCompute();
        return x + m;
    });
}

at::Tensor LlamaModel::loss(const at::Tensor& tokens) {
    const int64_t s = tokens.size(1);
    return rt.callModule(ModuleId(0), tokens, [&](const at::Tensor& ids) {
        const at::Tensor hidden = rt.callModule(model, ids, [&](const at::Tensor& t) {
            at::Tensor h = rt.callModule(embed, t, [&](const at::Tensor& x) {
                rt.noteCompute();
                return at::embedding(rt.param(embedW), x);
            });
            {
                // The position embeddings, where transformers' LlamaModel.forward computes
                // them: after embed_tokens, before the first layer (rotary_emb's run).
                at::NoGradGuard ng;
                const auto f32 = at::TensorOptions(at::kFloat).device(rt.device());
                const at::Tensor invFreq =
                    1.0 / at::pow(c.theta, at::arange(0, c.headDim, 2, f32) /
                                               static_cast<double>(c.headDim));
                const at::Tensor freqs = at::outer(at::arange(s, f32), invFreq);
                const at::Tensor emb = at::cat({freqs, freqs}, -1);
                cos = emb.cos();
                sin = emb.sin();
                rt.noteCompute();
            }
            for (const Layer& l : layers)
                h = layer(l, h);
            return rmsNorm(norm, normW, h);
        });
        const at::Tensor logits = linear(head, headW, ParamId(), hidden);
        rt.noteCompute();
        // Next-token labels, the last position ignored (-100), as transformers' ForCausalLMLoss
        // does: padding the labels instead of slicing the logits saves a copy of them.
        const at::Tensor labels =
            at::cat({ids.narrow(1, 1, s - 1), at::full({ids.size(0), 1}, -100, ids.options())}, 1);
        return at::cross_entropy_loss(logits.to(at::kFloat).reshape({-1, c.vocab}),
                                      labels.reshape({-1}), std::nullopt, at::Reduction::Mean,
                                      -100);
    });
}

}  // namespace shardscope::exec
