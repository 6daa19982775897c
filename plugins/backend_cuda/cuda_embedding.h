// Launchers of the embedding facet's kernels (cuda_embedding.cu); plain C++ like every launcher
// header (cuda_kernel_types.h).
//
// Contract
// - Enqueue on `stream` only, validate no shape or dtype (the backend did), return the
//   launch status. The ids are validated on the device: check_ids records its call's first row
//   whose id is outside [0, vocab) in `error` (ErrorRecord: first = row << 32 | id, classes =
//   vocab), with flag = `code`, a non-zero number naming the call: the first failing call claims
//   the record (an atomic compare-and-swap on flag), later ones leave it alone. The gather /
//   scatter kernels write nothing while error->flag is set; the host raises at its next
//   synchronising call and then clears the record.
// - gather: out[r, :] = (accumulate ? out[r, :] + : ) table[id[r], :], in FP32 with one rounding
//   into out (element::embedding_accumulate); equal storage without accumulate moves bits.
// - scatter_add: deterministic without float atomics. The row indices are sorted by id with a
//   stable radix sort (CUB), so each id's rows are listed in ascending row order; then one thread
//   per (id, column) sums its rows' dy in that order in FP32, starting from dtable's value (beta =
//   1) or +0 (beta = 0, where a first pass zeroes the table): the CPU backend's order, so the
//   bits equal its result for any launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// Flags the first row of ids[rows] outside [0, vocab) in `error` under `code` (non-zero).
cudaError_t check_ids(const std::int32_t* ids, std::int64_t rows, std::int64_t vocab, int code,
                      ErrorRecord* error, cudaStream_t stream);

// table [vocab, width], out [rows, width].
cudaError_t embedding_gather(const std::int32_t* ids, const void* table, Elem tt, void* out,
                             Elem ot, std::int64_t rows, std::int64_t vocab, std::int64_t width,
                             bool accumulate, const ErrorRecord* error, cudaStream_t stream);

// Bytes of device scratch scatter_add needs for `rows` ids (rows < 2^31).
std::size_t scatter_add_scratch(std::int64_t rows, std::int64_t vocab);
// dtable [vocab, width] fp32 = beta * dtable + Σ dy rows by id; dy [rows, width]; beta 0 or 1.
// scratch: scatter_add_scratch(rows, vocab) bytes, 256-byte aligned.
cudaError_t embedding_scatter_add(const std::int32_t* ids, const void* dy, Elem dyt, float* dtable,
                                  std::int64_t rows, std::int64_t vocab, std::int64_t width,
                                  bool overwrite, void* scratch, std::size_t scratch_bytes,
                                  const ErrorRecord* error, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
