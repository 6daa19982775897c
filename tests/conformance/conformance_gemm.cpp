// The GEMM facet: every declared dtype and transpose (on square, long-reduction and one-row or
// one-column shapes too), activation epilogues, gemm_gradient, the FP8 cast-transpose,
// strided-batched and grouped GEMMs.
#include <sstream>

#include "conformance_fixture.h"

namespace mixtrain::conformance {
namespace internal {
void link_gemm() {}  // see link_all_test_files()
}  // namespace internal

namespace {

using namespace internal;

TEST_P(Conformance, GemmEveryDeclaredDtypeAndTranspose) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  const std::int64_t m = 37, n = 29, k = 53;
  for (const auto& support : tested_->capabilities().gemm_inputs) {
    const DType dt = support.dtype;
    if (!ref_->capabilities().supports(dt) || dt == DType::int32) continue;
    // tf32 rounding may differ in tie handling between implementations; 16/8-bit inputs are
    // quantized identically by both backends' casts, so only accumulation order differs.
    const double tol = dt == DType::tf32 ? 2e-3 : 2e-5;
    const DType b_dt = dt == DType::fp8_e4m3 ? DType::fp8_e4m3 : dt;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Shape sa = ta ? Shape{k, m} : Shape{m, k};
        Shape sb = tb ? Shape{n, k} : Shape{k, n};
        auto a = upload(random_values(static_cast<std::size_t>(m * k), 2), sa, dt);
        auto b = upload(random_values(static_cast<std::size_t>(k * n), 3), sb, b_dt);
        auto c = upload(random_values(static_cast<std::size_t>(m * n), 4), Shape{m, n});
        auto bias = upload(random_values(static_cast<std::size_t>(n), 5), Shape{n});
        sdk::GemmArgs g;
        g.a.transpose = ta;
        g.b.transpose = tb;
        g.alpha = 1.5f;
        g.beta = 0.5f;
        g.compute = dt;
        gemm_both(g, a, b, c, &bias);
        expect_close(c, tol,
                     std::string(sdk::dtype_name(dt)) + (ta ? " At" : " A") + (tb ? " Bt" : " B"));
      }
  }
}

// The bound on a normwise difference of two FP32 accumulations over k terms in different orders:
// `at_53` (what GemmEveryDeclaredDtypeAndTranspose allows at k = 53), grown as rounding errors of
// random sign grow, with sqrt(k).
double accumulation_tolerance(double at_53, std::int64_t k) {
  return at_53 * std::sqrt(static_cast<double>(std::max<std::int64_t>(k, 53)) / 53.0);
}

// Shapes the case above cannot tell apart, each with every transpose pair:
// - square operands, where op(X) has X's shape, so a GEMM that drops a transpose still reads in
//   bounds and only the values tell;
// - reductions past 64 and off the common block sizes (65, 127, 257, 1000), where a blocked
//   kernel's tail in k is the part left to check;
// - a single row or column of C (m or n = 1, the paths a library takes as GEMV), and operands of
//   which only one is square.
TEST_P(Conformance, GemmSquareLongAndThinShapesWithEveryTranspose) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  struct Case {
    std::int64_t m, n, k;
  };
  const Case cases[] = {
      {16, 16, 16}, {65, 65, 65},  {20, 7, 20},  {7, 20, 20},  {24, 24, 13},
      {6, 5, 65},   {5, 7, 127},   {4, 3, 257},  {3, 5, 1000}, {1, 29, 53},
      {37, 1, 53},  {1, 17, 1000}, {17, 1, 257}, {1, 1, 65},
  };
  for (const auto& support : tested_->capabilities().gemm_inputs) {
    const DType dt = support.dtype;
    if (!ref_->capabilities().supports(dt) || dt == DType::int32) continue;
    // As GemmEveryDeclaredDtypeAndTranspose: both backends' casts quantize the inputs alike, so
    // only the accumulation order differs (and tf32's tie handling).
    const double at_53 = dt == DType::tf32 ? 2e-3 : 2e-5;
    std::ostringstream wrong;
    wrong.precision(3);
    unsigned seed = 100;
    for (const Case& s : cases)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const Shape sa = ta ? Shape{s.k, s.m} : Shape{s.m, s.k};
          const Shape sb = tb ? Shape{s.n, s.k} : Shape{s.k, s.n};
          auto a = upload(random_values(static_cast<std::size_t>(s.m * s.k), seed++), sa, dt);
          auto b = upload(random_values(static_cast<std::size_t>(s.k * s.n), seed++), sb, dt);
          auto c =
              upload(random_values(static_cast<std::size_t>(s.m * s.n), seed++), Shape{s.m, s.n});
          auto bias = upload(random_values(static_cast<std::size_t>(s.n), seed++), Shape{s.n});
          sdk::GemmArgs g;
          g.a.transpose = ta;
          g.b.transpose = tb;
          g.alpha = 1.5f;
          g.beta = 0.5f;
          g.compute = dt;
          gemm_both(g, a, b, c, &bias);
          const double tol = accumulation_tolerance(at_53, s.k);
          const double diff = relative_difference(tested_values(c), ref_values(c));
          if (!(diff <= tol))
            wrong << "\n  m " << s.m << " n " << s.n << " k " << s.k << (ta ? " At" : " A")
                  << (tb ? " Bt" : " B") << ": relative difference " << diff << " > " << tol;
        }
    EXPECT_TRUE(wrong.str().empty())
        << sdk::dtype_name(dt) << " GEMMs that differ from the reference:" << wrong.str();
  }
}

TEST_P(Conformance, GemmActivationEpilogue) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  // n = 64 meets cuBLASLt's aux rule (n % 8 == 0) so a GPU backend can fuse gelu with its
  // pre-activation; n = 29 takes the fp32-then-kernel route. Both must match the reference.
  const std::int64_t m = 45, k = 40;
  for (std::int64_t n : {std::int64_t{64}, std::int64_t{29}})
    for (DType out : {DType::fp32, DType::bf16, DType::fp16}) {
      if (!tested_->capabilities().supports(out)) continue;
      const DType in = out == DType::fp32 ? DType::fp32 : out;
      // One rounding of the output: the reference and the backend may differ by accumulation
      // order only, which can move a value across a rounding boundary.
      const double round_tol = out == DType::fp32 ? 2e-5 : (out == DType::bf16 ? 4e-3 : 1e-3);
      for (sdk::Activation act : {sdk::Activation::relu, sdk::Activation::gelu})
        for (bool with_pre : {false, true}) {
          // A GPU epilogue may evaluate gelu's tanh with a hardware approximation (~2^-11
          // relative), which is below bf16/fp16 rounding but above fp32 accumulation noise.
          const double tol = act == sdk::Activation::gelu && out == DType::fp32 ? 1e-4 : round_tol;
          auto a = upload(random_values(static_cast<std::size_t>(m * k), 6), Shape{m, k}, in);
          auto b = upload(random_values(static_cast<std::size_t>(n * k), 7), Shape{n, k}, in);
          auto bias = upload(random_values(static_cast<std::size_t>(n), 8), Shape{n});
          auto c = zeros(Shape{m, n}, out);
          auto pre = zeros(Shape{m, n}, out);
          sdk::GemmArgs g;
          g.b.transpose = true;
          g.has_activation = true;
          g.activation = act;
          gemm_both(g, a, b, c, &bias, with_pre ? &pre : nullptr);
          const std::string what = std::string(act == sdk::Activation::relu ? "relu" : "gelu") +
                                   " C " + std::string(sdk::dtype_name(out)) + " n " +
                                   std::to_string(n) + (with_pre ? " with pre_activation" : "");
          expect_close(c, tol, what);
          if (with_pre) expect_close(pre, tol, what + " (pre_activation)");
        }
    }
}

TEST_P(Conformance, GemmActivationEpilogueKeepsNaN) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  // A NaN in the GEMM result must survive the fused relu/gelu as the unfused kernels keep it
  // (a fused max(z, 0) that turned NaN into 0 would hide a non-finite step from found_inf).
  // m = 1024: C's 32,768 elements take the CPU backend's threaded epilogue too.
  const std::int64_t n = 32, k = 16;
  for (const std::int64_t m : {std::int64_t{8}, std::int64_t{1024}})
    for (DType out : {DType::fp32, DType::bf16}) {
      auto values = random_values(static_cast<std::size_t>(m * k), 9);
      values[2 * k + 5] = std::numeric_limits<float>::quiet_NaN();  // row 2 of A
      if (!tested_->capabilities().supports(out)) continue;
      for (sdk::Activation act : {sdk::Activation::relu, sdk::Activation::gelu}) {
        auto a = upload(values, Shape{m, k}, out);
        auto b = upload(random_values(static_cast<std::size_t>(n * k), 10), Shape{n, k}, out);
        auto bias = upload(random_values(static_cast<std::size_t>(n), 11), Shape{n});
        auto c = zeros(Shape{m, n}, out);
        sdk::GemmArgs g;
        g.b.transpose = true;
        g.has_activation = true;
        g.activation = act;
        gemm_both(g, a, b, c, &bias);
        const auto want = ref_values(c), got = tested_values(c);
        for (std::size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i]))
              << (act == sdk::Activation::relu ? "relu" : "gelu") << " C " << sdk::dtype_name(out)
              << " m=" << m << " element " << i;
        for (std::int64_t j = 0; j < n; ++j)
          EXPECT_TRUE(std::isnan(want[static_cast<std::size_t>(2 * n + j)]))
              << "reference, m=" << m << ", column " << j;
      }
    }
}

// The residual join (optional op): the FP32 sum rounded once, with and without the fused ReLU,
// NaN kept, into each storage dtype, from inputs of mixed dtypes, in place too.

TEST_P(Conformance, GemmGradientIsTheUnfusedOpsRoundedOnce) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  MIXTRAIN_FACETS(activation, ActivationFacet);
  if (tested_gemm->version() < sdk::FacetVersion{1, 5})
    GTEST_SKIP() << "backend '" << GetParam().name << "' has gemm facet "
                 << sdk::to_string(tested_gemm->version());
  const std::int64_t m = 37, k = 48;
  for (std::int64_t n : {std::int64_t{64}, std::int64_t{29}})
    for (DType dt : {DType::fp32, DType::bf16}) {
      if (!tested_->capabilities().supports(dt)) continue;
      if (!tested_gemm->supports(sdk::GemmOp::gemm_gradient, std::vector<DType>{dt, dt, dt}))
        continue;
      // gelu's tanh may be a hardware approximation on a GPU (~2^-11 relative, see
      // GemmActivationEpilogue), and gelu' magnifies it: over z in [-3, 3] about 2.7·ε
      // normwise, 1.3e-3 at ε = 2^-11 (cuBLASLt's DGELU epilogue takes the fp32 case at n = 64).
      // So 2e-3 for fp32's dz and its column sums; in bf16 one rounding of C dominates. The
      // wgrad below has no gelu and keeps its own bounds.
      const double tol = dt == DType::fp32 ? 2e-3 : 4e-3;
      const std::string what = std::string(sdk::dtype_name(dt)) + " n " + std::to_string(n);
      for (bool accumulate : {false, true}) {
        // dgrad: dz[m, n] = (dy[m, k] · W[k, n]) · gelu'(z), sums[n] (+)= Σ_m dz.
        auto dy = upload(random_values(static_cast<std::size_t>(m * k), 40), Shape{m, k}, dt);
        auto w = upload(random_values(static_cast<std::size_t>(k * n), 41), Shape{k, n}, dt);
        auto z =
            upload(random_values(static_cast<std::size_t>(m * n), 42, -3.f, 3.f), Shape{m, n}, dt);
        auto dz = zeros(Shape{m, n}, dt);
        auto dz32 = zeros(Shape{m, n});
        auto sums = upload(random_values(static_cast<std::size_t>(n), 43), Shape{n});
        sdk::GemmGradientArgs g;
        g.gemm.a.view = dy.tested->view();
        g.gemm.b.view = w.tested->view();
        g.gemm.c = dz.tested->view();
        g.gemm.alpha = 0.5f;
        g.gemm.compute = dt;
        g.has_activation_grad = true;
        g.pre_activation = z.tested->view();
        g.c_column_sums = sums.tested->view();
        g.accumulate_c_column_sums = accumulate;
        tested_gemm->gemm_gradient(g);
        sdk::GemmArgs r;
        r.a.view = dy.ref->view();
        r.b.view = w.ref->view();
        r.c = dz32.ref->view();
        r.alpha = 0.5f;
        r.compute = dt;
        ref_gemm->gemm(r);
        ref_activation->activation_backward(sdk::Activation::gelu, z.ref->view(), dz32.ref->view(),
                                            dz32.ref->view());
        ref_->cast(dz32.ref->view(), dz.ref->view());
        ref_activation->bias_grad(dz.ref->view(), sums.ref->view(), accumulate);
        expect_close(dz, tol, "dgrad with gelu's gradient, " + what);
        expect_close(sums, tol, "its column sums, " + what + (accumulate ? ", accumulated" : ""));

        // wgrad: dW[k, n] = dyᵀ · x, with dy [m, k] stored as A (transposed); sums[k] (+)= Σ_m dy.
        auto x = upload(random_values(static_cast<std::size_t>(m * n), 44), Shape{m, n}, dt);
        auto dw = upload(random_values(static_cast<std::size_t>(k * n), 45), Shape{k, n});
        auto dbias = upload(random_values(static_cast<std::size_t>(k), 46), Shape{k});
        sdk::GemmGradientArgs gw;
        gw.gemm.a.view = dy.tested->view();
        gw.gemm.a.transpose = true;
        gw.gemm.b.view = x.tested->view();
        gw.gemm.c = dw.tested->view();
        gw.gemm.beta = accumulate ? 1.0f : 0.0f;
        gw.gemm.compute = dt;
        gw.a_row_sums = dbias.tested->view();
        gw.accumulate_a_row_sums = accumulate;
        tested_gemm->gemm_gradient(gw);
        sdk::GemmArgs rw = gw.gemm;
        rw.a.view = dy.ref->view();
        rw.b.view = x.ref->view();
        rw.c = dw.ref->view();
        ref_gemm->gemm(rw);
        ref_activation->bias_grad(dy.ref->view(), dbias.ref->view(), accumulate);
        expect_close(dw, 2e-5, "wgrad, " + what);
        expect_close(dbias, 1e-6, "wgrad's row sums of dyᵀ, " + what);
      }
    }
}

TEST_P(Conformance, GemmGradientRejectsBadArguments) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  if (tested_gemm->version() < sdk::FacetVersion{1, 5} ||
      !tested_gemm->supports(sdk::GemmOp::gemm_gradient,
                             std::vector<DType>{DType::fp32, DType::fp32, DType::fp32}))
    GTEST_SKIP() << "backend '" << GetParam().name << "' has no gemm_gradient";
  auto a = upload(random_values(12, 50), Shape{3, 4});
  auto b = upload(random_values(20, 51), Shape{4, 5});
  auto c = zeros(Shape{3, 5});
  auto pre = zeros(Shape{3, 5});
  auto sums = zeros(Shape{5});
  auto good = [&] {
    sdk::GemmGradientArgs g;
    g.gemm.a.view = a.tested->view();
    g.gemm.b.view = b.tested->view();
    g.gemm.c = c.tested->view();
    g.has_activation_grad = true;
    g.pre_activation = pre.tested->view();
    return g;
  };
  EXPECT_NO_THROW(tested_gemm->gemm_gradient(good()));
  auto relu = good();
  relu.activation = sdk::Activation::relu;
  EXPECT_THROW(tested_gemm->gemm_gradient(relu), sdk::BackendError) << "relu is not defined";
  auto no_pre = good();
  no_pre.pre_activation = {};
  EXPECT_THROW(tested_gemm->gemm_gradient(no_pre), sdk::BackendError) << "gelu without z";
  auto short_pre = good();
  short_pre.pre_activation.shape = Shape{3, 4};
  EXPECT_THROW(tested_gemm->gemm_gradient(short_pre), sdk::BackendError) << "z of another shape";
  auto in_place = good();
  in_place.pre_activation = c.tested->view();
  EXPECT_THROW(tested_gemm->gemm_gradient(in_place), sdk::BackendError) << "z overlapping C";
  auto forward_bias = good();
  forward_bias.gemm.bias = sums.tested->view();
  EXPECT_THROW(tested_gemm->gemm_gradient(forward_bias), sdk::BackendError) << "a forward bias";
  auto row_sums = good();
  row_sums.a_row_sums = {sums.tested->view().data, DType::fp32, Shape{3}};
  EXPECT_THROW(tested_gemm->gemm_gradient(row_sums), sdk::BackendError) << "A not transposed";
  auto column_sums = good();
  column_sums.c_column_sums = {sums.tested->view().data, DType::fp32, Shape{4}};
  EXPECT_THROW(tested_gemm->gemm_gradient(column_sums), sdk::BackendError) << "sums of [4]";
}

// The FP8 codes of a cast_transpose output (or a cast), as bytes.
std::vector<std::uint8_t> codes_of(sdk::DeviceBackend& b, const TensorView& v) {
  std::vector<std::uint8_t> h(static_cast<std::size_t>(v.numel()));
  b.copy_to_host(h.data(), v);
  return h;
}

// How many elements (r, c) of `stored` [rows, cols] are not at (c, r) in `transposed`.
std::size_t transpose_mismatches(const std::vector<std::uint8_t>& transposed,
                                 const std::vector<std::uint8_t>& stored, std::int64_t rows,
                                 std::int64_t cols) {
  std::size_t wrong = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      wrong += transposed[static_cast<std::size_t>(c * rows + r)] !=
               stored[static_cast<std::size_t>(r * cols + c)];
  return wrong;
}

// gemm 1.6: each layout is the backend's own cast of the source, byte for byte (and so the
// reference's: CastsAgreeBitForBit), the transposed one element (r, c) at (c, r); the amax folds in
// as cast's does. Shapes around the kernels' tiles and their 4-wide packs, both FP8 formats, with
// saturating values and a scale.
TEST_P(Conformance, CastTransposeIsTheCastAndItsTransposeFromOneRead) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  auto offered = [&](DType from, DType to) {
    return tested_gemm->version() >= sdk::FacetVersion{1, 6} &&
           tested_gemm->supports(sdk::GemmOp::cast_transpose, std::vector<DType>{from, to});
  };
  if (!offered(DType::bf16, DType::fp8_e4m3))
    GTEST_SKIP() << "backend '" << GetParam().name << "' offers no cast_transpose";
  // {132, 68} and {68, 1028}: the 4-wide packs with partial tiles in both directions.
  const std::pair<std::int64_t, std::int64_t> shapes[] = {
      {1, 1}, {4, 8}, {67, 45}, {64, 128}, {130, 3}, {3, 130}, {132, 68}, {68, 1028}};
  unsigned seed = 60;
  for (const auto& [rows, cols] : shapes)
    for (DType from : {DType::fp32, DType::bf16, DType::fp16})
      for (DType to : {DType::fp8_e4m3, DType::fp8_e5m2}) {
        if (!offered(from, to)) continue;
        const std::string what = std::string(sdk::dtype_name(from)) + " -> " +
                                 std::string(sdk::dtype_name(to)) + " [" + std::to_string(rows) +
                                 ", " + std::to_string(cols) + "]";
        SCOPED_TRACE(what);
        auto values = random_values(static_cast<std::size_t>(rows * cols), seed++, -300.f, 300.f);
        values[0] = 60000.f;  // saturates e4m3 (and e5m2 at scale 2)
        if (values.size() > 2) values[2] = -0.0f;
        if (values.size() > 3) values[3] = 1e-7f;  // below both formats' subnormals
        auto src = upload(values, Shape{rows, cols}, from);
        const TensorView s = src.tested->view();
        for (float scale : {1.0f, 2.0f}) {
          DeviceTensor want(*tested_, to, Shape{rows, cols});
          DeviceTensor want_ref(*ref_, to, Shape{rows, cols});
          DeviceTensor out(*tested_, to, Shape{rows, cols});
          DeviceTensor out_t(*tested_, to, Shape{cols, rows});
          auto amax = upload({0.0f, 0.0f}, Shape{2});
          sdk::CastArgs cast;
          cast.scale = scale;
          cast.saturate = true;
          cast.amax = {amax.tested->view().data, DType::fp32, Shape{1}};
          tested_->cast(s, want.view(), cast);
          sdk::CastArgs ref_cast = cast;
          ref_cast.amax = {};
          ref_->cast(src.ref->view(), want_ref.view(), ref_cast);
          sdk::CastTransposeArgs both;
          both.src = s;
          both.out = out.view();
          both.out_transposed = out_t.view();
          both.cast = cast;
          both.cast.amax = {static_cast<float*>(amax.tested->view().data) + 1, DType::fp32,
                            Shape{1}};
          tested_gemm->cast_transpose(both);
          const auto expected = codes_of(*tested_, want.view());
          EXPECT_EQ(expected, codes_of(*ref_, want_ref.view())) << "scale " << scale;
          EXPECT_EQ(codes_of(*tested_, out.view()), expected) << "scale " << scale;
          EXPECT_EQ(transpose_mismatches(codes_of(*tested_, out_t.view()), expected, rows, cols),
                    0u)
              << "scale " << scale;
          const auto amaxes = tested_values(amax);
          EXPECT_EQ(amaxes[1], amaxes[0]) << "the amax is cast's";
          EXPECT_EQ(amaxes[0], std::abs(tested_values(src)[0])) << "60000 as the source stores it";
        }
        // One layout alone; an amax that only grows.
        DeviceTensor only_t(*tested_, to, Shape{cols, rows});
        DeviceTensor out_ref(*tested_, to, Shape{rows, cols});
        auto amax = upload({1e6f}, Shape{1});
        sdk::CastTransposeArgs one;
        one.src = s;
        one.out_transposed = only_t.view();
        one.cast.saturate = true;
        one.cast.amax = amax.tested->view();
        tested_gemm->cast_transpose(one);
        sdk::CastTransposeArgs stored;
        stored.src = s;
        stored.out = out_ref.view();
        stored.cast.saturate = true;
        tested_gemm->cast_transpose(stored);
        EXPECT_EQ(transpose_mismatches(codes_of(*tested_, only_t.view()),
                                       codes_of(*tested_, out_ref.view()), rows, cols),
                  0u);
        EXPECT_EQ(tested_values(amax)[0], 1e6f);
      }
  // A NaN in the source makes the amax NaN, as cast's does.
  auto values = random_values(64 * 8, 70);
  values[77] = std::numeric_limits<float>::quiet_NaN();
  auto src = upload(values, Shape{64, 8}, DType::bf16);
  DeviceTensor out_t(*tested_, DType::fp8_e4m3, Shape{8, 64});
  auto amax = upload({0.0f}, Shape{1});
  sdk::CastTransposeArgs nan;
  nan.src = src.tested->view();
  nan.out_transposed = out_t.view();
  nan.cast.saturate = true;
  nan.cast.amax = amax.tested->view();
  tested_gemm->cast_transpose(nan);
  EXPECT_TRUE(std::isnan(tested_values(amax)[0]));
}

TEST_P(Conformance, CastTransposeRejectsBadArguments) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  if (tested_gemm->version() < sdk::FacetVersion{1, 6} ||
      !tested_gemm->supports(sdk::GemmOp::cast_transpose,
                             std::vector<DType>{DType::bf16, DType::fp8_e4m3}))
    GTEST_SKIP() << "backend '" << GetParam().name << "' offers no cast_transpose";
  auto src = upload(random_values(6 * 10, 71), Shape{6, 10}, DType::bf16);
  DeviceTensor out(*tested_, DType::fp8_e4m3, Shape{6, 10});
  DeviceTensor out_t(*tested_, DType::fp8_e4m3, Shape{10, 6});
  DeviceTensor e5(*tested_, DType::fp8_e5m2, Shape{10, 6});
  DeviceTensor wide(*tested_, DType::bf16, Shape{10, 6});
  auto good = [&] {
    sdk::CastTransposeArgs a;
    a.src = src.tested->view();
    a.out = out.view();
    a.out_transposed = out_t.view();
    return a;
  };
  EXPECT_NO_THROW(tested_gemm->cast_transpose(good()));
  auto none = good();
  none.out = {};
  none.out_transposed = {};
  EXPECT_THROW(tested_gemm->cast_transpose(none), sdk::BackendError) << "no output";
  auto unswapped = good();
  unswapped.out_transposed.shape = Shape{6, 10};
  EXPECT_THROW(tested_gemm->cast_transpose(unswapped), sdk::BackendError) << "[rows, cols]";
  auto short_out = good();
  short_out.out.shape = Shape{6, 9};
  EXPECT_THROW(tested_gemm->cast_transpose(short_out), sdk::BackendError) << "out [6, 9]";
  auto mixed = good();
  mixed.out_transposed = e5.view();
  EXPECT_THROW(tested_gemm->cast_transpose(mixed), sdk::BackendError) << "e4m3 and e5m2";
  auto not_fp8 = good();
  not_fp8.out_transposed = wide.view();
  EXPECT_THROW(tested_gemm->cast_transpose(not_fp8), sdk::BackendError) << "a bf16 output";
  auto fp8_src = good();
  fp8_src.src = out.view();
  fp8_src.out = {};
  EXPECT_THROW(tested_gemm->cast_transpose(fp8_src), sdk::BackendError) << "an fp8 source";
  auto overlapping = good();
  overlapping.out_transposed = {out.view().data, DType::fp8_e4m3, Shape{10, 6}};
  EXPECT_THROW(tested_gemm->cast_transpose(overlapping), sdk::BackendError) << "out = out_t";
  auto amax = upload({0.0f, 0.0f}, Shape{2});
  auto two = good();
  two.cast.amax = amax.tested->view();
  EXPECT_THROW(tested_gemm->cast_transpose(two), sdk::BackendError) << "an amax of [2]";
  auto amax_in_src = good();
  amax_in_src.cast.amax = {src.tested->view().data, DType::fp32, Shape{1}};
  EXPECT_THROW(tested_gemm->cast_transpose(amax_in_src), sdk::BackendError) << "amax in src";
}

// gemm 1.7: cast_transpose_gradient is the backend's own activation_backward (gelu), then its
// cast_transpose, byte for byte, codes and amax; its column sums are that gradient's bias_grad
// within FP32 rounding (summed in another order). With and without gelu, with and without sums,
// accumulating and not, in both FP8 formats and every source dtype, around the tiles.
TEST_P(Conformance, CastTransposeGradientIsTheGeluGradientItsBiasSumAndItsCast) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  MIXTRAIN_FACETS(activation, ActivationFacet);
  auto offered = [&](DType from, DType to) {
    return tested_gemm->version() >= sdk::FacetVersion{1, 7} &&
           tested_gemm->supports(sdk::GemmOp::cast_transpose_gradient,
                                 std::vector<DType>{from, to});
  };
  if (!offered(DType::bf16, DType::fp8_e5m2))
    GTEST_SKIP() << "backend '" << GetParam().name << "' offers no cast_transpose_gradient";
  const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1},   {4, 8},    {67, 45},
                                                          {130, 3}, {132, 68}, {200, 1028}};
  unsigned seed = 80;
  for (const auto& [rows, cols] : shapes)
    for (DType from : {DType::fp32, DType::bf16, DType::fp16})
      for (DType to : {DType::fp8_e4m3, DType::fp8_e5m2})
        for (bool gelu : {false, true}) {
          if (!offered(from, to)) continue;
          SCOPED_TRACE(std::string(sdk::dtype_name(from)) + " -> " +
                       std::string(sdk::dtype_name(to)) + " [" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "]" + (gelu ? " with gelu" : ""));
          const Shape shape{rows, cols};
          const auto n = static_cast<std::size_t>(rows * cols);
          auto dy = upload(random_values(n, seed++, -8.f, 8.f), shape, from);
          auto z = upload(random_values(n, seed++, -4.f, 4.f), shape, from);
          // The unfused ops on the backend under test: d, its bias sums, its codes and amax.
          DeviceTensor d(*tested_, from, shape);
          if (gelu)
            tested_activation->activation_backward(sdk::Activation::gelu, z.tested->view(),
                                                   dy.tested->view(), d.view());
          else
            tested_->copy(d.view(), dy.tested->view());
          const std::vector<float> start(static_cast<std::size_t>(cols), 0.25f);
          auto want_sums = upload(start, Shape{cols});
          tested_activation->bias_grad(d.view(), want_sums.tested->view(), true);
          DeviceTensor want(*tested_, to, shape);
          auto amaxes = upload({0.0f, 0.0f}, Shape{2});
          auto* amax = static_cast<float*>(amaxes.tested->view().data);
          sdk::CastTransposeArgs cast;
          cast.src = d.view();
          cast.out = want.view();
          cast.cast.scale = 2.0f;
          cast.cast.saturate = true;
          cast.cast.amax = {amax, DType::fp32, Shape{1}};
          tested_gemm->cast_transpose(cast);
          // The fused op, accumulating into the same start.
          DeviceTensor out(*tested_, to, shape);
          DeviceTensor out_t(*tested_, to, Shape{cols, rows});
          auto sums = upload(start, Shape{cols});
          sdk::CastTransposeGradientArgs fused;
          fused.cast = cast;
          fused.cast.src = dy.tested->view();
          fused.cast.out = out.view();
          fused.cast.out_transposed = out_t.view();
          fused.cast.cast.amax = {amax + 1, DType::fp32, Shape{1}};
          fused.has_activation_grad = gelu;
          if (gelu) fused.pre_activation = z.tested->view();
          fused.column_sums = sums.tested->view();
          fused.accumulate_column_sums = true;
          tested_gemm->cast_transpose_gradient(fused);
          const auto expected = codes_of(*tested_, want.view());
          EXPECT_EQ(codes_of(*tested_, out.view()), expected);
          EXPECT_EQ(transpose_mismatches(codes_of(*tested_, out_t.view()), expected, rows, cols),
                    0u);
          const auto a = tested_values(amaxes);
          EXPECT_EQ(a[1], a[0]) << "the amax is of d";
          // Sums of up to 200 terms of |d| <= ~9, in FP32 in another order.
          const auto got = tested_values(sums), ref = tested_values(want_sums);
          std::vector<float> magnitude(static_cast<std::size_t>(cols), 0.25f);
          const auto dv = download(*tested_, d.view());
          for (std::size_t i = 0; i < dv.size(); ++i)
            magnitude[i % static_cast<std::size_t>(cols)] += std::abs(dv[i]);
          for (std::int64_t c = 0; c < cols; ++c) {
            const auto j = static_cast<std::size_t>(c);
            EXPECT_NEAR(got[j], ref[j], 4e-7f * static_cast<float>(rows) * magnitude[j]) << c;
          }
          // Overwriting instead of accumulating, and no sums at all: the same codes.
          fused.accumulate_column_sums = false;
          tested_gemm->cast_transpose_gradient(fused);
          const auto overwritten = tested_values(sums);
          for (std::int64_t c = 0; c < cols; ++c) {
            const auto j = static_cast<std::size_t>(c);
            EXPECT_NEAR(overwritten[j] + 0.25f, got[j],
                        4e-7f * static_cast<float>(rows) * magnitude[j] + 1e-6f)
                << c;
          }
          fused.column_sums = {};
          tested_gemm->cast_transpose_gradient(fused);
          EXPECT_EQ(codes_of(*tested_, out.view()), expected);
        }
}

TEST_P(Conformance, CastTransposeGradientRejectsBadArguments) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  if (tested_gemm->version() < sdk::FacetVersion{1, 7} ||
      !tested_gemm->supports(sdk::GemmOp::cast_transpose_gradient,
                             std::vector<DType>{DType::bf16, DType::fp8_e5m2}))
    GTEST_SKIP() << "backend '" << GetParam().name << "' offers no cast_transpose_gradient";
  auto dy = upload(random_values(6 * 10, 90), Shape{6, 10}, DType::bf16);
  auto z = upload(random_values(6 * 10, 91), Shape{6, 10}, DType::bf16);
  auto z32 = upload(random_values(6 * 10, 92), Shape{6, 10});
  DeviceTensor out_t(*tested_, DType::fp8_e5m2, Shape{10, 6});
  auto sums = upload(std::vector<float>(10, 0.0f), Shape{10});
  auto good = [&] {
    sdk::CastTransposeGradientArgs a;
    a.cast.src = dy.tested->view();
    a.cast.out_transposed = out_t.view();
    a.has_activation_grad = true;
    a.pre_activation = z.tested->view();
    a.column_sums = sums.tested->view();
    return a;
  };
  EXPECT_NO_THROW(tested_gemm->cast_transpose_gradient(good()));
  auto relu = good();
  relu.activation = sdk::Activation::relu;
  EXPECT_THROW(tested_gemm->cast_transpose_gradient(relu), sdk::BackendError) << "relu";
  auto no_z = good();
  no_z.pre_activation = {};
  EXPECT_THROW(tested_gemm->cast_transpose_gradient(no_z), sdk::BackendError) << "no z";
  auto other_dtype = good();
  other_dtype.pre_activation = z32.tested->view();
  EXPECT_THROW(tested_gemm->cast_transpose_gradient(other_dtype), sdk::BackendError) << "fp32 z";
  auto stray_z = good();
  stray_z.has_activation_grad = false;
  EXPECT_THROW(tested_gemm->cast_transpose_gradient(stray_z), sdk::BackendError)
      << "z without gelu";
  auto short_sums = good();
  short_sums.column_sums.shape = Shape{9};
  EXPECT_THROW(tested_gemm->cast_transpose_gradient(short_sums), sdk::BackendError) << "[9]";
  auto bf16_sums = good();
  bf16_sums.column_sums = {dy.tested->view().data, DType::bf16, Shape{10}};
  EXPECT_THROW(tested_gemm->cast_transpose_gradient(bf16_sums), sdk::BackendError) << "bf16 sums";
  auto sums_on_z = good();
  sums_on_z.column_sums = {z32.tested->view().data, DType::fp32, Shape{10}};
  sums_on_z.pre_activation = {z32.tested->view().data, DType::bf16, Shape{6, 10}};
  EXPECT_THROW(tested_gemm->cast_transpose_gradient(sums_on_z), sdk::BackendError)
      << "sums overlapping z";
  auto no_output = good();
  no_output.cast.out_transposed = {};
  EXPECT_THROW(tested_gemm->cast_transpose_gradient(no_output), sdk::BackendError) << "no output";
  auto amax_in_z = good();
  amax_in_z.cast.cast.amax = {z.tested->view().data, DType::fp32, Shape{1}};
  EXPECT_THROW(tested_gemm->cast_transpose_gradient(amax_in_z), sdk::BackendError) << "amax in z";
}

TEST_P(Conformance, GemmStridedBatchedEqualsOneGemmPerBatch) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  // Batch 3 of [m, k]·[n, k]ᵀ with a shared weight (stride_b = 0), checked against the reference
  // backend's batched call and against its single GEMMs, batch by batch.
  const std::int64_t batch = 3, m = 19, n = 24, k = 31;
  for (DType dt : {DType::fp32, DType::bf16}) {
    if (!tested_->capabilities().supports(dt)) continue;
    if (!tested_gemm->supports(sdk::GemmOp::gemm_strided_batched,
                               std::vector<DType>{dt, dt, DType::fp32}))
      continue;
    auto a =
        upload(random_values(static_cast<std::size_t>(batch * m * k), 30), Shape{batch * m, k}, dt);
    auto b = upload(random_values(static_cast<std::size_t>(n * k), 31), Shape{n, k}, dt);
    auto c =
        upload(random_values(static_cast<std::size_t>(batch * m * n), 32), Shape{batch * m, n});
    auto single =
        upload(random_values(static_cast<std::size_t>(batch * m * n), 32), Shape{batch * m, n});
    for (int which : {0, 1}) {
      auto side = [&](const Pair& p) { return which == 0 ? p.ref->view() : p.tested->view(); };
      sdk::GemmBatchedArgs g;
      g.gemm.a.view = {side(a).data, dt, Shape{m, k}};
      g.gemm.b.view = side(b);
      g.gemm.b.transpose = true;
      g.gemm.c = {side(c).data, DType::fp32, Shape{m, n}};
      g.gemm.alpha = 0.75f;
      g.gemm.beta = 0.5f;
      g.batch = batch;
      g.stride_a = m * k;
      g.stride_b = 0;
      g.stride_c = m * n;
      (which == 0 ? ref_gemm : tested_gemm)->gemm_strided_batched(g);
    }
    for (std::int64_t i = 0; i < batch; ++i) {
      sdk::GemmArgs g;
      g.a.view = {static_cast<char*>(a.ref->view().data) +
                      i * m * k * static_cast<std::int64_t>(sdk::dtype_size(dt)),
                  dt, Shape{m, k}};
      g.b.view = b.ref->view();
      g.b.transpose = true;
      g.c = {single.ref->view().as<float>() + i * m * n, DType::fp32, Shape{m, n}};
      g.alpha = 0.75f;
      g.beta = 0.5f;
      ref_gemm->gemm(g);
    }
    const double tol = dt == DType::fp32 ? 2e-5 : 2e-5;
    expect_close(c, tol, std::string("batched ") + std::string(sdk::dtype_name(dt)));
    EXPECT_LE(relative_difference(tested_values(c), ref_values(single)), tol)
        << "batched vs one gemm per batch, " << sdk::dtype_name(dt);
  }
}

TEST_P(Conformance, GemmGroupedEqualsOneGemmPerMember) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  // gemm 1.1: three GEMMs of different shapes (and transposes) in one call, against the reference
  // backend's single GEMMs, member by member.
  struct Member {
    std::int64_t m, n, k;
    bool ta, tb;
  };
  // The last two: square operands, both transposed, and a reduction past 128.
  const Member members[] = {{7, 5, 9, false, false},
                            {16, 3, 4, false, true},
                            {1, 11, 6, false, false},
                            {24, 24, 24, true, true},
                            {5, 6, 129, true, false}};
  for (DType dt : {DType::fp32, DType::bf16}) {
    if (!tested_->capabilities().supports(dt)) continue;
    if (!tested_gemm->supports(sdk::GemmOp::gemm_grouped, std::vector<DType>{dt, dt, DType::fp32}))
      continue;
    std::vector<Pair> as, bs, cs;
    unsigned seed = 40;
    for (const Member& mb : members) {
      const Shape a_shape = mb.ta ? Shape{mb.k, mb.m} : Shape{mb.m, mb.k};
      as.push_back(
          upload(random_values(static_cast<std::size_t>(mb.m * mb.k), seed++), a_shape, dt));
      const Shape b_shape = mb.tb ? Shape{mb.n, mb.k} : Shape{mb.k, mb.n};
      bs.push_back(
          upload(random_values(static_cast<std::size_t>(mb.k * mb.n), seed++), b_shape, dt));
      cs.push_back(
          upload(random_values(static_cast<std::size_t>(mb.m * mb.n), seed++), Shape{mb.m, mb.n}));
    }
    for (int which : {0, 1}) {
      std::vector<sdk::GemmArgs> group;
      for (std::size_t i = 0; i < std::size(members); ++i) {
        auto side = [&](const Pair& p) { return which == 0 ? p.ref->view() : p.tested->view(); };
        sdk::GemmArgs g;
        g.a.view = side(as[i]);
        g.a.transpose = members[i].ta;
        g.b.view = side(bs[i]);
        g.b.transpose = members[i].tb;
        g.c = side(cs[i]);
        g.alpha = 0.5f;
        g.beta = 0.25f;
        group.push_back(g);
      }
      if (which == 0)
        for (const auto& g : group) ref_gemm->gemm(g);  // the reference: one gemm per member
      else
        tested_gemm->gemm_grouped(group);
    }
    for (std::size_t i = 0; i < std::size(members); ++i)
      expect_close(cs[i], accumulation_tolerance(2e-5, members[i].k),
                   "grouped member " + std::to_string(i) + " " + std::string(sdk::dtype_name(dt)));
  }
}

TEST_P(Conformance, GemmStridedBatchedMatchesADoubleReference) {
  MIXTRAIN_FACETS(gemm, GemmFacet);
  // Attention-like batches with every transpose pair, a broadcast operand (stride 0) and gaps
  // between batches; square operands with every transpose pair, and reductions past 64 (one
  // with a single row); bf16 and fp32 operands, fp32 and bf16 C.
  struct Case {
    std::int64_t batch, m, n, k;
    bool ta, tb;
    std::int64_t pad_a, pad_b, pad_c;  // elements between batches; -1: broadcast (stride 0)
  };
  const std::vector<Case> cases = {
      {6, 17, 20, 16, false, true, 0, 0, 0},                                          // Q·Kᵀ
      {6, 17, 16, 20, false, false, 0, 0, 0},                                         // P·V
      {6, 17, 20, 16, true, false, 0, 0, 0},                                          // dKᵀ-like
      {6, 17, 20, 16, true, true, 5, 3, 7},   {5, 12, 9, 11, false, true, 0, -1, 0},  // shared B
      {5, 12, 9, 11, true, false, -1, 0, 4},                                          // shared A
      {3, 24, 24, 24, true, false, 0, 0, 0},  {3, 24, 24, 24, false, true, 0, 0, 0},
      {3, 24, 24, 24, true, true, 0, 0, 0},   {2, 9, 7, 127, false, true, 0, 0, 0},
      {2, 7, 9, 65, true, false, 0, 0, 0},    {2, 1, 5, 257, true, true, 0, -1, 0},
  };
  for (const auto& [in, out] :
       {std::pair{DType::fp32, DType::fp32}, std::pair{DType::bf16, DType::fp32},
        std::pair{DType::bf16, DType::bf16}}) {
    if (!tested_gemm->supports(sdk::GemmOp::gemm_strided_batched, std::vector<DType>{in, in, out}))
      continue;
    for (const Case& g : cases) {
      const Shape sa = g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k};
      const Shape sb = g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n};
      const std::int64_t stride_a = g.pad_a < 0 ? 0 : sa.numel() + g.pad_a;
      const std::int64_t stride_b = g.pad_b < 0 ? 0 : sb.numel() + g.pad_b;
      const std::int64_t stride_c = g.m * g.n + g.pad_c;
      const std::int64_t span_a = stride_a * (g.batch - 1) + sa.numel();
      const std::int64_t span_b = stride_b * (g.batch - 1) + sb.numel();
      const std::int64_t span_c = stride_c * (g.batch - 1) + g.m * g.n;
      auto a = upload(random_values(static_cast<std::size_t>(span_a), 48), Shape{span_a}, in);
      auto b = upload(random_values(static_cast<std::size_t>(span_b), 49), Shape{span_b}, in);
      auto c = upload(random_values(static_cast<std::size_t>(span_c), 50), Shape{span_c}, out);
      const auto av = tested_values(a), bv = tested_values(b), c0 = tested_values(c);
      sdk::GemmBatchedArgs args;
      args.gemm.a = {{a.tested->view().data, in, sa}, g.ta};
      args.gemm.b = {{b.tested->view().data, in, sb}, g.tb};
      args.gemm.c = {c.tested->view().data, out, Shape{g.m, g.n}};
      args.gemm.alpha = 0.75f;
      args.gemm.beta = 0.5f;
      args.batch = g.batch;
      args.stride_a = stride_a;
      args.stride_b = stride_b;
      args.stride_c = stride_c;
      tested_gemm->gemm_strided_batched(args);
      const auto got = tested_values(c);
      std::vector<float> want = c0;  // gaps between C batches stay as they were
      for (std::int64_t q = 0; q < g.batch; ++q)
        for (std::int64_t i = 0; i < g.m; ++i)
          for (std::int64_t j = 0; j < g.n; ++j) {
            double acc = 0.0;
            for (std::int64_t p = 0; p < g.k; ++p) {
              const std::int64_t ai = q * stride_a + (g.ta ? p * g.m + i : i * g.k + p);
              const std::int64_t bi = q * stride_b + (g.tb ? j * g.k + p : p * g.n + j);
              acc += static_cast<double>(av[static_cast<std::size_t>(ai)]) *
                     bv[static_cast<std::size_t>(bi)];
            }
            const auto ci = static_cast<std::size_t>(q * stride_c + i * g.n + j);
            want[ci] = stored(0.75 * acc + 0.5 * c0[ci], out);
          }
      const std::string what = dtypes_text({in, in, out}) + " batch " + std::to_string(g.batch) +
                               (g.ta ? " At" : " A") + (g.tb ? " Bt" : " B") + " strides " +
                               std::to_string(stride_a) + "/" + std::to_string(stride_b) + "/" +
                               std::to_string(stride_c);
      // fp32 accumulation: 1e-6 over k <= 20, growing with sqrt(k) past it (as
      // accumulation_tolerance); one rounding of a bf16 C dominates it.
      const double fp32_tol =
          1e-6 * std::sqrt(static_cast<double>(std::max<std::int64_t>(g.k, 20)) / 20.0);
      EXPECT_LE(relative_difference(got, want), out == DType::fp32 ? fp32_tol : 4e-3) << what;
      for (std::int64_t q = 0; q + 1 < g.batch; ++q)
        for (std::int64_t e = g.m * g.n; e < stride_c; ++e)
          EXPECT_EQ(got[static_cast<std::size_t>(q * stride_c + e)],
                    c0[static_cast<std::size_t>(q * stride_c + e)])
              << what << ": the gap after batch " << q << " was written";
    }
  }
}

}  // namespace
}  // namespace mixtrain::conformance
