// SPDX-License-Identifier: Apache-2.0
#include "engine/calibrate/kernel_samples.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "engine/sim/cost_model.h"
#include "plans/core/strings.h"
#include "plans/plan/resolve.h"
#include "profiler/import/kineto_import.h"

namespace shardscope {

const char* kernelClassName(KernelClass c) {
    switch (c) {
        case KernelClass::Gemm:
            return "gemm";
        case KernelClass::Attention:
            return "attention";
        case KernelClass::MemoryBound:
            return "memory-bound";
        case KernelClass::Collective:
            return "collective";
        case KernelClass::Other:
            break;
    }
    return "other";
}

namespace {

std::string lower(std::string_view s) {
    std::string r(s);
    for (char& c : r)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return r;
}

bool contains(std::string_view s, std::string_view what) {
    return s.find(what) != std::string_view::npos;
}

// The matmul ops whose FLOPs record_shapes gives: (index of A, index of B) in "Input Dims".
struct MatmulOp {
    std::string_view name;
    int a, b;
    bool batched, linear;
};
constexpr MatmulOp kMatmulOps[] = {
    {"aten::mm", 0, 1, false, false},
    {"aten::addmm", 1, 2, false, false},
    {"aten::_addmm_activation", 1, 2, false, false},
    {"aten::_scaled_mm", 0, 1, false, false},
    {"aten::bmm", 0, 1, true, false},
    {"aten::baddbmm", 1, 2, true, false},
    {"aten::linear", 0, 1, false, true},
};

const MatmulOp* matmulOp(std::string_view name) {
    for (const auto& m : kMatmulOps)
        if (m.name == name) return &m;
    return nullptr;
}

bool isAttentionOp(std::string_view name) {
    return contains(name, "attention") || contains(name, "_attn") || contains(name, "sdpa");
}

bool isGemmKernel(const std::string& lowerName) {
    static const char* const pats[] = {
        "gemm",  "nvjet", "cutlass", "xmma",  "cijk_", "bmm_",    "matmul", "wmma",    "s1688",
        "h1688", "s884",  "h884",    "sm80_", "sm90_", "ampere_", "volta_", "turing_", "hopper_"};
    for (const char* p : pats)
        if (contains(lowerName, p)) return true;
    return false;
}

bool isAttentionKernel(const std::string& lowerName) {
    return contains(lowerName, "flash") || contains(lowerName, "fmha") ||
           contains(lowerName, "attention") || contains(lowerName, "attn");
}

// Host ops that move no data (views, allocations, metadata): never a memory-bound sample.
bool movesNoData(std::string_view name) {
    if (name.substr(0, 6) == "aten::") name.remove_prefix(6);
    static const std::string_view none[] = {"view",
                                            "_unsafe_view",
                                            "reshape",
                                            "_reshape_alias",
                                            "t",
                                            "transpose",
                                            "permute",
                                            "expand",
                                            "expand_as",
                                            "as_strided",
                                            "slice",
                                            "select",
                                            "unsqueeze",
                                            "squeeze",
                                            "detach",
                                            "detach_",
                                            "alias",
                                            "split",
                                            "split_with_sizes",
                                            "chunk",
                                            "narrow",
                                            "unbind",
                                            "empty",
                                            "empty_like",
                                            "empty_strided",
                                            "new_empty",
                                            "new_empty_strided",
                                            "resize_",
                                            "set_",
                                            "lift_fresh",
                                            "view_as",
                                            "flatten",
                                            "unflatten",
                                            "contiguous",
                                            "to",
                                            "type_as",
                                            "result_type",
                                            "item",
                                            "_local_scalar_dense",
                                            "is_nonzero",
                                            "movedim",
                                            "swapaxes",
                                            "unfold",
                                            "diagonal",
                                            "requires_grad_",
                                            "retain_grad",
                                            "_has_compatible_shallow_copy_type",
                                            "record_stream",
                                            "numpy_T",
                                            "_to_copy",
                                            "clone",
                                            "zeros",
                                            "ones",
                                            "full",
                                            "zeros_like",
                                            "ones_like",
                                            "full_like",
                                            "new_zeros",
                                            "new_ones",
                                            "new_full",
                                            "arange",
                                            "lift",
                                            "stride",
                                            "size",
                                            "dim",
                                            "is_same_size",
                                            "_nested_tensor_from_mask_left_aligned"};
    for (auto n : none)
        if (name == n) return true;
    return false;
}

std::optional<DType> recordShapesDtype(std::string_view t) {
    if (t.substr(0, 5) == "c10::") t.remove_prefix(5);
    if (t == "float" || t == "Float") return DType::Float32;
    if (t == "double" || t == "Double") return DType::Float64;
    if (t == "BFloat16") return DType::BFloat16;
    if (t == "Half") return DType::Float16;
    if (t.substr(0, 11) == "Float8_e4m3") return DType::Float8E4M3;
    if (t.substr(0, 11) == "Float8_e5m2") return DType::Float8E5M2;
    return std::nullopt;
}

// 2·M·N·K (times the batch) of a matmul op, or 0 when its shapes do not say.
// M x K by K x N of a matmul op from its record_shapes inputs (a batched one's batch folded
// into M); 0s when they do not fit together.
struct MatmulShape {
    int64_t m = 0, n = 0, k = 0;
    [[nodiscard]] double flops() const {
        return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    }
};
MatmulShape matmulShape(const MatmulOp& m, const OpInputs& in) {
    const auto a = static_cast<size_t>(m.a), b = static_cast<size_t>(m.b);
    if (in.dims.size() <= std::max(a, b)) return {};
    const auto& A = in.dims[a];
    const auto& B = in.dims[b];
    // Every dimension positive (shapeElements: 0 for a negative one or on overflow).
    const auto fits = [](MatmulShape s) {
        return s.m > 0 && s.n > 0 && s.k > 0 ? s : MatmulShape{};
    };
    if (m.linear) {  // x[..., K] · W[N, K]^T
        if (A.empty() || B.size() != 2 || A.back() != B[1]) return {};
        return fits({shapeElements(std::vector<int64_t>(A.begin(), A.end() - 1)), B[0], B[1]});
    }
    if (m.batched) {
        if (A.size() != 3 || B.size() != 3 || A[2] != B[1] || A[0] != B[0]) return {};
        return fits({shapeElements({A[0], A[1]}), B[2], A[2]});
    }
    if (A.size() != 2 || B.size() != 2 || A[1] != B[0]) return {};
    return fits({A[0], B[1], A[1]});
}

// Sets a GEMM sample's FLOPs and shape.
void setMatmul(KernelSample& s, const MatmulOp& m, const OpInputs& in) {
    const MatmulShape sh = matmulShape(m, in);
    s.flops = sh.flops();
    s.m = sh.m;
    s.n = sh.n;
    s.k = sh.k;
}

// FLOPs of a scaled-dot-product-attention op from its record_shapes inputs, as
// torch.utils.flop_counter counts them (the full s_q x s_k score matrix, causal or not):
// forward 2·b·h·s_q·s_k·(d_q + d_v) from (query, key, value); backward, whose inputs start
// with grad_out, 2·b·h·s_q·s_k·(3·d_q + 2·d_v). Inputs are [b, h, s, d]; 0 when they are
// not.
double attentionFlops(std::string_view name, const OpInputs& in) {
    const bool backward = name.find("backward") != std::string_view::npos;
    const size_t q = backward ? 1 : 0;
    if (in.dims.size() < q + 3) return 0;
    const auto& Q = in.dims[q];
    const auto& K = in.dims[q + 1];
    const auto& V = in.dims[q + 2];
    if (Q.size() != 4 || K.size() != 4 || V.size() != 4 || Q[0] != K[0] || Q[3] != K[3] ||
        K[2] != V[2])
        return 0;
    const double bh = static_cast<double>(Q[0]) * static_cast<double>(Q[1]);
    const double sqk = static_cast<double>(Q[2]) * static_cast<double>(K[2]);
    const double dq = static_cast<double>(Q[3]), dv = static_cast<double>(V[3]);
    return 2.0 * bh * sqk * (backward ? 3.0 * dq + 2.0 * dv : dq + dv);
}

// Whether an SDPA op ran through a mask or bias: a 4-D input after q, k and v whose last
// two dimensions are the query and key lengths (a sliding window's (b, 1, s, s)).
bool attentionMasked(std::string_view name, const OpInputs& in) {
    const size_t q = name.find("backward") != std::string_view::npos ? 1 : 0;
    if (in.dims.size() < q + 3 || in.dims[q].size() != 4 || in.dims[q + 1].size() != 4)
        return false;
    const int64_t sq = in.dims[q][2], sk = in.dims[q + 1][2];
    for (size_t i = q + 3; i < in.dims.size(); ++i) {
        const auto& d = in.dims[i];
        if (d.size() == 4 && d[2] == sq && d[3] == sk) return true;
    }
    return false;
}

// Ops that read only the elements their index names from their largest input: an
// embedding's table, a loss's logits at the targets (nll_loss reads one logit a row).
bool readsByIndex(std::string_view name) {
    static constexpr std::string_view kByIndex[] = {"aten::embedding", "aten::nll_loss_forward",
                                                    "aten::nll_loss2d_forward"};
    return std::find(std::begin(kByIndex), std::end(kByIndex), name) != std::end(kByIndex);
}

// Bytes an op with these inputs moves: every tensor input read, plus one output the size
// of the largest input unless the op works in place (its name ends in '_', as copy_ and
// fill_ do: their first input is the output).
//  - An input broadcast to a larger shape (stride 0 in "Input Strides", as expand gives) is
//    read once: it counts its distinct elements. Its logical size still sizes the output
//    (x * rsqrt over [1, 4096, 1] writes all of x's [1, 4096, 4096]).
//  - An op that reads its largest input by index (readsByIndex), or, in a trace without
//    strides, any op whose largest input is over 4x all the others together (an expanded
//    index cannot be told from a streamed input there), counts that input as the largest of
//    the others. Before strides were read, that rule made every broadcast multiply (RMSNorm's
//    x * rsqrt and weight, RoPE's cos and sin) move a few KB, where it moves 67-134 MB
//    on a Llama-3.1-8B layer at 4,096 tokens.
// `broadcast`, when given, is set when a tensor input of more than one element is smaller than
// the largest (a weight, x * rsqrt over [..., 1], an expand): KernelSample::broadcast.
double opBytes(std::string_view name, const OpInputs& in, bool* broadcast = nullptr) {
    std::vector<double> read, logical;  // per tensor input: distinct and logical bytes
    std::vector<int64_t> elements;      // and logical elements
    bool strided = false;
    for (size_t i = 0; i < in.dims.size(); ++i) {
        if (in.dims[i].empty() || i >= in.types.size()) continue;
        const int64_t per = traceDtypeBytes(in.types[i]);
        if (per <= 0) continue;
        const auto& d = in.dims[i];
        const double all = static_cast<double>(shapeElements(d)) * static_cast<double>(per);
        double distinct = all;
        if (i < in.strides.size() && in.strides[i].size() == d.size()) {
            strided = true;
            std::vector<int64_t> kept;
            for (size_t k = 0; k < d.size(); ++k)
                if (in.strides[i][k] != 0) kept.push_back(d[k]);
            distinct = static_cast<double>(shapeElements(kept)) * static_cast<double>(per);
        }
        read.push_back(distinct);
        logical.push_back(all);
        elements.push_back(shapeElements(d));
    }
    if (read.empty()) return 0;
    const size_t largest =
        static_cast<size_t>(std::max_element(read.begin(), read.end()) - read.begin());
    double others = 0, secondLargest = 0;
    for (size_t i = 0; i < read.size(); ++i)
        if (i != largest) {
            others += read[i];
            secondLargest = std::max(secondLargest, read[i]);
        }
    if (read.size() >= 2 && (readsByIndex(name) || (!strided && read[largest] > 4 * others))) {
        read[largest] = secondLargest;
        logical[largest] = secondLargest;
    }
    const double out = *std::max_element(logical.begin(), logical.end());
    if (broadcast) {
        // By elements, not bytes: a casting copy_ reads bf16 into fp32 and broadcasts nothing.
        const int64_t most = *std::max_element(elements.begin(), elements.end());
        *broadcast = false;
        for (size_t i = 0; i < read.size(); ++i)
            if (read[i] < logical[i] || (elements[i] < most && elements[i] > 1)) *broadcast = true;
    }
    double sum = 0;
    for (double x : read)
        sum += x;
    const bool inPlace = !name.empty() && name.back() == '_';
    return sum + (inPlace ? 0 : out);
}

// torch._chunk_cat(tensors, dim, num_chunks, out=...), as FSDP2's reduce-scatter copy-in calls
// it: record_shapes gives its tensor list's shapes but not their dtype ("TensorList"), and
// lists `out` among the inputs, so opBytes would skip the list and count `out` as read and
// written (8 bytes an element for bf16 gradients cast into an fp32 buffer, where the kernel
// moves 6). It reads the list once and writes `out`: the list's elements at the source dtype,
// which the kernel's template arguments name (chunk_cat_cuda_kernel<dst_t, src_t>; out's
// dtype when the name does not), plus out's bytes. 0 when the op has no `out` tensor.
// torch._chunk_cat's `out` as record_shapes lists it: the last input with a shape and a
// dtype after the tensor list (whose dims record_shapes gives as one total).
struct ChunkCatOut {
    const std::vector<int64_t>* dims = nullptr;
    int64_t elementBytes = 0;
};
std::optional<ChunkCatOut> chunkCatOut(const OpInputs& in) {
    if (in.dims.empty() || in.types.empty() || in.types[0] != "TensorList" ||
        in.dims[0].size() != 1)
        return std::nullopt;
    for (size_t i = in.dims.size(); i-- > 1;)
        if (i < in.types.size() && !in.dims[i].empty())
            if (const int64_t b = traceDtypeBytes(in.types[i]); b > 0)
                return ChunkCatOut{&in.dims[i], b};
    return std::nullopt;
}

double chunkCatBytes(const OpInputs& in, std::string_view kernel) {
    const auto out = chunkCatOut(in);
    if (!out) return 0;
    const int64_t dst = out->elementBytes;
    const int64_t outBytes = shapeElements(*out->dims) * dst;
    if (outBytes <= 0) return 0;
    int64_t src = dst;
    constexpr std::string_view kTemplate = "chunk_cat_cuda_kernel<";
    if (const size_t at = kernel.find(kTemplate); at != std::string_view::npos) {
        std::string_view args = kernel.substr(at + kTemplate.size());
        const size_t comma = args.find(','), close = args.find('>');
        if (comma != std::string_view::npos && comma < close) {
            std::string_view s = args.substr(comma + 1, close - comma - 1);
            while (!s.empty() && s.front() == ' ')
                s.remove_prefix(1);
            while (!s.empty() && s.back() == ' ')
                s.remove_suffix(1);
            if (const int64_t b = traceDtypeBytes(s); b > 0) src = b;
        }
    }
    return static_cast<double>(in.dims[0][0]) * static_cast<double>(src) +
           static_cast<double>(outBytes);
}

// The blocks of one chunk of torch._chunk_cat's output, as its CUDA path lists them on the
// host (a block index for every kChunkCatBytesPerBlock): `out` is
// [num_chunks, chunk elements] for dim 0 (FSDP2 passes the reduce-scatter input viewed as
// [world size, -1]). Each tensor's piece of a chunk rounds up to whole blocks; record_shapes
// gives the list's total, not each tensor's, so this counts the chunk's bytes in blocks
// (short by at most one block a tensor). 0 when `out` is not such a tensor.
int64_t chunkCatBlocksPerChunk(const OpInputs& in) {
    const auto out = chunkCatOut(in);
    if (!out || out->dims->size() < 2 || out->dims->back() <= 0) return 0;
    const int64_t chunkBytes = checkedProduct(out->dims->back(), out->elementBytes);
    return chunkBytes > 0 ? (chunkBytes + kChunkCatBytesPerBlock - 1) / kChunkCatBytesPerBlock : 0;
}

// Ops that read or write the rows an index names: what they move follows the index, not
// their inputs' sizes (a cross-entropy's gather of [tokens, vocab] logits, or of a
// 151,936-row table through a [4096, 4096] index expanded from 4,096 ids, read as 436 MB
// in 20 us: 22 TB/s on an H200, which made `calibrate` raise the cluster's bandwidth 4x;
// nll_loss_backward, which writes one element of its fp32 [tokens, vocab] gradient a row into
// what a fill_ zeroed: read as inputs, 8.4 GB in 12 us on the H200 at 2 x 4,096).
// Embedding lookups keep their estimate (opBytes counts their table as the index's size).
bool indexedOp(std::string_view name) {
    static constexpr std::string_view kIndexed[] = {
        "aten::gather",          "aten::scatter",
        "aten::scatter_",        "aten::scatter_add",
        "aten::scatter_add_",    "aten::scatter_reduce",
        "aten::scatter_reduce_", "aten::index",
        "aten::index_select",    "aten::index_put",
        "aten::index_put_",      "aten::index_add",
        "aten::index_add_",      "aten::index_copy",
        "aten::index_copy_",     "aten::take",
        "aten::take_along_dim",  "aten::masked_select",
        "aten::masked_scatter",  "aten::masked_scatter_"};
    return std::find(std::begin(kIndexed), std::end(kIndexed), name) != std::end(kIndexed) ||
           name == "aten::nll_loss_backward" || name == "aten::nll_loss2d_backward";
}

int32_t stepNumber(std::string_view name) {
    // "ProfilerStep#12"
    if (name.substr(0, 13) != "ProfilerStep#") return -1;
    int32_t n = 0;
    bool any = false;
    for (char c : name.substr(13)) {
        if (c < '0' || c > '9') break;
        if (n > 100'000'000) return -1;
        n = n * 10 + (c - '0');
        any = true;
    }
    return any ? n : -1;
}

}  // namespace

std::string collectiveKind(const std::string& name) {
    const std::string n = lower(name);
    if (contains(n, "reduce_scatter") || contains(n, "reducescatter")) return "reduce_scatter";
    if (contains(n, "allreduce") || contains(n, "all_reduce")) return "allreduce";
    if (contains(n, "allgather") || contains(n, "all_gather")) return "allgather";
    if (contains(n, "broadcast")) return "broadcast";
    if (contains(n, "alltoall") || contains(n, "all_to_all")) return "alltoall";
    if (contains(n, "sendrecv") || contains(n, "send") || contains(n, "recv")) return "sendrecv";
    return "";
}

bool sameDevice(const std::string& traceDevice, const std::string& clusterDevice) {
    // The model is the first word with a letter and a digit ("A100-PG509-200" -> A100,
    // "H100", "MI250X"), up to a '-'; a name without one ("AMD Radeon Graphics") says nothing.
    std::string token;
    size_t i = 0;
    while (i < traceDevice.size() && token.empty()) {
        while (i < traceDevice.size() && traceDevice[i] == ' ')
            ++i;
        const size_t end = std::min(traceDevice.find(' ', i), traceDevice.size());
        std::string w = traceDevice.substr(i, end - i);
        if (const auto dash = w.find('-'); dash != std::string::npos && dash > 0) w.resize(dash);
        const bool digit =
            std::any_of(w.begin(), w.end(), [](char c) { return c >= '0' && c <= '9'; });
        const bool alpha = std::any_of(
            w.begin(), w.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
        if (digit && alpha) token = w;
        i = end;
    }
    if (token.empty()) return true;
    return contains(lower(clusterDevice), lower(token));
}

namespace {
// One trace's kernels as calibration samples (collectKernelSamples).
class SampleCollector {
public:
    SampleCollector(const Trace& trace, int32_t index, KernelSamples& samples,
                    const KernelSampleOptions& options)
        : t(trace), traceIndex(index), out(samples), o(options), n(trace.size()) {}

    void run() {
        for (const auto& d : t.deviceNames)
            if (std::find(out.deviceNames.begin(), out.deviceNames.end(), d) ==
                out.deviceNames.end())
                out.deviceNames.push_back(d);
        if (!t.opInputs.empty()) out.hasShapes = true;
        findNesting();
        findSteps();
        for (size_t c = 0; c < t.collectives.size(); ++c)
            collectiveOf[t.collectives[c].event] = c;
        size_t deviceKernels = 0;
        for (size_t i = 0; i < n; ++i)
            if (!onHost(i) &&
                (t.cls[i] == EventClass::Computation || t.cls[i] == EventClass::Communication))
                ++deviceKernels;
        out.deviceKernels += static_cast<int64_t>(deviceKernels);
        if (deviceKernels > 0)
            gpu();
        else
            hostOnly();
    }

private:
    const std::string& name(size_t i) const { return t.strings.at(t.name[i]); }
    const std::string& category(size_t i) const { return t.strings.at(t.category[i]); }
    bool isHostOp(size_t i) const {
        const auto& c = category(i);
        return c == "cpu_op" || c == "Operator";
    }
    bool onHost(size_t i) const {
        return t.lanes[static_cast<size_t>(t.lane[i])].kind == LaneKind::HostThread;
    }
    const OpInputs* inputsOf(int32_t e) const {
        auto it = t.opInputs.find(e);
        return it == t.opInputs.end() ? nullptr : &it->second;
    }
    void skip(const std::string& why) { ++out.skipped[why]; }

    // Nesting on each host thread: parent[i] is the innermost host event enclosing i.
    void findNesting() {
        parent.assign(n, -1);
        std::unordered_map<int32_t, std::vector<int32_t>> byLane;
        for (size_t i = 0; i < n; ++i)
            if (onHost(i) && t.cls[i] != EventClass::Communication)
                byLane[t.lane[i]].push_back(static_cast<int32_t>(i));
        std::vector<int32_t> stack;
        for (auto& [_, v] : byLane) {
            std::sort(v.begin(), v.end(), [&](int32_t a, int32_t b) {
                const auto ua = static_cast<size_t>(a), ub = static_cast<size_t>(b);
                if (t.start[ua] != t.start[ub]) return t.start[ua] < t.start[ub];
                if (t.dur[ua] != t.dur[ub]) return t.dur[ua] > t.dur[ub];
                return a < b;
            });
            stack.clear();
            for (int32_t e : v) {
                const auto ue = static_cast<size_t>(e);
                const int64_t end = t.start[ue] + t.dur[ue];
                while (!stack.empty()) {
                    const auto top = static_cast<size_t>(stack.back());
                    if (t.start[top] + t.dur[top] >= end && t.start[top] <= t.start[ue]) break;
                    stack.pop_back();
                }
                parent[ue] = stack.empty() ? -1 : stack.back();
                stack.push_back(e);
            }
        }
    }

    // ProfilerStep ranges, by start, per host lane's rank (one rank per trace file).
    void findSteps() {
        for (size_t i = 0; i < n; ++i)
            if (onHost(i))
                if (const int32_t s = stepNumber(name(i)); s >= 0)
                    steps.push_back({t.start[i], t.start[i] + t.dur[i], s});
        std::sort(steps.begin(), steps.end(),
                  [](const StepRange& a, const StepRange& b) { return a.start < b.start; });
        for (const auto& s : steps)
            if (std::find(out.steps.begin(), out.steps.end(), s.step) == out.steps.end())
                out.steps.push_back(s.step);
        std::sort(out.steps.begin(), out.steps.end());
    }

    int32_t stepAt(int64_t ts) const {
        auto it = std::upper_bound(steps.begin(), steps.end(), ts,
                                   [](int64_t v, const StepRange& s) { return v < s.start; });
        if (it == steps.begin()) return -1;
        --it;
        return ts < it->end ? it->step : -1;
    }

    void addCollective(size_t i, int32_t step) {
        auto it = collectiveOf.find(static_cast<int32_t>(i));
        if (it == collectiveOf.end()) {
            skip("collective kernel without its size (no 'In msg nelems' args)");
            return;
        }
        const Collective& c = t.collectives[it->second];
        KernelSample s;
        s.cls = KernelClass::Collective;
        s.trace = traceIndex;
        s.event = static_cast<int32_t>(i);
        s.step = step;
        s.durNs = t.dur[i];
        s.collective = collectiveKind(c.name.empty() ? name(i) : c.name);
        if (s.collective.empty()) s.collective = collectiveKind(name(i));
        s.groupSize = c.groupSize > 0 ? c.groupSize : static_cast<int32_t>(t.worldSize);
        double bytes = static_cast<double>(c.fullBytes > 0 ? c.fullBytes : c.bytes);
        // Gloo's ranges are sized by their input: an all-gather's S is the gathered tensor.
        if (c.groupSize <= 0 && s.collective == "allgather") bytes *= s.groupSize;
        s.bytes = bytes;
        if (auto d = recordShapesDtype(c.dtype)) s.dtype = *d;
        s.op = c.name;
        s.kernel = name(i);
        if (s.bytes <= 0) {
            skip("collective kernel without its size (no 'In msg nelems' args)");
            return;
        }
        if (s.groupSize <= 1) {
            skip("collective without its group size");
            return;
        }
        out.samples.push_back(std::move(s));
    }

    // Sized by the parameters' bytes (KernelSampleOptions::optimizerParamBytes): AdamW's
    // _foreach_* ops inside an Optimizer.step# range. The bytes one moves; 0 otherwise.
    double adamwForeachBytes(int32_t op) const {
        const auto e = static_cast<size_t>(op);
        if (optimizerSteps.empty() || !startsWith(name(e), "aten::_foreach_")) return 0.0;
        const bool inStep = std::any_of(
            optimizerSteps.begin(), optimizerSteps.end(),
            [&](const auto& s) { return t.start[e] >= s.first && t.start[e] < s.second; });
        if (!inStep) return 0.0;
        for (const AdamWForeachOp& f : kAdamWForeach)
            if (name(e) == f.op) return f.perByte * o.optimizerParamBytes;
        return 0.0;
    }

    // GPU: each kernel and the host event that launched it.
    void gpu() {
        if (o.optimizerParamBytes > 0)
            for (size_t i = 0; i < n; ++i)
                if (startsWith(name(i), "Optimizer.step#"))
                    optimizerSteps.emplace_back(t.start[i], t.start[i] + t.dur[i]);
        for (const auto& [host, dev] : t.flowEvents)
            if (host >= 0 && dev >= 0) launchOf.emplace(dev, host);
        hostLaunches();
        deviceGaps();
        for (size_t i = 0; i < n; ++i)
            gpuKernel(i);
        dropSplitOps();
    }

    void hostLaunches() {
        // Launch to launch on each thread: the CPU's cost per kernel. A gap over 1 ms is
        // the CPU waiting (a sync, the data loader), not launching.
        std::vector<std::pair<int64_t, int64_t>> optimizer;  // Optimizer.step# ranges
        std::unordered_set<int32_t> stepLanes;               // the threads that run ProfilerSteps
        for (size_t i = 0; i < n; ++i) {
            if (!onHost(i)) continue;
            if (startsWith(name(i), "Optimizer.step#"))
                optimizer.emplace_back(t.start[i], t.start[i] + t.dur[i]);
            if (stepNumber(name(i)) >= 0) stepLanes.insert(t.lane[i]);
        }
        auto launcher = [&](int32_t lane, int64_t ts) {
            for (const auto& [s0, s1] : optimizer)
                if (ts >= s0 && ts < s1) return KernelSamples::Launcher::Optimizer;
            return stepLanes.count(lane) ? KernelSamples::Launcher::Forward
                                         : KernelSamples::Launcher::Backward;
        };
        std::vector<std::pair<int32_t, int64_t>> launches;  // (lane, start) of kernels
        for (const auto& [host, dev] : t.flowEvents)
            if (host >= 0 && dev >= 0 && t.cls[static_cast<size_t>(dev)] == EventClass::Computation)
                launches.push_back(
                    {t.lane[static_cast<size_t>(host)], t.start[static_cast<size_t>(host)]});
        std::sort(launches.begin(), launches.end());
        launches.erase(std::unique(launches.begin(), launches.end()), launches.end());
        // Kernels and host events per step and launcher, on the launching threads.
        {
            std::map<std::pair<int32_t, KernelSamples::Launcher>, KernelSamples::LauncherEvents>
                per;
            std::unordered_set<int32_t> launching;
            for (const auto& [lane, ts] : launches) {
                launching.insert(lane);
                const auto by = launcher(lane, ts);
                auto& x = per[{stepAt(ts), by}];
                ++x.launches;
            }
            for (size_t i = 0; i < n; ++i) {
                if (!onHost(i) || !launching.count(t.lane[i])) continue;
                const auto& cat = category(i);
                if (!(isHostOp(i) || cat == "user_annotation" || cat == "cuda_runtime" ||
                      cat == "cuda_driver" || cat == "Runtime"))
                    continue;
                const auto it = per.find({stepAt(t.start[i]), launcher(t.lane[i], t.start[i])});
                if (it != per.end()) ++it->second.events;
            }
            for (auto& [key, x] : per) {
                if (key.first < 0) continue;
                x.step = key.first;
                x.by = key.second;
                out.launcherEvents.push_back(x);
            }
        }
        for (size_t k = 1; k < launches.size(); ++k) {
            if (launches[k].first != launches[k - 1].first) continue;
            const int64_t gap = launches[k].second - launches[k - 1].second;
            const int32_t step = stepAt(launches[k].second);
            if (gap > 0 && gap < 1000000 && step == stepAt(launches[k - 1].second))
                out.launchGaps.push_back(
                    {step, gap, launcher(launches[k].first, launches[k].second)});
        }
    }

    void deviceGaps() {
        // The device's own time between kernels: on each stream, from a kernel's end to
        // the next one's start where the next was launched before the first ended (it
        // was queued; a later launch would be the host's gap, not the device's).
        // Waits for another stream's event are in it too: its median is the figure.
        std::vector<std::tuple<int32_t, int64_t, size_t>> kernels;  // (lane, start, event)
        for (size_t i = 0; i < n; ++i)
            if (!onHost(i) &&
                (t.cls[i] == EventClass::Computation || t.cls[i] == EventClass::Communication ||
                 t.cls[i] == EventClass::Memory))
                kernels.emplace_back(t.lane[i], t.start[i], i);
        std::sort(kernels.begin(), kernels.end());
        for (size_t k = 1; k < kernels.size(); ++k) {
            const auto& [lane0, s0, e0] = kernels[k - 1];
            const auto& [lane1, s1, e1] = kernels[k];
            if (lane0 != lane1) continue;
            const int64_t end0 = s0 + t.dur[e0];
            const auto l = launchOf.find(static_cast<int32_t>(e1));
            if (l == launchOf.end()) continue;
            const auto host = static_cast<size_t>(l->second);
            const int64_t gap = s1 - end0;
            if (t.start[host] + t.dur[host] < end0 && gap >= 0 && gap < 1000000)
                out.deviceGaps.push_back({stepAt(t.start[host]), gap});
        }
        // The device idle, every stream at once, waiting for a launch: in start order, a
        // gap after all earlier work ended, before work launched after it had begun. Each
        // gap and span goes to the step whose range launched the work.
        std::vector<std::tuple<int64_t, int64_t, int64_t, int32_t>> work;  // start, end,
        for (const auto& [lane, start, e] : kernels) {                     // launch end, step
            const auto l = launchOf.find(static_cast<int32_t>(e));
            if (l == launchOf.end()) continue;
            const auto host = static_cast<size_t>(l->second);
            const int32_t step = stepAt(t.start[host]);
            if (step < 0) continue;
            work.emplace_back(start, start + t.dur[e], t.start[host] + t.dur[host], step);
        }
        std::sort(work.begin(), work.end());
        struct Span {
            int64_t first = 0, last = 0, wait = 0;
        };
        std::map<int32_t, Span> perStep;
        int64_t busyUntil = work.empty() ? 0 : std::get<0>(work.front());
        for (const auto& [start, end, launched, step] : work) {
            auto [it, fresh] = perStep.try_emplace(step, Span{start, end, 0});
            Span& v = it->second;
            v.last = std::max(v.last, end);
            if (!fresh && start > busyUntil && launched > busyUntil) v.wait += start - busyUntil;
            busyUntil = std::max(busyUntil, end);
        }
        for (const auto& [step, v] : perStep)
            out.stepDevice.push_back({step, v.last - v.first, v.wait});
    }

    void gpuKernel(size_t i) {
        if (onHost(i)) return;
        const EventClass cls = t.cls[i];
        if (cls != EventClass::Computation && cls != EventClass::Communication) {
            if (cls == EventClass::Memory) skip("memcpy/memset (not priced per kernel)");
            return;
        }
        auto l = launchOf.find(static_cast<int32_t>(i));
        const int32_t launch = l == launchOf.end() ? -1 : l->second;
        const int32_t step = launch >= 0 ? stepAt(t.start[static_cast<size_t>(launch)]) : -1;
        if (cls == EventClass::Communication) {
            addCollective(i, step);
            return;
        }
        if (launch < 0) {
            skip("kernel without a launch flow to its host op");
            return;
        }
        // The ops above the launch, innermost first.
        const MatmulOp* mm = nullptr;
        int32_t mmEvent = -1, inputsEvent = -1, attentionEvent = -1, innermostOp = -1,
                sdpaEvent = -1;
        bool convolution = false, collectiveOp = false;
        for (int32_t p = launch; p >= 0; p = parent[static_cast<size_t>(p)]) {
            const auto up = static_cast<size_t>(p);
            if (!isHostOp(up)) continue;
            if (innermostOp < 0) innermostOp = p;
            const std::string& on = name(up);
            if (!mm && mmEvent < 0)
                if (const MatmulOp* m = matmulOp(on)) {
                    mm = m;
                    mmEvent = p;
                }
            if (attentionEvent < 0 && isAttentionOp(lower(on))) attentionEvent = p;
            if (sdpaEvent < 0 && contains(on, "scaled_dot_product")) sdpaEvent = p;
            if (contains(on, "convolution") || contains(on, "conv2d") || contains(on, "conv1d") ||
                contains(on, "conv3d"))
                convolution = true;
            if (inputsEvent < 0 && inputsOf(p) && !inputsOf(p)->dims.empty()) inputsEvent = p;
            if (!collectiveKind(on).empty() && collectiveKind(on) != "sendrecv")
                collectiveOp = true;
        }
        if (collectiveOp) {
            skip("collective outside NCCL (symmetric memory, a custom all-reduce)");
            return;
        }
        const std::string kname = lower(name(i));
        KernelSample s;
        s.trace = traceIndex;
        s.event = static_cast<int32_t>(i);
        s.step = step;
        s.durNs = t.dur[i];
        s.kernel = name(i);
        // A kernel the public SDPA op launches itself, outside its backend op, that is no
        // attention kernel prepares the inputs (cuDNN's fill of a converted mask, 0.15 ms
        // beside a 3 ms forward on an H200): memory-bound, not a second attention call.
        const bool preparation =
            sdpaEvent >= 0 && !isAttentionKernel(kname) &&
            name(static_cast<size_t>(sdpaEvent)) == "aten::scaled_dot_product_attention";
        if ((attentionEvent >= 0 || isAttentionKernel(kname)) && !preparation) {
            s.cls = KernelClass::Attention;
            s.op = attentionEvent >= 0 ? name(static_cast<size_t>(attentionEvent)) : "";
            // Priced per SDPA op (flash backward launches two or three kernels): the
            // innermost op named scaled_dot_product gives the FLOPs, its kernels' times
            // add up into one sample.
            if (sdpaEvent >= 0) {
                if (auto it = attentionSample.find(sdpaEvent); it != attentionSample.end()) {
                    out.samples[it->second].durNs += s.durNs;
                    return;
                }
                const std::string& sn = name(static_cast<size_t>(sdpaEvent));
                if (const OpInputs* in = inputsOf(sdpaEvent)) {
                    s.flops = attentionFlops(sn, *in);
                    s.masked = attentionMasked(sn, *in);
                    const auto dt = !in->types.empty() ? recordShapesDtype(in->types[0])
                                                       : std::optional<DType>{};
                    if (dt) s.dtype = *dt;
                }
                s.op = sn;
                attentionSample.emplace(sdpaEvent, out.samples.size());
            }
            out.samples.push_back(std::move(s));
            return;
        }
        if (isGemmKernel(kname) || mm) {
            if (convolution) {
                skip("convolution kernel (FLOPs need the convolution's arguments)");
                return;
            }
            if (!mm) {
                skip("GEMM kernel under no matmul op (aten::mm/addmm/bmm/...)");
                return;
            }
            if (!isGemmKernel(kname)) {
                skip("helper kernel of a matmul op (bias copy, split-K reduction)");
                return;
            }
            const OpInputs* in = inputsOf(mmEvent);
            if (!in) {
                skip("GEMM kernel without record_shapes");
                return;
            }
            setMatmul(s, *mm, *in);
            const auto ti = static_cast<size_t>(mm->a);
            const auto dt =
                ti < in->types.size() ? recordShapesDtype(in->types[ti]) : std::optional<DType>{};
            if (s.flops <= 0 || !dt) {
                skip("GEMM whose shapes or dtype record_shapes does not give");
                return;
            }
            s.dtype = *dt;
            s.cls = KernelClass::Gemm;
            s.op = name(static_cast<size_t>(mmEvent));
            out.samples.push_back(std::move(s));
            return;
        }
        if (convolution) {
            skip("convolution kernel (FLOPs need the convolution's arguments)");
            return;
        }
        if (inputsEvent < 0) {
            skip(out.hasShapes || !t.opInputs.empty()
                     ? "kernel whose launching op has no tensor inputs"
                     : "kernel without record_shapes");
            return;
        }
        memoryBoundSample(std::move(s), i, inputsEvent, launch, step);
    }

    // A memory-bound kernel priced by the bytes of the op that launched it (AdamW's foreach
    // ops by the parameters' bytes).
    void memoryBoundSample(KernelSample s, size_t i, int32_t inputsEvent, int32_t launch,
                           int32_t step) {
        const std::string& on = name(static_cast<size_t>(inputsEvent));
        if (const double bytes = adamwForeachBytes(inputsEvent); bytes > 0) {
            s.bytes = bytes;  // the op's, shared by its kernels below
            s.cls = KernelClass::MemoryBound;
            s.op = kForeachOptimizerKey;
            foreachFrom.push_back({out.samples.size(), inputsEvent});
            out.samples.push_back(std::move(s));
            return;
        }
        if (indexedOp(on)) {
            skip(
                "kernel of an indexed op (gather, scatter, index_select...: it moves what "
                "its index names, not its inputs)");
            return;
        }
        const OpInputs& inputs = *inputsOf(inputsEvent);
        s.bytes = on == kChunkCatKey ? chunkCatBytes(inputs, name(i)) : 0;
        if (on == kChunkCatKey)
            if (const int64_t blocks = chunkCatBlocksPerChunk(inputs); blocks > 0) {
                // The host's time from entering the op to launching its kernel: the block
                // table, its copy to the device, the output's allocation.
                const auto host = static_cast<size_t>(inputsEvent);
                const int64_t ns = t.start[static_cast<size_t>(launch)] - t.start[host];
                if (ns > 0) out.chunkCatHost.push_back({step, blocks, ns});
            }
        if (s.bytes <= 0) s.bytes = opBytes(on, inputs, &s.broadcast);
        if (s.bytes <= 0) {
            skip("kernel whose launching op has no tensor inputs");
            return;
        }
        s.cls = KernelClass::MemoryBound;
        s.op = on;
        memoryFrom.push_back({out.samples.size(), inputsEvent});
        out.samples.push_back(std::move(s));
    }

    // An op that launched several memory-bound kernels (a fused custom op, MoE routing):
    // its bytes cannot be split among them. AdamW's foreach ops are: multi_tensor_apply
    // runs an op's tensor list as kernels of about equal chunks, and the step program
    // prices them so.
    void dropSplitOps() {
        std::unordered_map<int32_t, int32_t> kernelsOf;
        for (const auto& [_, op] : memoryFrom)
            ++kernelsOf[op];
        std::vector<uint8_t> drop(out.samples.size(), 0);
        for (const auto& [idx, op] : memoryFrom)
            if (kernelsOf[op] > 1) drop[idx] = 1;
        std::unordered_map<int32_t, int32_t> foreachKernelsOf;
        for (const auto& [_, op] : foreachFrom)
            ++foreachKernelsOf[op];
        for (const auto& [idx, op] : foreachFrom)
            out.samples[idx].bytes /= static_cast<double>(foreachKernelsOf[op]);
        size_t w = 0;
        for (size_t r = 0; r < out.samples.size(); ++r) {
            if (drop[r]) {
                skip("one of several kernels of one op (its bytes cannot be split among them)");
                continue;
            }
            if (w != r) out.samples[w] = std::move(out.samples[r]);
            ++w;
        }
        out.samples.resize(w);
    }

    // CPU only: host ops are the kernels.
    void hostOnly() {
        out.hostOnly = true;
        std::vector<uint8_t> hasChildOp(n, 0), underCompute(n, 0), hasMatmulBelow(n, 0);
        for (size_t i = 0; i < n; ++i) {
            if (!isHostOp(i)) continue;
            const bool mm = matmulOp(name(i)) != nullptr;
            bool first = true;
            for (int32_t p = parent[i]; p >= 0; p = parent[static_cast<size_t>(p)]) {
                const auto up = static_cast<size_t>(p);
                if (!isHostOp(up)) continue;
                if (first) hasChildOp[up] = 1;
                first = false;
                if (mm) hasMatmulBelow[up] = 1;
            }
        }
        for (size_t i = 0; i < n; ++i) {
            if (!isHostOp(i)) continue;
            for (int32_t p = parent[i]; p >= 0; p = parent[static_cast<size_t>(p)]) {
                const auto up = static_cast<size_t>(p);
                // aten ops only: autograd's "evaluate_function: ...AttentionBackward0" ranges
                // enclose the backward's aten op, which is the kernel.
                if (isHostOp(up) && name(up).compare(0, 6, "aten::") == 0 &&
                    (matmulOp(name(up)) || isAttentionOp(lower(name(up))))) {
                    underCompute[i] = 1;
                    break;
                }
            }
        }
        for (size_t i = 0; i < n; ++i) {
            if (t.cls[i] == EventClass::Communication) {
                addCollective(i, stepAt(t.start[i]));
                continue;
            }
            if (!isHostOp(i)) continue;
            const std::string& on = name(i);
            KernelSample s;
            s.trace = traceIndex;
            s.event = static_cast<int32_t>(i);
            s.step = stepAt(t.start[i]);
            s.durNs = t.dur[i];
            s.op = on;
            s.kernel = on;
            if (const MatmulOp* m = matmulOp(on)) {
                if (hasMatmulBelow[i]) continue;  // aten::linear above its aten::addmm
                const OpInputs* in = inputsOf(static_cast<int32_t>(i));
                if (!in) {
                    skip("matmul op without record_shapes");
                    continue;
                }
                setMatmul(s, *m, *in);
                const auto ti = static_cast<size_t>(m->a);
                const auto dt = ti < in->types.size() ? recordShapesDtype(in->types[ti])
                                                      : std::optional<DType>{};
                if (s.flops <= 0 || !dt) {
                    skip("matmul op whose shapes or dtype record_shapes does not give");
                    continue;
                }
                s.dtype = *dt;
                s.cls = KernelClass::Gemm;
                out.samples.push_back(std::move(s));
                continue;
            }
            if (underCompute[i]) continue;
            if (on.compare(0, 6, "aten::") == 0 && isAttentionOp(lower(on))) {
                s.cls = KernelClass::Attention;
                if (const OpInputs* in = inputsOf(static_cast<int32_t>(i))) {
                    s.flops = attentionFlops(on, *in);
                    const auto dt = !in->types.empty() ? recordShapesDtype(in->types[0])
                                                       : std::optional<DType>{};
                    if (dt) s.dtype = *dt;
                }
                out.samples.push_back(std::move(s));
                continue;
            }
            if (hasChildOp[i] || movesNoData(on) || on.substr(0, 6) != "aten::") continue;
            if (indexedOp(on)) {
                skip(
                    "indexed op (gather, scatter, index_select...: it moves what its index names, "
                    "not its inputs)");
                continue;
            }
            const OpInputs* in = inputsOf(static_cast<int32_t>(i));
            if (!in) {
                skip("op without record_shapes");
                continue;
            }
            s.bytes = opBytes(on, *in, &s.broadcast);
            if (s.bytes <= 0) continue;
            s.cls = KernelClass::MemoryBound;
            out.samples.push_back(std::move(s));
        }
    }

    const Trace& t;
    const int32_t traceIndex;
    KernelSamples& out;
    const KernelSampleOptions& o;
    const size_t n;
    std::vector<int32_t> parent;
    struct StepRange {
        int64_t start, end;
        int32_t step;
    };
    std::vector<StepRange> steps;
    std::unordered_map<int32_t, size_t> collectiveOf;
    std::vector<std::pair<int64_t, int64_t>> optimizerSteps;
    std::unordered_map<int32_t, int32_t> launchOf;
    std::unordered_map<int32_t, size_t> attentionSample;  // SDPA op -> its sample
    std::vector<std::pair<size_t, int32_t>> memoryFrom;   // sample -> the op it priced by
    std::vector<std::pair<size_t, int32_t>> foreachFrom;  // the same, AdamW's foreach ops
};
}  // namespace

void collectKernelSamples(const Trace& t, int32_t traceIndex, KernelSamples& out,
                          const KernelSampleOptions& o) {
    SampleCollector(t, traceIndex, out, o).run();
}

}  // namespace shardscope
