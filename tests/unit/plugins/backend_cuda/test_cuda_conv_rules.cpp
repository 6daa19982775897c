// The CUDA backend's convolution rules, the layer ops' argument checks and the layer norm
// backward's plan, on the host (no GPU, no cuDNN call): cuda_conv_rules.h (cuDNN dims/strides of
// a geometry, routes, plan-cache keys, the numerics policy on engines' numerical notes),
// cuda_layer_checks.h (BackendErrors naming op, tensor, dtype and shape before anything is
// enqueued) and cuda_layer_norm_plan.h (its route, partition, shared memory and scratch).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend_error_text.h"
#include "cuda_access.h"
#include "cuda_conv_plans.h"
#include "cuda_conv_rules.h"
#include "cuda_layer_checks.h"
#include "cuda_layer_norm_plan.h"
#include "mixtrain/sdk/error.h"

namespace {

using mixtrain::test::backend_error_of;

namespace conv = mixtrain::backend_cuda::conv;
namespace checks = mixtrain::backend_cuda::layer_checks;
namespace sdk = mixtrain::sdk;
using conv::DataType;
using conv::FilterLayout;
using conv::NumericalNote;
using mixtrain::backend_cuda::ConvPlans;
using sdk::DType;

int n(NumericalNote note) {
  return static_cast<int>(note);
}

sdk::Conv2dGeometry resnet_like() {
  sdk::Conv2dGeometry g;
  g.batch = 8;
  g.in_channels = 64;
  g.height = 16;
  g.width = 12;
  g.out_channels = 32;
  g.kernel_h = 3;
  g.kernel_w = 3;
  g.pad_h = g.pad_w = 1;
  return g;
}

// --- numerics policy
// -------------------------------------------------------------------------------

// The hint is due for the FP32-dw route of 16-bit operands on a fallback engine, the 16-bit dw
// route off; not for another op, an fp32 route, a mode-A engine or the option on.
TEST(cuda_conv_rules, TheFallbackWgradHintNamesTheOptionOnlyWhereItApplies) {
  const auto first = [](DType a, bool sixteen_bit_dw) {
    return conv::conv_routes(conv::ConvOp::backward_weights, a, a, DType::fp32, a, false,
                             FilterLayout::krsc, sixteen_bit_dw)
        .front();
  };
  const conv::Route fp32_dw = first(DType::bf16, false);
  ASSERT_EQ(fp32_dw.out, DataType::f32);
  const std::string hint =
      conv::wgrad_fallback_hint(conv::ConvOp::backward_weights, fp32_dw, true, false);
  EXPECT_NE(hint.find("backend.cuda.conv_wgrad_in_operand_dtype = true"), std::string::npos)
      << hint;
  EXPECT_NE(hint.find("bf16"), std::string::npos) << hint;
  EXPECT_EQ(conv::wgrad_fallback_hint(conv::ConvOp::backward_weights, fp32_dw, false, false), "");
  EXPECT_EQ(conv::wgrad_fallback_hint(conv::ConvOp::backward_weights, fp32_dw, true, true), "");
  EXPECT_EQ(conv::wgrad_fallback_hint(conv::ConvOp::backward_data, fp32_dw, true, false), "");
  EXPECT_EQ(conv::wgrad_fallback_hint(conv::ConvOp::backward_weights, first(DType::fp32, false),
                                      true, false),
            "");
  const conv::Route sixteen_bit_dw = first(DType::bf16, true);
  EXPECT_NE(sixteen_bit_dw.out, DataType::f32);
  EXPECT_EQ(conv::wgrad_fallback_hint(conv::ConvOp::backward_weights, sixteen_bit_dw, true, true),
            "");
}

TEST(cuda_conv_rules, Fp32ComputeOnFp32DataNeverTakesATensorCoreEngine) {
  const conv::NumericsPolicy strict{false, true, true};
  const std::vector<int> tc{n(NumericalNote::tensor_core)};
  EXPECT_FALSE(conv::engine_allowed(tc, strict));
  EXPECT_NE(conv::engine_refusal(tc, strict).find("TF32"), std::string::npos);
  // Notes in any order, among others.
  const std::vector<int> mixed{n(NumericalNote::winograd), n(NumericalNote::tensor_core)};
  EXPECT_FALSE(conv::engine_allowed(mixed, strict));
  EXPECT_TRUE(conv::engine_allowed(std::vector<int>{}, strict));
  EXPECT_TRUE(conv::engine_allowed(std::vector<int>{n(NumericalNote::fft)}, strict));
}

TEST(cuda_conv_rules, Tf32ComputeAndSixteenBitDataAllowTensorCores) {
  const std::vector<int> tc{n(NumericalNote::tensor_core)};
  EXPECT_TRUE(conv::engine_allowed(tc, {true, true, true}));    // compute tf32
  EXPECT_TRUE(conv::engine_allowed(tc, {false, false, true}));  // bf16 / fp16 data
}

TEST(cuda_conv_rules, DownConversionAndReducedPrecisionAccumulationAreNeverAllowed) {
  for (const conv::NumericsPolicy p :
       {conv::NumericsPolicy{true, true, false}, conv::NumericsPolicy{true, false, false}}) {
    EXPECT_FALSE(conv::engine_allowed(std::vector<int>{n(NumericalNote::down_convert_inputs)}, p));
    EXPECT_FALSE(
        conv::engine_allowed(std::vector<int>{n(NumericalNote::reduced_precision_reduction)}, p));
  }
}

TEST(cuda_conv_rules, NondeterministicEnginesOnlyInTheFallbackPass) {
  const std::vector<int> nd{n(NumericalNote::nondeterministic)};
  EXPECT_FALSE(conv::engine_allowed(nd, {false, true, true}));
  EXPECT_TRUE(conv::engine_allowed(nd, {false, true, false}));
}

TEST(cuda_conv_rules, EveryDeterministicPassComesBeforeAnyNondeterministicOne) {
  // A deterministic engine of the fallback heuristics beats a non-deterministic one of mode A.
  const auto passes = conv::search_passes();
  bool seen_nondeterministic = false;
  int deterministic_a = 0, deterministic_fallback = 0, nondeterministic = 0;
  for (const auto& p : passes) {
    if (!p.deterministic) {
      seen_nondeterministic = true;
      ++nondeterministic;
      continue;
    }
    EXPECT_FALSE(seen_nondeterministic) << "a deterministic pass after a non-deterministic one";
    (p.fallback_heuristics ? deterministic_fallback : deterministic_a) += 1;
  }
  EXPECT_EQ(deterministic_a, 1);
  EXPECT_EQ(deterministic_fallback, 1);
  EXPECT_EQ(nondeterministic, 2);
  EXPECT_FALSE(passes[0].fallback_heuristics);  // mode A first: the fallback list is queried lazily
  // The non-deterministic passes only retry what a deterministic pass refused for its determinism.
  for (const auto& p : passes) EXPECT_EQ(p.retry_only, !p.deterministic);
}

// deterministic_convolutions = false: mode A's list in its own order whatever the determinism,
// then the fallback list; no pass skips an engine a deterministic pass would have taken.
TEST(cuda_conv_rules, WithoutDeterminismModeAsOrderWins) {
  const auto passes = conv::search_passes(false);
  ASSERT_EQ(passes.size(), 2u);
  EXPECT_FALSE(passes[0].fallback_heuristics);
  EXPECT_TRUE(passes[1].fallback_heuristics);
  for (const auto& p : passes) {
    EXPECT_FALSE(p.deterministic);
    EXPECT_FALSE(p.retry_only);
  }
  // Such a pass takes a non-deterministic Tensor Core engine on 16-bit data, and still refuses
  // what the numerics policy forbids.
  const std::vector<int> nd_tc{n(NumericalNote::nondeterministic), n(NumericalNote::tensor_core)};
  EXPECT_TRUE(conv::engine_allowed(nd_tc, {false, false, false}));
  const std::vector<int> narrow{n(NumericalNote::reduced_precision_reduction)};
  EXPECT_FALSE(conv::engine_allowed(narrow, {false, false, false}));
}

// A plan that adds into its output (the accumulating dgrad's beta = 1) searches mode A alone, in
// the same order with or without determinism: a fallback engine once overwrote the sum.
TEST(cuda_conv_rules, APlanAddingIntoItsOutputSearchesModeAAlone) {
  for (bool deterministic_first : {true, false}) {
    const auto all = conv::search_passes(deterministic_first);
    const auto adding = conv::search_passes(deterministic_first, true);
    std::vector<conv::SearchPass> mode_a;
    for (const auto& p : all)
      if (!p.fallback_heuristics) mode_a.push_back(p);
    ASSERT_FALSE(adding.empty());
    ASSERT_EQ(adding.size(), mode_a.size());
    for (std::size_t i = 0; i < adding.size(); ++i) {
      EXPECT_FALSE(adding[i].fallback_heuristics);
      EXPECT_EQ(adding[i].deterministic, mode_a[i].deterministic);
      EXPECT_EQ(adding[i].retry_only, mode_a[i].retry_only);
    }
    EXPECT_LT(adding.size(), all.size());
  }
}

// conv_autotune's candidates: in the search's order, each engine once, up to N; with
// deterministic_first, no non-deterministic engine once a deterministic pass has given one, but
// the retry passes' engines where none did; without it, every pass's; a runtime-compiled engine
// only first.
TEST(cuda_conv_rules, AutotuneCandidatesKeepTheSearchOrderAndItsDeterminism) {
  const auto passes = conv::search_passes(true);  // A det, fallback det, A retry, fallback retry
  conv::AutotuneCandidates tune(3, true);
  EXPECT_TRUE(tune.wants(passes[0], "engine 1"));
  tune.take(passes[0], "engine 1");
  EXPECT_FALSE(tune.wants(passes[1], "engine 1")) << "the fallback list repeats an engine";
  tune.take(passes[1], "engine 1");
  EXPECT_EQ(tune.size(), 1u);
  tune.take(passes[1], "engine 7");
  EXPECT_FALSE(tune.wants(passes[2], "engine 9")) << "a non-deterministic engine beside them";
  tune.take(passes[2], "engine 9");
  EXPECT_EQ(tune.size(), 2u);
  EXPECT_FALSE(tune.full());
  tune.take(passes[1], "engine 8");
  EXPECT_TRUE(tune.full());
  EXPECT_FALSE(tune.wants(passes[0], "engine 2")) << "N reached";

  // No deterministic engine anywhere: the retry passes' engines compete among themselves.
  conv::AutotuneCandidates fallback(4, true);
  fallback.take(passes[2], "engine 3");
  EXPECT_TRUE(fallback.wants(passes[3], "engine 4"));

  // deterministic_convolutions = false: every pass's engines.
  const auto free_passes = conv::search_passes(false);
  conv::AutotuneCandidates any(2, false);
  any.take(free_passes[0], "engine 5");
  EXPECT_TRUE(any.wants(free_passes[1], "engine 6"));
  any.take(free_passes[1], "engine 6");
  EXPECT_TRUE(any.full());

  // An engine cuDNN compiles at run time: the first candidate only.
  conv::AutotuneCandidates compiled(4, true);
  EXPECT_TRUE(compiled.wants(passes[0], "engine 30", true));
  compiled.take(passes[0], "engine 30");
  EXPECT_FALSE(compiled.wants(passes[0], "engine 31", true));
  EXPECT_TRUE(compiled.wants(passes[0], "engine 32", false));

  // N below 2 asks for one: the first plan the search finds, as without autotuning.
  conv::AutotuneCandidates one(0, true);
  one.take(passes[0], "engine 1");
  EXPECT_TRUE(one.full());
}

// --- descriptors
// -----------------------------------------------------------------------------------

// Autotuning without the memory for the largest candidate's workspace times those that fit: the
// plan itself (candidate 0) always stays, the others over the limit go, in order.
TEST(cuda_conv_rules, CandidatesOverTheWorkspaceAtHandAreDroppedAndThePlanStays) {
  ConvPlans::Plan plan;
  plan.workspace = 1 << 20;
  for (std::int64_t w : {std::int64_t{0}, std::int64_t{1} << 30, std::int64_t{1} << 20,
                         (std::int64_t{1} << 20) + 1, std::int64_t{4096}}) {
    plan.untimed.push_back(std::make_unique<ConvPlans::Plan>());
    plan.untimed.back()->workspace = w;
    plan.untimed.back()->engine = "engine " + std::to_string(w);
  }
  EXPECT_EQ(plan.tuning_workspace(), std::int64_t{1} << 30);
  EXPECT_EQ(ConvPlans::drop_candidates_over(plan, plan.workspace), 2u);
  ASSERT_EQ(plan.untimed.size(), 3u);
  EXPECT_EQ(plan.untimed[0]->workspace, 0);
  EXPECT_EQ(plan.untimed[1]->workspace, std::int64_t{1} << 20);
  EXPECT_EQ(plan.untimed[2]->workspace, 4096);
  EXPECT_EQ(plan.tuning_workspace(), std::int64_t{1} << 20);
  EXPECT_EQ(ConvPlans::drop_candidates_over(plan, 0), 2u);
  EXPECT_EQ(plan.workspace, std::int64_t{1} << 20);  // the plan itself is never dropped
}

TEST(cuda_conv_rules, ImagesAreNchwDimsWithNhwcStrides) {
  const auto t = conv::image_dims(2, 3, 5, 7);
  EXPECT_EQ(t.dims, (std::array<std::int64_t, 4>{2, 3, 5, 7}));
  // [N, H, W, C] in memory: c moves by 1, w by C, h by W*C, n by H*W*C.
  EXPECT_EQ(t.strides, (std::array<std::int64_t, 4>{105, 1, 21, 3}));
}

TEST(cuda_conv_rules, FiltersAreKcrsAsStoredOrTheirChannelsLastCopy) {
  auto g = resnet_like();
  g.groups = 4;  // C/g = 16
  const auto kcrs = conv::filter_dims(g, FilterLayout::kcrs);
  EXPECT_EQ(kcrs.dims, (std::array<std::int64_t, 4>{32, 16, 3, 3}));
  EXPECT_EQ(kcrs.strides, (std::array<std::int64_t, 4>{144, 9, 3, 1}));
  const auto krsc = conv::filter_dims(g, FilterLayout::krsc);
  EXPECT_EQ(krsc.dims, kcrs.dims);
  EXPECT_EQ(krsc.strides, (std::array<std::int64_t, 4>{144, 1, 48, 16}));
}

TEST(cuda_conv_rules, ConvParamsArePytorchsSymmetricPadding) {
  auto g = resnet_like();
  g.stride_h = 2;
  g.dilation_w = 3;
  g.pad_w = 2;
  const auto p = conv::conv_params(g);
  EXPECT_EQ(p.pre_padding, (std::array<std::int64_t, 2>{1, 2}));
  EXPECT_EQ(p.post_padding, (std::array<std::int64_t, 2>{1, 2}));
  EXPECT_EQ(p.stride, (std::array<std::int64_t, 2>{2, 1}));
  EXPECT_EQ(p.dilation, (std::array<std::int64_t, 2>{1, 3}));
}

TEST(cuda_conv_rules, AlignmentIsTheLargestCommonPowerOfTwoUpTo16) {
  alignas(256) static char buf[512];
  EXPECT_EQ(conv::common_alignment({buf, buf + 256, nullptr}), 16);
  EXPECT_EQ(conv::common_alignment({buf, buf + 8}), 8);
  EXPECT_EQ(conv::common_alignment({buf + 2, buf + 16}), 2);
  EXPECT_EQ(conv::common_alignment({buf + 3}), 1);
}

// --- routes
// ----------------------------------------------------------------------------------------

TEST(cuda_conv_rules, Fp32RoutesNeverAllowTf32UnlessAsked) {
  const auto strict = conv::conv_routes(conv::ConvOp::forward, DType::fp32, DType::fp32,
                                        DType::fp32, DType::fp32, true, FilterLayout::krsc);
  ASSERT_EQ(strict.size(), 1u);
  EXPECT_EQ(strict[0].io, DataType::f32);
  EXPECT_FALSE(strict[0].tensor_cores);
  EXPECT_TRUE(strict[0].out_direct);  // fp32 y: cuDNN writes it, the bias is added in place
  for (auto [a, b, compute] : {std::tuple{DType::fp32, DType::fp32, DType::tf32},
                               std::tuple{DType::tf32, DType::fp32, DType::fp32},
                               std::tuple{DType::fp32, DType::tf32, DType::fp32}}) {
    const auto r = conv::conv_routes(conv::ConvOp::backward_data, a, b, DType::fp32, compute, false,
                                     FilterLayout::krsc);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_TRUE(r[0].tensor_cores);
  }
}

TEST(cuda_conv_rules, SixteenBitOperandsGoNativeThenDecodedExactly) {
  const auto r = conv::conv_routes(conv::ConvOp::forward, DType::bf16, DType::bf16, DType::bf16,
                                   DType::fp32, false, FilterLayout::krsc);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].io, DataType::bf16);
  EXPECT_EQ(r[0].out, DataType::bf16);
  EXPECT_TRUE(r[0].out_direct);
  EXPECT_TRUE(r[0].tensor_cores);
  EXPECT_EQ(r[1].io, DataType::f32);
  EXPECT_TRUE(r[1].decode_a && r[1].decode_b);
  EXPECT_TRUE(r[1].tensor_cores);  // decoded bf16 values are exact in TF32
  // A bias with a 16-bit y: FP32 scratch, then + bias and one rounding.
  const auto biased = conv::conv_routes(conv::ConvOp::forward, DType::fp16, DType::fp16,
                                        DType::fp16, DType::fp32, true, FilterLayout::krsc);
  EXPECT_EQ(biased[0].io, DataType::f16);
  EXPECT_EQ(biased[0].out, DataType::f32);
  EXPECT_FALSE(biased[0].out_direct);
  // fp32 y from fp16 operands: cuDNN writes fp32 directly.
  const auto wide = conv::conv_routes(conv::ConvOp::backward_data, DType::fp16, DType::fp16,
                                      DType::fp32, DType::fp32, false, FilterLayout::krsc);
  EXPECT_EQ(wide[0].out, DataType::f32);
  EXPECT_TRUE(wide[0].out_direct);
}

TEST(cuda_conv_rules, MixedOperandsDecodeAndStayStrictWhenOneIsFp32Data) {
  const auto r = conv::conv_routes(conv::ConvOp::forward, DType::bf16, DType::fp32, DType::fp16,
                                   DType::fp32, false, FilterLayout::kcrs);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].decode_a);
  EXPECT_FALSE(r[0].decode_b);
  EXPECT_FALSE(r[0].tensor_cores);
  EXPECT_FALSE(r[0].out_direct);
  const auto both16 = conv::conv_routes(conv::ConvOp::forward, DType::bf16, DType::fp16,
                                        DType::fp32, DType::fp32, false, FilterLayout::kcrs);
  EXPECT_TRUE(both16[0].tensor_cores);
}

TEST(cuda_conv_rules, WeightGradientIsWrittenDirectlyOnlyInKcrsWithoutAccumulating) {
  auto direct = [](FilterLayout l, bool acc) {
    return conv::conv_routes(conv::ConvOp::backward_weights, DType::fp32, DType::fp32, DType::fp32,
                             DType::fp32, acc, l)[0]
        .out_direct;
  };
  EXPECT_TRUE(direct(FilterLayout::kcrs, false));
  EXPECT_FALSE(direct(FilterLayout::kcrs, true));
  EXPECT_FALSE(direct(FilterLayout::krsc, false));
}

// conv_wgrad_in_operand_dtype: for 16-bit operands of one dtype, a route on which cuDNN writes dw
// in that dtype into scratch comes first (its own plan key: the output dtype differs), then the
// FP32-output routes as without it; fp32 or mixed operands, and the other ops, are unchanged.
TEST(cuda_conv_rules, WeightGradientInTheOperandDtypeIsTriedFirstOnlyWhereAsked) {
  const auto g = resnet_like();
  for (DType t : {DType::bf16, DType::fp16})
    for (bool acc : {false, true})
      for (FilterLayout l : {FilterLayout::krsc, FilterLayout::kcrs}) {
        const auto plain = conv::conv_routes(conv::ConvOp::backward_weights, t, t, DType::fp32,
                                             DType::fp32, acc, l);
        const auto asked = conv::conv_routes(conv::ConvOp::backward_weights, t, t, DType::fp32,
                                             DType::fp32, acc, l, true);
        ASSERT_EQ(asked.size(), plain.size() + 1);
        const DataType io = t == DType::bf16 ? DataType::bf16 : DataType::f16;
        EXPECT_EQ(asked[0].io, io);
        EXPECT_EQ(asked[0].out, io);
        EXPECT_FALSE(asked[0].out_direct);  // the finish decodes it into the fp32 dw
        EXPECT_FALSE(asked[0].decode_a || asked[0].decode_b);
        EXPECT_TRUE(asked[0].tensor_cores);
        EXPECT_TRUE(std::equal(plain.begin(), plain.end(), asked.begin() + 1));
        for (const auto& r : plain) EXPECT_EQ(r.out, DataType::f32);
        const auto k16 = conv::plan_key(conv::ConvOp::backward_weights, g, asked[0], l, 16);
        const auto k32 = conv::plan_key(conv::ConvOp::backward_weights, g, asked[1], l, 16);
        EXPECT_NE(k16, k32);
        EXPECT_NE(conv::key_text(k16), conv::key_text(k32));
      }
  for (auto [a, b] : {std::pair{DType::fp32, DType::fp32}, std::pair{DType::bf16, DType::fp16}})
    EXPECT_EQ(conv::conv_routes(conv::ConvOp::backward_weights, a, b, DType::fp32, DType::fp32,
                                false, FilterLayout::krsc, true),
              conv::conv_routes(conv::ConvOp::backward_weights, a, b, DType::fp32, DType::fp32,
                                false, FilterLayout::krsc));
  for (auto op : {conv::ConvOp::forward, conv::ConvOp::backward_data})
    EXPECT_EQ(conv::conv_routes(op, DType::bf16, DType::bf16, DType::bf16, DType::fp32, false,
                                FilterLayout::krsc, true),
              conv::conv_routes(op, DType::bf16, DType::bf16, DType::bf16, DType::fp32, false,
                                FilterLayout::krsc));
}

// The accumulating data gradient (convolution 1.1): per operand route, cuDNN adding into the fp32
// dx itself (beta = 1, its own plan key), then its output into scratch and one add: the operands'
// 16-bit dtype for 16-bit operands (the overwriting dgrad's plan), fp32 for fp32 ones.
TEST(cuda_conv_rules, AccumulatingDataGradientTriesBetaOneThenScratchAndAddPerOperandRoute) {
  const auto g = resnet_like();
  const auto r = conv::conv_routes(conv::ConvOp::backward_data, DType::bf16, DType::bf16,
                                   DType::fp32, DType::fp32, true, FilterLayout::krsc);
  ASSERT_EQ(r.size(), 4u);
  const DataType io[] = {DataType::bf16, DataType::bf16, DataType::f32, DataType::f32};
  for (std::size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].io, io[i]) << i;
    EXPECT_EQ(r[i].out, i == 1 ? DataType::bf16 : DataType::f32) << i;
    EXPECT_TRUE(r[i].accumulate) << i;
    EXPECT_EQ(r[i].out_direct, i % 2 == 0) << i;
    EXPECT_EQ(r[i].decode_a, i >= 2) << i;
    const auto key = conv::plan_key(conv::ConvOp::backward_data, g, r[i], FilterLayout::krsc, 16);
    EXPECT_EQ(key.beta_one, i % 2 == 0) << i;
    EXPECT_EQ(conv::key_text(key).find("beta 1") != std::string::npos, i % 2 == 0)
        << conv::key_text(key);
  }
  EXPECT_NE(conv::route_text(r[0]).find("(beta 1)"), std::string::npos) << conv::route_text(r[0]);
  EXPECT_NE(conv::route_text(r[1]).find("via scratch + add"), std::string::npos)
      << conv::route_text(r[1]);
  // The 16-bit scratch route's plan is the overwriting dgrad's into bf16 (the step's usual dgrad):
  // one cached plan for both.
  const auto usual = conv::conv_routes(conv::ConvOp::backward_data, DType::bf16, DType::bf16,
                                       DType::bf16, DType::fp32, false, FilterLayout::krsc);
  EXPECT_EQ(conv::plan_key(conv::ConvOp::backward_data, g, r[1], FilterLayout::krsc, 16),
            conv::plan_key(conv::ConvOp::backward_data, g, usual[0], FilterLayout::krsc, 16));
  EXPECT_FALSE(usual[0].accumulate);
  // Decoded to fp32, the scratch is fp32.
  EXPECT_EQ(r[3].out, DataType::f32);
  // A 16-bit sum (dx bf16): never beta 1 (cuDNN would add into bf16 storage); each operand route
  // writes its scratch in its own dtype and one add rounds the sum once into dx.
  const auto sum16 = conv::conv_routes(conv::ConvOp::backward_data, DType::bf16, DType::bf16,
                                       DType::bf16, DType::fp32, true, FilterLayout::krsc);
  ASSERT_EQ(sum16.size(), 2u);
  for (std::size_t i = 0; i < sum16.size(); ++i) {
    EXPECT_TRUE(sum16[i].accumulate) << i;
    EXPECT_FALSE(sum16[i].out_direct) << i;
    EXPECT_EQ(sum16[i].out, sum16[i].io) << i;
    EXPECT_FALSE(
        conv::plan_key(conv::ConvOp::backward_data, g, sum16[i], FilterLayout::krsc, 16).beta_one)
        << i;
  }
  // fp32 operands: as stored, beta 1 then scratch.
  const auto f32 = conv::conv_routes(conv::ConvOp::backward_data, DType::fp32, DType::fp32,
                                     DType::fp32, DType::fp32, true, FilterLayout::kcrs);
  ASSERT_EQ(f32.size(), 2u);
  EXPECT_TRUE(f32[0].out_direct && f32[0].accumulate && !f32[0].tensor_cores);
  EXPECT_TRUE(!f32[1].out_direct && f32[1].accumulate && f32[1].out == DataType::f32);
  // A forward's bias is not an accumulation.
  for (const auto& f : conv::conv_routes(conv::ConvOp::forward, DType::bf16, DType::bf16,
                                         DType::fp32, DType::fp32, true, FilterLayout::krsc))
    EXPECT_FALSE(f.accumulate);
}

// --- plan keys
// -------------------------------------------------------------------------------------

TEST(cuda_conv_rules, PlanKeysDifferInEveryFieldAPlanDependsOn) {
  const auto g = resnet_like();
  const conv::Route route{DataType::bf16, false, false, DataType::bf16, true, true};
  const auto base = conv::plan_key(conv::ConvOp::forward, g, route, FilterLayout::krsc, 16);
  EXPECT_EQ(base, conv::plan_key(conv::ConvOp::forward, g, route, FilterLayout::krsc, 16));
  EXPECT_EQ(
      conv::PlanKeyHash{}(base),
      conv::PlanKeyHash{}(conv::plan_key(conv::ConvOp::forward, g, route, FilterLayout::krsc, 16)));
  std::vector<conv::PlanKey> variants;
  variants.push_back(conv::plan_key(conv::ConvOp::backward_data, g, route, FilterLayout::krsc, 16));
  variants.push_back(conv::plan_key(conv::ConvOp::forward, g, route, FilterLayout::kcrs, 16));
  variants.push_back(conv::plan_key(conv::ConvOp::forward, g, route, FilterLayout::krsc, 8));
  auto r2 = route;
  r2.io = DataType::f16;
  variants.push_back(conv::plan_key(conv::ConvOp::forward, g, r2, FilterLayout::krsc, 16));
  r2 = route;
  r2.out = DataType::f32;
  variants.push_back(conv::plan_key(conv::ConvOp::forward, g, r2, FilterLayout::krsc, 16));
  r2 = route;
  r2.tensor_cores = false;
  variants.push_back(conv::plan_key(conv::ConvOp::forward, g, r2, FilterLayout::krsc, 16));
  r2 = route;
  r2.accumulate = true;  // direct: cuDNN's beta = 1
  variants.push_back(conv::plan_key(conv::ConvOp::forward, g, r2, FilterLayout::krsc, 16));
  for (int field = 0; field < 14; ++field) {
    auto h = g;
    std::int64_t* f[] = {&h.batch,    &h.in_channels, &h.height,     &h.width,    &h.out_channels,
                         &h.kernel_h, &h.kernel_w,    &h.stride_h,   &h.stride_w, &h.pad_h,
                         &h.pad_w,    &h.dilation_h,  &h.dilation_w, &h.groups};
    *f[field] += field == 13 ? 1 : 2;
    variants.push_back(conv::plan_key(conv::ConvOp::forward, h, route, FilterLayout::krsc, 16));
  }
  std::unordered_set<std::size_t> hashes{conv::PlanKeyHash{}(base)};
  for (const auto& v : variants) {
    EXPECT_NE(v, base) << conv::key_text(v);
    hashes.insert(conv::PlanKeyHash{}(v));
  }
  EXPECT_EQ(hashes.size(), variants.size() + 1) << "hash collisions among the variants";
  // The route's decode flags do not change what cuDNN sees: same key.
  auto decoded = route;
  decoded.decode_a = true;
  EXPECT_EQ(conv::plan_key(conv::ConvOp::forward, g, decoded, FilterLayout::krsc, 16), base);
}

#ifdef MIXTRAIN_HAVE_CUDNN
// cuDNN checks a convolution operation's tensors, descriptor and shapes on the host, before any
// device is involved: every key the routes can make passes them, over the geometries a CNN has
// (3x3, 1x1, the 7x7/2 stem on 3 channels, grouped, depthwise, strided with an odd side, dilated,
// rectangular), every op, filter layout, dtype pair and beta, at each pointer alignment. At
// alignment 2 an fp32 tensor is declared at its own 4 (cuDNN refuses an fp32 tensor below it:
// such plans were declined whenever a 16-bit operand started 2 bytes past 4).
TEST(cuda_conv_plans, EveryRouteKeyPassesCudnnsHostChecks) {
  struct G {
    std::int64_t n, c, h, w, k, r, s, stride, pad, dilation, groups;
  };
  const G geometries[] = {
      {2, 16, 9, 9, 24, 3, 3, 1, 1, 1, 1},  {2, 32, 8, 8, 16, 1, 1, 1, 0, 1, 1},
      {2, 3, 20, 20, 16, 7, 7, 2, 3, 1, 1}, {2, 16, 7, 7, 8, 3, 3, 1, 1, 1, 4},
      {2, 16, 7, 7, 16, 3, 3, 1, 1, 1, 16}, {2, 8, 10, 10, 8, 3, 3, 2, 1, 1, 1},
      {1, 8, 12, 12, 8, 3, 3, 1, 2, 2, 1},  {2, 64, 14, 14, 128, 1, 1, 2, 0, 1, 1},
      {1, 4, 9, 13, 4, 3, 5, 1, 0, 1, 1}};
  int keys = 0;
  for (const G& x : geometries) {
    sdk::Conv2dGeometry g;
    g.batch = x.n;
    g.in_channels = x.c;
    g.height = x.h;
    g.width = x.w;
    g.out_channels = x.k;
    g.kernel_h = x.r;
    g.kernel_w = x.s;
    g.stride_h = g.stride_w = x.stride;
    g.pad_h = g.pad_w = x.pad;
    g.dilation_h = g.dilation_w = x.dilation;
    g.groups = x.groups;
    for (auto op :
         {conv::ConvOp::forward, conv::ConvOp::backward_data, conv::ConvOp::backward_weights})
      for (FilterLayout layout : {FilterLayout::krsc, FilterLayout::kcrs})
        for (DataType io : {DataType::f32, DataType::bf16, DataType::f16})
          for (DataType out : {DataType::f32, io})
            for (bool beta_one : {false, true})
              for (std::int64_t alignment : {16, 4, 2}) {
                if (beta_one && op != conv::ConvOp::backward_data) continue;
                conv::Route route;
                route.io = io;
                route.out = out;
                route.tensor_cores = io != DataType::f32;
                route.accumulate = beta_one;
                const auto key = conv::plan_key(op, g, route, layout, alignment);
                ++keys;
                EXPECT_EQ(mixtrain::backend_cuda::ConvPlans::host_check(key), "")
                    << conv::key_text(key);
              }
  }
  EXPECT_EQ(keys, 9 * 144);  // per geometry: (forward + wgrad + dgrad's two betas) x 36
}
#endif  // MIXTRAIN_HAVE_CUDNN

// --- argument checks
// -------------------------------------------------------------------------------

// A view that is never dereferenced: the checks look at dtype, shape and address only.
sdk::TensorView fake(DType dt, sdk::Shape shape, std::uintptr_t address) {
  return {reinterpret_cast<void*>(address), dt, shape};
}

TEST(cuda_layer_checks, ConvShapeMismatchNamesOpTensorDtypeAndShape) {
  const auto g = resnet_like();
  sdk::Conv2dForwardArgs a;
  a.geometry = g;
  a.x = {fake(DType::bf16, {8, 16, 12, 64}, 0x10000), false, 1.0f};
  a.w = {fake(DType::bf16, {32, 64, 3, 3}, 0x200000), false, 1.0f};
  a.y = fake(DType::bf16, {8, 16, 12, 32}, 0x300000);
  EXPECT_NO_THROW(checks::conv_forward(a));
  a.x.view = fake(DType::bf16, {8, 64, 16, 12}, 0x10000);  // channels-first by mistake
  const std::string e = backend_error_of([&] { checks::conv_forward(a); });
  EXPECT_NE(e.find("backend_cuda.conv2d_forward"), std::string::npos) << e;
  EXPECT_NE(e.find("x is bf16 [8, 64, 16, 12]"), std::string::npos) << e;
  EXPECT_NE(e.find("[N, H, W, C] = [8, 16, 12, 64]"), std::string::npos) << e;
}

TEST(cuda_layer_checks, ConvRefusesFp8AndBadGeometryBeforeLaunching) {
  auto g = resnet_like();
  sdk::Conv2dBackwardDataArgs a;
  a.geometry = g;
  a.dy = {fake(DType::fp8_e4m3, {8, 16, 12, 32}, 0x10000), false, 0.5f};
  a.w = {fake(DType::bf16, {32, 64, 3, 3}, 0x200000), false, 1.0f};
  a.dx = fake(DType::bf16, {8, 16, 12, 64}, 0x300000);
  std::string e = backend_error_of([&] { checks::conv_backward_data(a); });
  EXPECT_NE(e.find("backend_cuda.conv2d_backward_data: dy is fp8_e4m3"), std::string::npos) << e;
  a.dy.view.dtype = DType::bf16;
  EXPECT_NO_THROW(checks::conv_backward_data(a));
  a.geometry.groups = 3;
  e = backend_error_of([&] { checks::conv_backward_data(a); });
  EXPECT_NE(e.find("groups = 3 must divide"), std::string::npos) << e;
  a.geometry = g;
  a.compute = DType::bf16;
  e = backend_error_of([&] { checks::conv_backward_data(a); });
  EXPECT_NE(e.find("compute = bf16"), std::string::npos) << e;
}

// conv2d_workspace_bytes' query is checked as the call it describes: fp8 operands, a non-float
// output, an accumulate into neither fp32 nor dy's 16-bit dtype and an activation past 2^31
// elements are refused before any plan is built, naming the query's field.
TEST(cuda_layer_checks, AWorkspaceQueryIsCheckedAsItsCall) {
  sdk::Conv2dWorkspaceQuery q;
  q.op = sdk::ConvolutionOp::conv2d_forward;
  q.geometry = resnet_like();
  q.a = q.b = q.out = DType::bf16;
  EXPECT_NO_THROW(checks::conv_workspace_query(q));
  q.a = DType::fp8_e4m3;
  std::string e = backend_error_of([&] { checks::conv_workspace_query(q); });
  EXPECT_NE(e.find("backend_cuda.conv2d_workspace_bytes: query.a is fp8_e4m3"), std::string::npos)
      << e;
  q.a = DType::bf16;
  q.out = DType::int32;
  e = backend_error_of([&] { checks::conv_workspace_query(q); });
  EXPECT_NE(e.find("query.out is int32"), std::string::npos) << e;
  q.op = sdk::ConvolutionOp::conv2d_backward_weights;  // dw is fp32 whatever the query's out
  EXPECT_NO_THROW(checks::conv_workspace_query(q));
  q.op = sdk::ConvolutionOp::conv2d_backward_data_accumulate;
  q.out = DType::fp32;
  EXPECT_NO_THROW(checks::conv_workspace_query(q));
  q.out = DType::bf16;
  EXPECT_NO_THROW(checks::conv_workspace_query(q));
  q.out = DType::fp16;
  e = backend_error_of([&] { checks::conv_workspace_query(q); });
  EXPECT_NE(e.find("query.out is fp16 with dy bf16"), std::string::npos) << e;
  q.out = DType::fp32;
  q.geometry.batch = 1 << 20;
  e = backend_error_of([&] { checks::conv_workspace_query(q); });
  EXPECT_NE(e.find("more than 2^31 - 1 elements"), std::string::npos) << e;
  // A query has no tensors to bound its products: 2^16 in each of N, H, W, C and K makes both
  // activations 2^64 elements, which unchecked int64 products wrap to 0.
  q.geometry.batch = q.geometry.height = q.geometry.width = q.geometry.in_channels =
      q.geometry.out_channels = 1 << 16;
  q.geometry.kernel_h = q.geometry.kernel_w = 1;
  q.geometry.pad_h = q.geometry.pad_w = 0;
  e = backend_error_of([&] { checks::conv_workspace_query(q); });
  EXPECT_NE(e.find("more than 2^31 - 1 elements"), std::string::npos) << e;
}

// An FP32 sum, or a 16-bit sum of dy's dtype (model.fp32_gradient_sums = false); any other dx is
// refused, naming it.
TEST(cuda_layer_checks, AccumulatingDataGradientAddsIntoAnFp32DxOrA16BitSumOfDysDtype) {
  const auto g = resnet_like();
  sdk::Conv2dBackwardDataArgs a;
  a.geometry = g;
  a.dy = {fake(DType::bf16, {8, 16, 12, 32}, 0x10000), false, 1.0f};
  a.w = {fake(DType::bf16, {32, 64, 3, 3}, 0x200000), false, 1.0f};
  a.dx = fake(DType::fp32, {8, 16, 12, 64}, 0x300000);
  EXPECT_NO_THROW(checks::conv_backward_data_accumulate(a));
  a.dx.dtype = DType::bf16;
  EXPECT_NO_THROW(checks::conv_backward_data_accumulate(a));
  a.dx.dtype = DType::fp16;
  std::string e = backend_error_of([&] { checks::conv_backward_data_accumulate(a); });
  EXPECT_NE(e.find("conv2d_backward_data_accumulate"), std::string::npos) << e;
  EXPECT_NE(e.find("dx"), std::string::npos) << e;
  a.dx.dtype = DType::fp32;
  a.dy.view.dtype = DType::fp8_e4m3;
  e = backend_error_of([&] { checks::conv_backward_data_accumulate(a); });
  EXPECT_NE(e.find("backend_cuda.conv2d_backward_data_accumulate: dy is fp8_e4m3"),
            std::string::npos)
      << e;
  a.dy.view.dtype = DType::bf16;
  a.dx = fake(DType::fp32, {8, 16, 12, 64}, 0x10000);  // on dy
  e = backend_error_of([&] { checks::conv_backward_data_accumulate(a); });
  EXPECT_NE(e.find("dx"), std::string::npos) << e;
}

TEST(cuda_layer_checks, WeightGradientMustBeFp32InPytorchLayout) {
  const auto g = resnet_like();
  sdk::Conv2dBackwardWeightsArgs a;
  a.geometry = g;
  a.x = {fake(DType::fp16, {8, 16, 12, 64}, 0x10000), false, 1.0f};
  a.dy = {fake(DType::fp16, {8, 16, 12, 32}, 0x200000), false, 1.0f};
  a.dw = fake(DType::fp32, {32, 64, 3, 3}, 0x300000);
  a.dbias = fake(DType::fp32, {32}, 0x400000);
  EXPECT_NO_THROW(checks::conv_backward_weights(a));
  a.dw = fake(DType::fp32, {32, 3, 3, 64}, 0x300000);
  std::string e = backend_error_of([&] { checks::conv_backward_weights(a); });
  EXPECT_NE(e.find("dw is fp32 [32, 3, 3, 64]"), std::string::npos) << e;
  EXPECT_NE(e.find("[O, C/groups, KH, KW]"), std::string::npos) << e;
  a.dw = fake(DType::bf16, {32, 64, 3, 3}, 0x300000);
  e = backend_error_of([&] { checks::conv_backward_weights(a); });
  EXPECT_NE(e.find("dw"), std::string::npos) << e;
  EXPECT_NE(e.find("bf16"), std::string::npos) << e;
}

TEST(cuda_layer_checks, PoolingPermuteAndBatchNormChecks) {
  sdk::Pool2dGeometry p;
  p.batch = 2;
  p.channels = 5;
  p.height = p.width = 7;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  const auto x = fake(DType::fp16, {2, 7, 7, 5}, 0x10000);
  const auto y = fake(DType::fp16, {2, 4, 4, 5}, 0x20000);
  EXPECT_NO_THROW(checks::pool_forward(p, x, y, {}, 0));
  std::string e = backend_error_of([&] {
    checks::pool_forward(p, x, fake(DType::bf16, {2, 4, 4, 5}, 0x20000), {}, 0);
  });
  EXPECT_NE(e.find("backend_cuda.pool2d_forward"), std::string::npos) << e;
  EXPECT_NE(e.find("y is bf16 [2, 4, 4, 5]"), std::string::npos) << e;
  e = backend_error_of(
      [&] { checks::pool_forward(p, x, y, fake(DType::int32, {10}, 0x30000), 160); });
  EXPECT_NE(e.find("160 bytes are needed"), std::string::npos) << e;
  p.pad_h = 2;
  e = backend_error_of([&] { checks::pool_forward(p, x, y, {}, 0); });
  EXPECT_NE(e.find("more than half the kernel"), std::string::npos) << e;

  // The permutes and batch norm run the SDK's shared checks only.
  const sdk::BackendArgumentChecks& shared = mixtrain::backend_cuda::checks();
  e = backend_error_of([&] {
    shared.channel_permute("to_channels_last", fake(DType::fp32, {2, 3, 4, 5}, 0x10000), 3, 4, 6,
                           fake(DType::bf16, {120}, 0x20000));
  });
  EXPECT_NE(e.find("backend_cuda.to_channels_last"), std::string::npos) << e;
  EXPECT_NE(e.find("not a whole number of 3x4x6 images"), std::string::npos) << e;
  EXPECT_EQ(shared.channel_permute("to_channels_last", fake(DType::fp32, {2, 3, 4, 5}, 0x10000), 3,
                                   4, 5, fake(DType::bf16, {120}, 0x20000)),
            2);

  const sdk::BatchNormShape s{70, 6, 1e-5f, true};
  const auto bx = fake(DType::bf16, {2, 5, 7, 6}, 0x10000);
  const auto mean = fake(DType::fp32, {6}, 0x30000), var = fake(DType::fp32, {6}, 0x40000);
  e = backend_error_of([&] {
    shared.batchnorm_forward_training(bx, {}, {}, s, fake(DType::bf16, {70, 5}, 0x20000), mean, var,
                                      {}, {}, {}, 48);
  });
  EXPECT_NE(e.find("backend_cuda.batchnorm_forward_training"), std::string::npos) << e;
  EXPECT_NE(e.find("y is bf16 [70, 5]"), std::string::npos) << e;
  e = backend_error_of([&] {
    shared.batchnorm_forward_training(bx, fake(DType::fp32, {6}, 0x50000), {}, s, bx, mean, var, {},
                                      {}, {}, 48);
  });
  EXPECT_NE(e.find("both given"), std::string::npos) << e;
  e = backend_error_of([&] {
    shared.batchnorm_backward(bx, bx, {}, {}, mean, var, s, {}, 48,
                              fake(DType::bf16, {70, 6}, 0x50000), {}, {});
  });
  EXPECT_NE(e.find("needs the forward's workspace or y"), std::string::npos) << e;
}

TEST(cuda_layer_checks, BatchNormAddForwardChecks) {
  const sdk::BackendArgumentChecks& shared = mixtrain::backend_cuda::checks();
  sdk::BatchNormAddArgs a;
  a.x = fake(DType::bf16, {2, 5, 7, 6}, 0x10000);
  a.residual = fake(DType::bf16, {70, 6}, 0x20000);
  a.y = a.residual;  // in place
  a.shape = {70, 6, 1e-5f, true};
  a.save_mean = fake(DType::fp32, {6}, 0x30000);
  a.save_var = fake(DType::fp32, {6}, 0x40000);
  EXPECT_NO_THROW(shared.batchnorm_add_forward(a));
  auto error = [&](const sdk::BatchNormAddArgs& b) {
    return backend_error_of([&] { shared.batchnorm_add_forward(b); });
  };
  sdk::BatchNormAddArgs b = a;
  b.residual = fake(DType::fp16, {70, 6}, 0x20000);
  std::string e = error(b);
  EXPECT_NE(e.find("backend_cuda.batchnorm_add_forward"), std::string::npos) << e;
  EXPECT_NE(e.find("residual is fp16 [70, 6]"), std::string::npos) << e;
  b = a;
  b.residual = fake(DType::bf16, {70, 6}, 0x10000 + 64);
  b.y = fake(DType::bf16, {70, 6}, 0x50000);
  e = error(b);
  EXPECT_NE(e.find("residual overlaps x"), std::string::npos) << e;
  b = a;
  b.y = a.x;
  e = error(b);
  EXPECT_NE(e.find("y is x"), std::string::npos) << e;
  b = a;
  b.save_var = {};
  e = error(b);
  EXPECT_NE(e.find("save_var"), std::string::npos) << e;
  b = a;
  b.training = false;  // evaluation reads the running statistics
  e = error(b);
  EXPECT_NE(e.find("running_mean"), std::string::npos) << e;
  b.running_mean = fake(DType::fp32, {6}, 0x60000);
  b.running_var = fake(DType::fp32, {6}, 0x70000);
  EXPECT_NO_THROW(shared.batchnorm_add_forward(b));
  b = a;
  b.shape.rows = 1;
  b.x = fake(DType::bf16, {1, 6}, 0x10000);
  b.residual = b.y = fake(DType::bf16, {1, 6}, 0x20000);
  e = error(b);
  EXPECT_NE(e.find("more than one value per channel"), std::string::npos) << e;
}

// The one-pass backward where the parameter sums are wanted, the option is on and a block's
// slices fit; the column sums otherwise; the row kernel alone without sums.
TEST(cuda_layer_norm_plan, RouteFollowsTheSumsTheOptionAndSharedMemory) {
  namespace ln = mixtrain::backend_cuda::layer_norm_plan;
  using ln::BackwardRoute;
  constexpr std::size_t hopper = 227 * 1024, small = 48 * 1024;
  EXPECT_EQ(ln::backward_route(true, true, 768, hopper), BackwardRoute::one_pass);
  EXPECT_EQ(ln::backward_route(true, false, 768, hopper), BackwardRoute::column_sums_then_rows);
  EXPECT_EQ(ln::backward_route(false, true, 768, hopper), BackwardRoute::rows_only);
  EXPECT_EQ(ln::backward_route(false, false, 768, hopper), BackwardRoute::rows_only);
  // GPT-2 small's 768 columns: 4 warps x (dgamma, dbeta) x 768 floats, under the default 48 KiB.
  EXPECT_EQ(ln::one_pass_shared_bytes(768), 24u * 1024);
  // GPT-2 XL's 1600 needs the opt-in; a width whose slices exceed the device runs column sums.
  EXPECT_EQ(ln::backward_route(true, true, 1600, hopper), BackwardRoute::one_pass);
  EXPECT_EQ(ln::backward_route(true, true, 1600, small), BackwardRoute::column_sums_then_rows);
  const std::int64_t widest = static_cast<std::int64_t>(hopper / ln::one_pass_shared_bytes(1));
  EXPECT_EQ(ln::backward_route(true, true, widest, hopper), BackwardRoute::one_pass);
  EXPECT_EQ(ln::backward_route(true, true, widest + 1, hopper),
            BackwardRoute::column_sums_then_rows);
}

TEST(cuda_layer_norm_plan, PartitionAndScratchAreFunctionsOfTheShape) {
  namespace ln = mixtrain::backend_cuda::layer_norm_plan;
  EXPECT_EQ(ln::kRowsPerBlock, 16);
  EXPECT_EQ(ln::one_pass_blocks(0), 0);
  EXPECT_EQ(ln::one_pass_blocks(1), 1);
  EXPECT_EQ(ln::one_pass_blocks(16), 1);
  EXPECT_EQ(ln::one_pass_blocks(17), 2);
  EXPECT_EQ(ln::one_pass_blocks(8192), 512);  // GPT-2 small's batch of 8 x 1024 tokens
  // One partial row per block for each sum; at least one row each, so a batch of no rows still
  // gets a valid pointer.
  EXPECT_EQ(ln::one_pass_scratch_floats(8192, 768), 2u * 512 * 768);
  EXPECT_EQ(ln::one_pass_scratch_floats(0, 768), 2u * 768);
}

// The accumulating dgrad of a pointwise convolution on 16-bit operands is one GEMM; any other
// geometry or dtype keeps cuDNN.
TEST(cuda_conv_rules, OnlyAPointwiseSixteenBitDgradIntoASumIsAGemm) {
  sdk::Conv2dGeometry g;
  g.batch = 2;
  g.in_channels = 64;
  g.height = g.width = 56;
  g.out_channels = 256;
  using sdk::DType;
  EXPECT_TRUE(conv::pointwise_dgrad_accumulates_as_gemm(g, DType::bf16, DType::bf16));
  EXPECT_TRUE(conv::pointwise_dgrad_accumulates_as_gemm(g, DType::fp16, DType::fp16));
  EXPECT_FALSE(conv::pointwise_dgrad_accumulates_as_gemm(g, DType::fp32, DType::fp32));
  EXPECT_FALSE(conv::pointwise_dgrad_accumulates_as_gemm(g, DType::bf16, DType::fp16));
  const auto refused = [&](auto change) {
    sdk::Conv2dGeometry h = g;
    change(h);
    return !conv::pointwise_dgrad_accumulates_as_gemm(h, DType::bf16, DType::bf16);
  };
  EXPECT_TRUE(refused([](auto& h) { h.kernel_h = h.kernel_w = 3; }));
  EXPECT_TRUE(refused([](auto& h) { h.kernel_w = 3; }));
  EXPECT_TRUE(refused([](auto& h) { h.stride_h = h.stride_w = 2; }));
  EXPECT_TRUE(refused([](auto& h) { h.stride_w = 2; }));
  EXPECT_TRUE(refused([](auto& h) { h.pad_h = 1; }));
  EXPECT_TRUE(refused([](auto& h) { h.dilation_w = 2; }));
  EXPECT_TRUE(refused([](auto& h) { h.groups = 4; }));
}

// A call's scratch in a caller's workspace (convolution facet 1.2): every part from a 256-byte
// boundary (cuDNN's workspace, the decoded operands' vector loads), all inside the bytes the query
// reported however the workspace's start is aligned, and apart from each other.
// Every route conv_routes offers, sized as the facet sizes it: a decoded operand in fp32, the
// channels-last weights in the io dtype, and the output's scratch in the dtype cuDNN writes there
// (a 16-bit dw or sum takes 2 bytes an element, not 4).
TEST(cuda_conv_rules, ARoutesScratchIsSizedInTheDtypesItHolds) {
  const std::int64_t a_numel = 1000, b_numel = 300, out_numel = 700;
  int sixteen_bit_outputs = 0;
  for (conv::ConvOp op :
       {conv::ConvOp::forward, conv::ConvOp::backward_data, conv::ConvOp::backward_weights})
    for (DType a : {DType::fp32, DType::bf16, DType::fp16})
      for (DType out : {DType::fp32, DType::bf16})
        for (bool extra : {false, true})
          for (bool wgrad16 : {false, true})
            for (const conv::Route& r : conv::conv_routes(op, a, a, out, DType::fp32, extra,
                                                          FilterLayout::krsc, wgrad16)) {
              SCOPED_TRACE(conv::route_text(r));
              for (bool filter_copy : {false, true}) {
                const conv::RouteScratch s = conv::route_scratch(
                    r, 4096, a_numel, b_numel, out_numel, filter_copy, r.out_direct);
                EXPECT_EQ(s.workspace, 4096u);
                EXPECT_EQ(s.a, r.decode_a ? 4000u : 0u);
                const std::size_t io = r.io == conv::DataType::f32 ? 4 : 2;
                EXPECT_EQ(s.b, filter_copy ? 300 * io : r.decode_b ? 1200u : 0u);
                const std::size_t out_bytes = r.out == conv::DataType::f32 ? 4 : 2;
                EXPECT_EQ(s.out, r.out_direct ? 0u : 700 * out_bytes);
                if (!r.out_direct && r.out != conv::DataType::f32) ++sixteen_bit_outputs;
              }
              // A 1x1 or depthwise dw that cuDNN writes in place takes no output scratch.
              EXPECT_EQ(conv::route_scratch(r, 0, a_numel, b_numel, out_numel, false, true).out,
                        0u);
            }
  EXPECT_GT(sixteen_bit_outputs, 0) << "the 16-bit dw and 16-bit sum routes were covered";
}

TEST(cuda_conv_rules, ARoutesScratchFitsTheBytesItAsksForAtAnyStart) {
  EXPECT_EQ(conv::RouteScratch{}.caller_bytes(), 0u) << "a route with no scratch asks for none";
  const std::vector<conv::RouteScratch> routes = {
      {102'760'448, 0, 0, 0}, {1, 2, 3, 4}, {0, 4096, 0, 257}, {0, 0, 18'432, 0}, {513, 0, 1, 0}};
  for (const conv::RouteScratch& r : routes) {
    const std::size_t bytes = r.caller_bytes();
    EXPECT_LE(bytes, r.workspace + r.a + r.b + r.out + 4 * 255 + 255);
    std::vector<std::byte> memory(bytes + 256);
    for (std::size_t shift : {0, 1, 64, 128, 255}) {
      std::byte* base = memory.data() + shift;
      const conv::RouteScratch::Places p = r.place_in(base);
      const std::pair<void*, std::size_t> parts[] = {
          {p.workspace, r.workspace}, {p.a, r.a}, {p.b, r.b}, {p.out, r.out}};
      std::byte* last_end = base;
      for (const auto& [at, size] : parts) {
        if (size == 0) {
          EXPECT_EQ(at, nullptr);
          continue;
        }
        auto* begin = static_cast<std::byte*>(at);
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(begin) % 256, 0u);
        EXPECT_GE(begin, last_end) << "parts in order, apart";
        EXPECT_LE(begin + size, base + bytes) << "inside the " << bytes << " bytes asked for";
        last_end = begin + size;
      }
    }
  }
}

}  // namespace
