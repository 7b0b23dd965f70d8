// SPDX-License-Identifier: Apache-2.0
#pragma once
// Imports PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzip, streaming: a SAX
// parser builds one small JSON value per event, consumes it and drops it, so a file is never
// held whole as a DOM. Three dialects are handled (docs/pytorch-traces.md):
// modern (relative ts with baseTimeNanoseconds), absolute epoch microseconds, and the 2021
// legacy categories (Kernel/Memcpy/Memset/Runtime/Operator, tid "stream 7").
//  - GPU events (kernel, gpu_memcpy, gpu_memset and the legacy names) are classified as HTA
//    does: communication ^nccl|^hip|^hccl|ncclKernel, memory ^(hip)?Memcpy|^(hip)?Memset|^dma,
//    computation unless a non-compute pattern matches;
//  - NCCL kernels become collectives, sized by their "Collective name", "In msg nelems" and
//    "dtype" args, or through "External id" from the record_param_comms CPU op;
//  - [memory] instant events become the device-memory counter;
//  - python_function events are skipped (counted) unless asked for; flow ends without a
//    start are tolerated (counted).
#include <atomic>
#include <functional>
#include <string>
#include <string_view>

#include "plans/core/expected.h"
#include "profiler/trace/trace.h"

namespace shardscope {

struct KinetoImportOptions {
    bool keepPythonFunctions = false;
    // Keep record_shapes' inputs of every host op, not only those FSDP analysis reads
    // (collectives, the embedding): kernel calibration prices GEMMs and memory-bound kernels
    // by the shapes of the op that launched them.
    bool keepAllOpInputs = false;
    // Checked every 256 KiB read: when set, the import stops with the error "cancelled".
    const std::atomic<bool>* cancel = nullptr;
    // Called every 256 KiB read with the fraction of the file (compressed bytes for .gz) read.
    std::function<void(double fraction)> progress;
};

// HTA's classification of a device event (hta/common/types.py, hta/utils/utils.py), by
// kernel name and category: communication (NCCL, RCCL, HCCL), memory, computation, other.
[[nodiscard]] EventClass classifyDeviceEvent(const std::string& name, const std::string& category);

// Bytes per element of a record_shapes "Input type" ("float", "c10::BFloat16", "long int"); 0
// for a type it does not know (a Scalar, a list).
[[nodiscard]] int64_t traceDtypeBytes(std::string_view recordShapesType);

[[nodiscard]] Expected<Trace> importKinetoFile(const std::string& path,
                                               const KinetoImportOptions& o = {});

}  // namespace shardscope
