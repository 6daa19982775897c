// Launcher of the image_input facet's decode kernel (cuda_image_decode.cu); plain C++ like every
// launcher header (cuda_kernel_types.h).
//
// Contract: enqueues on `stream` only, validates nothing (the facet did:
// BackendArgumentChecks::decode_images), returns the launch status.
// - pixels is [rows, channels, plane] bytes in device memory, passed as planes = rows·channels
//   planes of `plane` pixels (plane q holds channel q % channels); table is fp32 [channels, 256]
//   in device memory; y is [rows, channels, plane] in yt (f32, bf16 or f16), overlapping neither.
// - y[q, p] = table[q % channels, pixels[q, p]] rounded once into yt by element::storage's store
//   (round to nearest even, bit for bit sdk/float_formats.h; fp32 is a copy of the table's bits).
// - Pixels move four at a time (one 4-byte load, one 16- or 8-byte store) when plane % 4 == 0,
//   pixels is 4-byte aligned and y aligned to four of its elements; otherwise one at a time. The
//   values are the same either way.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

cudaError_t decode_images(const std::uint8_t* pixels, const float* table, void* y, Elem yt,
                          std::int64_t planes, std::int64_t channels, std::int64_t plane,
                          cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
