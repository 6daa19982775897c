// The embedding facet's kernels: the device id check, the row gather and the deterministic
// scatter-add through a stable radix sort of the rows by id (contract: cuda_embedding.h).
#include <cub/device/device_radix_sort.cuh>

#include <type_traits>

#include "cuda_device.cuh"
#include "cuda_embedding.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

constexpr int kColumnThreads = 256;  // scatter-add: threads (columns) per block

__global__ void check_ids_kernel(const std::int32_t* ids, std::int64_t rows, std::int64_t vocab,
                                 int code, ErrorRecord* error) {
  for (std::int64_t r = global_thread(); r < rows; r += grid_threads()) {
    const std::int32_t id = ids[r];
    if (id < 0 || id >= vocab) {
      // The record belongs to the first failing call: an earlier call's flag keeps its row.
      const int owner = atomicCAS(&error->flag, 0, code);
      if (owner != 0 && owner != code) return;
      atomicMin(&error->first, (static_cast<unsigned long long>(r) << 32) |
                                   static_cast<unsigned long long>(static_cast<std::uint32_t>(id)));
      error->classes = static_cast<int>(vocab);
    }
  }
}

// table [vocab, width] in storage TS, out [rows, width] in storage OS; one thread per element of
// out.
template <class TS, class OS>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const std::int32_t* ids, const elem_t<TS>* table, elem_t<OS>* out,
                  std::int64_t rows, std::int64_t vocab, std::int64_t width, bool accumulate,
                  const ErrorRecord* error) {
  if (error->flag != 0) return;  // a bad id: write nothing, the host raises
  const std::int64_t total = rows * width;
  for (std::int64_t e = global_thread(); e < total; e += grid_threads()) {
    const std::int64_t r = e / width, c = e % width;
    const std::int32_t id = ids[r];
    if (id < 0 || id >= vocab) continue;  // flagged by check_ids (a later call's, here)
    const elem_t<TS> t = table[static_cast<std::int64_t>(id) * width + c];
    if (accumulate)
      out[e] = OS::store(element::embedding_accumulate(OS::load(out[e]), TS::load(t)), false);
    else if constexpr (std::is_same_v<TS, OS>)
      out[e] = t;  // same storage: the bits move
    else
      out[e] = OS::store(TS::load(t), false);
  }
}

__global__ void iota_kernel(std::int32_t* v, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    v[i] = static_cast<std::int32_t>(i);
}

// beta = 0: the table's gradient restarts from +0 (rows no id names stay 0).
__global__ void zero_table_kernel(float* dtable, std::int64_t n, const ErrorRecord* error) {
  if (error->flag != 0) return;
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) dtable[i] = 0.0f;
}

// sorted_ids [rows] ascending, order [rows] the rows in that order (ascending within an id);
// dy [rows, width] in storage S, dtable [vocab, width]. Block x is a sorted position; only the
// first position of each id works: its threads (one per column of block y's slice) walk the id's
// rows in ascending order.
template <class S>
__global__ void __launch_bounds__(kColumnThreads)
    scatter_sum_kernel(const std::uint32_t* sorted_ids, const std::int32_t* order,
                       const elem_t<S>* dy, float* dtable, std::int64_t rows, std::int64_t width,
                       const ErrorRecord* error) {
  if (error->flag != 0) return;
  const std::int64_t at = blockIdx.x;
  const std::uint32_t id = sorted_ids[at];
  if (at > 0 && sorted_ids[at - 1] == id) return;  // not the first row of its id
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.y) * kColumnThreads + threadIdx.x;
  if (c >= width) return;
  float* dst = dtable + static_cast<std::int64_t>(id) * width + c;
  float acc = *dst;
  for (std::int64_t k = at; k < rows && sorted_ids[k] == id; ++k)
    acc = element::embedding_accumulate(acc, S::load(dy[order[k] * width + c]));
  *dst = acc;
}

// Bits the radix sort needs for ids in [0, vocab).
int id_bits(std::int64_t vocab) {
  int bits = 1;
  while (bits < 32 && (std::int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

std::size_t align256(std::size_t b) {
  return (b + 255) / 256 * 256;
}

// The radix sort's temporary bytes for `rows` keys (CUB's size query: nothing is enqueued).
std::size_t sort_bytes(std::int64_t rows, std::int64_t vocab) {
  std::size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const std::uint32_t*>(nullptr),
      static_cast<std::uint32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), static_cast<int>(rows), 0, id_bits(vocab));
  return bytes;
}

}  // namespace

cudaError_t check_ids(const std::int32_t* ids, std::int64_t rows, std::int64_t vocab, int code,
                      ErrorRecord* error, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  check_ids_kernel<<<grid_for(rows), kThreads, 0, stream>>>(ids, rows, vocab, code, error);
  return cudaGetLastError();
}

cudaError_t embedding_gather(const std::int32_t* ids, const void* table, Elem tt, void* out,
                             Elem ot, std::int64_t rows, std::int64_t vocab, std::int64_t width,
                             bool accumulate, const ErrorRecord* error, cudaStream_t stream) {
  const std::int64_t total = rows * width;
  if (total == 0) return cudaSuccess;
  bool known = false;
  with_float_storage(tt, [&](auto ts) {
    known = with_float_storage(ot, [&](auto os) {
      using TS = decltype(ts);
      using OS = decltype(os);
      gather_kernel<TS, OS><<<grid_for(total), kThreads, 0, stream>>>(
          ids, static_cast<const elem_t<TS>*>(table), static_cast<elem_t<OS>*>(out), rows, vocab,
          width, accumulate, error);
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

std::size_t scatter_add_scratch(std::int64_t rows, std::int64_t vocab) {
  // sorted ids, the rows in order, the rows 0..rows-1, then the sort's own temporaries.
  const std::size_t ints = align256(static_cast<std::size_t>(rows) * 4);
  return 3 * ints + align256(sort_bytes(rows, vocab));
}

cudaError_t embedding_scatter_add(const std::int32_t* ids, const void* dy, Elem dyt, float* dtable,
                                  std::int64_t rows, std::int64_t vocab, std::int64_t width,
                                  bool overwrite, void* scratch, std::size_t scratch_bytes,
                                  const ErrorRecord* error, cudaStream_t stream) {
  if (overwrite && vocab * width > 0) {
    zero_table_kernel<<<grid_for(vocab * width), kThreads, 0, stream>>>(dtable, vocab * width,
                                                                        error);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (rows == 0 || width == 0) return cudaSuccess;
  const std::size_t ints = align256(static_cast<std::size_t>(rows) * 4);
  auto* base = static_cast<unsigned char*>(scratch);
  auto* sorted_ids = reinterpret_cast<std::uint32_t*>(base);
  auto* order = reinterpret_cast<std::int32_t*>(base + ints);
  auto* rows_in = reinterpret_cast<std::int32_t*>(base + 2 * ints);
  void* temp = base + 3 * ints;
  std::size_t temp_bytes = scratch_bytes - 3 * ints;
  iota_kernel<<<grid_for(rows), kThreads, 0, stream>>>(rows_in, rows);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  // Ids read as unsigned: valid ones are below 2^31, and a negative one has been flagged (the
  // sum below then writes nothing), so its place in the order does not matter.
  const cudaError_t sorted = cub::DeviceRadixSort::SortPairs(
      temp, temp_bytes, reinterpret_cast<const std::uint32_t*>(ids), sorted_ids, rows_in, order,
      static_cast<int>(rows), 0, id_bits(vocab), stream);
  if (sorted != cudaSuccess) return sorted;
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((width + kColumnThreads - 1) / kColumnThreads));
  const bool known = with_float_storage(dyt, [&](auto s) {
    using S = decltype(s);
    scatter_sum_kernel<S><<<grid, kColumnThreads, 0, stream>>>(
        sorted_ids, order, static_cast<const elem_t<S>*>(dy), dtable, rows, width, error);
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

}  // namespace mixtrain::backend_cuda::kernels
