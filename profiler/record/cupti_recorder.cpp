// SPDX-License-Identifier: Apache-2.0
#include "profiler/record/cupti_recorder.h"

#include <cupti.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "profiler/record/cupti_converter.h"

namespace shardscope::record {

namespace {

// What the recorder enables: GPU work, the calls that launched it (NCCL launches its
// kernels through the driver API), memory and the engine's op labels.
constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
    CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_DRIVER,
    CUPTI_ACTIVITY_KIND_MEMORY2,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
};

std::string apiName(bool runtime, uint32_t cbid) {
    const char* name = nullptr;
    if (cuptiGetCallbackName(runtime ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
                             cbid, &name) != CUPTI_SUCCESS ||
        !name)
        return {};
    return name;
}

void CUPTIAPI ignoreCallback(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}

}  // namespace

struct CuptiRecorder::Impl {
    std::function<int64_t()> cpuClock;
    std::mutex mutex;
    CuptiConverter converter{&apiName};
    CUpti_SubscriberHandle subscriber = nullptr;
    std::vector<CUpti_ActivityKind> enabled;
    int64_t cpu0 = 0;
    uint64_t dev0 = 0;
    std::string bufferError;

    static inline Impl* s_active = nullptr;

    static void CUPTIAPI bufferRequested(uint8_t** buffer, size_t* size, size_t* maxRecords) {
        // CUPTI requires 8-byte alignment; nullptr (out of memory) makes it drop records,
        // which the dropped count then reports.
        *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
        *size = *buffer ? kBufferBytes : 0;
        *maxRecords = 0;
    }

    static void CUPTIAPI bufferCompleted(CUcontext ctx, uint32_t streamId, uint8_t* buffer,
                                         size_t /*size*/, size_t validSize) {
        Impl* self = s_active;
        if (self && buffer) {
            std::lock_guard lock(self->mutex);
            CUpti_Activity* record = nullptr;
            for (;;) {
                const CUptiResult r = cuptiActivityGetNextRecord(buffer, validSize, &record);
                if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
                if (r != CUPTI_SUCCESS) {
                    self->bufferError = "reading a CUPTI buffer: " + resultText(r);
                    break;
                }
                self->converter.add(record);
            }
            size_t dropped = 0;
            if (cuptiActivityGetNumDroppedRecords(ctx, streamId, &dropped) == CUPTI_SUCCESS)
                self->converter.addDropped(dropped);
        }
        std::free(buffer);
    }

    // A (CPU, CUPTI) clock pair: the CPU time is the midpoint around the CUPTI read.
    bool sample(int64_t& cpu, uint64_t& dev) const {
        const int64_t a = cpuClock();
        if (cuptiGetTimestamp(&dev) != CUPTI_SUCCESS) return false;
        const int64_t b = cpuClock();
        cpu = a + (b - a) / 2;
        return true;
    }

    void disable() {
        for (auto k : enabled)
            cuptiActivityDisable(k);
        enabled.clear();
        if (subscriber) cuptiUnsubscribe(subscriber);
        subscriber = nullptr;
    }
    void release() {
        disable();
        if (s_active == this) s_active = nullptr;
    }
};

CuptiRecorder::CuptiRecorder(std::function<int64_t()> cpuClock) : d(std::make_unique<Impl>()) {
    d->cpuClock = std::move(cpuClock);
}

CuptiRecorder::~CuptiRecorder() {
    if (m_running) {
        cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        d->release();
    }
}

std::string CuptiRecorder::resultText(int result) {
    const char* s = nullptr;
    if (cuptiGetResultString(static_cast<CUptiResult>(result), &s) == CUPTI_SUCCESS && s) return s;
    return "CUPTI error " + std::to_string(result);
}

Status CuptiRecorder::start() {
    if (m_running) return Error{"CUPTI recorder: already recording"};
    if (Impl::s_active)
        return Error{"CUPTI recorder: another recorder of this process is recording"};
    char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 1] = {};
    CUpti_SubscriberParams params{};
    params.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
    params.subscriberName = "ShardScope";
    params.oldSubscriberName = holder;
    params.oldSubscriberSize = sizeof holder - 1;
    const CUptiResult sub = cuptiSubscribe_v2(&d->subscriber, &ignoreCallback, nullptr, &params);
    if (sub == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
        d->subscriber = nullptr;
        const std::string who = holder[0] ? std::string(holder) : std::string("another tool");
        return Error{"CUPTI is already held by " + who +
                     ": one process can have one CUPTI subscriber, and the PyTorch profiler, "
                     "Nsight Systems and Nsight Compute each take it. Stop that profiler, or "
                     "run without the device trace (--no-device-trace)."};
    }
    if (sub != CUPTI_SUCCESS) {
        d->subscriber = nullptr;
        return Error{"CUPTI could not start: " + resultText(sub) +
                     " (a CUDA driver and device are needed to record GPU activity)"};
    }
    Impl::s_active = d.get();
    if (const CUptiResult r =
            cuptiActivityRegisterCallbacks(&Impl::bufferRequested, &Impl::bufferCompleted);
        r != CUPTI_SUCCESS) {
        d->release();
        return Error{"CUPTI could not register its buffers: " + resultText(r)};
    }
    for (auto k : kKinds) {
        if (const CUptiResult r = cuptiActivityEnable(k); r != CUPTI_SUCCESS) {
            d->release();
            return Error{"CUPTI could not enable activity kind " + std::to_string(k) + ": " +
                         resultText(r)};
        }
        d->enabled.push_back(k);
    }
    if (!d->sample(d->cpu0, d->dev0)) {
        d->release();
        return Error{"CUPTI could not read its clock"};
    }
    m_running = true;
    return {};
}

void CuptiRecorder::pushOp(uint64_t id) {
    cuptiActivityPushExternalCorrelationId(kFsdpOpCorrelation, id);
}

void CuptiRecorder::popOp() {
    uint64_t last = 0;
    cuptiActivityPopExternalCorrelationId(kFsdpOpCorrelation, &last);
}

Expected<DeviceActivity> CuptiRecorder::stop() {
    if (!m_running) return Error{"CUPTI recorder: not recording"};
    m_running = false;
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    int64_t cpu1 = 0;
    uint64_t dev1 = 0;
    const bool sampled = d->sample(cpu1, dev1);
    d->disable();
    // Buffers completed by this flush still reach the converter (s_active is kept).
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    Impl::s_active = nullptr;
    std::lock_guard lock(d->mutex);
    if (!d->bufferError.empty()) return Error{d->bufferError};
    const ClockFit fit = sampled ? ClockFit::fromSamples(d->cpu0, d->dev0, cpu1, dev1)
                                 : ClockFit::fromSamples(d->cpu0, d->dev0, d->cpu0, d->dev0);
    return d->converter.finish(fit);
}

}  // namespace shardscope::record
