// SPDX-License-Identifier: Apache-2.0
#include "engine/exec/tensor_storage.h"

#include <ATen/core/grad_mode.h>
#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/variable.h>

namespace shardscope::exec {

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

void copyPreservingVersion(const at::Tensor& dst, int64_t row0, const at::Tensor& src) {
    const int64_t v = dst._version();
    {
        at::NoGradGuard ng;
        dst.detach().narrow(0, row0, src.size(0)).copy_(src);
    }
    c10::VariableVersion counter = torch::autograd::impl::version_counter(dst);  // shares the count
    counter.set_version(v);
}

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

}  // namespace shardscope::exec
