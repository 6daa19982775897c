// Software prefetches for the CPU backend's passes that stream tensors from memory.
//
// Contract
// - kPrefetchBytes (2 KiB): how far ahead a pass asks for the lines it will read. With the
//   hardware prefetcher alone, passes with arithmetic between their loads (the gradient check,
//   AdamW, batch norm's sums and statistics) kept too few reads in flight: on an AMX Xeon whose
//   two cores read 28 GB/s they read 17-21 (bench/RESULTS.md, sessions 69 and 70).
// - prefetch_ahead(p, i): the lines of the block of kStreamBlock elements at i, kPrefetchBytes on.
// - prefetch_span(begin, count, tensors...): the lines of elements [begin, begin + count) of each
//   non-null tensor (a slice of a row, kPrefetchBytes / sizeof(T) on, in the row-wise passes).
// - streamed(len, element, streams...): element(i) for i in [0, len), in blocks of kStreamBlock
//   under `omp simd`, each block first asking for its lines ahead in every stream; the arithmetic
//   per element is the caller's, so are the bits.
// - A prefetch changes no value, and one past an array's end is ignored, never a fault.
#pragma once

#include <cstdint>

namespace mixtrain::backend_cpu {

inline constexpr std::int64_t kPrefetchBytes = 2048;
inline constexpr std::int64_t kStreamBlock = 32;

// kPrefetchBytes in elements of T.
template <class T>
inline constexpr std::int64_t kPrefetchElements = kPrefetchBytes /
                                                  static_cast<std::int64_t>(sizeof(T));

template <class T>
[[gnu::always_inline]] inline void prefetch_ahead(const T* p, std::int64_t i) {
  const char* at = reinterpret_cast<const char*>(p + i + kPrefetchElements<T>);
  for (std::int64_t o = 0; o < kStreamBlock * static_cast<std::int64_t>(sizeof(T)); o += 64)
    __builtin_prefetch(at + o);
}

template <class T, class... More>
[[gnu::always_inline]] inline void prefetch_span(std::int64_t begin, std::int64_t count,
                                                 const T* first, const More*... more) {
  if (first != nullptr) {
    const char* at = reinterpret_cast<const char*>(first + begin);
    const std::int64_t bytes = count * static_cast<std::int64_t>(sizeof(T));
    for (std::int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(at + o);
  }
  if constexpr (sizeof...(More) > 0) prefetch_span(begin, count, more...);
}

template <class Element, class... Stream>
[[gnu::always_inline]] inline void streamed(std::int64_t len, Element&& element,
                                            const Stream*... streams) {
  std::int64_t i = 0;
  for (; i + kStreamBlock <= len; i += kStreamBlock) {
    (prefetch_ahead(streams, i), ...);
#pragma omp simd
    for (std::int64_t j = i; j < i + kStreamBlock; ++j) element(j);
  }
  for (; i < len; ++i) element(i);
}

}  // namespace mixtrain::backend_cpu
