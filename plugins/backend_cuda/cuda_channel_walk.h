// ChannelWalk: the channel of element i of a channels-last [rows, C] tensor as a grid-stride loop
// walks it, kept without a 64-bit division per element (dozens of instructions: more than a
// memory-bound element's budget). One modulo for the thread's first element and one for the
// stride, then an add and a compare per step. Host and device (host-tested in
// test_cuda_layer_math against i % C).
//
// Contract: ChannelWalk(first, stride, channels) with first, stride >= 0 and channels >= 1; after k
// calls of advance(), c == (first + k·stride) % channels.
#pragma once

#include <cstdint>

#include "mixtrain/sdk/support/float_format_rules.h"  // MIXTRAIN_SDK_HOST_DEVICE

namespace mixtrain::backend_cuda {

struct ChannelWalk {
  std::int64_t c, step, channels;
  MIXTRAIN_SDK_HOST_DEVICE ChannelWalk(std::int64_t first, std::int64_t stride, std::int64_t ch)
      : c(first % ch), step(stride % ch), channels(ch) {}
  MIXTRAIN_SDK_HOST_DEVICE void advance() {
    c += step;
    if (c >= channels) c -= channels;
  }
};

}  // namespace mixtrain::backend_cuda
