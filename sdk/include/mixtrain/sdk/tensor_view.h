// Non-owning views of tensors that cross the SDK boundary.
//
// Contract: a TensorView is a pointer to contiguous, row-major memory of `numel()` elements of
// `dtype`, living on the device of the backend that allocated it (host memory for the CPU
// backend). It never owns memory; the allocator (a DeviceBackend) and whoever holds the
// allocation decide lifetime. Rank is 0..4; a rank-2 view [rows, cols] is the common case.
// Element and byte counts are checked: sizes come from configs and files, so a product that does
// not fit (in int64 elements, in size_t bytes) throws UserError instead of wrapping.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "mixtrain/sdk/dtype.h"

namespace mixtrain::sdk {

// Throws UserError: a tensor of these dimensions has more elements or bytes than fit in 64 bits.
[[noreturn]] void throw_size_overflow(const std::vector<std::int64_t>& dims);

struct Shape {
  static constexpr int kMaxRank = 4;
  std::array<std::int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> d) {
    for (auto v : d) dims[static_cast<std::size_t>(rank++)] = v;
  }
  static Shape from_vector(const std::vector<std::int64_t>& d);

  std::int64_t operator[](int i) const { return dims[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i)
      if (__builtin_mul_overflow(n, dims[static_cast<std::size_t>(i)], &n))
        throw_size_overflow(to_vector());
    return n;
  }
  // Leading dimensions folded: a [B, T, C] view is rows()=B*T, cols()=C (also when C is 0).
  std::int64_t cols() const { return rank == 0 ? 1 : dims[static_cast<std::size_t>(rank - 1)]; }
  std::int64_t rows() const {
    std::int64_t r = 1;
    for (int i = 0; i + 1 < rank; ++i)
      if (__builtin_mul_overflow(r, dims[static_cast<std::size_t>(i)], &r))
        throw_size_overflow(to_vector());
    return r;
  }
  std::vector<std::int64_t> to_vector() const { return {dims.begin(), dims.begin() + rank}; }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[static_cast<std::size_t>(i)] != o.dims[static_cast<std::size_t>(i)]) return false;
    return true;
  }
  std::string to_string() const;  // "[512, 1024]"
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::fp32;
  Shape shape;

  std::int64_t numel() const { return shape.numel(); }
  std::size_t bytes() const {
    std::size_t b = 0;
    if (__builtin_mul_overflow(static_cast<std::size_t>(numel()), dtype_size(dtype), &b))
      throw_size_overflow(shape.to_vector());
    return b;
  }
  bool empty() const { return data == nullptr; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// A host-memory tensor with a name; used by checkpoints and state dictionaries.
struct HostTensor {
  std::string name;
  DType dtype = DType::fp32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape)
      if (__builtin_mul_overflow(n, d, &n)) throw_size_overflow(shape);
    return n;
  }
};

}  // namespace mixtrain::sdk
