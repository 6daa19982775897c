// GemmPlanKey: the key of a backend's GEMM plan cache (oneDNN primitives, cuBLASLt descriptors and
// algorithms), so that every backend keys and hashes its plans the same way.
//
// Contract
// - A backend derives its key from GemmPlanKey, adding what else selects its plan (dtypes,
//   epilogue, alignment, batch strides: integers, enums and bools only), defaults operator==,
//   and lists every added member in `auto fields() const { return std::tie(...); }`.
// - m, n, k and the transposes are the problem as the backend's library sees it (a backend that
//   swaps operands stores the swapped problem).
// - GemmPlanKeyHash hashes the shape, then each of fields() in order, with boost::hash_combine.
//   A member missing from fields() still takes part in equality (lookups stay correct) but not in
//   the hash (more collisions).
// - Header-only and host-only; no key crosses the plugin boundary.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <tuple>

#include <boost/container_hash/hash.hpp>

namespace mixtrain::sdk {

struct GemmPlanKey {
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  bool operator==(const GemmPlanKey&) const = default;
};

struct GemmPlanKeyHash {
  template <class Key>
  requires std::derived_from<Key, GemmPlanKey> std::size_t operator()(
      const Key& key) const noexcept {
    std::size_t h = 0;
    boost::hash_combine(h, key.m);
    boost::hash_combine(h, key.n);
    boost::hash_combine(h, key.k);
    boost::hash_combine(h, key.trans_a);
    boost::hash_combine(h, key.trans_b);
    std::apply([&h](const auto&... field) { (boost::hash_combine(h, field), ...); }, key.fields());
    return h;
  }
};

}  // namespace mixtrain::sdk
