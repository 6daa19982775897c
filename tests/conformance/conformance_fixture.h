// What the conformance kit's test files share (not installed): the Conformance fixture, which runs
// each op on the backend under test and on the reference from the same inputs, the device tensors
// it uploads, the comparisons and the double-precision helpers of several files.
//
// Contract
// - TEST_P(Conformance, ...) in any of the kit's files: GoogleTest runs it once per backend
//   registered with add_backend() (backend_conformance.h), against set_reference()'s backend.
// - Each test file defines link_<file>(); set_reference() calls them all, so a program that links
//   the kit as a static library keeps every file's tests (a linker takes an archive's object only
//   for a symbol the program uses).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mixtrain/conformance/backend_conformance.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/facet_list.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "mixtrain/sdk/support/gradient_clipping.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::conformance {

// The factory set_reference() stored (backend_conformance.cpp).
const BackendFactory& reference_factory();
// What the training-parity test scans for plugins: set_plugin_search_path()'s folders, else
// PluginRegistry::default_search_path().
std::vector<std::filesystem::path> plugin_search_path();

namespace internal {

// One per test file, called by set_reference() (see the contract above).
void link_kernels();
void link_gemm();
void link_weight_formats();
void link_attention();
void link_embedding_dropout();
void link_foreach_memory();
void link_image_input();
void link_training();
void link_convolution();
void link_batch_norm();

using sdk::DType;
using sdk::Shape;
using sdk::TensorView;

// A tensor on one backend, freed through it.
class DeviceTensor {
 public:
  DeviceTensor(sdk::DeviceBackend& b, DType dtype, Shape shape) : b_(&b) {
    view_ = {b.allocate(std::max<std::size_t>(
                 64, static_cast<std::size_t>(shape.numel()) * sdk::dtype_size(dtype))),
             dtype, shape};
  }
  ~DeviceTensor() { b_->deallocate(view_.data); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  const TensorView& view() const { return view_; }

 private:
  sdk::DeviceBackend* b_;
  TensorView view_;
};

inline std::vector<float> random_values(std::size_t n, unsigned seed, float lo = -1.f,
                                        float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Normwise relative difference: the right measure when only accumulation order differs.
inline double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Why the backend's answer to find_facet(F::kName) is not a facet a host of this SDK talks to,
// or "" when it is one of F's major. A facet of F's name at another major is one the host refuses
// at plan time (facet.h, "Major step"), so the kit fails it: skipping it, as a facet the backend
// does not offer, would pass a backend no host can use.
template <class F>
std::string facet_refusal(const std::string& backend, const sdk::Facet& found) {
  const std::string name(F::kName);
  if (found.name() != F::kName)
    return "backend '" + backend + "' answers find_facet(\"" + name + "\") with its " +
           std::string(found.name()) + " facet";
  const sdk::FacetVersion has = found.version();
  if (has.major == F::kVersion.major) return "";
  return "backend '" + backend + "' offers " + name + " facet " + sdk::to_string(has) +
         ", built against " + (has.major > F::kVersion.major ? "a newer" : "an older") +
         " SDK; this kit speaks " + name + " " + sdk::to_string(F::kVersion) + " (any " +
         std::to_string(F::kVersion.major) +
         ".x), and a host refuses the facet at plan time: rebuild the backend against this "
         "mixtrain's SDK";
}

// `ref_<name>` and `tested_<name>`: the two backends' facet; the test is skipped when the backend
// under test has no facet of that name (a facet is optional), fails when its facet is of another
// major (facet_refusal), and fails when the reference lacks it. A facet older than this SDK's
// minor is skipped, naming both versions: the kit's cases may call any op up to this minor.
#define MIXTRAIN_FACETS(var, Class)                                                           \
  auto* ref_##var = sdk::facet<sdk::Class>(*ref_);                                            \
  ASSERT_NE(ref_##var, nullptr) << "the reference backend has no " #var " facet";             \
  const sdk::Facet* found_##var = tested_->find_facet(sdk::Class::kName);                     \
  if (found_##var == nullptr)                                                                 \
    GTEST_SKIP() << "backend '" << GetParam().name << "' has no " #var " facet";              \
  if (const std::string why_##var = facet_refusal<sdk::Class>(GetParam().name, *found_##var); \
      !why_##var.empty())                                                                     \
    FAIL() << why_##var;                                                                      \
  auto* tested_##var = sdk::facet<sdk::Class>(*tested_);                                      \
  if (tested_##var == nullptr)                                                                \
  GTEST_SKIP() << "backend '" << GetParam().name << "' has " #var " facet "                   \
               << sdk::to_string(found_##var->version()) << ", older than the "               \
               << sdk::to_string(sdk::Class::kVersion) << " this kit checks"

class Conformance : public ::testing::TestWithParam<BackendUnderTest> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(reference_factory()) << "set_reference() was not called before RUN_ALL_TESTS";
    try {
      tested_ = GetParam().make();
    } catch (const std::exception& e) {
      GTEST_SKIP() << "backend '" << GetParam().name << "' is unavailable here: " << e.what();
    }
    ref_ = reference_factory()();
  }

  // A pair of tensors holding the same fp32 values, then cast (by each backend) to `dtype`.
  struct Pair {
    std::unique_ptr<DeviceTensor> ref, tested;
  };
  Pair upload(const std::vector<float>& values, Shape shape, DType dtype = DType::fp32,
              float scale = 1.0f) {
    Pair p;
    p.ref = make_on(*ref_, values, shape, dtype, scale);
    p.tested = make_on(*tested_, values, shape, dtype, scale);
    return p;
  }
  // saturate = false keeps infinities a 16-bit dtype can hold (upload() saturates them to its
  // largest finite value, as a cast of real data does).
  static std::unique_ptr<DeviceTensor> make_on(sdk::DeviceBackend& b,
                                               const std::vector<float>& values, Shape shape,
                                               DType dtype, float scale, bool saturate = true) {
    auto f32 = std::make_unique<DeviceTensor>(b, DType::fp32, shape);
    b.copy_from_host(f32->view(), values.data());
    if (dtype == DType::fp32) return f32;
    auto out = std::make_unique<DeviceTensor>(b, dtype == DType::tf32 ? DType::fp32 : dtype, shape);
    sdk::CastArgs args;
    args.scale = scale;
    args.saturate = saturate;
    b.cast(f32->view(), out->view(), args);
    return out;
  }
  Pair zeros(Shape shape, DType dtype = DType::fp32) {
    return upload(std::vector<float>(static_cast<std::size_t>(shape.numel()), 0.0f), shape, dtype);
  }
  static std::vector<float> download(sdk::DeviceBackend& b, const TensorView& v) {
    DeviceTensor f32(b, DType::fp32, v.shape);
    if (v.dtype == DType::fp32) {
      std::vector<float> h(static_cast<std::size_t>(v.numel()));
      b.copy_to_host(h.data(), v);
      return h;
    }
    b.cast(v, f32.view());
    std::vector<float> h(static_cast<std::size_t>(v.numel()));
    b.copy_to_host(h.data(), f32.view());
    return h;
  }
  std::vector<float> ref_values(const Pair& p) { return download(*ref_, p.ref->view()); }
  std::vector<float> tested_values(const Pair& p) { return download(*tested_, p.tested->view()); }
  void expect_close(const Pair& p, double tolerance, const std::string& what) {
    EXPECT_LE(relative_difference(tested_values(p), ref_values(p)), tolerance) << what;
  }
  // One GEMM on both backends: `args` carries flags and scalars, the pairs the tensors (bias and
  // pre_activation may be null).
  void gemm_both(const sdk::GemmArgs& args, const Pair& a, const Pair& b, const Pair& c,
                 const Pair* bias = nullptr, const Pair* pre = nullptr) {
    for (int which : {0, 1}) {
      auto side = [&](const Pair& p) { return which == 0 ? p.ref->view() : p.tested->view(); };
      sdk::GemmArgs g = args;
      g.a.view = side(a);
      g.b.view = side(b);
      g.c = side(c);
      if (bias != nullptr) g.bias = side(*bias);
      if (pre != nullptr) g.pre_activation = side(*pre);
      sdk::facet<sdk::GemmFacet>(which == 0 ? *ref_ : *tested_)->gemm(g);
    }
  }

  std::shared_ptr<sdk::DeviceBackend> ref_, tested_;
};

// The value `dtype` stores for v: RNE, as every backend's cast rounds (values here are in range).
inline float stored(double v, DType dtype) {
  const auto f = static_cast<float>(v);
  switch (dtype) {
    case DType::bf16:
      return sdk::decode_bf16(sdk::encode_bf16(f));
    case DType::fp16:
      return sdk::decode_fp16(sdk::encode_fp16(f));
    default:
      return f;
  }
}

// One unit in the last place relative to the value, per storage dtype.
inline double ulp(DType dtype) {
  return dtype == DType::bf16 ? 0x1p-7 : (dtype == DType::fp16 ? 0x1p-10 : 0x1p-23);
}

inline constexpr DType kStorageFloats[] = {DType::fp32, DType::bf16, DType::fp16};

inline std::string dtypes_text(std::initializer_list<DType> ts) {
  std::string s;
  for (DType t : ts) s += (s.empty() ? "" : "/") + std::string(sdk::dtype_name(t));
  return s;
}

// Normwise relative difference against a double-precision reference.
inline double relative_to(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Tolerance for a result rounded once into `out` after FP32 accumulation: the rounding's relative
// error (2^-8 bf16, 2^-11 fp16), or a few hundred FP32 ulps of accumulation for fp32.
inline double output_tolerance(DType out) {
  return out == DType::bf16 ? 0x1p-8 : (out == DType::fp16 ? 0x1p-10 : 2e-5);
}

inline std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// A workspace of at least `bytes` (int32 elements) on one backend.
inline std::unique_ptr<DeviceTensor> workspace_on(sdk::DeviceBackend& b, std::size_t bytes) {
  return std::make_unique<DeviceTensor>(
      b, DType::int32,
      Shape{std::max<std::int64_t>(1, static_cast<std::int64_t>((bytes + 3) / 4))});
}

}  // namespace internal
}  // namespace mixtrain::conformance
