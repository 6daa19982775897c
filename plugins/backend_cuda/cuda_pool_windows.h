// The output windows of a pooling that contain one input position, along one axis: what the
// pooling backward kernel (cuda_pooling.cu) sums for each input element. Host and device
// (host-tested in test_cuda_layer_math against a scan of every window).
//
// Contract: I is std::int32_t or std::int64_t; 0 <= pos < the axis' input size, 0 <= pad,
// 1 <= k, 1 <= stride, out >= 1 windows (window o covers inputs [o·stride − pad, o·stride − pad +
// k)). *lo and *hi receive the first and last window holding pos; lo > hi when none does. Every
// value formed stays within pos + pad and out: a stride up to the type's maximum never overflows I.
#pragma once

#include "mixtrain/sdk/support/float_format_rules.h"  // MIXTRAIN_SDK_HOST_DEVICE

namespace mixtrain::backend_cuda {

template <class I>
MIXTRAIN_SDK_HOST_DEVICE void pool_windows_of(I pos, int pad, int k, int stride, I out, I* lo,
                                              I* hi) {
  const I first = pos + pad - k + 1;  // window o holds pos when o·stride >= first
  // ceil(first / stride), without first + stride − 1 (it overflows at a stride near the maximum).
  *lo = first <= 0 ? 0 : (first - 1) / stride + 1;
  const I last = (pos + pad) / stride;
  *hi = last < out - 1 ? last : out - 1;
}

}  // namespace mixtrain::backend_cuda
