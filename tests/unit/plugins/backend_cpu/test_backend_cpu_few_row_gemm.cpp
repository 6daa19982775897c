// The few-row GEMM (cpu_few_row_gemm.h), through the gemm facet as decoding calls it: which
// products take it, and that each value is its definition's sum bit for bit (32 lanes in order,
// their fixed tree, the bias, one rounding) on every ISA variant and thread count; subnormal
// products kept; the other products left to oneDNN.
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "backend_test_util.h"
#include "cpu_few_row_gemm.h"
#include "cpu_gemm.h"
#include "isa_variants.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu::testing {
namespace {

// The header's definition, one fp32 operation at a time: product p joins lane p mod 32; lane 2l
// is then added to lane 2l + 1, and those 16 pairwise (l + 8, + 4, + 2, + 1); the bias last.
float defined_sum(const std::vector<float>& a, const std::vector<float>& b, std::int64_t row,
                  std::int64_t col, std::int64_t k, const std::vector<float>& bias) {
  float lanes[32] = {};
  for (std::int64_t p = 0; p < k; ++p) {
    volatile float product = a[static_cast<std::size_t>(row * k + p)] *
                             b[static_cast<std::size_t>(col * k + p)];  // no contraction
    lanes[p % 32] = lanes[p % 32] + product;
  }
  float acc[16];
  for (int l = 0; l < 16; ++l) acc[l] = lanes[2 * l] + lanes[2 * l + 1];
  for (int w = 8; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] = acc[l] + acc[l + w];
  return bias.empty() ? acc[0] : acc[0] + bias[static_cast<std::size_t>(col)];
}

struct GemmRun {
  std::vector<float> c;
  std::string implementation;
};

GemmRun run_gemm(int threads, std::int64_t m, std::int64_t n, std::int64_t k,
                 const std::vector<float>& a, const std::vector<float>& b,
                 const std::vector<float>& bias, DType c_dtype, float alpha = 1.0f,
                 float beta = 0.0f, bool transpose_b = true) {
  CpuBackend be(threads);
  DeviceTensor at(be, DType::bf16, {m, k}, a);
  DeviceTensor bt(be, DType::bf16, transpose_b ? Shape{n, k} : Shape{k, n}, b);
  DeviceTensor c(be, c_dtype, {m, n});
  DeviceTensor bias_t(be, DType::fp32, {n}, bias.empty() ? std::vector<float>(n) : bias);
  sdk::GemmArgs args;
  args.a = {at, false};
  args.b = {bt, transpose_b};
  args.c = c;
  args.alpha = alpha;
  args.beta = beta;
  if (!bias.empty()) args.bias = bias_t;
  sdk::facet<sdk::GemmFacet>(be)->gemm(args);
  return {c.get(), be.last_gemm_implementation()};
}

using Shape3 = std::tuple<std::int64_t, std::int64_t, std::int64_t>;  // m, n, k

// Shapes: k a multiple of 32 and not (the tail joins its lanes), below one chunk, n not a
// multiple of 4 (rows summed one at a time) and large enough to run on the team.
const Shape3 kShapes[] = {{1, 7, 5}, {2, 9, 31},    {1, 37, 64},   {2, 61, 100},
                          {1, 1, 1}, {1, 301, 768}, {2, 130, 777}, {1, 64, 3072}};

TEST(backend_cpu_few_row_gemm, EachValueIsItsDefinedSumOnEveryIsaAndThreadCount) {
  for (const auto& [m, n, k] : kShapes)
    for (const bool with_bias : {false, true})
      for (const DType c_dtype : {DType::bf16, DType::fp32}) {
        SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) +
                     " k=" + std::to_string(k) + (with_bias ? " bias " : " ") +
                     std::string(sdk::dtype_name(c_dtype)));
        const auto a =
            representable(random_values(static_cast<std::size_t>(m * k), 71), DType::bf16);
        const auto b =
            representable(random_values(static_cast<std::size_t>(n * k), 72), DType::bf16);
        const auto bias =
            with_bias ? random_values(static_cast<std::size_t>(n), 73) : std::vector<float>{};
        std::vector<float> want(static_cast<std::size_t>(m * n));
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            const float sum = defined_sum(a, b, i, j, k, bias);
            want[static_cast<std::size_t>(i * n + j)] =
                c_dtype == DType::bf16 ? representable({sum}, DType::bf16)[0] : sum;
          }
        for (const auto& [threads, isa] : thread_and_isa_runs()) {
          SCOPED_TRACE(isa_name(isa) + ", " + std::to_string(threads) + " thread(s)");
          const IsaScope scope(isa);
          const GemmRun got = run_gemm(threads, m, n, k, a, b, bias, c_dtype);
          EXPECT_EQ(got.implementation, GemmEngine::kFewRowsImplementation);
          ASSERT_EQ(got.c.size(), want.size());
          for (std::size_t e = 0; e < want.size(); ++e)
            ASSERT_EQ(std::bit_cast<std::uint32_t>(got.c[e]), std::bit_cast<std::uint32_t>(want[e]))
                << "C[" << e << "] = " << got.c[e] << ", defined " << want[e];
        }
      }
}

// vdpbf16ps and oneDNN's bf16 destination flush subnormals; this kernel keeps them, as the
// emulated route does: 2^-70 · 2^-70 summed 40 times is 40 · 2^-140, a subnormal fp32.
TEST(backend_cpu_few_row_gemm, SubnormalProductsAreKept) {
  const std::int64_t k = 40;
  const std::vector<float> a(k, 0x1p-70f), b(k, 0x1p-70f);
  for (const Isa isa : runnable_isas()) {
    const IsaScope scope(isa);
    const GemmRun got = run_gemm(1, 1, 1, k, a, b, {}, DType::fp32);
    EXPECT_EQ(got.c[0], 40 * 0x1p-140f) << isa_name(isa);
  }
}

// What the kernel does not define goes to oneDNN (or the emulated route) as before.
TEST(backend_cpu_few_row_gemm, OtherProductsAreNotTaken) {
  const std::int64_t n = 16, k = 64;
  const std::int64_t more = kFewGemmRows + 1;
  const auto a = representable(random_values(static_cast<std::size_t>(k), 81), DType::bf16);
  const auto a_more =
      representable(random_values(static_cast<std::size_t>(more * k), 81), DType::bf16);
  const auto b = representable(random_values(static_cast<std::size_t>(n * k), 82), DType::bf16);
  const auto few = [](const GemmRun& r) {
    return r.implementation == GemmEngine::kFewRowsImplementation;
  };
  EXPECT_TRUE(few(run_gemm(1, 1, n, k, a, b, {}, DType::bf16)));
  EXPECT_FALSE(few(run_gemm(1, more, n, k, a_more, b, {}, DType::bf16))) << "rows";
  EXPECT_FALSE(few(run_gemm(1, 1, n, k, a, b, {}, DType::bf16, 2.0f))) << "alpha";
  EXPECT_FALSE(few(run_gemm(1, 1, n, k, a, b, {}, DType::bf16, 1.0f, 1.0f))) << "beta";
  EXPECT_FALSE(few(run_gemm(1, 1, n, k, a, b, {}, DType::bf16, 1.0f, 0.0f, false))) << "B [k, n]";
  EXPECT_FALSE(few(run_gemm(1, 1, n, k, a, b, {}, DType::fp16))) << "an fp16 C";
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
