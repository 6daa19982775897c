// The CPU backend's convolutions as one GEMM (cpu_conv_gemm.h, the rule in cpu_conv_gemm_rule.h):
// the weight gradient, the 1x1 data gradient (plain and accumulating) and the 1x1 forward are
// within the FP32 sum's bound of the exact sum on every operand route, as the convolution is;
// repeatable bit for bit; a weight gradient's two column orders give the same bits; their scratch
// comes from the workspace they asked for; and the rule takes what it says, where it says.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend_test_util.h"
#include "conv_test_util.h"
#include "cpu_context.h"
#include "cpu_conv_gemm.h"
#include "cpu_conv_gemm_rule.h"
#include "cpu_features.h"
#include "mixtrain/sdk/backend_scratch.h"

namespace mixtrain::backend_cpu::testing {
namespace {

// The data gradient of an unpadded 1x1 convolution as one GEMM (conv_gemm = gemm,
// cpu_conv_gemm.h) on every operand route, at stride 1, 2 and (2, 3), plain and accumulating:
// an x pixel on the stride is Σ_o dy·w (+ dx0 when accumulating) within the FP32 sum's bound of
// the exact sum, |err| <= γ(O+2)·(Σ|products| + |dx0|) + u·|dx|, plus one rounding into a 16-bit
// dx; a pixel off the stride is +0, or dx0 untouched when accumulating. supports() offers the
// accumulating op where the rule takes the GEMM: under `gemm` for an fp32 dx, under `auto` for
// bf16 operands read natively with AMX-BF16 and for fp32 ones with AMX-BF16, under `convolution`
// nowhere; a shape the GEMM does not take (a padded 1x1) still adds what the overwriting call
// writes.
TEST(BackendCpuConvolution, PointwiseDataGradientAsAGemmIsWithinTheFp32SumBound) {
  using C = sdk::ConvolutionOp;
  struct Stride {
    std::int64_t h, w;
  };
  for (const Stride st : {Stride{1, 1}, Stride{2, 2}, Stride{2, 3}})
    for (const auto& [dtype, scale] :
         {std::pair{DType::fp32, 1.0f}, std::pair{DType::bf16, 1.0f}, std::pair{DType::fp16, 1.0f},
          std::pair{DType::fp8_e4m3, 0.5f}})
      for (const auto& [accumulate, dx_dtype] :
           {std::pair{true, DType::fp32}, std::pair{false, DType::fp32},
            std::pair{false, DType::bf16}, std::pair{false, DType::fp16}}) {
        auto g = geometry(3, 24, 7, 8, 40, 1, 1, 1, 0);
        g.stride_h = st.h;
        g.stride_w = st.w;
        SCOPED_TRACE(std::string(sdk::dtype_name(dtype)) + ", stride " + std::to_string(st.h) +
                     "x" + std::to_string(st.w) + (accumulate ? ", accumulating" : ", plain") +
                     " into " + std::string(sdk::dtype_name(dx_dtype)));
        CpuBackend be(2);
        be.set_conv_gemm(ConvGemm::gemm);
        auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
        EXPECT_TRUE(conv.supports(C::conv2d_backward_data_accumulate,
                                  std::vector<DType>{dtype, dtype, DType::fp32}));
        const auto dyv = representable(random_values(y_shape(g).numel(), 71), dtype);
        const auto wv = representable(random_values(w_shape(g).numel(), 72), dtype);
        const auto dx0 = representable(random_values(x_shape(g).numel(), 73), dx_dtype);
        DeviceTensor dy(be, dtype, y_shape(g), dyv), w(be, dtype, w_shape(g), wv);
        DeviceTensor dx(be, dx_dtype, x_shape(g), dx0);
        sdk::Conv2dBackwardDataArgs bd;
        bd.geometry = g;
        bd.dy.view = dy;
        bd.dy.scale_inv = scale;
        bd.w.view = w;
        bd.w.scale_inv = scale;
        bd.dx = dx;
        if (accumulate)
          conv.conv2d_backward_data_accumulate(bd);
        else
          conv.conv2d_backward_data(bd);
        EXPECT_EQ(be.last_conv_implementation().rfind("gemm ", 0), 0u)
            << be.last_conv_implementation();
        const auto got = dx.get();
        const std::int64_t O = g.out_channels, Cn = g.in_channels;
        const std::int64_t oh = g.out_height(), ow = g.out_width();
        const double u = 0x1p-24, gamma = (O + 2) * u / (1.0 - (O + 2) * u);
        const double rounding = dx_dtype == DType::bf16   ? 0x1p-8
                                : dx_dtype == DType::fp16 ? 0x1p-11
                                                          : 0.0;
        int bad = 0;
        for (std::int64_t n = 0; n < g.batch; ++n)
          for (std::int64_t h = 0; h < g.height; ++h)
            for (std::int64_t x = 0; x < g.width; ++x)
              for (std::int64_t c = 0; c < Cn; ++c) {
                const auto e =
                    static_cast<std::size_t>(((n * g.height + h) * g.width + x) * Cn + c);
                const double base = accumulate ? dx0[e] : 0.0;
                if (h % st.h != 0 || x % st.w != 0) {
                  // Off the stride: nothing of the product reaches it.
                  if (got[e] != base || (!accumulate && std::signbit(got[e])))
                    if (++bad <= 3)
                      ADD_FAILURE() << "dx[" << e << "] = " << got[e] << ", want " << base
                                    << " (off the stride)";
                  continue;
                }
                const std::int64_t m = (n * oh + h / st.h) * ow + x / st.w;  // dy's pixel
                double exact = 0.0, magnitude = 0.0;
                for (std::int64_t o = 0; o < O; ++o) {
                  const double p = double{dyv[static_cast<std::size_t>(m * O + o)]} *
                                   wv[static_cast<std::size_t>(o * Cn + c)] * scale * scale;
                  exact += p;
                  magnitude += std::abs(p);
                }
                const double want = exact + base;
                const double bound = gamma * (magnitude + std::abs(base)) + u * std::abs(want) +
                                     rounding * (std::abs(want) + gamma * magnitude);
                if (std::abs(got[e] - want) > bound && ++bad <= 3)
                  ADD_FAILURE() << "dx[" << e << "] = " << got[e] << ", exact " << want
                                << ", bound " << bound;
              }
        // A 16-bit sum is not the GEMM's: refused by supports(), run by the convolution.
        EXPECT_FALSE(conv.supports(C::conv2d_backward_data_accumulate,
                                   std::vector<DType>{DType::bf16, DType::bf16, DType::bf16}));
      }
  // A padded 1x1: the convolution's route, dx0 + the overwriting call's dx exactly.
  CpuBackend be(2);
  be.set_conv_gemm(ConvGemm::gemm);
  EXPECT_NE(expect_accumulate_adds_the_overwritten(be, geometry(2, 8, 7, 7, 16, 1, 1, 2, 1),
                                                   DType::bf16, 74)
                .rfind("gemm ", 0),
            0u);
  // What auto and convolution offer.
  CpuBackend automatic(1), never(1);
  never.set_conv_gemm(ConvGemm::convolution);
  const bool amx_native =
      detect_cpu().has("amx_bf16") && automatic.bf16_conv_native() && automatic.bf16_gemm_native();
  const std::vector<DType> bf16_sum{DType::bf16, DType::bf16, DType::fp32};
  const std::vector<DType> fp32_sum{DType::fp32, DType::fp32, DType::fp32};
  EXPECT_EQ(sdk::facet<sdk::ConvolutionFacet>(automatic)->supports(
                C::conv2d_backward_data_accumulate, bf16_sum),
            amx_native);
  EXPECT_EQ(sdk::facet<sdk::ConvolutionFacet>(automatic)->supports(
                C::conv2d_backward_data_accumulate, fp32_sum),
            detect_cpu().has("amx_bf16"));
  EXPECT_FALSE(sdk::facet<sdk::ConvolutionFacet>(never)->supports(
      C::conv2d_backward_data_accumulate, bf16_sum));
}

// A weight gradient as one GEMM (conv_gemm = gemm, cpu_conv_gemm.h) on every operand route and
// on 1x1, padded, strided, dilated and non-square kernels: dw and dbias, overwritten and
// accumulated, within the FP32 summation bound of the exact (double) sum for every element —
// |err| <= γ(K+2)·Σ|products| with γ(n) = n·u / (1 − n·u), u = 2^-24, K = N·OH·OW summed terms
// plus the fp8 scale's and the accumulate's roundings — as the convolution is; repeatable bit for
// bit; its gathered columns and product from the workspace it asked for; and the calls the GEMM
// cannot take stay on the convolution.
struct WgradCase {
  DType dtype;
  DType compute;
  float scale_x, scale_dy;  // fp8 scale_inv (1 otherwise)
  bool bias;
  sdk::Conv2dGeometry g;
  const char* what;
};

// dw and dbias by one backend, overwritten then accumulated into `dw0` / `db0`, and the
// implementation that ran.
struct WgradOut {
  std::vector<float> dw, db, dw_acc, db_acc;
  std::string impl;
};
WgradOut run_wgrad(ConvGemm choice, const WgradCase& k, const std::vector<float>& xv,
                   const std::vector<float>& dyv, const std::vector<float>& dw0,
                   const std::vector<float>& db0) {
  CpuBackend be(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
  be.set_conv_gemm(choice);
  const auto& g = k.g;
  DeviceTensor x(be, k.dtype, x_shape(g), xv), dy(be, k.dtype, y_shape(g), dyv);
  DeviceTensor dw(be, DType::fp32, w_shape(g)), db(be, DType::fp32, Shape{g.out_channels});
  sdk::Conv2dBackwardWeightsArgs bw;
  bw.geometry = g;
  bw.x.view = x;
  bw.x.scale_inv = k.scale_x;
  bw.dy.view = dy;
  bw.dy.scale_inv = k.scale_dy;
  bw.dw = dw;
  if (k.bias) bw.dbias = db;
  bw.compute = k.compute;
  auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
  conv.conv2d_backward_weights(bw);
  WgradOut out;
  out.impl = be.last_conv_implementation();
  out.dw = dw.get();
  out.db = k.bias ? db.get() : std::vector<float>{};
  dw.set(dw0);
  db.set(db0);
  bw.accumulate = true;
  conv.conv2d_backward_weights(bw);
  out.dw_acc = dw.get();
  out.db_acc = k.bias ? db.get() : std::vector<float>{};
  return out;
}

TEST(BackendCpuConvolution, WeightGradientAsAGemmIsWithinTheFp32SumBound) {
  sdk::Conv2dGeometry uneven = geometry(2, 12, 9, 7, 20, 1, 1, 1, 0);
  uneven.stride_h = 2;
  uneven.stride_w = 3;
  sdk::Conv2dGeometry dilated = geometry(2, 8, 9, 9, 12, 3, 3, 1, 2);
  dilated.dilation_h = dilated.dilation_w = 2;
  sdk::Conv2dGeometry oblong = geometry(2, 6, 7, 8, 10, 3, 2, 1, 0);
  oblong.pad_h = 1;
  const std::vector<WgradCase> cases = {
      {DType::fp32, DType::fp32, 1.0f, 1.0f, true, geometry(3, 24, 6, 5, 40, 1, 1, 1, 0),
       "fp32, 1x1, bias"},
      {DType::bf16, DType::fp32, 1.0f, 1.0f, true, geometry(2, 32, 7, 9, 16, 1, 1, 2, 0),
       "bf16, 1x1 stride 2 on odd sizes, bias"},
      {DType::bf16, DType::fp32, 1.0f, 1.0f, false, uneven, "bf16, 1x1 strides 2 and 3"},
      {DType::bf16, DType::fp32, 1.0f, 1.0f, true, geometry(2, 16, 9, 7, 24, 3, 3, 2, 1),
       "bf16, 3x3 stride 2 padded, bias"},
      {DType::fp32, DType::fp32, 1.0f, 1.0f, false, dilated, "fp32, 3x3 dilation 2"},
      {DType::fp16, DType::fp32, 1.0f, 1.0f, true, oblong, "fp16, 3x2 padded in h only, bias"},
      {DType::bf16, DType::fp32, 1.0f, 1.0f, false, geometry(2, 8, 6, 6, 8, 1, 1, 1, 1),
       "bf16, a padded 1x1"},
      {DType::fp32, DType::tf32, 1.0f, 1.0f, false, geometry(2, 16, 6, 6, 8, 3, 3, 2, 1),
       "tf32 compute on tf32 values, 3x3 stride 2"},
      {DType::fp8_e4m3, DType::fp32, 0.5f, 0.25f, false, geometry(2, 16, 6, 6, 32, 3, 3, 1, 1),
       "fp8 e4m3 with scales, 3x3"}};
  for (const WgradCase& k : cases) {
    SCOPED_TRACE(k.what);
    const auto& g = k.g;
    // tf32: values that tf32 holds (bf16 ones), so its rounding of the operands changes nothing.
    const DType values = k.compute == DType::tf32 ? DType::bf16 : k.dtype;
    const auto xv = representable(random_values(x_shape(g).numel(), 41), values);
    const auto dyv = representable(random_values(y_shape(g).numel(), 42), values);
    const auto dw0 = random_values(w_shape(g).numel(), 43);
    const auto db0 = random_values(static_cast<std::size_t>(g.out_channels), 44);
    const WgradOut gemm = run_wgrad(ConvGemm::gemm, k, xv, dyv, dw0, db0);
    const WgradOut conv = run_wgrad(ConvGemm::convolution, k, xv, dyv, dw0, db0);
    EXPECT_EQ(gemm.impl.rfind("gemm ", 0), 0u) << gemm.impl;
    EXPECT_NE(conv.impl.rfind("gemm ", 0), 0u) << conv.impl;  // oneDNN's own, e.g. x64:gemm:jit
    // The same call again: the same bits.
    const WgradOut again = run_wgrad(ConvGemm::gemm, k, xv, dyv, dw0, db0);
    EXPECT_EQ(again.dw, gemm.dw);
    EXPECT_EQ(again.dw_acc, gemm.dw_acc);
    EXPECT_EQ(again.db, gemm.db);

    // The exact sums in double, with Σ|products| for the bound; dw is [O, C, KH, KW].
    const std::int64_t oh = g.out_height(), ow = g.out_width(), C = g.in_channels,
                       O = g.out_channels, K = g.batch * oh * ow;
    const double scale = double{k.scale_x} * k.scale_dy;
    std::vector<double> dw(w_shape(g).numel()), dw_abs(dw.size());
    std::vector<double> db(static_cast<std::size_t>(O)), db_abs(db.size());
    for (std::int64_t n = 0; n < g.batch; ++n)
      for (std::int64_t i = 0; i < oh; ++i)
        for (std::int64_t j = 0; j < ow; ++j)
          for (std::int64_t o = 0; o < O; ++o) {
            const double d = dyv[static_cast<std::size_t>(((n * oh + i) * ow + j) * O + o)];
            db[static_cast<std::size_t>(o)] += d * k.scale_dy;
            db_abs[static_cast<std::size_t>(o)] += std::abs(d * k.scale_dy);
            for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
              for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
                const std::int64_t h = i * g.stride_h - g.pad_h + kh * g.dilation_h,
                                   w = j * g.stride_w - g.pad_w + kw * g.dilation_w;
                if (h < 0 || h >= g.height || w < 0 || w >= g.width) continue;
                for (std::int64_t c = 0; c < C; ++c) {
                  const double xe =
                      xv[static_cast<std::size_t>(((n * g.height + h) * g.width + w) * C + c)];
                  const auto at =
                      static_cast<std::size_t>(((o * C + c) * g.kernel_h + kh) * g.kernel_w + kw);
                  dw[at] += d * xe * scale;
                  dw_abs[at] += std::abs(d * xe * scale);
                }
              }
          }
    const double u = 0x1p-24;
    const double gamma = (K + 2) * u / (1.0 - (K + 2) * u);
    const auto within = [&](const std::vector<float>& got, const std::vector<double>& want,
                            const std::vector<double>& abs_sum, const std::vector<float>& base,
                            const char* what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      int bad = 0;
      for (std::size_t e = 0; e < want.size(); ++e) {
        const double b = base.empty() ? 0.0 : base[e];
        const double bound = gamma * (abs_sum[e] + std::abs(b)) + u * std::abs(want[e] + b);
        if (std::abs(got[e] - (want[e] + b)) > bound && ++bad <= 3)
          ADD_FAILURE() << what << "[" << e << "] = " << got[e] << ", exact " << want[e] + b
                        << ", bound " << bound;
      }
    };
    for (const WgradOut* r : {&gemm, &conv}) {
      SCOPED_TRACE(r->impl);
      within(r->dw, dw, dw_abs, {}, "dw");
      within(r->dw_acc, dw, dw_abs, dw0, "dw +=");
      if (k.bias) {
        within(r->db, db, db_abs, {}, "dbias");
        within(r->db_acc, db, db_abs, db0, "dbias +=");
      }
    }
  }
}

TEST(BackendCpuConvolution, WeightGradientAsAGemmTakesItsScratchFromTheWorkspaceItAskedFor) {
  // A 1x1 at stride 2 gathers x's pixels (3 images of 5x4 pixels of 24 bf16 channels); a 3x3 also
  // gathers its columns (9 taps a pixel): in OIHW's order where M <= 3·O (18 rows, 16 channels),
  // the GEMM writing dw, else also its product [O, 3, 3, C] in fp32 before the reorder into OIHW
  // (50 rows, 4 channels); a 1x1 at stride 1 reads x where it is and writes dw itself: nothing.
  struct Case {
    sdk::Conv2dGeometry g;
    std::size_t least;
  };
  for (const Case& k :
       {Case{geometry(3, 24, 9, 8, 16, 1, 1, 2, 0), std::size_t{3 * 5 * 4 * 24 * 2}},
        Case{geometry(2, 8, 6, 6, 16, 3, 3, 2, 1), std::size_t{2 * 3 * 3 * 9 * 8 * 2}},
        Case{geometry(2, 8, 10, 10, 4, 3, 3, 2, 1),
             std::size_t{2 * 5 * 5 * 9 * 8 * 2 + 4 * 9 * 8 * 4}},
        Case{geometry(3, 24, 9, 8, 16, 1, 1, 1, 0), std::size_t{0}}}) {
    const auto& g = k.g;
    SCOPED_TRACE(::testing::Message()
                 << g.kernel_h << "x" << g.kernel_w << " stride " << g.stride_h);
    const auto xv = representable(random_values(x_shape(g).numel(), 51), DType::bf16);
    const auto dyv = representable(random_values(y_shape(g).numel(), 52), DType::bf16);
    sdk::Conv2dWorkspaceQuery q;
    q.op = sdk::ConvolutionOp::conv2d_backward_weights;
    q.geometry = g;
    q.a = q.b = DType::bf16;
    q.out = DType::fp32;
    const auto run = [&](bool with_workspace, std::size_t* asked, std::size_t* grew) {
      CpuBackend be(1, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
      be.set_conv_gemm(ConvGemm::gemm);
      auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
      const auto& scratch = *sdk::facet<sdk::ScratchFacet>(be);
      DeviceTensor x(be, DType::bf16, x_shape(g), xv), dy(be, DType::bf16, y_shape(g), dyv);
      DeviceTensor dw(be, DType::fp32, w_shape(g));
      *asked = conv.conv2d_workspace_bytes(q);
      std::vector<std::byte> memory(*asked + 64, std::byte{0xFF});
      auto* at = reinterpret_cast<std::byte*>(
          (reinterpret_cast<std::uintptr_t>(memory.data()) + 63) / 64 * 64);
      sdk::Conv2dBackwardWeightsArgs bw;
      bw.geometry = g;
      bw.x.view = x;
      bw.dy.view = dy;
      bw.dw = dw;
      const std::size_t before = scratch.scratch_bytes();
      if (with_workspace)
        conv.conv2d_backward_weights_with_workspace(
            bw, {at, DType::fp32, Shape{static_cast<std::int64_t>((*asked + 3) / 4)}});
      else
        conv.conv2d_backward_weights(bw);
      *grew = scratch.scratch_bytes() - before;
      EXPECT_EQ(be.last_conv_implementation().rfind("gemm ", 0), 0u);
      return dw.get();
    };
    std::size_t asked = 0, grew = 0, asked_lent = 0, grew_lent = 0;
    const auto own = run(false, &asked, &grew);
    const auto lent = run(true, &asked_lent, &grew_lent);
    EXPECT_EQ(lent, own);
    // Where oneDNN has no native bf16 matmul (a CPU without AVX512-BF16), the GEMM engine decodes
    // its operands, dy [M, O] and the columns [M, KH·KW·C], into fp32 scratch of its own, with or
    // without a workspace (cpu_conv_gemm.h).
    const std::size_t pixels = static_cast<std::size_t>(g.batch * g.out_height() * g.out_width());
    const std::size_t engine_own =
        CpuBackend(1).bf16_gemm_native()
            ? 0
            : pixels *
                  static_cast<std::size_t>(g.out_channels +
                                           g.kernel_h * g.kernel_w * g.in_channels) *
                  4;
    if (k.least == 0) {
      EXPECT_EQ(asked, 0u);
      EXPECT_EQ(grew, engine_own);
      continue;
    }
    // Each request from a 64-byte boundary, and 63 bytes for the workspace's own start.
    EXPECT_GE(asked, k.least);
    EXPECT_LE(asked, k.least + 64 * 2 + 63);
    EXPECT_GT(grew, engine_own) << "without a workspace the scratch is the backend's own";
    EXPECT_EQ(grew_lent, engine_own) << "with it, nothing else of the backend's grew";
  }
}

// A 1x1's data gradient as a GEMM keeps its product [N·OH·OW, C] in fp32 before writing it to
// every stride-th pixel, or before rounding it into a 16-bit dx: from the workspace it asked for
// when given one (the same dx, plain and accumulating), from the backend's own scratch otherwise;
// at stride 1 into an fp32 dx, or a bf16 one that the GEMM engine writes itself (bf16 operands on
// its native route), it asks for nothing (the GEMM writes dx).
TEST(BackendCpuConvolution, DataGradientAsAGemmTakesItsProductFromTheWorkspaceItAskedFor) {
  struct Case {
    std::int64_t stride;
    DType dx;
    bool accumulate;
    std::size_t least;
  };
  const bool native = CpuBackend(1).bf16_gemm_native();
  for (const Case& k :
       {Case{2, DType::fp32, false, 3 * 5 * 4 * 24 * 4},
        Case{2, DType::fp32, true, 3 * 5 * 4 * 24 * 4},
        Case{2, DType::bf16, false, 3 * 5 * 4 * 24 * 4},
        Case{1, DType::bf16, false, native ? std::size_t{0} : std::size_t{3 * 9 * 8 * 24 * 4}},
        Case{1, DType::fp16, false, 3 * 9 * 8 * 24 * 4}, Case{1, DType::fp32, false, 0},
        Case{1, DType::fp32, true, 0}}) {
    const std::int64_t stride = k.stride;
    const bool accumulate = k.accumulate;
    const auto g = geometry(3, 24, 9, 8, 16, 1, 1, stride, 0);
    SCOPED_TRACE(::testing::Message() << "stride " << stride << ", dx " << sdk::dtype_name(k.dx)
                                      << (accumulate ? ", +=" : ""));
    const std::size_t least = k.least;
    const auto dyv = representable(random_values(y_shape(g).numel(), 53), DType::bf16);
    const auto wv = representable(random_values(w_shape(g).numel(), 54), DType::bf16);
    const auto dx0 = random_values(x_shape(g).numel(), 55);
    sdk::Conv2dWorkspaceQuery q;
    q.op = accumulate ? sdk::ConvolutionOp::conv2d_backward_data_accumulate
                      : sdk::ConvolutionOp::conv2d_backward_data;
    q.geometry = g;
    q.a = q.b = DType::bf16;
    q.out = k.dx;
    const auto run = [&](bool with_workspace, std::size_t* asked, std::size_t* grew) {
      CpuBackend be(1, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
      be.set_conv_gemm(ConvGemm::gemm);
      auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
      const auto& scratch = *sdk::facet<sdk::ScratchFacet>(be);
      DeviceTensor dy(be, DType::bf16, y_shape(g), dyv), w(be, DType::bf16, w_shape(g), wv);
      DeviceTensor dx(be, k.dx, x_shape(g), dx0);
      *asked = conv.conv2d_workspace_bytes(q);
      std::vector<std::byte> memory(*asked + 64, std::byte{0xFF});
      auto* at = reinterpret_cast<std::byte*>(
          (reinterpret_cast<std::uintptr_t>(memory.data()) + 63) / 64 * 64);
      sdk::Conv2dBackwardDataArgs bd;
      bd.geometry = g;
      bd.dy.view = dy;
      bd.w.view = w;
      bd.dx = dx;
      const TensorView ws{at, DType::fp32, Shape{static_cast<std::int64_t>((*asked + 3) / 4)}};
      const std::size_t before = scratch.scratch_bytes();
      if (accumulate && with_workspace)
        conv.conv2d_backward_data_accumulate_with_workspace(bd, ws);
      else if (accumulate)
        conv.conv2d_backward_data_accumulate(bd);
      else if (with_workspace)
        conv.conv2d_backward_data_with_workspace(bd, ws);
      else
        conv.conv2d_backward_data(bd);
      *grew = scratch.scratch_bytes() - before;
      EXPECT_EQ(be.last_conv_implementation().rfind("gemm ", 0), 0u);
      return dx.get();
    };
    std::size_t asked = 0, grew = 0, asked_lent = 0, grew_lent = 0;
    const auto own = run(false, &asked, &grew);
    const auto lent = run(true, &asked_lent, &grew_lent);
    EXPECT_EQ(lent, own);
    EXPECT_EQ(asked, asked_lent);
    // Where oneDNN has no native bf16 matmul, the GEMM engine decodes dy [M, O] and w [O, C] into
    // fp32 scratch of its own, with or without a workspace (cpu_conv_gemm.h).
    const std::size_t engine_own =
        native
            ? 0
            : static_cast<std::size_t>(g.batch * g.out_height() * g.out_width() * g.out_channels +
                                       g.out_channels * g.in_channels) *
                  4;
    if (least == 0) {
      EXPECT_EQ(asked, 0u);
      EXPECT_EQ(grew, engine_own);
      continue;
    }
    EXPECT_GE(asked, least);
    EXPECT_LE(asked, least + 64 + 63);
    EXPECT_GT(grew, engine_own) << "without a workspace the product is the backend's own scratch";
    EXPECT_EQ(grew_lent, engine_own) << "with it, nothing else of the backend's grew";
  }
}

// What the GEMM does not take (groups, an fp8 dy with a bias gradient) stays on the convolution
// under conv_gemm = gemm; `auto` takes the GEMM only for the 1x1 and wide 3x3 shapes of the
// rule, bf16 operands read natively, with AMX-BF16; and `convolution` never.
TEST(BackendCpuConvolution, WgradGemmRuleTakesOnlyWhatTheGemmComputesAndWhereItPays) {
  const auto impl = [](ConvGemm choice, const sdk::Conv2dGeometry& g, DType dtype, bool bias) {
    CpuBackend be(1, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
    be.set_conv_gemm(choice);
    DeviceTensor x(be, dtype, x_shape(g), random_values(x_shape(g).numel(), 61, -0.5f, 0.5f));
    DeviceTensor dy(be, dtype, y_shape(g), random_values(y_shape(g).numel(), 62, -0.5f, 0.5f));
    DeviceTensor dw(be, DType::fp32, w_shape(g)), db(be, DType::fp32, Shape{g.out_channels});
    sdk::Conv2dBackwardWeightsArgs bw;
    bw.geometry = g;
    bw.x.view = x;
    bw.dy.view = dy;
    bw.dw = dw;
    if (bias) bw.dbias = db;
    sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_backward_weights(bw);
    return be.last_conv_implementation();
  };
  const auto is_gemm = [](const std::string& s) { return s.rfind("gemm ", 0) == 0; };
  const sdk::Conv2dGeometry pointwise = geometry(2, 16, 6, 6, 16, 1, 1, 1, 0);
  const sdk::Conv2dGeometry narrow_3x3 = geometry(2, 16, 6, 6, 16, 3, 3, 1, 1);
  EXPECT_TRUE(is_gemm(impl(ConvGemm::gemm, pointwise, DType::fp32, true)));
  EXPECT_TRUE(is_gemm(impl(ConvGemm::gemm, narrow_3x3, DType::fp32, false)));
  EXPECT_FALSE(
      is_gemm(impl(ConvGemm::gemm, geometry(2, 16, 6, 6, 16, 1, 1, 1, 0, 4), DType::fp32, false)))
      << "groups";
  EXPECT_FALSE(is_gemm(impl(ConvGemm::gemm, pointwise, DType::fp8_e4m3, true)))
      << "an fp8 dy with a bias gradient";
  EXPECT_TRUE(is_gemm(impl(ConvGemm::gemm, pointwise, DType::fp8_e4m3, false)));
  for (DType d : {DType::bf16, DType::fp32})
    EXPECT_FALSE(is_gemm(impl(ConvGemm::convolution, pointwise, d, false)));
  const sdk::Conv2dGeometry wide_map_pointwise = geometry(2, 16, 12, 12, 16, 1, 1, 1, 0);
  EXPECT_FALSE(is_gemm(impl(ConvGemm::automatic, wide_map_pointwise, DType::fp32, false)))
      << "auto keeps fp32 1x1s on maps past 7x7 with few weights a row on the convolution";
  EXPECT_FALSE(is_gemm(impl(ConvGemm::automatic, narrow_3x3, DType::fp32, false)));
  EXPECT_FALSE(is_gemm(impl(ConvGemm::automatic, pointwise, DType::fp16, false)));
  EXPECT_FALSE(is_gemm(impl(ConvGemm::automatic, narrow_3x3, DType::bf16, false)))
      << "auto keeps narrow 3x3s on the convolution";
  CpuBackend probe(1, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
  const bool amx = detect_cpu().has("amx_bf16");
  const bool native = probe.bf16_conv_native() && probe.bf16_gemm_native();
  EXPECT_EQ(is_gemm(impl(ConvGemm::automatic, pointwise, DType::bf16, false)), amx && native)
      << probe.conv_gemm_note();
  // A 6x6 map: fp32's rule takes it on the CPU class it was measured on (AMX-BF16) alone.
  EXPECT_EQ(is_gemm(impl(ConvGemm::automatic, pointwise, DType::fp32, false)), amx)
      << probe.conv_gemm_note();
  EXPECT_NE(probe.conv_gemm_note().find("conv_gemm = auto"), std::string::npos);
  // The rule's shapes, on ResNet-50's convolutions (batch 8) and their neighbours.
  EXPECT_TRUE(wgrad_gemm_pays(geometry(8, 1024, 14, 14, 2048, 1, 1, 2, 0)));
  EXPECT_TRUE(wgrad_gemm_pays(geometry(8, 64, 56, 56, 256, 1, 1, 1, 0)));
  EXPECT_TRUE(wgrad_gemm_pays(geometry(8, 256, 28, 28, 256, 3, 3, 2, 1)));
  EXPECT_TRUE(wgrad_gemm_pays(geometry(8, 512, 7, 7, 512, 3, 3, 1, 1)));
  EXPECT_FALSE(wgrad_gemm_pays(geometry(8, 256, 14, 14, 256, 3, 3, 1, 1))) << "measured a tie";
  EXPECT_FALSE(wgrad_gemm_pays(geometry(8, 128, 56, 56, 128, 3, 3, 2, 1)));
  EXPECT_FALSE(wgrad_gemm_pays(geometry(8, 3, 224, 224, 64, 7, 7, 2, 3))) << "the stem";
  EXPECT_FALSE(wgrad_gemm_pays(geometry(8, 512, 7, 7, 512, 1, 1, 1, 1))) << "a padded 1x1";
  EXPECT_FALSE(wgrad_gemm_pays(geometry(8, 512, 7, 7, 512, 3, 3, 1, 1, 2))) << "groups";
}

// fp32's rule (cpu_conv_gemm_rule.h's session-73 table, ResNet-50's 1x1s at batch 8): weight
// gradients and forwards on 7x7 maps or with at least 256 weights a product row; data gradients
// also at stride 1 on maps of 56x56 and more; never a 3x3, a padded 1x1 or a grouped one.
TEST(BackendCpuConvolution, Fp32GemmRuleTakesSmallMapsManyWeightsARowAndWideDataGradients) {
  const auto layer4_conv1 = geometry(8, 2048, 7, 7, 512, 1, 1, 1, 0);
  const auto layer4_downsample = geometry(8, 1024, 14, 14, 2048, 1, 1, 2, 0);  // 7x7 out
  const auto layer4_0_conv1 = geometry(8, 1024, 14, 14, 512, 1, 1, 1, 0);      // 334 a row
  const auto layer3_conv1 = geometry(8, 1024, 14, 14, 256, 1, 1, 1, 0);        // 167 a row
  const auto layer2_conv3 = geometry(8, 128, 28, 28, 512, 1, 1, 1, 0);
  const auto layer1_conv3 = geometry(8, 64, 56, 56, 256, 1, 1, 1, 0);
  const auto layer2_downsample = geometry(8, 256, 56, 56, 512, 1, 1, 2, 0);  // 28x28 out
  for (const auto& g : {layer4_conv1, layer4_downsample, layer4_0_conv1}) {
    EXPECT_TRUE(fp32_gemm_pays(g));
    EXPECT_TRUE(fp32_dgrad_gemm_pays(g));
  }
  for (const auto& g : {layer3_conv1, layer2_conv3, layer1_conv3, layer2_downsample})
    EXPECT_FALSE(fp32_gemm_pays(g));
  EXPECT_TRUE(fp32_dgrad_gemm_pays(layer1_conv3)) << "a wide stride-1 map";
  EXPECT_TRUE(fp32_dgrad_gemm_pays(geometry(8, 256, 56, 56, 128, 1, 1, 1, 0)));
  EXPECT_FALSE(fp32_dgrad_gemm_pays(layer2_conv3));
  EXPECT_FALSE(fp32_dgrad_gemm_pays(layer3_conv1));
  EXPECT_FALSE(fp32_dgrad_gemm_pays(layer2_downsample)) << "stride 2";
  EXPECT_FALSE(fp32_gemm_pays(geometry(8, 512, 7, 7, 512, 3, 3, 1, 1))) << "a 3x3";
  EXPECT_FALSE(fp32_dgrad_gemm_pays(geometry(8, 64, 56, 56, 64, 3, 3, 1, 1))) << "a 3x3";
  EXPECT_FALSE(fp32_gemm_pays(geometry(8, 2048, 7, 7, 512, 1, 1, 1, 1))) << "a padded 1x1";
  EXPECT_FALSE(fp32_dgrad_gemm_pays(geometry(8, 64, 56, 56, 256, 1, 1, 1, 0, 4))) << "groups";

  // What `auto` runs: with AMX-BF16, the fp32 data gradient of a small map and of a wide
  // stride-1 map as a GEMM, not one in between; the accumulating one is offered into an fp32 sum
  // of fp32 operands there alone, and never into a 16-bit sum; tf32 operands never.
  const auto dgrad_impl = [](const sdk::Conv2dGeometry& g, DType dtype, DType compute,
                             bool accumulate) {
    CpuBackend be(1);
    DeviceTensor dy(be, dtype, y_shape(g), random_values(y_shape(g).numel(), 81));
    DeviceTensor w(be, dtype, w_shape(g), random_values(w_shape(g).numel(), 82));
    DeviceTensor dx(be, DType::fp32, x_shape(g), random_values(x_shape(g).numel(), 83));
    sdk::Conv2dBackwardDataArgs bd;
    bd.geometry = g;
    bd.dy.view = dy;
    bd.w.view = w;
    bd.dx = dx;
    bd.compute = compute;
    auto* conv = sdk::facet<sdk::ConvolutionFacet>(be);
    if (accumulate)
      conv->conv2d_backward_data_accumulate(bd);
    else
      conv->conv2d_backward_data(bd);
    return be.last_conv_implementation().rfind("gemm ", 0) == 0;
  };
  const bool amx = detect_cpu().has("amx_bf16");
  const auto small_map = geometry(2, 64, 7, 7, 32, 1, 1, 1, 0);
  const auto wide_map = geometry(1, 8, 56, 56, 8, 1, 1, 1, 0);
  const auto between = geometry(2, 8, 14, 14, 8, 1, 1, 1, 0);
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulating" : "plain");
    EXPECT_EQ(dgrad_impl(small_map, DType::fp32, DType::fp32, accumulate), amx);
    EXPECT_EQ(dgrad_impl(wide_map, DType::fp32, DType::fp32, accumulate), amx);
    EXPECT_FALSE(dgrad_impl(between, DType::fp32, DType::fp32, accumulate));
    EXPECT_FALSE(dgrad_impl(small_map, DType::fp32, DType::tf32, accumulate));
  }
  CpuBackend be(1);
  auto* conv = sdk::facet<sdk::ConvolutionFacet>(be);
  using C = sdk::ConvolutionOp;
  EXPECT_EQ(conv->supports(C::conv2d_backward_data_accumulate,
                           std::vector<DType>{DType::fp32, DType::fp32, DType::fp32}),
            amx);
  EXPECT_FALSE(conv->supports(C::conv2d_backward_data_accumulate,
                              std::vector<DType>{DType::fp16, DType::fp16, DType::fp32}));
  EXPECT_FALSE(conv->supports(C::conv2d_backward_data_accumulate,
                              std::vector<DType>{DType::fp32, DType::fp32, DType::bf16}));
}

// The forward of an unpadded 1x1 convolution as one GEMM (conv_gemm = gemm, cpu_conv_gemm.h) on
// every operand route, at strides 1, 2 and (2, 3), with and without a bias, into an fp32, bf16 or
// fp16 y: each element within the FP32 sum's bound of the exact s·Σ_c x·w + b,
// |err| <= γ(C+2)·(Σ|products| + |b|) + u·|y|, plus one rounding into a 16-bit y; the same bits
// twice; the convolution's route within the same bound.
TEST(BackendCpuConvolution, PointwiseForwardAsAGemmIsWithinTheFp32SumBound) {
  struct Stride {
    std::int64_t h, w;
  };
  for (const Stride st : {Stride{1, 1}, Stride{2, 2}, Stride{2, 3}})
    for (const auto& operands : {std::pair{DType::fp32, 1.0f}, std::pair{DType::bf16, 1.0f},
                                 std::pair{DType::fp16, 1.0f}, std::pair{DType::fp8_e4m3, 0.5f}})
      for (const DType y_dtype : {DType::fp32, DType::bf16, DType::fp16})
        for (const bool bias : {false, true}) {
          const DType dtype = operands.first;  // not structured bindings: lambdas capture these
          const float scale = operands.second;
          auto g = geometry(3, 40, 7, 8, 24, 1, 1, 1, 0);
          g.stride_h = st.h;
          g.stride_w = st.w;
          SCOPED_TRACE(std::string(sdk::dtype_name(dtype)) + ", stride " + std::to_string(st.h) +
                       "x" + std::to_string(st.w) + " into " +
                       std::string(sdk::dtype_name(y_dtype)) + (bias ? ", bias" : ""));
          const auto xv = representable(random_values(x_shape(g).numel(), 81), dtype);
          const auto wv = representable(random_values(w_shape(g).numel(), 82), dtype);
          const auto bv = random_values(static_cast<std::size_t>(g.out_channels), 83);
          const auto forward = [&](ConvGemm choice) {
            CpuBackend be(2);
            be.set_conv_gemm(choice);
            DeviceTensor x(be, dtype, x_shape(g), xv), w(be, dtype, w_shape(g), wv);
            DeviceTensor b(be, DType::fp32, Shape{g.out_channels}, bv);
            DeviceTensor y(be, y_dtype, y_shape(g));
            sdk::Conv2dForwardArgs f;
            f.geometry = g;
            f.x.view = x;
            f.x.scale_inv = scale;
            f.w.view = w;
            f.w.scale_inv = scale;
            if (bias) f.bias = b;
            f.y = y;
            sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f);
            return std::pair{y.get(), be.last_conv_implementation()};
          };
          const auto [gemm, gemm_impl] = forward(ConvGemm::gemm);
          const auto [conv, conv_impl] = forward(ConvGemm::convolution);
          EXPECT_EQ(gemm_impl.rfind("gemm ", 0), 0u) << gemm_impl;
          EXPECT_NE(conv_impl.rfind("gemm ", 0), 0u) << conv_impl;
          EXPECT_EQ(forward(ConvGemm::gemm).first, gemm);  // the same bits again
          const std::int64_t C = g.in_channels, O = g.out_channels;
          const std::int64_t oh = g.out_height(), ow = g.out_width();
          const double u = 0x1p-24, gamma = (C + 2) * u / (1.0 - (C + 2) * u);
          const double rounding = y_dtype == DType::bf16   ? 0x1p-8
                                  : y_dtype == DType::fp16 ? 0x1p-11
                                                           : 0.0;
          for (const auto* got : {&gemm, &conv}) {
            int bad = 0;
            for (std::int64_t n = 0; n < g.batch; ++n)
              for (std::int64_t i = 0; i < oh; ++i)
                for (std::int64_t j = 0; j < ow; ++j) {
                  // The output pixel reads x's pixel (i·sh, j·sw).
                  const std::int64_t at = (n * g.height + i * st.h) * g.width + j * st.w;
                  for (std::int64_t o = 0; o < O; ++o) {
                    double exact = 0.0, magnitude = 0.0;
                    for (std::int64_t c = 0; c < C; ++c) {
                      const double p = double{xv[static_cast<std::size_t>(at * C + c)]} *
                                       wv[static_cast<std::size_t>(o * C + c)] * scale * scale;
                      exact += p;
                      magnitude += std::abs(p);
                    }
                    const double b0 = bias ? bv[static_cast<std::size_t>(o)] : 0.0;
                    const double want = exact + b0;
                    const double bound = gamma * (magnitude + std::abs(b0)) + u * std::abs(want) +
                                         rounding * (std::abs(want) + gamma * magnitude);
                    const auto e = static_cast<std::size_t>(((n * oh + i) * ow + j) * O + o);
                    if (std::abs((*got)[e] - want) > bound && ++bad <= 3)
                      ADD_FAILURE()
                          << (got == &gemm ? gemm_impl : conv_impl) << ": y[" << e
                          << "] = " << (*got)[e] << ", exact " << want << ", bound " << bound;
                  }
                }
          }
        }
}

// A strided 1x1 forward as a GEMM gathers x's strided pixels into the workspace it asked for (the
// same y as without one, none of the backend's own scratch grown); at stride 1 it asks nothing.
TEST(BackendCpuConvolution, PointwiseForwardAsAGemmTakesItsColumnsFromTheWorkspaceItAskedFor) {
  for (const std::int64_t stride : {std::int64_t{1}, std::int64_t{2}}) {
    SCOPED_TRACE("stride " + std::to_string(stride));
    const auto g = geometry(3, 24, 10, 8, 32, 1, 1, stride, 0);
    const auto xv = representable(random_values(x_shape(g).numel(), 86), DType::bf16);
    const auto wv = representable(random_values(w_shape(g).numel(), 87), DType::bf16);
    const auto run = [&](bool with_workspace, std::size_t* asked, std::size_t* grew) {
      CpuBackend be(1);
      be.set_conv_gemm(ConvGemm::gemm);
      auto& conv = *sdk::facet<sdk::ConvolutionFacet>(be);
      const auto& scratch = *sdk::facet<sdk::ScratchFacet>(be);
      DeviceTensor x(be, DType::bf16, x_shape(g), xv), w(be, DType::bf16, w_shape(g), wv);
      DeviceTensor y(be, DType::bf16, y_shape(g));
      sdk::Conv2dWorkspaceQuery q;
      q.op = sdk::ConvolutionOp::conv2d_forward;
      q.geometry = g;
      q.a = q.b = q.out = DType::bf16;
      *asked = conv.conv2d_workspace_bytes(q);
      std::vector<float> space((*asked + 3) / 4 + 1);
      sdk::Conv2dForwardArgs f;
      f.geometry = g;
      f.x.view = x;
      f.w.view = w;
      f.y = y;
      const std::size_t before = scratch.scratch_bytes();
      if (with_workspace)
        conv.conv2d_forward_with_workspace(
            f,
            TensorView{space.data(), DType::fp32, Shape{static_cast<std::int64_t>(space.size())}});
      else
        conv.conv2d_forward(f);
      *grew = scratch.scratch_bytes() - before;
      EXPECT_EQ(be.last_conv_implementation().rfind("gemm ", 0), 0u);
      return y.get();
    };
    std::size_t asked = 0, grew = 0, asked_plain = 0, grew_plain = 0;
    const auto lent = run(true, &asked, &grew);
    const auto own = run(false, &asked_plain, &grew_plain);
    EXPECT_EQ(lent, own);
    // Where oneDNN has no native bf16 matmul the GEMM engine decodes its operands, the columns
    // [M, C] and w [O, C], and computes the bf16 y [M, O] in fp32, in scratch of its own, with or
    // without a workspace (cpu_gemm.h); on the native route it needs none.
    const auto pixels = static_cast<std::size_t>(g.batch * g.out_height() * g.out_width());
    const std::size_t engine_own =
        CpuBackend(1).bf16_gemm_native()
            ? 0
            : (pixels * static_cast<std::size_t>(g.in_channels + g.out_channels) +
               static_cast<std::size_t>(g.out_channels * g.in_channels)) *
                  4;
    EXPECT_EQ(grew, engine_own);
    // The strided pixels [N·OH·OW, C] in bf16, from a 64-byte boundary, and 63 bytes for the
    // workspace's own start.
    const std::size_t columns =
        static_cast<std::size_t>(g.batch * g.out_height() * g.out_width() * g.in_channels) * 2;
    if (stride == 1) {
      EXPECT_EQ(asked, 0u);
      EXPECT_EQ(grew_plain, engine_own);
    } else {
      EXPECT_GE(asked, columns);
      EXPECT_LE(asked, columns + 64 + 63);
      EXPECT_GE(grew_plain, engine_own + columns)
          << "without a workspace the columns are the backend's own";
    }
  }
}

// A weight gradient's columns in (kh, kw, c) order (an OHWI product reordered into dw) and in
// OIHW's (c, kh, kw) (the GEMM writing dw) give the same dw bit for bit, overwritten and
// accumulated: each element sums the same terms over the output pixels in the same order.
TEST(BackendCpuConvolution, WeightGradientColumnOrdersGiveTheSameBits) {
  sdk::Conv2dGeometry dilated = geometry(2, 8, 9, 9, 12, 3, 3, 1, 2);
  dilated.dilation_h = dilated.dilation_w = 2;
  sdk::Conv2dGeometry oblong = geometry(2, 6, 7, 8, 10, 3, 2, 1, 0);
  oblong.pad_h = 1;
  struct Case {
    DType dtype;
    float scale;
    sdk::Conv2dGeometry g;
  };
  for (const Case& k : {Case{DType::bf16, 1.0f, geometry(2, 16, 9, 7, 24, 3, 3, 2, 1)},
                        Case{DType::bf16, 1.0f, geometry(3, 32, 6, 6, 16, 3, 3, 1, 1)},
                        Case{DType::fp32, 1.0f, dilated}, Case{DType::fp16, 1.0f, oblong},
                        Case{DType::fp8_e4m3, 0.5f, geometry(2, 16, 6, 6, 32, 3, 3, 1, 1)}}) {
    const auto& g = k.g;
    SCOPED_TRACE(std::string(sdk::dtype_name(k.dtype)) + ", " + std::to_string(g.kernel_h) + "x" +
                 std::to_string(g.kernel_w) + ", C " + std::to_string(g.in_channels));
    CpuBackend be(2);
    CpuContext context(2, Bf16GemmPath::automatic, Bf16ConvPath::automatic, ConvAlgorithm::direct);
    DeviceTensor x(be, k.dtype, x_shape(g),
                   representable(random_values(x_shape(g).numel(), 88), k.dtype));
    DeviceTensor dy(be, k.dtype, y_shape(g),
                    representable(random_values(y_shape(g).numel(), 89), k.dtype));
    const auto dw0 = random_values(w_shape(g).numel(), 90);
    std::vector<char> cols(wgrad_gemm_cols_bytes(g, k.dtype));
    std::vector<float> product(wgrad_gemm_product_bytes(g, WgradColumns::ohwi) / 4);
    EXPECT_EQ(wgrad_gemm_product_bytes(g, WgradColumns::oihw), 0u);
    const auto run = [&](WgradColumns columns, bool accumulate) {
      DeviceTensor dw(be, DType::fp32, w_shape(g), dw0);
      sdk::Conv2dBackwardWeightsArgs bw;
      bw.geometry = g;
      bw.x.view = x;
      bw.x.scale_inv = k.scale;
      bw.dy.view = dy;
      bw.dy.scale_inv = k.scale;
      bw.dw = dw;
      bw.accumulate = accumulate;
      weight_gradient_as_gemm(context, bw, columns, cols.data(), product.data());
      return dw.get();
    };
    for (const bool accumulate : {false, true}) {
      const auto ohwi = run(WgradColumns::ohwi, accumulate);
      const auto oihw = run(WgradColumns::oihw, accumulate);
      ASSERT_EQ(ohwi.size(), oihw.size());
      EXPECT_EQ(std::memcmp(ohwi.data(), oihw.data(), ohwi.size() * sizeof(float)), 0)
          << (accumulate ? "accumulated" : "overwritten");
      EXPECT_NE(ohwi, dw0);
    }
  }
}

// The rule's shapes (cpu_conv_gemm_rule.h's tables, ResNet-50's convolutions): the 1x1 forwards
// on 7x7 maps at any batch, and on larger maps only where the weights outnumber the rows 1024 to
// one; a weight gradient's columns in OIHW's order where M <= 3·O. Then what `auto` runs on this
// CPU: the GEMM for a bf16 7x7 1x1 forward only with AMX-BF16 and native bf16; never a padded 1x1,
// a 3x3 forward, or an fp32 one.
TEST(BackendCpuConvolution, ForwardGemmRuleTakesSmallMapsAndTheColumnOrderFollowsTheRows) {
  for (const std::int64_t n : {std::int64_t{8}, std::int64_t{16}, std::int64_t{32}}) {
    SCOPED_TRACE("batch " + std::to_string(n));
    EXPECT_TRUE(fprop_gemm_pays(geometry(n, 512, 7, 7, 2048, 1, 1, 1, 0)));
    EXPECT_TRUE(fprop_gemm_pays(geometry(n, 2048, 7, 7, 512, 1, 1, 1, 0)));
    EXPECT_TRUE(fprop_gemm_pays(geometry(n, 1024, 14, 14, 2048, 1, 1, 2, 0)));  // 7x7 out
    EXPECT_FALSE(fprop_gemm_pays(geometry(n, 1024, 14, 14, 256, 1, 1, 1, 0)));
    EXPECT_FALSE(fprop_gemm_pays(geometry(n, 256, 14, 14, 1024, 1, 1, 1, 0)));
    EXPECT_FALSE(fprop_gemm_pays(geometry(n, 512, 28, 28, 1024, 1, 1, 2, 0)));
    EXPECT_FALSE(fprop_gemm_pays(geometry(n, 256, 56, 56, 512, 1, 1, 2, 0)));
    EXPECT_FALSE(fprop_gemm_pays(geometry(n, 512, 7, 7, 512, 3, 3, 1, 1)));      // 3x3
    EXPECT_FALSE(fprop_gemm_pays(geometry(n, 512, 7, 7, 2048, 1, 1, 1, 1)));     // padded
    EXPECT_FALSE(fprop_gemm_pays(geometry(n, 512, 7, 7, 2048, 1, 1, 1, 0, 2)));  // groups
  }
  // A small batch: 392 rows, 524288 weights (measured 0.46 -> 0.27 ms at batch 2).
  EXPECT_TRUE(fprop_gemm_pays(geometry(2, 1024, 14, 14, 512, 1, 1, 1, 0)));
  EXPECT_EQ(wgrad_columns(geometry(8, 512, 7, 7, 512, 3, 3, 1, 1)), WgradColumns::oihw);
  EXPECT_EQ(wgrad_columns(geometry(16, 512, 14, 14, 512, 3, 3, 2, 1)), WgradColumns::oihw);
  EXPECT_EQ(wgrad_columns(geometry(32, 512, 7, 7, 512, 3, 3, 1, 1)), WgradColumns::ohwi);
  EXPECT_EQ(wgrad_columns(geometry(8, 256, 28, 28, 256, 3, 3, 2, 1)), WgradColumns::ohwi);
  EXPECT_EQ(wgrad_columns(geometry(1, 8, 3, 3, 64, 1, 1, 1, 0)), WgradColumns::ohwi);  // 1x1

  const auto impl = [](ConvGemm choice, const sdk::Conv2dGeometry& g, DType dtype) {
    CpuBackend be(1);
    be.set_conv_gemm(choice);
    DeviceTensor x(be, dtype, x_shape(g), random_values(x_shape(g).numel(), 91));
    DeviceTensor w(be, dtype, w_shape(g), random_values(w_shape(g).numel(), 92));
    DeviceTensor y(be, dtype, y_shape(g));
    sdk::Conv2dForwardArgs f;
    f.geometry = g;
    f.x.view = x;
    f.w.view = w;
    f.y = y;
    sdk::facet<sdk::ConvolutionFacet>(be)->conv2d_forward(f);
    return be.last_conv_implementation().rfind("gemm ", 0) == 0;
  };
  const auto small_map = geometry(2, 64, 7, 7, 128, 1, 1, 1, 0);
  const auto wide_map = geometry(2, 16, 28, 28, 32, 1, 1, 1, 0);
  CpuBackend probe(1);
  const bool amx_native =
      detect_cpu().has("amx_bf16") && probe.bf16_conv_native() && probe.bf16_gemm_native();
  EXPECT_EQ(impl(ConvGemm::automatic, small_map, DType::bf16), amx_native);
  EXPECT_FALSE(impl(ConvGemm::automatic, wide_map, DType::bf16));
  EXPECT_EQ(impl(ConvGemm::automatic, small_map, DType::fp32), detect_cpu().has("amx_bf16"))
      << "fp32's rule, with AMX-BF16 alone";
  EXPECT_FALSE(impl(ConvGemm::automatic, wide_map, DType::fp32));
  EXPECT_FALSE(impl(ConvGemm::automatic, geometry(2, 64, 7, 7, 128, 1, 1, 1, 1), DType::bf16));
  EXPECT_FALSE(impl(ConvGemm::automatic, geometry(2, 64, 7, 7, 128, 3, 3, 1, 1), DType::bf16));
  EXPECT_TRUE(impl(ConvGemm::gemm, wide_map, DType::fp32));
  EXPECT_FALSE(impl(ConvGemm::gemm, geometry(2, 64, 7, 7, 128, 3, 3, 1, 1), DType::bf16));
  EXPECT_FALSE(impl(ConvGemm::convolution, small_map, DType::bf16));
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
