// The GEMM engine's routes (cuda_gemm_routes.h) over every combination of input dtype, C dtype,
// bias, activation and pre_activation, and gemm_gradient's (gelu's gradient: DGELU or the gradient
// kernel) over input, C and pre_activation dtypes, beta and n: the rules that keep every route's
// result the same hold without a GPU, since choosing a route calls no CUDA.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "cuda_gemm_routes.h"

namespace mixtrain::backend_cuda {
namespace {

using sdk::DType;
using Output = GemmRoute::Output;

std::string describe(const GemmRouteQuery& q) {
  return std::string("input ") + std::string(sdk::dtype_name(q.input)) + ", C " +
         std::string(sdk::dtype_name(q.c)) + (q.bias ? ", bias" : "") +
         (q.activation ? (q.act == sdk::Activation::relu ? ", relu" : ", gelu") : "") +
         (q.pre_activation ? ", pre_activation " + std::string(sdk::dtype_name(q.pre_activation_dtype))
                           : "") +
         ", n " + std::to_string(q.n);
}

// Every query the engine can make: inputs as they reach cuBLASLt, outputs it allows.
template <class F>
void for_each_query(F&& check) {
  for (DType input : {DType::fp32, DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2})
    for (DType c : {DType::fp32, DType::bf16, DType::fp16})
      for (bool bias : {false, true})
        for (int act = 0; act < 3; ++act)  // none, relu, gelu
          for (int pre = 0; pre < 4; ++pre)  // none, fp32, bf16, fp16
            for (std::int64_t n : {std::int64_t{64}, std::int64_t{30}}) {
              if (act == 0 && pre != 0) continue;  // pre_activation needs an activation
              GemmRouteQuery q;
              q.input = input;
              q.c = c;
              q.bias = bias;
              q.activation = act != 0;
              q.act = act == 1 ? sdk::Activation::relu : sdk::Activation::gelu;
              q.pre_activation = pre != 0;
              q.pre_activation_dtype = pre == 2 ? DType::bf16 : pre == 3 ? DType::fp16 : DType::fp32;
              q.n = n;
              check(q, gemm_routes(q));
            }
}

TEST(cuda_gemm_routes, EveryRouteComputesTheSameThing) {
  int queries = 0, routes_seen = 0;
  for_each_query([&](const GemmRouteQuery& q, const std::vector<GemmRoute>& routes) {
    ++queries;
    SCOPED_TRACE(describe(q));
    ASSERT_FALSE(routes.empty());
    for (const GemmRoute& r : routes) {
      ++routes_seen;
      const bool d_is_c = r.output == Output::direct || r.output == Output::direct_narrow_bias;
      EXPECT_EQ(r.d_dtype, d_is_c ? q.c : DType::fp32);
      EXPECT_TRUE(!d_is_c || gemm_direct_output(q.input, q.c));
      // The bias is added exactly once.
      EXPECT_EQ(r.bias_in_epilogue + r.bias_by_kernel, q.bias ? 1 : 0);
      if (r.bias_in_epilogue && r.bias_dtype != DType::fp32) {
        EXPECT_EQ(r.output, Output::direct_narrow_bias);
        EXPECT_EQ(r.bias_dtype, q.c);
        EXPECT_NE(q.c, DType::fp32);
      }
      // The activation is applied exactly once, and the pre_activation written exactly once.
      EXPECT_EQ(r.activation_in_epilogue + r.activation_by_kernel, q.activation ? 1 : 0);
      EXPECT_EQ(r.aux_in_epilogue + r.pre_activation_by_kernel, q.pre_activation ? 1 : 0);
      // GELU_AUX: gelu only, aux in C's dtype (cuBLASLt's default aux type), n % 8 == 0.
      if (r.aux_in_epilogue) {
        EXPECT_EQ(q.act, sdk::Activation::gelu);
        EXPECT_EQ(q.pre_activation_dtype, q.c);
        EXPECT_EQ(q.n % 8, 0);
        EXPECT_TRUE(r.activation_in_epilogue);
      }
      // One rounding: a kernel that reads z must read it in fp32, so a 16-bit D never feeds the
      // activation or pre_activation kernels (D = C then holds act(z) or z already rounded).
      EXPECT_TRUE(!(r.activation_by_kernel || r.pre_activation_by_kernel) || r.d_dtype == DType::fp32);
      // An epilogue activation writes C itself.
      EXPECT_TRUE(!r.activation_in_epilogue || d_is_c);
      // Without an activation an fp32 D is rounded into a 16-bit C by exactly one kernel.
      EXPECT_EQ(r.encode_by_kernel, !q.activation && r.d_dtype != q.c);
    }
    // The last route uses no epilogue, so it runs wherever cuBLASLt runs the inputs at all.
    const GemmRoute& last = routes.back();
    EXPECT_FALSE(last.bias_in_epilogue);
    EXPECT_FALSE(last.activation_in_epilogue);
    EXPECT_FALSE(last.aux_in_epilogue);
  });
  EXPECT_EQ(queries, 5 * 3 * 2 * (1 + 2 * 4) * 2);
  EXPECT_GT(routes_seen, queries);
}

TEST(cuda_gemm_routes, FusedRoutesComeFirstWhereCublasLtHasThem) {
  GemmRouteQuery q;
  q.input = DType::bf16;
  q.c = DType::bf16;
  q.bias = true;
  q.activation = true;
  q.act = sdk::Activation::gelu;
  q.pre_activation = true;
  q.pre_activation_dtype = DType::bf16;
  q.n = 4096;
  auto routes = gemm_routes(q);
  ASSERT_EQ(routes.size(), 4u);
  EXPECT_EQ(routes[0].output, Output::direct);  // GELU_AUX_BIAS, fp32 bias
  EXPECT_TRUE(routes[0].aux_in_epilogue && routes[0].bias_in_epilogue);
  EXPECT_EQ(routes[1].output, Output::direct_narrow_bias);  // the same with a bf16 bias
  EXPECT_EQ(routes[2].output, Output::fp32_epilogue);
  EXPECT_EQ(routes[3].output, Output::fp32_kernel_bias);

  // A relu wants no aux (its backward reads C), so it fuses at any n.
  q.act = sdk::Activation::relu;
  q.pre_activation = false;
  q.n = 30;
  routes = gemm_routes(q);
  EXPECT_TRUE(routes[0].activation_in_epilogue);

  // A gelu pre_activation at n % 8 != 0 cannot ride GELU_AUX: a 16-bit C then goes through fp32.
  q.act = sdk::Activation::gelu;
  q.pre_activation = true;
  routes = gemm_routes(q);
  for (const auto& r : routes) EXPECT_EQ(r.d_dtype, DType::fp32) << static_cast<int>(r.output);

  // fp32 inputs cannot write a bf16 D: straight to fp32 scratch.
  q.input = DType::fp32;
  q.activation = false;
  q.pre_activation = false;
  routes = gemm_routes(q);
  EXPECT_EQ(routes.front().output, Output::fp32_epilogue);
  EXPECT_TRUE(routes.front().encode_by_kernel);
}

// CudaBackend's GemmFacet::supports: the SDK's table narrowed to the A/B dtypes the device
// declares. Checked against the rule it had before the table moved into the SDK (A, B: listed in
// capabilities(); C: a storage float; at most three dtypes), for every list of up to four.
TEST(GemmSupported, IsTheSdkTableNarrowedToTheDeclaredInputs) {
  auto caps_for = [](bool fp8) {
    sdk::BackendCapabilities caps;
    for (DType t : {DType::fp32, DType::tf32, DType::bf16, DType::fp16})
      caps.gemm_inputs.push_back({t, true, ""});
    if (fp8)
      for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2}) caps.gemm_inputs.push_back({t, true, ""});
    return caps;
  };
  auto storage = [](DType t) {
    return t == DType::fp32 || t == DType::tf32 || t == DType::bf16 || t == DType::fp16;
  };
  for (bool fp8 : {false, true}) {
    const sdk::BackendCapabilities caps = caps_for(fp8);
    auto old_rule = [&](std::span<const DType> d) {
      for (std::size_t i = 0; i < d.size(); ++i) {
        if (i >= 3) return false;
        if (i < 2 ? !caps.supports(d[i]) : !storage(d[i])) return false;
      }
      return true;
    };
    std::vector<DType> d;
    auto rec = [&](auto& self, std::size_t depth) -> void {
      for (auto op : {sdk::GemmOp::gemm, sdk::GemmOp::gemm_strided_batched})
        EXPECT_EQ(gemm_supported(caps, op, d), old_rule(d)) << fp8 << " " << d.size();
      if (depth == 4) return;
      for (DType t : sdk::kAllDTypes) {
        d.push_back(t);
        self(self, depth + 1);
        d.pop_back();
      }
    };
    rec(rec, 0);
  }
  const DType fp8_gemm[] = {DType::fp8_e4m3, DType::fp8_e5m2, DType::bf16};
  EXPECT_FALSE(gemm_supported(caps_for(false), sdk::GemmOp::gemm, fp8_gemm));  // before sm_89
  EXPECT_TRUE(gemm_supported(caps_for(true), sdk::GemmOp::gemm, fp8_gemm));
}

// Realigned rows (gemm_realign): a row is padded to the next 16 bytes of its dtype, only where it
// is not aligned already, only for one large 16-bit GEMM.
TEST(cuda_gemm_routes, RealignsOnlyLargeSixteenBitGemmsWithUnalignedRows) {
  EXPECT_EQ(aligned_ld(50257, DType::bf16), 50264);
  EXPECT_EQ(aligned_ld(50257, DType::fp32), 50260);
  EXPECT_EQ(aligned_ld(768, DType::bf16), 768);
  EXPECT_EQ(aligned_ld(1, DType::fp16), 8);
  // GPT-2's LM head, one block of 1024 rows: forward C [1024, 50257] (A = x [1024, 768], B = W
  // [50257, 768] read transposed), the input gradient A = dlogits [1024, 50257] (k = V), the weight
  // gradient A = dlogits read transposed (its stored cols are V).
  const Realign forward =
      realign_for({DType::bf16, 768, 768, DType::bf16, 1024, 50257, 768, false});
  EXPECT_FALSE(forward.a);
  EXPECT_FALSE(forward.b);
  EXPECT_TRUE(forward.c);
  const Realign dgrad =
      realign_for({DType::bf16, 50257, 768, DType::bf16, 1024, 768, 50257, false});
  EXPECT_TRUE(dgrad.a);
  EXPECT_FALSE(dgrad.b);
  EXPECT_FALSE(dgrad.c);
  const Realign wgrad =
      realign_for({DType::bf16, 50257, 768, DType::fp32, 50257, 768, 1024, false});
  EXPECT_TRUE(wgrad.a);
  EXPECT_FALSE(wgrad.c);
  // An fp32 C of odd width is realigned too (4 bytes a column).
  EXPECT_TRUE(realign_for({DType::bf16, 768, 768, DType::fp32, 1024, 50257, 768, false}).c);
  // Not: aligned rows, fp32 inputs (no 16-bit Tensor Core kernel to reach), a batch, a small GEMM.
  EXPECT_FALSE(realign_for({DType::bf16, 768, 768, DType::bf16, 1024, 50264, 768, false}).any());
  EXPECT_FALSE(realign_for({DType::fp32, 768, 768, DType::fp32, 1024, 50257, 768, false}).any());
  EXPECT_FALSE(realign_for({DType::bf16, 768, 768, DType::bf16, 1024, 50257, 768, true}).any());
  EXPECT_FALSE(realign_for({DType::bf16, 37, 53, DType::bf16, 29, 37, 53, false}).any());
  // The threshold is m·n·k >= 2^27, computed without overflow.
  EXPECT_TRUE(realign_for({DType::fp16, 1, 1, DType::fp16, 1 << 9, 1 << 9, 1 << 9, false}).any());
  EXPECT_FALSE(
      realign_for({DType::fp16, 1, 1, DType::fp16, 1 << 9, 1 << 9, (1 << 9) - 1, false}).any());
  EXPECT_TRUE(
      realign_for({DType::bf16, 9, 9, DType::bf16, std::int64_t{1} << 40, 9, 1 << 20, false})
          .any());
}

// A padded C takes only the routes that leave C to cuBLASLt: no kernel reads or writes it packed
// afterwards, and no aux (pre_activation) laid out like it.
TEST(cuda_gemm_routes, APaddedOutputTakesOnlyRoutesThatWriteItDirectly) {
  GemmRouteQuery q;
  q.input = DType::bf16;
  q.c = DType::bf16;
  q.n = 50257;
  const auto plain = gemm_routes(q);
  ASSERT_FALSE(plain.empty());
  EXPECT_TRUE(route_writes_c_directly(plain.front()));
  q.bias = true;
  q.activation = true;
  q.act = sdk::Activation::gelu;
  q.pre_activation = true;
  q.pre_activation_dtype = DType::bf16;
  for (const GemmRoute& r : gemm_routes(q)) {
    const bool kernel_after = r.bias_by_kernel || r.pre_activation_by_kernel ||
                              r.activation_by_kernel || r.encode_by_kernel || r.aux_in_epilogue;
    EXPECT_EQ(
        route_writes_c_directly(r),
        !kernel_after && (r.output == Output::direct || r.output == Output::direct_narrow_bias));
  }
  GemmRoute scratch;
  scratch.output = Output::fp32_epilogue;
  EXPECT_FALSE(route_writes_c_directly(scratch));
}

// --- gemm_gradient
// ---------------------------------------------------------------------------------

bool dgelu_input(DType t) {
  return t == DType::fp32 || t == DType::bf16 || t == DType::fp16;
}

GemmRouteQuery gradient_query(DType input, DType c, DType pre, bool beta_nonzero, std::int64_t n) {
  GemmRouteQuery q;
  q.input = input;
  q.c = c;
  q.activation_grad = true;
  q.pre_activation_dtype = pre;
  q.beta_nonzero = beta_nonzero;
  q.n = n;
  return q;
}

// gelu' is applied exactly once (DGELU or the kernel), z is rounded once into C, DGELU only where
// cuBLASLt can take it, and the last route always runs: for every query gemm_gradient can make.
TEST(cuda_gemm_routes, GradientRoutesApplyGeluGradOnceAndRoundOnce) {
  int queries = 0;
  for (DType input : {DType::fp32, DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2})
    for (DType c : {DType::fp32, DType::bf16, DType::fp16})
      for (DType pre : {DType::fp32, DType::bf16, DType::fp16})
        for (bool beta : {false, true})
          for (std::int64_t n : {std::int64_t{64}, std::int64_t{30}}) {
            ++queries;
            const GemmRouteQuery q = gradient_query(input, c, pre, beta, n);
            SCOPED_TRACE(std::string(sdk::dtype_name(input)) + " -> " +
                         std::string(sdk::dtype_name(c)) + ", pre " +
                         std::string(sdk::dtype_name(pre)) + (beta ? ", beta" : "") + ", n " +
                         std::to_string(n));
            const auto routes = gemm_routes(q);
            ASSERT_FALSE(routes.empty());
            int dgelu_routes = 0;
            for (const GemmRoute& r : routes) {
              const bool d_is_c = r.output == Output::direct;
              EXPECT_TRUE(r.output == Output::direct || r.output == Output::fp32_epilogue);
              EXPECT_EQ(r.d_dtype, d_is_c ? c : DType::fp32);
              EXPECT_TRUE(!d_is_c || gemm_direct_output(input, c));
              // Nothing of the forward's epilogues.
              EXPECT_FALSE(r.bias_in_epilogue || r.bias_by_kernel || r.activation_in_epilogue ||
                           r.activation_by_kernel || r.aux_in_epilogue ||
                           r.pre_activation_by_kernel);
              EXPECT_EQ(r.dgelu_in_epilogue + r.activation_grad_by_kernel, 1);
              if (r.dgelu_in_epilogue) {
                ++dgelu_routes;
                // cuBLASLt's aux is in D's dtype, its ld (our n) a multiple of 8; no beta·C, no
                // FP8.
                EXPECT_EQ(pre, r.d_dtype);
                EXPECT_EQ(n % 8, 0);
                EXPECT_FALSE(beta);
                EXPECT_TRUE(dgelu_input(input));
                // D = C, or fp32 D encoded once.
                EXPECT_EQ(r.encode_by_kernel, r.d_dtype != c);
              } else {
                // The kernel reads z in fp32 and is the one rounding into C.
                EXPECT_EQ(r.d_dtype, DType::fp32);
                EXPECT_FALSE(r.encode_by_kernel);
              }
              // A padded C (realigned rows) takes none of them.
              EXPECT_FALSE(route_writes_c_directly(r));
            }
            // DGELU is offered wherever its conditions hold, into C or into fp32 scratch.
            const bool can = dgelu_input(input) && !beta && n % 8 == 0;
            const int want = can ? (pre == c && gemm_direct_output(input, c) ? 1 : 0) +
                                       (pre == DType::fp32 && c != DType::fp32 ? 1 : 0)
                                 : 0;
            EXPECT_EQ(dgelu_routes, want);
            // The last route has no epilogue: it runs wherever cuBLASLt runs the inputs at all.
            EXPECT_TRUE(routes.back().activation_grad_by_kernel);
            EXPECT_FALSE(routes.back().dgelu_in_epilogue);
          }
  EXPECT_EQ(queries, 5 * 3 * 3 * 2 * 2);
}

TEST(cuda_gemm_routes, GradientRoutesForRepresentativeCalls) {
  // GPT-2's MLP dgrad in bf16: dy [*, 768] · W_projᵀ into the gelu input's gradient [*, 3072],
  // pre_activation bf16: DGELU straight into C first, the fp32 kernel route last.
  auto routes = gemm_routes(gradient_query(DType::bf16, DType::bf16, DType::bf16, false, 3072));
  ASSERT_EQ(routes.size(), 2u);
  EXPECT_EQ(routes[0].output, Output::direct);
  EXPECT_TRUE(routes[0].dgelu_in_epilogue);
  EXPECT_FALSE(routes[0].encode_by_kernel);
  EXPECT_EQ(routes[1].output, Output::fp32_epilogue);
  EXPECT_TRUE(routes[1].activation_grad_by_kernel);

  // An fp32 pre_activation with a bf16 C: DGELU into fp32 scratch (aux in D's dtype), then one
  // encode.
  routes = gemm_routes(gradient_query(DType::bf16, DType::bf16, DType::fp32, false, 3072));
  ASSERT_EQ(routes.size(), 2u);
  EXPECT_EQ(routes[0].output, Output::fp32_epilogue);
  EXPECT_TRUE(routes[0].dgelu_in_epilogue && routes[0].encode_by_kernel);
  EXPECT_TRUE(routes[1].activation_grad_by_kernel);

  // fp32 throughout: DGELU into C, else the kernel on C in place.
  routes = gemm_routes(gradient_query(DType::fp32, DType::fp32, DType::fp32, false, 64));
  ASSERT_EQ(routes.size(), 2u);
  EXPECT_TRUE(routes[0].dgelu_in_epilogue);
  EXPECT_EQ(routes[1].output, Output::direct);
  EXPECT_EQ(routes[1].d_dtype, DType::fp32);
  EXPECT_TRUE(routes[1].activation_grad_by_kernel);

  // The fallback alone: a misaligned aux ld (n % 8 != 0), beta != 0, a pre_activation in neither
  // C's dtype nor fp32's place, FP8 operands.
  for (const GemmRouteQuery& q :
       {gradient_query(DType::bf16, DType::bf16, DType::bf16, false, 30),
        gradient_query(DType::bf16, DType::bf16, DType::bf16, true, 3072),
        gradient_query(DType::bf16, DType::bf16, DType::fp16, false, 3072),
        gradient_query(DType::fp32, DType::bf16, DType::bf16, false, 3072),
        gradient_query(DType::fp8_e4m3, DType::bf16, DType::bf16, false, 3072)}) {
    routes = gemm_routes(q);
    ASSERT_EQ(routes.size(), 1u);
    EXPECT_TRUE(routes[0].activation_grad_by_kernel);
    EXPECT_EQ(routes[0].d_dtype, DType::fp32);
    EXPECT_EQ(routes[0].output, Output::fp32_epilogue);
  }

  // Without the activation gradient gemm_gradient's GEMM is gemm's: the same routes.
  GemmRouteQuery plain;
  plain.input = DType::bf16;
  plain.c = DType::bf16;
  plain.n = 3072;
  GemmRouteQuery beta_only = plain;
  beta_only.beta_nonzero = true;
  const auto a = gemm_routes(plain), b = gemm_routes(beta_only);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].output, b[i].output);
    EXPECT_FALSE(a[i].dgelu_in_epilogue || a[i].activation_grad_by_kernel);
  }
}

// supports(gemm_gradient, {A, B, C}) is supports(gemm, {A, B, C}) for every list of up to three
// dtypes, with and without FP8 inputs declared.
TEST(GemmSupported, GemmGradientAnswersAsGemm) {
  for (bool fp8 : {false, true}) {
    sdk::BackendCapabilities caps;
    for (DType t : {DType::fp32, DType::tf32, DType::bf16, DType::fp16})
      caps.gemm_inputs.push_back({t, true, ""});
    if (fp8)
      for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2}) caps.gemm_inputs.push_back({t, true, ""});
    int accepted = 0;
    std::vector<DType> d;
    auto rec = [&](auto& self, std::size_t depth) -> void {
      const bool gemm = gemm_supported(caps, sdk::GemmOp::gemm, d);
      EXPECT_EQ(gemm_supported(caps, sdk::GemmOp::gemm_gradient, d), gemm)
          << fp8 << " " << d.size();
      accepted += gemm;
      if (depth == 3) return;
      for (DType t : sdk::kAllDTypes) {
        d.push_back(t);
        self(self, depth + 1);
        d.pop_back();
      }
    };
    rec(rec, 0);
    EXPECT_GT(accepted, 0);
  }
}

}  // namespace
}  // namespace mixtrain::backend_cuda
