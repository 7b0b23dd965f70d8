// SPDX-License-Identifier: Apache-2.0
#include "engine/exec/fsdp_runtime.h"

#include "engine/exec/collectives.h"
#include "engine/exec/cuda_support.h"

#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

namespace shardscope::exec {

namespace {

at::ScalarType scalarType(DType d) {
    switch (d) {
        case DType::Float16:
            return at::kHalf;
        case DType::BFloat16:
            return at::kBFloat16;
        case DType::Float64:
            return at::kDouble;
        default:
            return at::kFloat;
    }
}

int64_t ceilDiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

void resizeStorage(const at::Tensor& t, size_t bytes) {
    c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (t.device().is_cpu()) {
        at::native::resize_bytes_cpu(s, bytes);
        return;
    }
    // On a GPU the storage only goes between empty and full size and the copy-out rewrites
    // it whole, so a fresh block from the storage's own allocator (the caching allocator)
    // replaces the old one, which goes back to the cache: untyped_storage().resize_().
    if (s->nbytes() == bytes) return;
    s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
    s->set_nbytes(bytes);
}

// Copies into a tensor autograd has saved without bumping its version counter: the
// re-gathered parameter is the same value forward saw (FSDP2 does the same with
// torch.autograd._unsafe_preserve_version_counter).
void copyPreservingVersion(const at::Tensor& dst, int64_t row0, const at::Tensor& src) {
    const int64_t v = dst._version();
    {
        at::NoGradGuard ng;
        dst.detach().narrow(0, row0, src.size(0)).copy_(src);
    }
    c10::VariableVersion counter = torch::autograd::impl::version_counter(dst);  // shares the count
    counter.set_version(v);
}

// dst (a parameter) takes src's data, a view of a gathered buffer, keeping its own version
// counter and autograd identity: FSDP1's `param.data = view`.
void viewPreservingVersion(const at::Tensor& dst, const at::Tensor& src) {
    const int64_t v = dst._version();
    {
        at::NoGradGuard ng;
        torch::autograd::Variable var = dst;
        var.set_data(src);
    }
    c10::VariableVersion counter = torch::autograd::impl::version_counter(dst);
    counter.set_version(v);
}

FsdpRuntime* g_runtime = nullptr;  // the autograd nodes call back into it (one per process)

struct BoundaryFn : torch::autograd::Function<BoundaryFn> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                              int64_t boundary) {
        ctx->saved_data["b"] = boundary;
        return x.view_as(x);
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        g_runtime->boundaryBackward(ctx->saved_data["b"].toInt());
        return {grads[0], at::Tensor()};
    }
};

}  // namespace

struct FsdpRuntime::Impl {
    const ResolvedPlan& plan;
    const ModelGraph& model;
    Groups* groups;
    Recorder* rec;
    RuntimeOptions opts;
    FsdpRuntime* self = nullptr;
    Collectives coll{rec, opts.blockingCollectives};

    struct PState {
        ParamId id;
        int64_t d0 = 1, row = 1;         // dim 0 and elements per row
        int64_t rows = 1;                // rows per rank in the shard group (ceil(d0/N))
        int64_t pfRows = 0;              // rows per rank of the int-reshard copy
        std::vector<int64_t> shape;      // the sharding's view: [numel] when flat1d
        std::vector<int64_t> trueShape;  // the parameter's own shape
        bool flat1d = false;             // fairscale without flattening: sharded as a flat vector
        at::Tensor sharded;              // fp32 master shard [rows, ...], zero-padded
        at::Tensor unsharded;            // the leaf the model computes with [shape], param dtype
        at::Tensor postForward;          // int reshard: this rank's rows of the k-rank group
        bool trainable = true;
    };
    struct UState {
        std::vector<int32_t> params;  // indices into ps
        bool unsharded = false;
        bool fromPostForward = false;
        Collective agWork;
        bool localPending = false;  // group of one: unshard() called, the copy not yet made
        at::Tensor agOut;
        int64_t agIn = 0, agGroup = 1;
        bool postBackwardDone = false;
        bool backwardBegun = false;
        // A unit of several checkpointed modules (norm + lm_head) recomputes each in its own
        // checkpoint; the step program has one recompute op a micro-batch, the first of them
        // (the others count in the unit's backward).
        bool recomputeRecorded = false;
        bool postForwardCopy = false;
        // Modules of the unit still to run forward: FSDP2 runs a group's pre-forward before
        // the first of its modules and its post-forward after the last (fully_shard of a
        // list of modules), not around each one.
        size_t modulesLeft = 0;
        at::ScalarType agType = at::kFloat, reduceType = at::kFloat;
        // FSDP1 / fairscale: one flat parameter; each parameter at its offset in it.
        bool flat = false;
        at::Tensor flatSharded;  // fp32 master shard [flatShard]
        at::Tensor flatFull;     // the gathered flat parameter; its parameters are views of it
        int64_t flatShard = 0;
        std::vector<int64_t> offset;  // per unit parameter
    };
    struct Reduction {
        int32_t unit;
        Collective work;
        at::Tensor out;    // this rank's reduced shard, flat, reduce dtype
        at::Tensor input;  // the whole input until the reduction is done
        int64_t chunk = 0, me = 0;
        bool inPlace = false;   // Gloo: N in-place reduces, the result copied out of the input
        bool averaged = false;  // reduced with ReduceOp::AVG: already divided by the ranks
    };
    // Copies an in-place reduce-scatter's chunk out and frees its input (after it completed).
    // Also frees the input's memory: the works may keep their tensors for a while after
    // completing (a Gloo work until its worker thread lets go of it, an NCCL work until it
    // is destroyed), and FSDP2 frees the reduce-scatter input when the reduction is done.
    static void retire(Reduction& red) {
        if (!red.input.defined()) return;
        red.work.wait();
        if (red.inPlace) red.out.copy_(red.input.narrow(0, red.me * red.chunk, red.chunk));
        resizeStorage(red.input, 0);
        red.input.reset();
    }
    // Lets go of the inputs of the reductions that are done, and adds each unit's later
    // ones to its first (foldCompleted).
    void retireCompleted() {
        for (auto& red : reductions)
            if (red.input.defined() && red.work.completed()) retire(red);
        foldCompleted();
    }
    // A completed reduction becomes the unit's sharded gradients. As FSDP2: the reduced
    // shard is divided in place and the sharded gradients are views of it (a copy only where
    // the reduce dtype is not fp32); a gradient an earlier micro-batch reduced is added to
    // instead (foreach_reduce's `grad += new_sharded_grad`; FSDP1's _saved_grad_shard +=).
    void fold(Reduction& red) {
        retire(red);
        const double divide = static_cast<double>(groups->shardSize * groups->replicateSize);
        if (!red.averaged) red.out.div_(divide);
        const auto asFloat = [](const at::Tensor& t) {
            return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
        };
        at::NoGradGuard ng;
        const auto give = [](at::Tensor& param, const at::Tensor& grad) {
            if (param.grad().defined())
                param.mutable_grad().add_(grad);
            else
                param.mutable_grad() = grad;
        };
        auto& u = unitStates[red.unit];
        if (plan.noShard) {
            for (size_t q = 0; q < u.params.size(); ++q) {
                auto& p = paramStates[u.params[q]];
                if (p.trainable)
                    give(p.unsharded, red.out.narrow(0, u.offset[q], p.unsharded.numel())
                                          .view(p.unsharded.sizes()));
            }
            return;
        }
        if (u.flat) {
            if (u.flatSharded.defined()) give(u.flatSharded, asFloat(red.out));
            return;
        }
        int64_t off = 0;
        for (int32_t pi : u.params) {
            auto& p = paramStates[pi];
            const int64_t len = p.rows * p.row;
            if (p.trainable)
                give(p.sharded, asFloat(red.out.narrow(0, off, len)).view(p.sharded.sizes()));
            off += len;
        }
    }
    // Gradients reduced every micro-batch: a later reduction of a unit, once it and the
    // unit's first one of the step are done, is added to the first and let go, so that the
    // step holds one reduced shard per unit as FSDP2 does (it adds each output to the
    // sharded gradient as the reduce-scatter is issued).
    void foldCompleted() {
        for (size_t i = 0; i < reductions.size();) {
            Reduction& later = reductions[i];
            const auto first =
                std::find_if(reductions.begin(), reductions.begin() + static_cast<ptrdiff_t>(i),
                             [&](const Reduction& x) { return x.unit == later.unit; });
            if (first == reductions.begin() + static_cast<ptrdiff_t>(i) ||
                !later.work.completed() || !first->work.completed()) {
                ++i;
                continue;
            }
            retire(*first);
            retire(later);
            first->out.add_(later.out);
            reductions.erase(reductions.begin() + static_cast<ptrdiff_t>(i));
        }
    }
    struct Boundary {
        bool exit = false;
        int32_t unit = 0;
        int32_t segAfter = -1;
    };
    struct Seg {
        int32_t unit = 0;
        bool hasCompute = false;
    };

    // FSDP2 (_get_gradient_divide_factors) averages fp32 and bf16 gradients inside the
    // collective (ReduceOp::AVG, on Gloo a division on its worker thread, inside its span);
    // other reduce dtypes are summed and divided afterwards. The in-place chunked reduces
    // stay summed (the division follows, before the optimizer step).
    [[nodiscard]] bool averageInCollective(at::ScalarType reduceType) const {
        return (reduceType == at::kFloat || reduceType == at::kBFloat16) &&
               groups->shardSize * groups->replicateSize > 1 && !coll.inPlaceChunks(*groups->shard);
    }

    std::vector<PState> paramStates;
    std::vector<int32_t> paramStateOf;  // ParamId index -> ps index
    std::vector<UState> unitStates;
    std::vector<int32_t> unitAt;  // module -> unit whose module list holds it, or -1
    std::vector<Reduction> reductions;
    std::vector<Boundary> boundaries;
    std::vector<int32_t> deferred;  // boundaries whose tensor needs no gradient
    std::vector<Seg> segs;
    std::vector<int32_t> unitStack;
    std::vector<int32_t> postForwardOrder;
    std::vector<std::function<at::Tensor(const at::Tensor&)>> bodies;  // checkpointed units
    int32_t curSeg = -1;
    int64_t segStart = 0, lastBwdMark = 0;
    int32_t mb = 0;
    bool lastMicroBatch = true;
    bool sync = true;
    bool recomputing = false;
    std::unique_ptr<torch::optim::AdamW> adam, hostAdam;

    Impl(const ResolvedPlan& resolved, Groups* gr, Recorder* recorder, RuntimeOptions options)
        : plan(resolved), model(*resolved.model), groups(gr), rec(recorder), opts(options) {}

    int64_t shardN() const { return opts.fsdp ? groups->shardSize : 1; }
    // Tensors on the run's device, and on the host (CPU-offloaded shards).
    at::TensorOptions on(at::ScalarType t) const {
        return at::TensorOptions(t).device(opts.device);
    }
    static at::TensorOptions host(at::ScalarType t) { return at::TensorOptions(t); }

    // Post-forward of unit u after its last module ran: reshard, output cast and the
    // boundary whose backward runs the unit's pre-backward.
    at::Tensor finishForward(int32_t u, at::Tensor y) {
        const auto& unit = plan.units[u];
        closeSeg();
        postForward(u);
        if (y.is_floating_point() && unit.mixedPrecision.outputDtype)
            y = y.to(scalarType(*unit.mixedPrecision.outputDtype));
        const int32_t exit = newBoundary(true, u);
        if (!unitStack.empty())
            openSeg(unitStack.back());
        else
            curSeg = -1;
        boundaries[exit].segAfter = curSeg;
        return attach(y, exit);
    }

    void init() {
        paramStateOf.assign(model.paramCount(), -1);
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
        std::vector<at::Tensor> fulls(model.paramCount());
        const int64_t n = shardN();
        const int64_t myShard = opts.fsdp ? groups->shardRank : 0;
        std::vector<at::Tensor> masters;
        for (size_t i = 0; i < model.paramCount(); ++i) {
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
            paramStateOf[i] = static_cast<int32_t>(paramStates.size());
            paramStates.push_back(std::move(p));
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
        // CPU offload: the offloaded units' shards are stepped by the host optimizer.
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
    void buildFlat(int32_t u, const std::vector<at::Tensor>& fulls,
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
        at::Tensor flat = at::zeros(
            {n * s.flatShard}, plan.units[u].offload.enabled ? host(at::kFloat) : on(at::kFloat));
        for (size_t k = 0; k < s.params.size(); ++k) {
            const at::Tensor& f = fulls[paramStates[s.params[k]].id.index()];
            flat.narrow(0, s.offset[k], f.numel()).copy_(f.reshape({-1}));
        }
        s.flatSharded = flat.narrow(0, groups->shardRank * s.flatShard, s.flatShard)
                            .clone()
                            .requires_grad_(true);
        if (!s.params.empty()) masters.push_back(s.flatSharded);
    }

    // --- unshard / reshard --------------------------------------------------------------

    void unshard(int32_t u, Phase phase) {
        UState& s = unitStates[u];
        if (s.unsharded || s.agWork || s.localPending || s.params.empty()) return;
        const auto& unit = plan.units[u];
        s.fromPostForward =
            phase == Phase::Backward && unit.reshard == Reshard::Int && s.postForwardCopy;
        c10d::Backend& pg =
            s.fromPostForward ? groups->postForwardGroup(unit.reshardK) : *groups->shard;
        const int64_t n = pg.getSize(), me = pg.getRank();
        // FSDP2 over a group of one gathers nothing: the copy is made at wait_for_unshard, on
        // the compute stream (FSDPParamGroup's world_size == 1 path), as the step program has.
        if (n == 1 && !s.flat && !unit.offload.enabled) {
            s.localPending = true;
            return;
        }
        int64_t in = s.flat ? s.flatShard : 0;
        if (!s.flat)
            for (int32_t pi : s.params)
                in += (s.fromPostForward ? paramStates[pi].pfRows : paramStates[pi].rows) *
                      paramStates[pi].row;
        rec->setCurrent(unit.displayName() + " all-gather");
        // CPU offload: the shards come to the device first (on a CPU run, a copy).
        std::vector<at::Tensor> onDevice;
        if (unit.offload.enabled && !s.fromPostForward) {
            const size_t h2d = rec->begin(OpKind::H2D, phase, Stream::H2D, u, mb);
            at::NoGradGuard ng;
            const auto toDevice = [&](const at::Tensor& t) {
                return t.detach().to(opts.device, /*non_blocking=*/false, /*copy=*/true);
            };
            if (s.flat) onDevice.push_back(toDevice(s.flatSharded));
            for (int32_t pi : s.flat ? std::vector<int32_t>{} : s.params)
                onDevice.push_back(toDevice(paramStates[pi].sharded));
            rec->end(h2d);
        }
        const size_t ci = rec->begin(OpKind::CopyIn, phase, Stream::CopyIn, u, mb);
        if (s.flat) {
            // FSDP1's padded unsharded flat parameter: one storage for the unit's life,
            // re-allocated in place at each unshard (_alloc_storage) and freed at each reshard,
            // so the views autograd saved in forward see the backward's gather.
            const auto bytes = static_cast<size_t>(n * in) * c10::elementSize(s.agType);
            if (!s.flatFull.defined())
                s.flatFull = at::empty({n * in}, on(s.agType));
            else
                resizeStorage(s.flatFull, bytes);
            s.agOut = s.flatFull;
        } else {
            s.agOut = at::empty({n * in}, on(s.agType));
        }
        at::Tensor input = s.agOut.narrow(0, me * in, in);
        int64_t off = 0;
        {
            at::NoGradGuard ng;
            if (s.flat) input.copy_(onDevice.empty() ? s.flatSharded : onDevice[0]);
            size_t k = 0;
            for (int32_t pi : s.flat ? std::vector<int32_t>{} : s.params) {
                const PState& p = paramStates[pi];
                const at::Tensor& src = !onDevice.empty()   ? onDevice[k++]
                                        : s.fromPostForward ? p.postForward
                                                            : p.sharded;
                const int64_t len = src.numel();
                input.narrow(0, off, len).copy_(src.reshape({len}));
                off += len;
            }
        }
        rec->end(ci);
        const size_t ag = coll.begin(OpKind::AllGather, phase, Stream::AllGather, u, mb);
        s.agWork = coll.allGather(pg, s.agOut, input, in);
        s.agIn = in;
        s.agGroup = n;
        coll.issued(s.agWork, ag);
    }

    void waitForUnshard(int32_t u, Phase phase) {
        UState& s = unitStates[u];
        if (s.localPending) {
            // Each parameter cast to its dtype and copied into its unsharded storage.
            const size_t co = rec->begin(OpKind::CopyOut, phase, Stream::Compute, u, mb);
            for (int32_t pi : s.params) {
                PState& p = paramStates[pi];
                resizeStorage(p.unsharded, static_cast<size_t>(p.unsharded.numel()) *
                                               p.unsharded.element_size());
                const at::Tensor& src = s.fromPostForward ? p.postForward : p.sharded;
                auto shape = p.shape;
                shape[0] = p.d0;
                copyPreservingVersion(p.flat1d ? p.unsharded.detach().view({-1}) : p.unsharded, 0,
                                      src.reshape({-1}).narrow(0, 0, p.d0 * p.row).view(shape));
                if (s.fromPostForward) p.postForward.reset();
            }
            s.localPending = false;
            s.unsharded = true;
            s.postForwardCopy = false;
            rec->end(co);
            return;
        }
        if (!s.agWork) return;
        // The copy-out starts once the all-gather is done: waiting is idle time on the
        // compute stream, as in the step program, not part of the copy.
        s.agWork.wait();
        const size_t co = rec->begin(OpKind::CopyOut, phase, Stream::Compute, u, mb);
        int64_t off = 0;
        if (s.flat) {
            // The gathered flat buffer is the whole padded flat parameter, and the parameters
            // become views of it, as FSDP1's (FlatParamHandle._use_unsharded_views): no copy.
            // The reshard frees it through them.
            for (size_t k = 0; k < s.params.size(); ++k) {
                PState& p = paramStates[s.params[k]];
                viewPreservingVersion(
                    p.unsharded,
                    s.agOut.narrow(0, s.offset[k], p.unsharded.numel()).view(p.unsharded.sizes()));
            }
        }
        for (int32_t pi : s.flat ? std::vector<int32_t>{} : s.params) {
            PState& p = paramStates[pi];
            const int64_t rows = s.fromPostForward ? p.pfRows : p.rows;
            resizeStorage(p.unsharded,
                          static_cast<size_t>(p.unsharded.numel()) * p.unsharded.element_size());
            for (int64_t src = 0; src < s.agGroup; ++src) {
                const int64_t r0 = src * rows, r1 = std::min(p.d0, r0 + rows);
                if (r1 <= r0) continue;
                at::Tensor chunk = s.agOut.narrow(0, src * s.agIn + off, (r1 - r0) * p.row);
                auto shape = p.shape;
                shape[0] = r1 - r0;
                copyPreservingVersion(p.flat1d ? p.unsharded.detach().view({-1}) : p.unsharded, r0,
                                      chunk.view(shape));
            }
            off += rows * p.row;
            if (s.fromPostForward) p.postForward.reset();
        }
        s.agWork = Collective();
        // The gathered buffer is dead once copied out; its memory goes now, even if a work
        // still holds the tensor (a Gloo work until its worker thread lets go of it).
        // FSDP1's is the parameters' storage until the reshard.
        if (!s.flat) resizeStorage(s.agOut, 0);
        s.agOut.reset();
        s.unsharded = true;
        s.postForwardCopy = false;
        rec->end(co);
    }

    void reshard(int32_t u, bool keepPostForwardCopy) {
        UState& s = unitStates[u];
        if (!s.unsharded || plan.noShard) return;
        const auto& unit = plan.units[u];
        if (keepPostForwardCopy) {
            const int64_t k = unit.reshardK;
            const int64_t j = groups->shardRank % k;
            at::NoGradGuard ng;
            for (int32_t pi : s.params) {
                PState& p = paramStates[pi];
                auto shape = p.shape;
                shape[0] = p.pfRows;
                p.postForward = at::zeros(shape, on(s.agType));
                const int64_t r0 = j * p.pfRows, r1 = std::min(p.d0, r0 + p.pfRows);
                if (r1 > r0)
                    p.postForward.narrow(0, 0, r1 - r0)
                        .copy_(p.unsharded.detach().narrow(0, r0, r1 - r0));
            }
            s.postForwardCopy = true;
        }
        for (int32_t pi : s.params)
            resizeStorage(paramStates[pi].unsharded, 0);
        s.unsharded = false;
    }

    // --- hooks --------------------------------------------------------------------------

    void closeSeg() {
        if (curSeg >= 0 && self->m_segHasCompute && !segs[curSeg].hasCompute) {
            segs[curSeg].hasCompute = true;
            const size_t i =
                rec->begin(OpKind::Forward, Phase::Forward, Stream::Compute, segs[curSeg].unit, mb);
            rec->setStart(i, segStart);
            rec->end(i);
        }
        self->m_segHasCompute = false;
    }

    void openSeg(int32_t unit) {
        segs.push_back({unit, false});
        curSeg = static_cast<int32_t>(segs.size() - 1);
        segStart = nowNs();
        self->m_segHasCompute = false;
    }

    int32_t newBoundary(bool exit, int32_t u) {
        boundaries.push_back({exit, u, -1});
        return static_cast<int32_t>(boundaries.size() - 1);
    }

    at::Tensor attach(const at::Tensor& t, int32_t b) {
        if (t.requires_grad() && at::GradMode::is_enabled()) return BoundaryFn::apply(t, b);
        deferred.push_back(b);
        return t;
    }

    void preForward(int32_t u) {
        unshard(u, Phase::Forward);
        waitForUnshard(u, Phase::Forward);
        const auto& unit = plan.units[u];
        if (unit.explicitForwardPrefetch) {
            for (UnitId t : unit.forwardPrefetch)
                unshard(t.value, Phase::Forward);
        } else if (fsdp1() && plan.plan.fsdp1.forwardPrefetch &&
                   u + 1 < static_cast<int32_t>(plan.units.size())) {
            unshard(u + 1, Phase::Forward);  // FSDP1 forward_prefetch: the next unit
        }
    }
    bool fsdp1() const { return plan.plan.api == PlanApi::Fsdp1; }
    // The unit before u in post-forward order (the implicit backward prefetch target).
    int32_t previousInPostForward(int32_t u) const {
        auto it = std::find(postForwardOrder.begin(), postForwardOrder.end(), u);
        return it != postForwardOrder.end() && it != postForwardOrder.begin() ? *(it - 1) : -1;
    }

    void postForward(int32_t u) {
        const auto& unit = plan.units[u];
        if (unit.reshard != Reshard::False) reshard(u, unit.reshard == Reshard::Int);
        // Only parameter groups record the post-forward order (FSDPParamGroup.post_forward).
        if (!unit.params.empty()) postForwardOrder.push_back(u);
    }

    void recordBackwardSeg(int32_t s) {
        if (s >= 0 && segs[s].hasCompute) {
            const size_t i =
                rec->begin(OpKind::Backward, Phase::Backward, Stream::Compute, segs[s].unit, mb);
            rec->setStart(i, lastBwdMark);
            rec->end(i);
        }
    }

    void preBackward(int32_t u) {
        rec->setCurrent(plan.units[u].displayName() + " pre-backward");
        unitStates[u].backwardBegun = true;
        unshard(u, Phase::Backward);
        waitForUnshard(u, Phase::Backward);
        const auto& unit = plan.units[u];
        if (unit.explicitBackwardPrefetch) {
            for (UnitId t : unit.backwardPrefetch)
                unshard(t.value, Phase::Backward);
        } else if ((!fsdp1() || plan.plan.fsdp1.backwardPrefetch == "BACKWARD_PRE") &&
                   !unit.params.empty()) {
            // The implicit prefetch is the parameter group's (FSDPParamGroup.pre_backward;
            // FSDP1's from its handle): a unit without parameters, such as a root whose
            // modules all have units of their own, prefetches nothing.
            if (const int32_t t = previousInPostForward(u); t >= 0) unshard(t, Phase::Backward);
        }
    }

    void postBackward(int32_t u) {
        UState& s = unitStates[u];
        if (s.postBackwardDone) return;
        s.postBackwardDone = true;
        // Kept unsharded between micro-batches, resharded after the last one's backward (as
        // samples/apply_plan.py's prepare_micro_batch and the step program do).
        if (plan.units[u].reshardAfterBackward || lastMicroBatch) reshard(u, false);
        // A unit without parameters to train has no parameter group: it reduces nothing.
        if (sync && !plan.units[u].params.empty() && plan.units[u].trainableShardedBytes > 0)
            reduce(u);
    }

    void reduce(int32_t u) {
        UState& s = unitStates[u];
        const int64_t n = groups->shardSize;
        int64_t in = s.flat ? s.flatShard : 0;
        if (!s.flat)
            for (int32_t pi : s.params)
                in += paramStates[pi].rows * paramStates[pi].row;
        rec->setCurrent(plan.units[u].displayName() +
                        (plan.noShard ? " all-reduce" : " reduce-scatter"));
        const size_t ci =
            rec->begin(OpKind::ReduceScatterCopyIn, Phase::Backward, Stream::Compute, u, mb);
        at::Tensor input = at::zeros({n * in}, on(s.reduceType));
        int64_t off = 0;
        {
            at::NoGradGuard ng;
            if (s.flat)
                for (size_t k = 0; k < s.params.size(); ++k) {
                    PState& p = paramStates[s.params[k]];
                    const at::Tensor grad = p.unsharded.grad();
                    if (!grad.defined()) continue;
                    input.narrow(0, s.offset[k], grad.numel()).copy_(grad.reshape({-1}));
                    p.unsharded.mutable_grad() = at::Tensor();
                }
            for (int32_t pi : s.flat ? std::vector<int32_t>{} : s.params) {
                PState& p = paramStates[pi];
                at::Tensor grad = p.unsharded.grad();
                if (grad.defined() && p.flat1d) grad = grad.reshape({-1});
                if (grad.defined()) {
                    for (int64_t dst = 0; dst < n; ++dst) {
                        const int64_t r0 = dst * p.rows, r1 = std::min(p.d0, r0 + p.rows);
                        if (r1 <= r0) continue;
                        input.narrow(0, dst * in + off, (r1 - r0) * p.row)
                            .copy_(grad.narrow(0, r0, r1 - r0).reshape({-1}));
                    }
                    p.unsharded.mutable_grad() = at::Tensor();  // freed: the copy holds it
                }
                off += p.rows * p.row;
            }
        }
        rec->end(ci);
        if (plan.noShard) {
            // NO_SHARD: the gradients are all-reduced over every rank, in place.
            const size_t ar =
                coll.begin(OpKind::AllReduce, Phase::Backward, Stream::ReduceScatter, u, mb);
            Reduction red{u, {}, input, {}, in, 0};
            std::vector<at::Tensor> t{input};
            c10d::AllreduceOptions ao;
            red.averaged = averageInCollective(s.reduceType);
            if (red.averaged) ao.reduceOp = c10d::ReduceOp::AVG;
            red.work.works.push_back(groups->replicate->allreduce(t, ao));
            coll.issued(red.work, ar);
            reductions.push_back(std::move(red));
            return;
        }
        const size_t rs =
            coll.begin(OpKind::ReduceScatter, Phase::Backward, Stream::ReduceScatter, u, mb);
        c10d::Backend& pg = *groups->shard;
        Reduction red{u, {}, {}, {}, in, pg.getRank()};
        if (coll.inPlaceChunks(pg)) {
            for (int64_t dst = 0; dst < n; ++dst) {
                std::vector<at::Tensor> t{input.narrow(0, dst * in, in)};
                c10d::ReduceOptions ro;
                ro.rootRank = dst;
                ro.reduceOp = c10d::ReduceOp::SUM;
                red.work.works.push_back(pg.reduce(t, ro));
            }
            red.inPlace = true;
            // The reduced shard's buffer exists from the issue on, as the output of NCCL's
            // reduce-scatter does: retiring copies into it, so no allocation happens then.
            red.out = at::empty({in}, on(s.reduceType));
        } else {
            red.out = at::empty({in}, on(s.reduceType));
            c10d::ReduceScatterOptions ro;
            red.averaged = averageInCollective(s.reduceType);
            ro.reduceOp = red.averaged ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
            red.work.works.push_back(pg._reduce_scatter_base(red.out, input, ro));
        }
        red.input = input;
        input = at::Tensor();
        if (groups->replicateSize > 1) {
            // HSDP: the replicas all-reduce the reduced shard; it needs the reduce-scatter's
            // result, so the CPU waits for it before issuing.
            if (opts.blockingCollectives) {
                coll.waitBlocking(red.work, rs);
            } else {
                coll.drain();
                red.work.wait();
                rec->endAt(rs, nowNs());
            }
            retire(red);
            const size_t ar =
                coll.begin(OpKind::AllReduce, Phase::Backward, Stream::AllReduce, u, mb);
            std::vector<at::Tensor> t{red.out};
            red.work = Collective();
            c10d::AllreduceOptions ao;
            if (red.averaged) ao.reduceOp = c10d::ReduceOp::AVG;
            red.work.works.push_back(groups->replicate->allreduce(t, ao));
            coll.issued(red.work, ar);
        } else {
            coll.issued(red.work, rs);
        }
        if (opts.blockingCollectives) retire(red);
        if (plan.units[u].offload.enabled) {
            // CPU offload: the reduced shard goes back to the host for its optimizer step.
            coll.drain();
            red.work.wait();
            retire(red);
            const size_t d2h = rec->begin(OpKind::D2H, Phase::Backward, Stream::D2H, u, mb);
            red.out = red.out.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
            rec->end(d2h);
        }
        reductions.push_back(std::move(red));
        retireCompleted();
    }
};

// ---------------------------------------------------------------------------------------

FsdpRuntime::FsdpRuntime(const ResolvedPlan& plan, Groups* groups, Recorder* recorder,
                         RuntimeOptions options)
    : m_impl(std::make_unique<Impl>(plan, groups, recorder, options)) {
    m_impl->self = this;
    m_impl->init();
    if (options.blockingCollectives) observeGlooSpans();
    g_runtime = this;
}

FsdpRuntime::~FsdpRuntime() {
    m_impl->coll.stop();
    if (g_runtime == this) g_runtime = nullptr;
}

const at::Tensor& FsdpRuntime::param(ParamId p) const {
    return m_impl->paramStates[m_impl->paramStateOf[p.index()]].unsharded;
}

at::Tensor FsdpRuntime::callModule(ModuleId m, const at::Tensor& input,
                                   const std::function<at::Tensor(const at::Tensor&)>& body) {
    Impl& s = *m_impl;
    const int32_t u = s.unitAt[m.index()];
    // Selective checkpointing: the attention modules of a unit are recomputed in backward.
    if (s.opts.fsdp && u < 0 && !s.recomputing && !s.unitStack.empty() &&
        at::GradMode::is_enabled() &&
        s.plan.units[s.unitStack.back()].activationCheckpointing == AcMode::Attention &&
        s.model.module(m).cls.find("Attention") != std::string::npos)
        return checkpoint(input, body, s.unitStack.back());
    if (!s.opts.fsdp || u < 0 || s.recomputing) return body(input);
    const auto& unit = s.plan.units[u];
    at::Tensor x = input;
    // A unit of several modules: its pre-forward runs before the first of them only (a later
    // one runs inside the group's forward already).
    if (s.unitStates[u].modulesLeft == 0) {
        s.unitStates[u].modulesLeft = std::max<size_t>(1, unit.modules.size());
        // Pre-forward.
        s.closeSeg();
        const int32_t enter = s.newBoundary(false, u);
        s.rec->setCurrent(unit.displayName() + " pre-forward");
        s.preForward(u);
        s.openSeg(u);
        s.boundaries[enter].segAfter = s.curSeg;
        if (x.is_floating_point() && unit.mixedPrecision.paramDtype &&
            unit.mixedPrecision.castForwardInputs)
            x = x.to(s.unitStates[u].agType);
        x = s.attach(x, enter);
    }
    s.unitStack.push_back(u);
    const at::Tensor y = unit.activationCheckpointing == AcMode::Full && at::GradMode::is_enabled()
                             ? checkpoint(x, body, u)
                             : body(x);
    s.unitStack.pop_back();
    if (--s.unitStates[u].modulesLeft > 0) return y;  // the group's other modules run later
    return s.finishForward(u, y);
}

// Runs `body` without saving for backward and recomputes it there (reentrant
// checkpointing, as torch.utils.checkpoint with use_reentrant=True).
at::Tensor FsdpRuntime::checkpoint(const at::Tensor& x,
                                   const std::function<at::Tensor(const at::Tensor&)>& body,
                                   int32_t u) {
    Impl& s = *m_impl;
    s.bodies.push_back(body);
    struct Checkpoint : torch::autograd::Function<Checkpoint> {
        // `anchor` requires grad so the output does even when the unit's input does not
        // (the parameters' gradients come from the recompute's own backward).
        static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                  const at::Tensor& anchor, int64_t bodyIndex, int64_t unit) {
            (void)anchor;
            ctx->saved_data["body"] = bodyIndex;
            ctx->saved_data["unit"] = unit;
            ctx->save_for_backward({x});
            return g_runtime->m_impl->bodies[static_cast<size_t>(bodyIndex)](x);
        }
        static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                       torch::autograd::variable_list grads) {
            Impl& s = *g_runtime->m_impl;
            const at::Tensor x = ctx->get_saved_variables()[0];
            const auto bodyIndex = static_cast<size_t>(ctx->saved_data["body"].toInt());
            const auto unit = static_cast<int32_t>(ctx->saved_data["unit"].toInt());
            bool& recorded = s.unitStates[static_cast<size_t>(unit)].recomputeRecorded;
            const bool record = !recorded;
            recorded = true;
            const size_t rc = record ? s.rec->begin(OpKind::Recompute, Phase::Backward,
                                                    Stream::Compute, unit, s.mb)
                                     : Recorder::kNone;
            at::Tensor xd = x.detach().requires_grad_(x.requires_grad());
            at::Tensor y;
            {
                at::AutoGradMode on(true);
                s.recomputing = true;
                y = s.bodies[bodyIndex](xd);
                s.recomputing = false;
            }
            if (record) {
                s.rec->end(rc);
                s.lastBwdMark = nowNs();
            }
            torch::autograd::backward({y}, {grads[0]});
            return {xd.requires_grad() ? xd.grad() : at::Tensor(), at::Tensor(), at::Tensor(),
                    at::Tensor()};
        }
    };
    static const at::Tensor anchor = at::empty({0}).requires_grad_(true);
    at::Tensor y = Checkpoint::apply(x, anchor, static_cast<int64_t>(s.bodies.size() - 1),
                                     static_cast<int64_t>(u));
    noteCompute();
    return y;
}

void FsdpRuntime::boundaryBackward(int64_t b) {
    Impl& s = *m_impl;
    const auto bd = s.boundaries[static_cast<size_t>(b)];
    s.recordBackwardSeg(bd.segAfter);
    if (bd.exit) {
        s.preBackward(bd.unit);
    } else {
        // FSDP1 BACKWARD_POST: prefetch the previous unit once this one's gradients are
        // computed, before its reduce-scatter.
        // Only a unit whose backward has not begun (FSDP1's _needs_pre_backward_unshard).
        if (s.fsdp1() && s.plan.plan.fsdp1.backwardPrefetch == "BACKWARD_POST" &&
            !s.unitStates[bd.unit].postBackwardDone)
            if (const int32_t t = s.previousInPostForward(bd.unit);
                t >= 0 && !s.unitStates[t].backwardBegun)
                s.unshard(t, Phase::Backward);
        s.postBackward(bd.unit);
    }
    s.lastBwdMark = nowNs();
}

void FsdpRuntime::beginMicroBatch(int32_t mb, bool syncGradients, bool last) {
    Impl& s = *m_impl;
    s.mb = mb;
    s.lastMicroBatch = last;
    s.sync = syncGradients;
    s.boundaries.clear();
    s.deferred.clear();
    s.segs.clear();
    s.curSeg = -1;
    s.postForwardOrder.clear();
    s.bodies.clear();
    for (auto& u : s.unitStates)
        u.postBackwardDone = u.backwardBegun = u.recomputeRecorded = false;
    m_segHasCompute = false;
}

void FsdpRuntime::backward(const at::Tensor& loss) {
    Impl& s = *m_impl;
    s.lastBwdMark = nowNs();
    if (!s.opts.fsdp) {
        torch::autograd::backward({loss});
        return;
    }
    torch::autograd::backward({loss});
    // Boundaries whose tensor needed no gradient (the model's token-id input): their
    // segment's backward has finished when autograd returns.
    for (auto it = s.deferred.rbegin(); it != s.deferred.rend(); ++it) {
        s.recordBackwardSeg(s.boundaries[static_cast<size_t>(*it)].segAfter);
        s.lastBwdMark = nowNs();
    }
    // The root's final callback: post-backward of every unit that has not run it, in
    // unit order (FSDPState._root_post_backward_final_callback over all states).
    for (size_t u = 0; u < s.unitStates.size(); ++u)
        s.postBackward(static_cast<int32_t>(u));
    // FSDP2's finalize_backward lets go of the reduce-scatter inputs that are done.
    s.retireCompleted();
}

void FsdpRuntime::optimizerStep() {
    Impl& s = *m_impl;
    s.rec->setCurrent("optimizer step (waiting for the gradient reductions)");
    if (s.opts.fsdp) {
        // The watcher finishes its waits first: one Gloo work must not be waited on by two
        // threads at once. The step starts when every reduction is done (waiting is idle).
        s.coll.drain();
        for (auto& red : s.reductions)
            red.work.wait();
    }
    const size_t st =
        s.rec->begin(OpKind::OptimizerStep, Phase::Optimizer, Stream::Compute, 0, s.mb);
    if (s.opts.fsdp) {
        for (auto& red : s.reductions) {
            red.work.wait();
            s.fold(red);
        }
        s.reductions.clear();
    }
    s.rec->setCurrent("optimizer step");
    // zero_grad(set_to_none=True): the gradients are freed.
    auto stepAndFree = [](torch::optim::AdamW& opt) {
        opt.step();
        for (auto& group : opt.param_groups())
            for (auto& p : group.params())
                p.mutable_grad() = at::Tensor();
    };
    if (s.adam) stepAndFree(*s.adam);
    s.rec->end(st);
    if (s.hostAdam) {  // offloaded shards: the host's optimizer step
        s.rec->setCurrent("optimizer step (host)");
        const size_t h =
            s.rec->begin(OpKind::OptimizerStep, Phase::Optimizer, Stream::Host, 0, s.mb);
        stepAndFree(*s.hostAdam);
        s.rec->end(h);
    }
}

std::vector<at::Tensor> FsdpRuntime::fullParameters() {
    Impl& s = *m_impl;
    std::vector<at::Tensor> out;
    std::vector<at::Tensor> flatFull(s.unitStates.size());
    for (size_t u = 0; u < s.unitStates.size(); ++u) {
        const auto& st = s.unitStates[u];
        if (!s.opts.fsdp || !st.flat || s.plan.noShard || !st.flatSharded.defined()) continue;
        const int64_t n = s.groups->shardSize;
        at::Tensor gathered = at::empty({n * st.flatShard}, s.on(at::kFloat));
        at::Tensor local = st.flatSharded.detach().to(s.opts.device).contiguous();
        s.groups->shard->_allgather_base(gathered, local)->wait();
        flatFull[u] = gathered;
    }
    for (auto& p : s.paramStates) {
        const int32_t unit =
            s.plan.unitOfParam[p.id.index()].valid() ? s.plan.unitOfParam[p.id.index()].value : 0;
        const auto& st = s.unitStates[static_cast<size_t>(unit)];
        if (s.opts.fsdp && st.flat && !s.plan.noShard) {
            const size_t k = static_cast<size_t>(
                std::find(st.params.begin(), st.params.end(), s.paramStateOf[p.id.index()]) -
                st.params.begin());
            out.push_back(flatFull[static_cast<size_t>(unit)]
                              .narrow(0, st.offset[k], p.unsharded.numel())
                              .view(p.unsharded.sizes())
                              .clone());
            continue;
        }
        if (!s.opts.fsdp || s.plan.noShard) {
            out.push_back(p.unsharded.detach().clone());
            continue;
        }
        const int64_t n = s.groups->shardSize;
        at::Tensor gathered = at::empty({n * p.sharded.numel()}, s.on(at::kFloat));
        at::Tensor local = p.sharded.detach().to(s.opts.device).reshape({-1}).contiguous();
        s.groups->shard->_allgather_base(gathered, local)->wait();
        auto shape = p.shape;
        shape[0] = n * p.rows;
        out.push_back(gathered.view(shape).narrow(0, 0, p.d0).reshape(p.trueShape).clone());
    }
    return out;
}

c10::Device FsdpRuntime::device() const {
    return m_impl->opts.device;
}

int64_t FsdpRuntime::shardedBytes() const {
    int64_t b = 0;
    for (const auto& p : m_impl->paramStates)
        if (p.sharded.defined()) b += p.sharded.numel() * p.sharded.element_size();
    return b;
}

}  // namespace shardscope::exec
