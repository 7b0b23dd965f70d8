// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tensor storage as FSDP handles it: storages resized in place (freed and re-allocated while
// autograd holds the tensor), and copies into saved tensors that keep their version counter.
// Only engine/exec translation units include this header (it pulls in ATen).
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>

#include "plans/core/dtype.h"

namespace shardscope::exec {

at::ScalarType scalarType(DType d);

inline int64_t ceilDiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

// Resizes t's storage to `bytes` (0 frees it) under every tensor that shares it.
void resizeStorage(const at::Tensor& t, size_t bytes);

// Copies into a tensor autograd has saved without bumping its version counter: the
// re-gathered parameter is the same value forward saw (FSDP2 does the same with
// torch.autograd._unsafe_preserve_version_counter).
void copyPreservingVersion(const at::Tensor& dst, int64_t row0, const at::Tensor& src);

// dst (a parameter) takes src's data, a view of a gathered buffer, keeping its own version
// counter and autograd identity: FSDP1's `param.data = view`.
void viewPreservingVersion(const at::Tensor& dst, const at::Tensor& src);

}  // namespace shardscope::exec
