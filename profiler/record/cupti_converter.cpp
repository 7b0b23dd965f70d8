// SPDX-License-Identifier: Apache-2.0
#include "profiler/record/cupti_converter.h"

#include <cxxabi.h>

#include <cstdlib>

#include <algorithm>

namespace shardscope::record {

const char* memcpyKindName(uint8_t copyKind) {
    switch (copyKind) {
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
            return "Memcpy HtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
            return "Memcpy DtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
            return "Memcpy HtoA";
        case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
            return "Memcpy AtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
            return "Memcpy AtoA";
        case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
            return "Memcpy AtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
            return "Memcpy DtoA";
        case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
            return "Memcpy DtoD";
        case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
            return "Memcpy HtoH";
        case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
            return "Memcpy PtoP";
        default:
            return "Memcpy";
    }
}

const char* synchronizationName(CUpti_ActivitySynchronizationType t) {
    switch (t) {
        case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE:
            return "cudaEventSynchronize";
        case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT:
            return "cudaStreamWaitEvent";
        case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE:
            return "cudaStreamSynchronize";
        case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE:
            return "cudaDeviceSynchronize";
        default:
            return "synchronization";
    }
}

int32_t CuptiConverter::intern(const std::string& s) {
    auto [it, fresh] = m_names.try_emplace(s, static_cast<int32_t>(m_out.names.size()));
    if (fresh) m_out.names.push_back(s);
    return it->second;
}

void CuptiConverter::addOp(DeviceOpKind kind, const std::string& name, uint64_t start, uint64_t end,
                           uint32_t device, uint32_t stream, uint32_t correlation, int64_t bytes) {
    DeviceOp op;
    op.kind = kind;
    op.name = intern(name);
    // Device-clock times until finish(); a record CUPTI could not time (end < start) keeps
    // zero length instead of a negative one.
    op.startNs = static_cast<int64_t>(start);
    op.endNs = static_cast<int64_t>(std::max(start, end));
    op.device = device;
    op.stream = stream;
    op.correlation = correlation;
    op.bytes = bytes;
    m_out.ops.push_back(op);
}

// CUPTI names kernels by their mangled symbols; traces show them as Kineto does, demangled
// ("void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)"), which is also what
// the kernel classes (GEMM, attention, NCCL) and `calibrate --from-trace` match on.
std::string demangledKernelName(const char* name) {
    if (!name) return "kernel";
    int status = 0;
    char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string s = status == 0 && out ? std::string(out) : std::string(name);
    std::free(out);
    return s;
}

void CuptiConverter::add(const CUpti_Activity* record) {
    switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
            addOp(DeviceOpKind::Kernel, demangledKernelName(k->name), k->start, k->end, k->deviceId,
                  k->streamId, k->correlationId, 0);
            return;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
            addOp(DeviceOpKind::Memcpy, memcpyKindName(m->copyKind), m->start, m->end, m->deviceId,
                  m->streamId, m->correlationId, static_cast<int64_t>(m->bytes));
            return;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
            addOp(DeviceOpKind::Memset, "Memset", m->start, m->end, m->deviceId, m->streamId,
                  m->correlationId, static_cast<int64_t>(m->bytes));
            return;
        }
        case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
            const auto* s = reinterpret_cast<const CUpti_ActivitySynchronization2*>(record);
            addOp(DeviceOpKind::Synchronization, synchronizationName(s->type), s->start, s->end, 0,
                  s->streamId, s->correlationId, 0);
            return;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER: {
            const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
            const bool runtime = record->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
            std::string name = m_namer ? m_namer(runtime, a->cbid) : std::string();
            if (name.empty())
                name = std::string(runtime ? "cuda runtime #" : "cuda driver #") +
                       std::to_string(a->cbid);
            addOp(runtime ? DeviceOpKind::RuntimeApi : DeviceOpKind::DriverApi, name, a->start,
                  a->end, 0, a->threadId, a->correlationId, 0);
            return;
        }
        case CUPTI_ACTIVITY_KIND_MEMORY2: {
            const auto* m = reinterpret_cast<const CUpti_ActivityMemory4*>(record);
            const bool alloc =
                m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
            const bool release =
                m->memoryOperationType == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
            // Host (pinned) memory is not the device's; only device allocations count.
            if ((!alloc && !release) || m->memoryKind != CUPTI_ACTIVITY_MEMORY_KIND_DEVICE) {
                ++m_out.otherRecords;
                return;
            }
            const auto bytes = static_cast<int64_t>(m->bytes);
            m_out.memory.push_back({static_cast<int64_t>(m->timestamp), alloc ? bytes : -bytes,
                                    m->address, m->deviceId});
            return;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
            const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
            if (e->externalKind == kFsdpOpCorrelation)
                m_external[e->correlationId] = e->externalId;
            else
                ++m_out.otherRecords;
            return;
        }
        default:
            ++m_out.otherRecords;
            return;
    }
}

DeviceActivity CuptiConverter::finish(const ClockFit& fit) {
    DeviceActivity out = std::move(m_out);
    m_out = {};
    m_names.clear();
    for (auto& op : out.ops) {
        op.startNs = fit.toCpu(static_cast<uint64_t>(op.startNs));
        op.endNs = std::max(op.startNs, fit.toCpu(static_cast<uint64_t>(op.endNs)));
        if (auto it = m_external.find(op.correlation); it != m_external.end())
            op.external = static_cast<int64_t>(it->second);
    }
    m_external.clear();
    std::stable_sort(out.ops.begin(), out.ops.end(),
                     [](const DeviceOp& a, const DeviceOp& b) { return a.startNs < b.startNs; });
    for (auto& m : out.memory)
        m.ts = fit.toCpu(static_cast<uint64_t>(m.ts));
    std::stable_sort(
        out.memory.begin(), out.memory.end(),
        [](const DeviceMemoryEvent& a, const DeviceMemoryEvent& b) { return a.ts < b.ts; });
    for (const auto& [ts, bytes] : deviceMemoryTimeline(out.memory))
        out.peakDeviceBytes = std::max(out.peakDeviceBytes, bytes);
    return out;
}

}  // namespace shardscope::record
