// Non-owning views of tensors that cross the SDK boundary.
//
// Contract: a TensorView is a pointer to contiguous, row-major memory of `numel()` elements of
// `dtype`, living on the device of the backend that allocated it (host memory for the CPU
// backend). It never owns memory; the allocator (a DeviceBackend) and whoever holds the
// allocation decide lifetime. Rank is 0..4; a rank-2 view [rows, cols] is the common case.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "mixtrain/sdk/dtype.h"

namespace mixtrain::sdk {

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
    for (int i = 0; i < rank; ++i) n *= dims[static_cast<std::size_t>(i)];
    return n;
  }
  // Leading dimensions folded: a [B, T, C] view is rows()=B*T, cols()=C (also when C is 0).
  std::int64_t cols() const { return rank == 0 ? 1 : dims[static_cast<std::size_t>(rank - 1)]; }
  std::int64_t rows() const {
    std::int64_t r = 1;
    for (int i = 0; i + 1 < rank; ++i) r *= dims[static_cast<std::size_t>(i)];
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
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
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
    for (auto d : shape) n *= d;
    return n;
  }
};

}  // namespace mixtrain::sdk
