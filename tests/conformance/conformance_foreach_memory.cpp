// The multi-tensor (foreach) ops, and the memory a backend counts: allocations and scratch.
#include "conformance_fixture.h"

namespace mixtrain::conformance {
namespace internal {
void link_foreach_memory() {}  // see link_all_test_files()
}  // namespace internal

namespace {

using namespace internal;

TEST_P(Conformance, ForeachOpsMatchAStraightforwardReference) {
  MIXTRAIN_FACETS(foreach, ForeachFacet);
  // Two tensors per list (sizes straddling a vector width), each op against a host loop.
  const std::vector<std::int64_t> sizes = {1003, 64};
  auto make = [&](unsigned seed, float lo, float hi) {
    std::vector<std::vector<float>> host;
    std::vector<Pair> dev;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      host.push_back(random_values(static_cast<std::size_t>(sizes[i]),
                                   seed + static_cast<unsigned>(i), lo, hi));
      dev.push_back(upload(host.back(), Shape{sizes[i]}));
    }
    return std::make_pair(host, std::move(dev));
  };
  auto views = [](const std::vector<Pair>& ps) {
    std::vector<TensorView> v;
    for (const auto& p : ps) v.push_back(p.tested->view());
    return v;
  };
  struct Case {
    const char* name;
    sdk::ForeachOp op;
    std::function<void(sdk::ForeachFacet&, std::span<const TensorView>, std::span<const TensorView>,
                       std::span<const TensorView>)>
        run;
    std::function<float(float, float, float)> ref;
  };
  const std::vector<Case> cases = {
      {"mul_scalar", sdk::ForeachOp::foreach_mul_scalar,
       [](auto& f, auto x, auto, auto) { f.foreach_mul_scalar(x, -1.5f); },
       [](float x, float, float) { return x * -1.5f; }},
      {"mul", sdk::ForeachOp::foreach_mul,
       [](auto& f, auto x, auto a, auto) { f.foreach_mul(x, a); },
       [](float x, float a, float) { return x * a; }},
      {"add_scalar", sdk::ForeachOp::foreach_add_scalar,
       [](auto& f, auto x, auto, auto) { f.foreach_add_scalar(x, 0.25f); },
       [](float x, float, float) { return x + 0.25f; }},
      {"add", sdk::ForeachOp::foreach_add,
       [](auto& f, auto x, auto a, auto) { f.foreach_add(x, a, -0.5f); },
       [](float x, float a, float) { return x + -0.5f * a; }},
      {"addcmul", sdk::ForeachOp::foreach_addcmul,
       [](auto& f, auto x, auto a, auto b) { f.foreach_addcmul(x, a, b, 0.1f); },
       [](float x, float a, float b) { return x + 0.1f * a * b; }},
      {"sqrt", sdk::ForeachOp::foreach_sqrt, [](auto& f, auto x, auto, auto) { f.foreach_sqrt(x); },
       [](float x, float, float) { return std::sqrt(x); }},
      {"sign", sdk::ForeachOp::foreach_sign, [](auto& f, auto x, auto, auto) { f.foreach_sign(x); },
       [](float x, float, float) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }},
      {"lerp", sdk::ForeachOp::foreach_lerp,
       [](auto& f, auto x, auto a, auto) { f.foreach_lerp(x, a, 0.1f); },
       [](float x, float a, float) { return x + 0.1f * (a - x); }},
      {"clamp", sdk::ForeachOp::foreach_clamp,
       [](auto& f, auto x, auto, auto) { f.foreach_clamp(x, -0.3f, 0.6f); },
       [](float x, float, float) { return x < -0.3f ? -0.3f : (x > 0.6f ? 0.6f : x); }},
  };
  for (const Case& c : cases) {
    const std::vector<DType> dtypes(3, DType::fp32);
    if (!tested_foreach->supports(c.op, std::span(dtypes).first(1))) {
      ADD_FAILURE() << "the foreach facet must support foreach_" << c.name << " on fp32";
      continue;
    }
    // sqrt reads non-negative values; the others see both signs, zeros and a NaN.
    const bool sqrt = c.op == sdk::ForeachOp::foreach_sqrt;
    auto [xh, xd] = make(40, sqrt ? 0.0f : -1.0f, 1.0f);
    if (!sqrt) {
      xh[0][3] = 0.0f;
      xh[0][4] = std::numeric_limits<float>::quiet_NaN();
      xd[0] = upload(xh[0], Shape{sizes[0]});
    }
    auto [ah, ad] = make(50, -1.0f, 1.0f);
    auto [bh, bd] = make(60, -1.0f, 1.0f);
    c.run(*tested_foreach, views(xd), views(ad), views(bd));
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      const auto got = tested_values(xd[t]);
      for (std::size_t i = 0; i < got.size(); ++i) {
        const float want = c.ref(xh[t][i], ah[t][i], bh[t][i]);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got[i])) << "foreach_" << c.name << " keeps NaN, tensor " << t;
          continue;
        }
        // One or two roundings; a backend may differ from this order by an ulp or so.
        EXPECT_NEAR(got[i], want, 2e-7f * std::max(1.0f, std::abs(want)))
            << "foreach_" << c.name << " tensor " << t << " element " << i;
      }
    }
  }
  // Lists of unequal length are refused.
  auto [xh, xd] = make(70, -1.0f, 1.0f);
  const auto x = views(xd);
  EXPECT_THROW(tested_foreach->foreach_add(x, std::span(x).first(1)), sdk::BackendError);
  EXPECT_THROW(tested_foreach->foreach_clamp(x, 1.0f, -1.0f), sdk::BackendError);
}

TEST_P(Conformance, MemoryStatsTrackAllocations) {
  auto before = tested_->memory_stats();
  {
    DeviceTensor t(*tested_, DType::fp32, Shape{1 << 20});
    auto during = tested_->memory_stats();
    EXPECT_GE(during.current_bytes, before.current_bytes + (4u << 20));
    EXPECT_GE(during.peak_bytes, during.current_bytes);
  }
  EXPECT_LE(tested_->memory_stats().current_bytes, before.current_bytes + 4096);
}

// NF4 decoding (quantized_weight facet): the codes and absmax of the SDK's reference quantizer,
// decoded into every storage dtype the backend declares, equal the reference's fp32 values
// rounded once into that dtype, bit for bit: whole and partial blocks, a zero block, odd counts.
// A short absmax or a null code pointer is a BackendError.

TEST_P(Conformance, ScratchIsTheCountedMemoryNoCallerHolds) {
  MIXTRAIN_FACETS(scratch, ScratchFacet);
  auto* gemm = sdk::facet<sdk::GemmFacet>(*tested_);
  ASSERT_NE(gemm, nullptr);
  const auto before = tested_->memory_stats();
  const std::size_t scratch_before = tested_scratch->scratch_bytes();
  ASSERT_LE(scratch_before, before.current_bytes);
  const std::int64_t m = 96, n = 80, k = 72;
  for (const auto& support : tested_->capabilities().gemm_inputs) {
    const DType dt = support.dtype;
    if (dt == DType::int32 || dt == DType::tf32) continue;
    auto a =
        make_on(*tested_, random_values(static_cast<std::size_t>(m * k), 6), Shape{m, k}, dt, 1.0f);
    auto b =
        make_on(*tested_, random_values(static_cast<std::size_t>(k * n), 7), Shape{k, n}, dt, 1.0f);
    DeviceTensor c(*tested_, DType::fp16, Shape{m, n});
    sdk::GemmArgs g;
    g.a.view = a->view();
    g.b.view = b->view();
    g.c = c.view();
    gemm->gemm(g);
    tested_->synchronize();
    EXPECT_LE(tested_scratch->scratch_bytes(), tested_->memory_stats().current_bytes)
        << sdk::dtype_name(dt);
  }
  const auto after = tested_->memory_stats();
  const std::size_t scratch_after = tested_scratch->scratch_bytes();
  ASSERT_LE(scratch_after, after.current_bytes);
  EXPECT_EQ(after.current_bytes - scratch_after, before.current_bytes - scratch_before);
}

// The quickstart model trained for 100 steps on both backends: every step's loss agrees.

}  // namespace
}  // namespace mixtrain::conformance
