// SPDX-License-Identifier: Apache-2.0
#include "engine/exec/proxy_model.h"

#include <cmath>

#include <torch/csrc/autograd/custom_function.h>

namespace shardscope::exec {

namespace {

constexpr int64_t kBurnWidth = 128;

// Spends `flops` FLOPs on [T, 128] x [128, 128] matmuls (rounded to whole ones).
void spend(const at::Tensor& like, double flops) {
    static const at::Tensor cpuSquare = [] {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(20261121);
        return at::normal(0.0, 1.0 / std::sqrt(static_cast<double>(kBurnWidth)),
                          {kBurnWidth, kBurnWidth}, gen, at::TensorOptions(at::kFloat));
    }();
    // One copy on the GPU when the run is there (a process uses one device).
    static const at::Tensor deviceSquare =
        like.device().is_cpu() ? cpuSquare : cpuSquare.to(like.device());
    const at::Tensor& square = like.device().is_cpu() ? cpuSquare : deviceSquare;
    const int64_t t = std::max<int64_t>(1, like.size(0));
    const double per = 2.0 * static_cast<double>(t) * kBurnWidth * kBurnWidth;
    const auto n = static_cast<int64_t>(std::llround(flops / per));
    if (n <= 0) return;
    at::NoGradGuard ng;
    at::Tensor y = at::ones({t, kBurnWidth}, like.options().dtype(at::kFloat));
    for (int64_t i = 0; i < n; ++i)
        y = at::matmul(y, square);
}

struct Burn : torch::autograd::Function<Burn> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                              double flops) {
        ctx->saved_data["flops"] = flops;
        spend(x, flops);
        return x.view_as(x);
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        spend(grads[0], 2.0 * ctx->saved_data["flops"].toDouble());
        return {grads[0], at::Tensor()};
    }
};

}  // namespace

ProxyModel::ProxyModel(const ModelGraph& graph, FsdpRuntime& runtime, uint64_t s)
    : g(graph), rt(runtime), seed(s) {}

at::Tensor ProxyModel::loss(const at::Tensor& tokens) {
    batch = tokens.size(0);
    seq = tokens.dim() > 1 ? tokens.size(1) : 1;
    const int64_t t = tokens.numel();
    // A data-dependent input without gradient: the token ids scaled onto the width.
    const at::Tensor x =
        (tokens.reshape({t, 1}).to(at::kFloat) + 1.0) /
        static_cast<double>(std::max<int64_t>(1, tokens.max().item<int64_t>() + 1)) *
        at::linspace(0.5, 1.5, kWidth, tokens.options().dtype(at::kFloat)).reshape({1, kWidth});
    const at::Tensor y = forward(g.root(), x);
    return y.pow(2).mean();
}

at::Tensor ProxyModel::forward(ModuleId m, const at::Tensor& in) {
    return rt.callModule(m, in, [this, m](const at::Tensor& x0) {
        at::Tensor x = x0;
        for (ModuleId c : g.module(m).children)
            x = forward(c, x);
        return own(m, x);
    });
}

at::Tensor ProxyModel::own(ModuleId m, const at::Tensor& x) {
    const ModuleNode& node = g.module(m);
    const double flops = node.cost.fwdFlops.at(batch, seq);
    const double saved = node.cost.savedAt(batch, seq, g.slidingWindow);
    if (node.params.empty() && flops <= 0 && saved <= 0) return x;
    rt.noteCompute();
    // Every parameter enters through its mean: its gradient is full-size, as a layer's is.
    at::Tensor coef;
    for (ParamId p : node.params) {
        const at::Tensor& w = rt.param(p);
        if (!w.requires_grad()) continue;
        const at::Tensor mean = w.to(at::kFloat).mean();
        coef = coef.defined() ? coef + mean : mean;
    }
    // Forward FLOPs, and twice as many in backward, spent on matmuls of a fixed square
    // matrix that save nothing: the module's time without memory that is not the model's.
    at::Tensor out = flops > 0 ? Burn::apply(x, flops) : x;
    if (coef.defined()) out = out * (1.0 + 1e-3 * coef);
    // Saved activations: a buffer of the recorded size that backward needs (the product's
    // gradient with respect to the coefficient reads it).
    const auto elems = static_cast<int64_t>(saved / 4.0);
    if (elems > 0 && coef.defined()) {
        const at::Tensor buf = at::full({elems}, 1e-6, x.options().dtype(at::kFloat));
        out = out + (coef * buf).sum() * 0.0;
    }
    return out.to(x.scalar_type());
}

}  // namespace shardscope::exec
