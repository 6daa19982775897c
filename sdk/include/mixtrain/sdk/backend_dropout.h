// DropoutFacet: inverted dropout (torch.nn.Dropout's convention) whose mask is a pure function of
// a key and the element index, so backward recomputes it instead of storing it.
//
// Contract
// - A backend offers it as find_facet("dropout") (nullptr: the backend has none).
// - supports(op, dtypes) answers without running anything. dtypes: dropout_forward {x, y};
//   dropout_backward {dy, dx}; each fp32, bf16 or fp16 storage, in any mix. Math in FP32, one
//   rounding into the output's dtype.
// - Shapes: any; the output has the input's element count (both are read as flat arrays of numel
//   elements, element i of one is element i of the other). Input and output are the same view
//   (in place) or do not overlap.
// - The mask: element i is kept when dropout_keeps(key, i, dropout_threshold(p)) (below, defined
//   here once so every backend draws the same mask bit for bit, whatever its thread count or
//   launch shape); a kept element is multiplied by dropout_scale(p) = 1 / (1 - p) in FP32, a
//   dropped one becomes +0. dropout_backward with the same key and p applies the same mask to dy.
// - p in [0, 1); anything else, a non-storage dtype, a size mismatch or a partial overlap raises
//   BackendError naming the op, the tensor and its dtype/shape.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class DropoutOp { dropout_forward, dropout_backward };
MIXTRAIN_SDK_API std::string_view op_name(DropoutOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(DropoutOp op) noexcept;

// Which mask: `seed` names the mask's owner (the host derives it from the run seed and the node),
// `stream` which draw of it (the host's optimizer step and micro-batch). Equal keys, equal masks.
struct DropoutKey {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
};

// Elements are dropped when their 32 random bits fall below this: floor(p · 2³²).
constexpr std::uint32_t dropout_threshold(float p) noexcept {
  const double t = static_cast<double>(p) * 4294967296.0;
  return t <= 0.0 ? 0u : t >= 4294967295.0 ? 4294967295u : static_cast<std::uint32_t>(t);
}

// The SplitMix64 output function: a bijection of 64 bits whose outputs pass BigCrush for
// consecutive inputs, which is what makes a counter (the element index) a usable stream.
constexpr std::uint64_t dropout_mix(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Whether element `index` survives: the top 32 bits of SplitMix64 at position index + 1 of the
// sequence that starts at the key's mixed state, compared with the threshold.
constexpr bool dropout_keeps(DropoutKey key, std::uint64_t index,
                             std::uint32_t threshold) noexcept {
  const std::uint64_t state =
      dropout_mix(key.seed ^ dropout_mix(key.stream + 0x9E3779B97F4A7C15ull));
  const std::uint64_t bits = dropout_mix(state + (index + 1) * 0x9E3779B97F4A7C15ull);
  return static_cast<std::uint32_t>(bits >> 32) >= threshold;
}

// What a kept element is multiplied by, in FP32 (torch's noise value, 1 / (1 - p)).
constexpr float dropout_scale(float p) noexcept {
  return 1.0f / (1.0f - p);
}

class MIXTRAIN_SDK_API DropoutFacet : public Facet {
 public:
  using Op = DropoutOp;
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "dropout";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(DropoutOp op, std::span<const DType> dtypes) const;

  // y[i] = keeps(key, i) ? x[i] · scale(p) : 0; x, y of equal numel.
  virtual void dropout_forward(TensorView x, TensorView y, float p, DropoutKey key) = 0;
  // dx[i] = keeps(key, i) ? dy[i] · scale(p) : 0 (the forward's mask, from the same key and p);
  // dy, dx of equal numel; dx is overwritten.
  virtual void dropout_backward(TensorView dy, TensorView dx, float p, DropoutKey key) = 0;

 protected:
  ~DropoutFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
