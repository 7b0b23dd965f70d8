// SPDX-License-Identifier: Apache-2.0
// FsdpRuntime's parameters sharded as the plan resolved them, and its optimizers
// (fsdp_runtime_impl.h).
#include "engine/exec/fsdp_runtime_impl.h"

#include "engine/exec/tensor_storage.h"

#include <stdexcept>
#include <string>
#include <unordered_set>

namespace shardscope::exec {

void FsdpRuntime::Impl::init() {
    setUpUnits();
    paramStateOf.assign(model.paramCount(), -1);
    std::vector<at::Tensor> fulls(model.paramCount());
    std::vector<at::Tensor> masters;
    for (size_t i = 0; i < model.paramCount(); ++i) {
        paramStateOf[i] = static_cast<int32_t>(paramStates.size());
        paramStates.push_back(shardParam(i, fulls, masters));
    }
    for (size_t u = 0; u < plan.units.size(); ++u)
        for (ParamId pid : plan.units[u].params)
            unitStates[u].params.push_back(paramStateOf[pid.index()]);
    // The shards as laid out here are the sizes the plan resolved (dim-0 rows for FSDP2,
    // padded flat vectors for fairscale without flattening).
    if (opts.fsdp && !plan.flatParams)
        for (size_t u = 0; u < plan.units.size(); ++u) {
            int64_t numel = 0;
            for (int32_t pi : unitStates[u].params)
                numel += paramStates[pi].rows * paramStates[pi].row;
            if (numel != plan.units[u].shardedNumel)
                throw std::logic_error("shard of " + plan.units[u].displayName() + " is " +
                                       std::to_string(numel) + " elements, the plan says " +
                                       std::to_string(plan.units[u].shardedNumel));
        }
    if (opts.fsdp && plan.flatParams)
        for (size_t u = 0; u < plan.units.size(); ++u)
            buildFlat(static_cast<int32_t>(u), fulls, masters);
    makeOptimizers(masters);
}

// Each unit's modules and dtypes; what the engine does not run is refused here, naming the
// unit.
void FsdpRuntime::Impl::setUpUnits() {
    unitAt.assign(model.moduleCount(), -1);
    unitStates.resize(plan.units.size());
    if (!plan.ignoredParams.empty())
        throw std::runtime_error("the engine does not run plans with ignored_params yet");
    for (size_t u = 0; u < plan.units.size(); ++u) {
        const auto& unit = plan.units[u];
        for (ModuleId m : unit.modules)
            unitAt[m.index()] = static_cast<int32_t>(u);
        if (unit.float8.enabled || unit.compile != CompileMode::None)
            throw std::runtime_error(
                "unit " + unit.displayName() +
                ": float8 and compile are simulated and exported (samples/apply_plan.py "
                "applies them with torchao and torch.compile) but the engine does not run "
                "them; drop them from the plan for shardscope run");
        if (unit.activationCheckpointing == AcMode::SelectiveOp)
            throw std::runtime_error(
                "unit " + unit.displayName() +
                ": activation_checkpointing \"selective_op\" (op-level selective "
                "checkpointing) is simulated and exported but the engine does not run it "
                "yet; use \"full\", \"attention\" or \"none\" with shardscope run");
        if (unit.activationCheckpointing == AcMode::Full)
            for (size_t v = 0; v < plan.units.size(); ++v)
                for (ModuleId m : unit.modules)
                    if (v != u && model.isAncestorOrSelf(m, plan.units[v].modules[0]))
                        throw std::runtime_error(
                            "unit " + unit.displayName() +
                            ": activation checkpointing on a unit that contains other units "
                            "(here " +
                            plan.units[v].displayName() +
                            ") would recompute them too; set it on the inner units only "
                            "(as checkpoint_wrapper is applied to decoder layers)");
        unitStates[u].agType = scalarType(unit.allGatherDtype);
        unitStates[u].reduceType = scalarType(unit.reduceDtype);
    }
    if (plan.noShard)
        for (const auto& unit : plan.units)
            if (unit.mixedPrecision.paramDtype)
                throw std::runtime_error(
                    "the engine does not run NO_SHARD with mixed "
                    "precision yet");
}

// Parameter i, initialised the same on every rank and sharded as the plan says: this rank's
// dim-0 rows (FSDP2), a flat vector's (fairscale without flattening), or, under a flat
// parameter (FSDP1, fairscale), its full value in `fulls` for buildFlat. The tensors the
// optimizer steps go to `masters`.
FsdpRuntime::Impl::PState FsdpRuntime::Impl::shardParam(size_t i, std::vector<at::Tensor>& fulls,
                                                        std::vector<at::Tensor>& masters) {
    const int64_t n = shardN();
    const int64_t myShard = opts.fsdp ? groups->shardRank : 0;
    const ParamInfo& info = model.params()[i];
    PState p;
    p.id = ParamId(static_cast<int32_t>(i));
    p.trueShape = info.shape.empty() ? std::vector<int64_t>{1} : info.shape;
    // fairscale without flattening shards each parameter as a flat vector, padded
    // to a multiple of N; FSDP2 shards dim 0.
    p.flat1d = opts.fsdp && !plan.flatParams && plan.plan.api == PlanApi::Lightning;
    p.shape = p.flat1d ? std::vector<int64_t>{info.numel} : p.trueShape;
    p.d0 = p.shape[0];
    p.row = 1;
    for (size_t k = 1; k < p.shape.size(); ++k)
        p.row *= p.shape[k];
    p.rows = ceilDiv(p.d0, n);
    p.trainable = info.requiresGrad;
    const int32_t u = plan.unitOfParam[i].valid() ? plan.unitOfParam[i].value : 0;
    const auto& unit = plan.units[static_cast<size_t>(u)];
    if (unit.reshard == Reshard::Int) p.pfRows = ceilDiv(p.d0, unit.reshardK);
    // Deterministic initial values, independent of the sharding: N(0, 0.02) for
    // matrices and embeddings, ones for norm weights and other vectors.
    at::Tensor full;
    if (p.trueShape.size() == 1) {
        full = at::ones(p.trueShape, at::kFloat);
    } else {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(opts.seed * 1000003ULL + i);
        full = at::normal(0.0, 0.02, p.trueShape, gen, at::TensorOptions(at::kFloat));
    }
    // Offloaded units keep their shards on the host; everything else is on the device
    // (the values are generated on the CPU, so every device starts from the same).
    const bool offloaded = opts.fsdp && unit.offload.enabled;
    const at::TensorOptions master = offloaded ? host(at::kFloat) : on(at::kFloat);
    full = full.to(master.device());
    auto shardShape = p.shape;
    shardShape[0] = p.rows;
    if (opts.fsdp && plan.flatParams) {
        fulls[i] = full;  // the unit's flat parameter is built below
        p.unsharded = at::empty(p.trueShape, on(unitStates[u].agType));
        if (plan.noShard) {
            p.unsharded.copy_(full);  // NO_SHARD: always resident, trained in place
        } else {
            resizeStorage(p.unsharded, 0);
        }
        p.unsharded.requires_grad_(p.trainable);
        if (p.trainable && plan.noShard) masters.push_back(p.unsharded);
    } else if (opts.fsdp) {
        p.sharded = at::zeros(shardShape, master);
        const int64_t r0 = myShard * p.rows, r1 = std::min(p.d0, r0 + p.rows);
        const at::Tensor byRows = full.reshape(p.shape);
        if (r1 > r0) p.sharded.narrow(0, 0, r1 - r0).copy_(byRows.narrow(0, r0, r1 - r0));
        p.sharded.requires_grad_(p.trainable);
        p.unsharded = at::empty(p.trueShape, on(unitStates[u].agType));
        resizeStorage(p.unsharded, 0);
        p.unsharded.requires_grad_(p.trainable);
        if (p.trainable) masters.push_back(p.sharded);
    } else {
        p.unsharded = full.requires_grad_(p.trainable);
        if (p.trainable) masters.push_back(p.unsharded);
    }
    return p;
}

// AdamW over the masters; CPU offload: the offloaded units' shards are stepped by a host
// optimizer of their own.
void FsdpRuntime::Impl::makeOptimizers(const std::vector<at::Tensor>& masters) {
    std::vector<at::Tensor> device, host;
    std::unordered_set<const void*> offloaded;
    for (size_t u = 0; u < plan.units.size(); ++u)
        if (opts.fsdp && plan.units[u].offload.enabled) {
            if (unitStates[u].flatSharded.defined())
                offloaded.insert(unitStates[u].flatSharded.unsafeGetTensorImpl());
            for (int32_t pi : unitStates[u].params)
                if (paramStates[pi].sharded.defined())
                    offloaded.insert(paramStates[pi].sharded.unsafeGetTensorImpl());
        }
    for (auto& t : masters)
        (offloaded.count(t.unsafeGetTensorImpl()) ? host : device).push_back(t);
    const auto adamOptions = torch::optim::AdamWOptions(opts.lr)
                                 .betas({opts.beta1, opts.beta2})
                                 .eps(opts.eps)
                                 .weight_decay(opts.weightDecay);
    if (!device.empty()) adam = std::make_unique<torch::optim::AdamW>(device, adamOptions);
    if (!host.empty()) hostAdam = std::make_unique<torch::optim::AdamW>(host, adamOptions);
}

// FlatParamHandle's layout: with use_orig_params each parameter starts 16-byte aligned,
// the total is padded to a multiple of the shard size, and each rank holds one
// contiguous 1/N of it (fairscale: no alignment). Checked against the resolver's sizes.
void FsdpRuntime::Impl::buildFlat(int32_t u, const std::vector<at::Tensor>& fulls,
                                  std::vector<at::Tensor>& masters) {
    UState& s = unitStates[u];
    s.flat = true;
    const bool aligned = plan.plan.api == PlanApi::Fsdp1 && plan.plan.fsdp1.useOrigParams;
    const int64_t n = groups->shardSize;
    int64_t total = 0;
    for (int32_t pi : s.params) {
        if (aligned) {
            const int64_t align = 4;  // 16 bytes of fp32
            total += (align - total % align) % align;
        }
        s.offset.push_back(total);
        total += fulls[paramStates[pi].id.index()].numel();
    }
    if (aligned && total % n != 0) total += n - total % n;
    s.flatShard = ceilDiv(total, n);
    if (s.flatShard != plan.units[u].shardedNumel && !s.params.empty())
        throw std::logic_error("flat shard of " + plan.units[u].displayName() + " is " +
                               std::to_string(s.flatShard) + " elements, the plan says " +
                               std::to_string(plan.units[u].shardedNumel));
    if (plan.noShard) {  // the parameters are the unsharded leaves, always resident
        s.unsharded = true;
        return;
    }
    at::Tensor flat = at::zeros({n * s.flatShard},
                                plan.units[u].offload.enabled ? host(at::kFloat) : on(at::kFloat));
    for (size_t k = 0; k < s.params.size(); ++k) {
        const at::Tensor& f = fulls[paramStates[s.params[k]].id.index()];
        flat.narrow(0, s.offset[k], f.numel()).copy_(f.reshape({-1}));
    }
    s.flatSharded =
        flat.narrow(0, groups->shardRank * s.flatShard, s.flatShard).clone().requires_grad_(true);
    if (!s.params.empty()) masters.push_back(s.flatSharded);
}

}  // namespace shardscope::exec
