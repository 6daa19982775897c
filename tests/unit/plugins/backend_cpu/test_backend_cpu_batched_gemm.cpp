// gemm_strided_batched: the one 3-D oneDNN primitive against a loop of gemm() over the same
// batches (every A/B dtype route, 16-bit C, transposes, broadcast stride 0, gaps between
// batches), the fallbacks (negative or overlapping strides, k = 0) and the primitive cache.
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>

#include "backend_test_util.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu::testing {
namespace {

struct Batched {
  std::int64_t batch, m, n, k;
  bool ta, tb;
  std::int64_t stride_a, stride_b, stride_c;  // -1: compact (rows * cols of that operand)
};

struct Route {
  const char* name;
  DType a, b, c;
  DType compute;
  Bf16GemmPath bf16;
};

// A's, B's and C's batch-0 views and elements spanned by `batch` batches of each.
struct Layout {
  Shape a, b, c;
  std::int64_t sa, sb, sc;
  std::int64_t span(std::int64_t stride, const Shape& s, std::int64_t batch) const {
    return stride == 0 ? s.numel() : std::abs(stride) * (batch - 1) + s.numel();
  }
};

Layout layout_of(const Batched& g) {
  Layout l;
  l.a = g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k};
  l.b = g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n};
  l.c = Shape{g.m, g.n};
  l.sa = g.stride_a == -1 ? l.a.numel() : g.stride_a;
  l.sb = g.stride_b == -1 ? l.b.numel() : g.stride_b;
  l.sc = g.stride_c == -1 ? l.c.numel() : g.stride_c;
  return l;
}

TensorView moved(TensorView v, std::int64_t elements) {
  v.data =
      static_cast<char*>(v.data) + elements * static_cast<std::int64_t>(sdk::dtype_size(v.dtype));
  return v;
}

// C (all batches) after one gemm_strided_batched call and after a loop of gemm() calls, on
// backends made alike, and the oneDNN implementation each ran last. Negative strides start
// batch 0 at the end of the buffer.
struct Outcome {
  std::vector<float> batched, loop;
  std::string batched_impl, loop_impl;
};
Outcome batched_and_loop(const Batched& g, const Route& r, float alpha, float beta) {
  const Layout l = layout_of(g);
  const std::int64_t a_span = l.span(l.sa, l.a, g.batch), b_span = l.span(l.sb, l.b, g.batch);
  const std::int64_t c_span = l.span(l.sc, l.c, g.batch);
  const auto a_values = random_values(static_cast<std::size_t>(a_span), 11);
  const auto b_values = random_values(static_cast<std::size_t>(b_span), 12);
  const auto c_values = random_values(static_cast<std::size_t>(c_span), 13);
  Outcome out;
  for (bool batched : {true, false}) {
    CpuBackend be(2, r.bf16);
    DeviceTensor a(be, r.a, Shape{a_span}, a_values);
    DeviceTensor b(be, r.b, Shape{b_span}, b_values);
    DeviceTensor c(be, r.c, Shape{c_span}, c_values);
    auto first = [&](const DeviceTensor& t, std::int64_t stride, std::int64_t span, Shape s) {
      TensorView v = moved(t.view(), stride < 0 ? span - s.numel() : 0);
      v.shape = s;
      return v;
    };
    sdk::GemmBatchedArgs args;
    args.gemm.a = {first(a, l.sa, a_span, l.a), g.ta, 0.5f};
    args.gemm.b = {first(b, l.sb, b_span, l.b), g.tb, 2.0f};
    args.gemm.c = first(c, l.sc, c_span, l.c);
    args.gemm.alpha = alpha;
    args.gemm.beta = beta;
    args.gemm.compute = r.compute;
    args.batch = g.batch;
    args.stride_a = l.sa;
    args.stride_b = l.sb;
    args.stride_c = l.sc;
    if (batched) {
      sdk::facet<sdk::GemmFacet>(be)->gemm_strided_batched(args);
    } else {
      sdk::GemmArgs one = args.gemm;
      for (std::int64_t i = 0; i < g.batch; ++i) {
        one.a.view = moved(args.gemm.a.view, i * l.sa);
        one.b.view = moved(args.gemm.b.view, i * l.sb);
        one.c = moved(args.gemm.c, i * l.sc);
        sdk::facet<sdk::GemmFacet>(be)->gemm(one);
      }
    }
    (batched ? out.batched : out.loop) = c.get();
    (batched ? out.batched_impl : out.loop_impl) = be.last_gemm_implementation();
  }
  return out;
}

// Normwise relative difference (accumulation order only).
double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

const Route kRoutes[] = {
    {"fp32", DType::fp32, DType::fp32, DType::fp32, DType::fp32, Bf16GemmPath::automatic},
    {"tf32", DType::fp32, DType::fp32, DType::fp32, DType::tf32, Bf16GemmPath::automatic},
    {"bf16 emulated", DType::bf16, DType::bf16, DType::fp32, DType::fp32, Bf16GemmPath::emulated},
    {"bf16 onednn, bf16 C", DType::bf16, DType::bf16, DType::bf16, DType::fp32,
     Bf16GemmPath::onednn},
    {"bf16 emulated, bf16 C", DType::bf16, DType::bf16, DType::bf16, DType::fp32,
     Bf16GemmPath::emulated},
    {"fp16, fp16 C", DType::fp16, DType::fp16, DType::fp16, DType::fp32, Bf16GemmPath::automatic},
    {"fp8 e4m3 x bf16", DType::fp8_e4m3, DType::bf16, DType::fp32, DType::fp32,
     Bf16GemmPath::automatic},
    {"fp32 x fp16", DType::fp32, DType::fp16, DType::fp32, DType::fp32, Bf16GemmPath::automatic},
};

const Batched kShapes[] = {
    {4, 19, 24, 31, false, false, -1, -1, -1},
    {4, 19, 24, 31, false, true, -1, -1, -1},  // Q·Kᵀ
    {4, 19, 24, 31, true, false, -1, -1, -1},
    {4, 19, 24, 31, true, true, -1, -1, -1},
    {3, 16, 8, 12, false, true, -1, 0, -1},   // shared weight (B broadcast)
    {3, 16, 8, 12, false, false, 0, -1, -1},  // A broadcast
    {3, 9, 10, 11, false, false, 9 * 11 + 5, 10 * 11 + 3, 9 * 10 + 7},  // gaps between batches
    {64, 128, 32, 128, false, false, -1, -1, -1},  // P·V of an attention layer
};

TEST(backend_cpu_batched_gemm, OnePrimitiveEqualsALoopOfGemm) {
  // When the batched primitive is the same oneDNN implementation as gemm()'s 2-D one, each batch
  // is that kernel on the same operands: the same bits. Another implementation (a CPU where
  // oneDNN picks, say, brgemm for one and jit gemm for the other) may block K differently, so
  // then the bound is a normwise few fp32 ulps (plus one output rounding for 16-bit C).
  for (const Route& r : kRoutes)
    for (const Batched& g : kShapes)
      for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.75f, 0.5f}}) {
        const Outcome o = batched_and_loop(g, r, alpha, beta);
        const std::string what =
            std::string(r.name) + " batch " + std::to_string(g.batch) + " m" + std::to_string(g.m) +
            " n" + std::to_string(g.n) + " k" + std::to_string(g.k) + (g.ta ? " At" : "") +
            (g.tb ? " Bt" : "") + " strides " + std::to_string(g.stride_a) + "/" +
            std::to_string(g.stride_b) + "/" + std::to_string(g.stride_c) + " alpha " +
            std::to_string(alpha) + " beta " + std::to_string(beta) + " (" + o.batched_impl +
            " vs " + o.loop_impl + ")";
        ASSERT_FALSE(o.batched_impl.empty()) << what;
        if (o.batched_impl == o.loop_impl) {
          EXPECT_EQ(o.batched, o.loop) << what;
        } else {
          const double tol = r.c == DType::fp32 ? 1e-6 : (r.c == DType::bf16 ? 4e-3 : 5e-4);
          EXPECT_LE(relative_difference(o.batched, o.loop), tol) << what;
        }
      }
}

TEST(backend_cpu_batched_gemm, FallbacksComputeTheSameAsTheLoop) {
  // Negative and overlapping strides, and k = 0, are not one primitive: the loop runs them.
  const Route fp32 = kRoutes[0];
  const Route bf16 = kRoutes[4];
  for (const Route& r : {fp32, bf16}) {
    for (const Batched& g : {Batched{3, 5, 6, 7, false, false, -35, -42, -30},
                             Batched{4, 5, 6, 7, false, false, 7, -1, -1},  // sliding A windows
                             Batched{3, 5, 6, 0, false, false, -1, -1, -1}}) {
      const Outcome o = batched_and_loop(g, r, 0.75f, 0.5f);
      EXPECT_EQ(o.batched, o.loop) << r.name << " strides " << g.stride_a << "/" << g.stride_b
                                   << "/" << g.stride_c << " k " << g.k;
    }
  }
}

TEST(backend_cpu_batched_gemm, MatchesADoubleReference) {
  CpuBackend be(2);
  const std::int64_t batch = 5, m = 7, n = 9, k = 13;
  const auto a = random_values(static_cast<std::size_t>(batch * k * m), 21);  // stored [k, m]
  const auto b = random_values(static_cast<std::size_t>(n * k), 22);          // shared [n, k]
  const auto c0 = random_values(static_cast<std::size_t>(batch * m * n), 23);
  DeviceTensor at(be, DType::fp32, Shape{batch * k, m}, a);
  DeviceTensor bt(be, DType::fp32, Shape{n, k}, b);
  DeviceTensor c(be, DType::fp32, Shape{batch * m, n}, c0);
  sdk::GemmBatchedArgs args;
  args.gemm.a = {{at.view().data, DType::fp32, Shape{k, m}}, true};
  args.gemm.b = {bt.view(), true};
  args.gemm.c = {c.view().data, DType::fp32, Shape{m, n}};
  args.gemm.alpha = 1.5f;
  args.gemm.beta = -0.5f;
  args.batch = batch;
  args.stride_a = k * m;
  args.stride_b = 0;
  args.stride_c = m * n;
  sdk::facet<sdk::GemmFacet>(be)->gemm_strided_batched(args);
  std::vector<double> want(c0.size());
  for (std::int64_t q = 0; q < batch; ++q)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (std::int64_t p = 0; p < k; ++p)
          acc += static_cast<double>(a[static_cast<std::size_t>(q * k * m + p * m + i)]) *
                 b[static_cast<std::size_t>(j * k + p)];
        const auto at_c = static_cast<std::size_t>(q * m * n + i * n + j);
        want[at_c] = 1.5 * acc - 0.5 * c0[at_c];
      }
  expect_close(c.get(), want, 1e-5, 1e-5, "batched C");
}

TEST(backend_cpu_batched_gemm, OnePrimitivePerShapeIsCreatedAndReused) {
  const Batched g{8, 16, 16, 8, false, true, -1, -1, -1};
  const Layout l = layout_of(g);
  CpuBackend be(1);
  DeviceTensor a(be, DType::fp32, Shape{g.batch * g.m, g.k}, random_values(1024, 31));
  DeviceTensor b(be, DType::fp32, Shape{g.batch * g.n, g.k}, random_values(1024, 32));
  DeviceTensor c(be, DType::fp32, Shape{g.batch * g.m, g.n});
  sdk::GemmBatchedArgs args;
  args.gemm.a = {{a.view().data, DType::fp32, l.a}, false};
  args.gemm.b = {{b.view().data, DType::fp32, l.b}, true};
  args.gemm.c = {c.view().data, DType::fp32, l.c};
  args.batch = g.batch;
  args.stride_a = l.a.numel();
  args.stride_b = l.b.numel();
  args.stride_c = l.c.numel();
  ASSERT_EQ(be.cached_gemm_primitives(), 0u);
  sdk::facet<sdk::GemmFacet>(be)->gemm_strided_batched(args);
  EXPECT_EQ(be.cached_gemm_primitives(), 1u);
  sdk::facet<sdk::GemmFacet>(be)->gemm_strided_batched(args);
  EXPECT_EQ(be.cached_gemm_primitives(), 1u) << "the batched primitive is reused";
  // The batched call did not go through gemm(): its 2-D primitive is new.
  sdk::facet<sdk::GemmFacet>(be)->gemm(args.gemm);
  EXPECT_EQ(be.cached_gemm_primitives(), 2u);
  // An overlapping stride is the loop over that 2-D primitive: nothing new is created.
  args.stride_a = 8;
  sdk::facet<sdk::GemmFacet>(be)->gemm_strided_batched(args);
  EXPECT_EQ(be.cached_gemm_primitives(), 2u);
}

TEST(backend_cpu_batched_gemm, ArgumentErrorsAreBackendErrors) {
  CpuBackend be(1);
  DeviceTensor a(be, DType::fp32, Shape{4, 3});
  DeviceTensor c(be, DType::fp32, Shape{4, 4});
  DeviceTensor ints(be, DType::int32, Shape{3, 4});
  sdk::GemmBatchedArgs args;
  args.gemm.a = {a.view()};
  args.gemm.b = {ints.view()};
  args.gemm.c = c.view();
  args.batch = 2;
  args.stride_c = 16;
  EXPECT_THROW(sdk::facet<sdk::GemmFacet>(be)->gemm_strided_batched(args),
               sdk::BackendError);  // int32 B
  args.gemm.b = {a.view(), true};
  args.stride_c = 8;  // overlapping outputs
  EXPECT_THROW(sdk::facet<sdk::GemmFacet>(be)->gemm_strided_batched(args), sdk::BackendError);
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
