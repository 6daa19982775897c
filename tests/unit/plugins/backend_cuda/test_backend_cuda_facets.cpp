// CudaBackend's residual (add and add_backward), attention, embedding and dropout facets, the
// strided-batched GEMM and the multi-tensor foreach ops against the CPU reference (skipped without
// a device). The element steps are cuda_element_math.h's, host-checked against the CPU in
// test_cuda_element_math, so residual, permutes, embedding and dropout must match bit for bit;
// the softmax within a few ulps (its exp is not oneDNN's; double sums in another order); GEMMs to
// the input format's rounding.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_activation_facet.h"
#include "cuda_attention_facet.h"
#include "cuda_batch_norm_facet.h"
#include "cuda_embedding_facet.h"
#include "cuda_foreach_facet.h"
#include "cuda_gemm_facet.h"
#include "cuda_gradient_check_facet.h"
#include "cuda_layer_norm_facet.h"
#include "cuda_loss_facet.h"
#include "cuda_native_stream_facet.h"
#include "cuda_optimizer_facet.h"
#include "cuda_quantized_weight_facet.h"
#include "cuda_residual_facet.h"
#include "cuda_step_graph_facet.h"
#include "cuda_test_util.h"
#ifdef MIXTRAIN_HAVE_CUDNN
#include "cuda_convolution_facet.h"
#endif
#include "mixtrain/sdk/backend_kernel_trace.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda::testing {
namespace {

const DType kStorage[] = {DType::fp32, DType::bf16, DType::fp16};

std::string name_of(DType t) {
  return std::string(sdk::dtype_name(t));
}

// F implements facet interface I as a final class of its own, built over the shared context.
template <class F, class I>
constexpr bool is_facet_class =
    std::is_final_v<F>&& std::is_base_of_v<I, F>&& std::is_constructible_v<F, CudaContext&> &&
    !std::is_copy_assignable_v<F>;

// Host-only (no device needed): the backend is no facet itself; each facet is an object of its own.
TEST(backend_cuda_facet_classes, EachFacetIsAFinalClassOverTheContext) {
  static_assert(!std::is_base_of_v<sdk::Facet, CudaBackend>);
  static_assert(is_facet_class<CudaGemm, sdk::GemmFacet>);
  static_assert(is_facet_class<CudaActivation, sdk::ActivationFacet>);
  static_assert(is_facet_class<CudaGradientCheck, sdk::GradientCheckFacet>);
  static_assert(is_facet_class<CudaForeach, sdk::ForeachFacet>);
  static_assert(is_facet_class<CudaLayerNorm, sdk::LayerNormFacet>);
  static_assert(is_facet_class<CudaBatchNorm, sdk::BatchNormFacet>);
#ifdef MIXTRAIN_HAVE_CUDNN
  static_assert(is_facet_class<CudaConvolution, sdk::ConvolutionFacet>);
#endif
  static_assert(is_facet_class<CudaLoss, sdk::LossFacet>);
  static_assert(is_facet_class<CudaOptimizer, sdk::OptimizerFacet>);
  static_assert(is_facet_class<CudaResidual, sdk::ResidualFacet>);
  static_assert(is_facet_class<CudaAttention, sdk::AttentionFacet>);
  static_assert(is_facet_class<CudaEmbedding, sdk::EmbeddingFacet>);
  static_assert(is_facet_class<CudaStepGraph, sdk::StepGraphFacet>);
  static_assert(is_facet_class<CudaNativeStream, sdk::NativeStreamFacet>);
  static_assert(is_facet_class<CudaQuantizedWeight, sdk::QuantizedWeightFacet>);
  // The facet classes answer with their interfaces' names.
  EXPECT_EQ(CudaGemm::kName, "gemm");
  EXPECT_EQ(CudaGradientCheck::kName, "gradient_check");
  EXPECT_EQ(CudaNativeStream::kName, "native_stream");
}

// Host-only: the facet objects a CudaBackend makes are the registrations linked into this binary
// (each facet's own file registers it; sdk/support/facet_registry.h), one per facet, every one a
// facet of the SDK's list; a facet whose class lives in its file alone (dropout) is among them.
TEST(backend_cuda_facet_classes, EveryFacetFileRegistersItsFacetOnce) {
  std::vector<std::string> names;
  for (const auto& entry : sdk::FacetRegistry<CudaContext>::entries())
    names.emplace_back(entry.name);
  std::sort(names.begin(), names.end());
  std::vector<std::string> expected = {
      "activation", "attention",     "batch_norm",     "dropout",         "embedding",
      "foreach",    "gemm",          "gradient_check", "image_input",     "layer_norm",
      "loss",       "native_stream", "optimizer",      "plan_report",     "residual",
      "scratch",    "step_graph",    "host_memory",    "quantized_weight"};
#ifdef MIXTRAIN_HAVE_CUDNN
  expected.push_back("convolution");
#endif
#ifdef MIXTRAIN_HAVE_CUPTI
  expected.push_back("kernel_trace");
#endif
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);
}

TEST_F(backend_cuda_vs_cpu, FacetsAreOffered) {
  // Each facet is an object of its own (not the backend), distinct from the others, that answers
  // to its own name.
  std::vector<const sdk::Facet*> seen;
  for (const char* facet :
       {"gemm", "activation", "gradient_check", "foreach", "layer_norm", "batch_norm", "loss",
        "optimizer", "residual", "attention", "embedding", "dropout", "step_graph", "native_stream",
        "scratch", "image_input", "plan_report", "host_memory", "quantized_weight"}) {
    const sdk::Facet* f = gpu().find_facet(facet);
    ASSERT_NE(f, nullptr) << facet;
    EXPECT_EQ(f->name(), facet);
    EXPECT_EQ(std::find(seen.begin(), seen.end(), f), seen.end()) << facet;
    seen.push_back(f);
  }
#ifdef MIXTRAIN_HAVE_CUDNN
  ASSERT_NE(gpu().find_facet("convolution"), nullptr);
  EXPECT_EQ(gpu().find_facet("convolution")->name(), "convolution");
#else
  EXPECT_EQ(gpu().find_facet("convolution"), nullptr);
#endif
#ifdef MIXTRAIN_HAVE_CUPTI
  ASSERT_NE(gpu().find_facet("kernel_trace"), nullptr);
#else
  EXPECT_EQ(gpu().find_facet("kernel_trace"), nullptr);
#endif
  EXPECT_EQ(gpu().find_facet("no_such_facet"), nullptr);
  EXPECT_EQ(gpu().find_facet(""), nullptr);
}

#ifdef MIXTRAIN_HAVE_CUPTI
// The kernel trace (CUPTI): the kernels of the ops run between start and stop, each under its
// name with its calls and device time; nothing from before the start; a second start while one
// runs is refused; a stop without a start is empty.
TEST_F(backend_cuda_vs_cpu, KernelTraceRecordsTheKernelsRunBetweenStartAndStop) {
  auto* trace = sdk::facet<sdk::KernelTraceFacet>(gpu());
  ASSERT_NE(trace, nullptr);
  EXPECT_TRUE(trace->stop_kernel_trace().kernels.empty());
  Tensor x(gpu(), DType::fp32, Shape{1 << 20});
  gpu().fill(x, 1.0f);  // before the trace: not in it
  gpu().synchronize();
  try {
    trace->start_kernel_trace();
  } catch (const sdk::BackendError& e) {
    // The machine's CUPTI (missing, another major, a sandbox that refuses activity tracing):
    // what the profile stage then reports too; not the backend's fault.
    GTEST_SKIP() << "no kernel trace here: " << e.what();
  }
  EXPECT_THROW(trace->start_kernel_trace(), sdk::BackendError);
  for (int i = 1; i <= 5; ++i) gpu().fill(x, static_cast<float>(i));
  const sdk::KernelTrace got = trace->stop_kernel_trace();
  ASSERT_FALSE(got.kernels.empty());
  std::int64_t calls = 0;
  for (const sdk::KernelTime& k : got.kernels) {
    std::printf("  %lld x %.3f ms  %s\n", static_cast<long long>(k.calls), 1e3 * k.device_seconds,
                k.name.c_str());
    EXPECT_GT(k.calls, 0) << k.name;
    EXPECT_GT(k.device_seconds, 0.0) << k.name;
    calls += k.calls;
  }
  EXPECT_EQ(calls, 5);  // the five fills, one kernel each, and nothing else
  EXPECT_TRUE(std::is_sorted(got.kernels.begin(), got.kernels.end(),
                             [](const sdk::KernelTime& a, const sdk::KernelTime& b) {
                               return a.device_seconds > b.device_seconds;
                             }));
  EXPECT_TRUE(trace->stop_kernel_trace().kernels.empty());  // stopped
}
#endif

TEST_F(backend_cuda_vs_cpu, ResidualAddBitForBit) {
  const std::int64_t n = 3001;
  for (DType t1 : kStorage)
    for (DType ty : kStorage)
      for (bool relu : {false, true}) {
        const std::string what = "add " + name_of(t1) + " + bf16 -> " + name_of(ty);
        Tensor g1(gpu(), t1, {n}, random_values(n, 1, -3, 3)),
            c1(cpu(), t1, {n}, random_values(n, 1, -3, 3));
        Tensor g2(gpu(), DType::bf16, {n}, random_values(n, 2, -3, 3)),
            c2(cpu(), DType::bf16, {n}, random_values(n, 2, -3, 3));
        Tensor gy(gpu(), ty, {n}), cy(cpu(), ty, {n});
        const TensorView gx[] = {g1, g2}, cx[] = {c1, c2};
        gpu<sdk::ResidualFacet>().add(gx, relu, gy);
        sdk::facet<sdk::ResidualFacet>(cpu())->add(cx, relu, cy);
        EXPECT_EQ(gy.raw(), cy.raw()) << what << (relu ? " relu" : "");
      }
  // Eleven inputs (more than one launch takes), the output one of them.
  std::vector<std::unique_ptr<Tensor>> gs, cs;
  std::vector<TensorView> gv, cv;
  for (int k = 0; k < 11; ++k) {
    const DType t = kStorage[k % 3];
    gs.push_back(std::make_unique<Tensor>(gpu(), t, Shape{n}, random_values(n, 10 + k, -2, 2)));
    cs.push_back(std::make_unique<Tensor>(cpu(), t, Shape{n}, random_values(n, 10 + k, -2, 2)));
    gv.push_back(*gs.back());
    cv.push_back(*cs.back());
  }
  gpu<sdk::ResidualFacet>().add(gv, true, gv[4]);
  sdk::facet<sdk::ResidualFacet>(cpu())->add(cv, true, cv[4]);
  EXPECT_EQ(gs[4]->raw(), cs[4]->raw()) << "eleven inputs, in place";
}

// add_backward: every gradient bit for bit the CPU's, for each dtype of dy, y and dx (with NaN,
// -0 and negative y, a NaN dy on either side of the mask), an empty gradient skipped, dy masked in
// place, and more gradients than one launch takes with the in-place one among them.
TEST_F(backend_cuda_vs_cpu, ResidualAddBackwardBitForBit) {
  const std::int64_t n = 3001;
  auto dyv = random_values(n, 41, -3, 3), yv = random_values(n, 42, -3, 3);
  dyv[5] = dyv[6] = NAN;
  yv[5] = 1.0f;
  yv[9] = NAN;
  yv[10] = -0.0f;
  yv[11] = 0.0f;
  for (DType tdy : kStorage)
    for (DType ty : kStorage)
      for (DType tdx : kStorage)
        for (bool relu : {false, true}) {
          const std::string what = "add_backward dy " + name_of(tdy) + " y " + name_of(ty) +
                                   " dx " + name_of(tdx) + (relu ? " relu" : "");
          Tensor gdy(gpu(), tdy, {n}, dyv), cdy(cpu(), tdy, {n}, dyv);
          Tensor gy(gpu(), ty, {n}, yv), cy(cpu(), ty, {n}, yv);
          Tensor gdx(gpu(), tdx, {n}), cdx(cpu(), tdx, {n});
          Tensor gdx2(gpu(), DType::bf16, {n}), cdx2(cpu(), DType::bf16, {n});
          const TensorView gdxs[] = {gdx, TensorView{}, gdx2}, cdxs[] = {cdx, TensorView{}, cdx2};
          gpu<sdk::ResidualFacet>().add_backward(gdy, relu ? gy.view() : TensorView{}, relu, gdxs);
          sdk::facet<sdk::ResidualFacet>(cpu())->add_backward(cdy, relu ? cy.view() : TensorView{},
                                                              relu, cdxs);
          EXPECT_EQ(gdx.raw(), cdx.raw()) << what;
          EXPECT_EQ(gdx2.raw(), cdx2.raw()) << what << " (bf16 dx2)";
          EXPECT_EQ(gdy.raw(), cdy.raw()) << what << " (dy untouched)";
          // In place: dy masked where it lies, beside a second gradient.
          const TensorView gin[] = {gdx2, gdy}, cin[] = {cdx2, cdy};
          gpu<sdk::ResidualFacet>().add_backward(gdy, gy, relu, gin);
          sdk::facet<sdk::ResidualFacet>(cpu())->add_backward(cdy, cy, relu, cin);
          EXPECT_EQ(gdy.raw(), cdy.raw()) << what << " in place";
          EXPECT_EQ(gdx2.raw(), cdx2.raw()) << what << " in place (bf16 dx2)";
        }
  // Eleven gradients (more than one launch takes), dy itself the third.
  Tensor gdy(gpu(), DType::bf16, {n}, dyv), cdy(cpu(), DType::bf16, {n}, dyv);
  Tensor gy(gpu(), DType::fp16, {n}, yv), cy(cpu(), DType::fp16, {n}, yv);
  std::vector<std::unique_ptr<Tensor>> gs, cs;
  std::vector<TensorView> gv, cv;
  for (int k = 0; k < 11; ++k) {
    if (k == 2) {
      gv.push_back(gdy);
      cv.push_back(cdy);
      continue;
    }
    gs.push_back(std::make_unique<Tensor>(gpu(), kStorage[k % 3], Shape{n}));
    cs.push_back(std::make_unique<Tensor>(cpu(), kStorage[k % 3], Shape{n}));
    gv.push_back(*gs.back());
    cv.push_back(*cs.back());
  }
  gpu<sdk::ResidualFacet>().add_backward(gdy, gy, true, gv);
  sdk::facet<sdk::ResidualFacet>(cpu())->add_backward(cdy, cy, true, cv);
  EXPECT_EQ(gdy.raw(), cdy.raw()) << "eleven gradients, dy in place";
  for (std::size_t k = 0; k < gs.size(); ++k)
    EXPECT_EQ(gs[k]->raw(), cs[k]->raw()) << "eleven gradients, gradient " << k;
}

// The residual kernels take 4 grid-stride elements a thread a round, and a grid holds at most
// 8192 blocks of 256 threads: at 3001 elements only the first of the 4 is ever live. Past 4
// rounds (8,400,001 elements) every unrolled element and the tail run: two inputs into a third
// dtype, eleven in place, and the backward with dy in place among three gradients.
TEST_F(backend_cuda_vs_cpu, ResidualPastFourRoundsOfTheGridBitForBit) {
  const std::int64_t n = 8'400'001;
  const auto av = random_values(n, 51, -3, 3), bv = random_values(n, 52, -3, 3);
  Tensor ga(gpu(), DType::fp32, {n}, av), ca(cpu(), DType::fp32, {n}, av);
  Tensor gb(gpu(), DType::bf16, {n}, bv), cb(cpu(), DType::bf16, {n}, bv);
  Tensor gy(gpu(), DType::fp16, {n}), cy(cpu(), DType::fp16, {n});
  const TensorView gx[] = {ga, gb}, cx[] = {ca, cb};
  gpu<sdk::ResidualFacet>().add(gx, true, gy);
  sdk::facet<sdk::ResidualFacet>(cpu())->add(cx, true, cy);
  EXPECT_EQ(gy.raw(), cy.raw()) << "add fp32 + bf16 -> fp16, relu";
  std::vector<std::unique_ptr<Tensor>> gs, cs;
  std::vector<TensorView> gv, cv;
  for (int k = 0; k < 11; ++k) {
    const auto v = random_values(n, 60 + k, -2, 2);
    gs.push_back(std::make_unique<Tensor>(gpu(), DType::bf16, Shape{n}, v));
    cs.push_back(std::make_unique<Tensor>(cpu(), DType::bf16, Shape{n}, v));
    gv.push_back(*gs.back());
    cv.push_back(*cs.back());
  }
  gpu<sdk::ResidualFacet>().add(gv, false, gv[7]);
  sdk::facet<sdk::ResidualFacet>(cpu())->add(cv, false, cv[7]);
  EXPECT_EQ(gs[7]->raw(), cs[7]->raw()) << "eleven inputs, in place";
  Tensor gdx(gpu(), DType::fp32, {n}), cdx(cpu(), DType::fp32, {n});
  Tensor gdx2(gpu(), DType::bf16, {n}), cdx2(cpu(), DType::bf16, {n});
  const TensorView gd[] = {gdx, gb, gdx2}, cd[] = {cdx, cb, cdx2};  // dy (b) second
  gpu<sdk::ResidualFacet>().add_backward(gb, ga, true, gd);
  sdk::facet<sdk::ResidualFacet>(cpu())->add_backward(cb, ca, true, cd);
  EXPECT_EQ(gdx.raw(), cdx.raw()) << "add_backward dx";
  EXPECT_EQ(gdx2.raw(), cdx2.raw()) << "add_backward dx2";
  EXPECT_EQ(gb.raw(), cb.raw()) << "add_backward dy in place";
}

TEST_F(backend_cuda_vs_cpu, HeadPermutesWithCacheOffsetsBitForBit) {
  // QKV split into a KV cache of 9 tokens at offset 4, then merged back.
  const sdk::HeadLayout l{2, 3, 4, 8, 3, 9, 4};  // N, T, H, D, P, T', offset
  const std::int64_t x_n = 2 * 3 * 3 * 4 * 8, y_n = 3 * 2 * 4 * 9 * 8;
  for (DType xt : kStorage)
    for (DType yt : kStorage) {
      const std::string what = name_of(xt) + " <-> " + name_of(yt);
      const auto xv = random_values(x_n, 3), yv = random_values(y_n, 4);
      Tensor gx(gpu(), xt, {x_n}, xv), cx(cpu(), xt, {x_n}, xv);
      Tensor gy(gpu(), yt, {y_n}, yv), cy(cpu(), yt, {y_n}, yv);  // rows outside stay
      gpu<sdk::AttentionFacet>().split_heads(gx, l, gy);
      sdk::facet<sdk::AttentionFacet>(cpu())->split_heads(cx, l, cy);
      EXPECT_EQ(gy.raw(), cy.raw()) << "split_heads " << what;
      Tensor gb(gpu(), xt, {x_n}), cb(cpu(), xt, {x_n});
      gpu<sdk::AttentionFacet>().merge_heads(gy, l, gb);
      sdk::facet<sdk::AttentionFacet>(cpu())->merge_heads(cy, l, cb);
      EXPECT_EQ(gb.raw(), cb.raw()) << "merge_heads " << what;
    }
}

TEST_F(backend_cuda_vs_cpu, SoftmaxForwardBackwardMaskedAndReproducible) {
  struct Case {
    std::int64_t batch, rows, cols;
    bool causal;
  };
  for (const Case& k : {Case{6, 33, 33, true}, Case{4, 1, 70, true}, Case{3, 7, 300, true},
                        Case{5, 40, 40, false}, Case{2, 64, 1025, true}}) {
    const std::string what = std::to_string(k.batch) + "x" + std::to_string(k.rows) + "x" +
                             std::to_string(k.cols) + (k.causal ? " causal" : "");
    const std::int64_t n = k.batch * k.rows * k.cols;
    const sdk::SoftmaxShape shape{k.batch, k.rows, k.cols, k.causal};
    const float scale = 0.17f;
    const auto s = random_values(n, 5, -20, 20), dp = random_values(n, 6);
    Tensor gs(gpu(), DType::fp32, {n}, s), cs(cpu(), DType::fp32, {n}, s);
    Tensor gp(gpu(), DType::fp32, {n}), cp(cpu(), DType::fp32, {n});
    gpu<sdk::AttentionFacet>().softmax_forward(gs, shape, scale, gp);
    sdk::facet<sdk::AttentionFacet>(cpu())->softmax_forward(cs, shape, scale, cp);
    const auto probs = gp.get();
    expect_close(probs, cp.get(), 5e-7, 1e-37, "softmax_forward " + what);
    for (std::int64_t q = 0; q < k.batch * k.rows; ++q)  // masked: exact +0
      for (std::int64_t j = (k.causal ? q % k.rows + k.cols - k.rows + 1 : k.cols); j < k.cols; ++j)
        ASSERT_TRUE(probs[q * k.cols + j] == 0.0f && !std::signbit(probs[q * k.cols + j])) << what;
    gpu<sdk::AttentionFacet>().softmax_forward(gs, shape, scale, gs);  // in place, same bits
    EXPECT_EQ(gs.raw(), gp.raw()) << "in place " << what;
    // Backward from the same probabilities on both.
    cp.set(probs);
    Tensor gd(gpu(), DType::fp32, {n}, dp), cd(cpu(), DType::fp32, {n}, dp);
    Tensor gds(gpu(), DType::fp32, {n}), cds(cpu(), DType::fp32, {n});
    gpu<sdk::AttentionFacet>().softmax_backward(gp, gd, shape, scale, gds);
    sdk::facet<sdk::AttentionFacet>(cpu())->softmax_backward(cp, cd, shape, scale, cds);
    expect_close(gds.get(), cds.get(), 2e-7, 1e-30, "softmax_backward " + what);
    gpu<sdk::AttentionFacet>().softmax_backward(gp, gd, shape, scale,
                                                gd);  // dscores aliasing dprobs
    EXPECT_EQ(gd.raw(), gds.raw()) << "backward in place " << what;
  }
}

std::vector<float> ids_for(std::int64_t rows, std::int64_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> ids(static_cast<std::size_t>(rows));
  for (auto& id : ids) id = static_cast<float>(rng() % 5 == 0 ? 1 : rng() % vocab);  // a hot id
  return ids;
}

TEST_F(backend_cuda_vs_cpu, EmbeddingGatherAndScatterAddBitForBit) {
  const std::int64_t vocab = 101, width = 300, rows = 777;
  const auto id_values = ids_for(rows, vocab, 7);
  Tensor gi(gpu(), DType::int32, {rows}, id_values), ci(cpu(), DType::int32, {rows}, id_values);
  for (DType tt : kStorage)
    for (DType ot : kStorage)
      for (bool accumulate : {false, true}) {
        const auto tv = random_values(vocab * width, 8), ov = random_values(rows * width, 9);
        Tensor gt(gpu(), tt, {vocab, width}, tv), ct(cpu(), tt, {vocab, width}, tv);
        Tensor go(gpu(), ot, {rows, width}, ov), co(cpu(), ot, {rows, width}, ov);
        gpu<sdk::EmbeddingFacet>().gather(gi, gt, go, accumulate);
        sdk::facet<sdk::EmbeddingFacet>(cpu())->gather(ci, ct, co, accumulate);
        EXPECT_EQ(go.raw(), co.raw()) << "gather " << name_of(tt) << " -> " << name_of(ot);
      }
  for (DType dt : kStorage)
    for (float beta : {0.0f, 1.0f}) {
      const auto dyv = random_values(rows * width, 10), tv = random_values(vocab * width, 11);
      Tensor gdy(gpu(), dt, {rows, width}, dyv), cdy(cpu(), dt, {rows, width}, dyv);
      Tensor gt(gpu(), DType::fp32, {vocab, width}, tv), ct(cpu(), DType::fp32, {vocab, width}, tv);
      gpu<sdk::EmbeddingFacet>().scatter_add(gi, gdy, gt, beta);
      sdk::facet<sdk::EmbeddingFacet>(cpu())->scatter_add(ci, cdy, ct, beta);
      EXPECT_EQ(gt.raw(), ct.raw()) << "scatter_add " << name_of(dt) << " beta " << beta;
    }
}

TEST_F(backend_cuda_vs_cpu, EmbeddingBadIdRaisesAtTheNextSyncAndLeavesOutputsUntouched) {
  const std::int64_t vocab = 10, width = 4, rows = 6;
  Tensor ids(gpu(), DType::int32, {rows}, {1, 2, 3, 12, 4, -1});
  Tensor table(gpu(), DType::fp32, {vocab, width}, random_values(vocab * width, 1));
  Tensor out(gpu(), DType::fp32, {rows, width}, std::vector<float>(rows * width, 42.0f));
  gpu<sdk::EmbeddingFacet>().gather(ids, table, out, false);
  try {
    gpu().synchronize();
    FAIL() << "no error for id 12 of 10 rows";
  } catch (const sdk::BackendError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("backend_cuda.gather"), std::string::npos) << what;
    EXPECT_NE(what.find("id 12 at row 3"), std::string::npos) << what;
    EXPECT_NE(what.find("[0, 10)"), std::string::npos) << what;
  }
  EXPECT_EQ(out.get(), std::vector<float>(rows * width, 42.0f));
  Tensor dtable(gpu(), DType::fp32, {vocab, width}, std::vector<float>(vocab * width, 7.0f));
  gpu<sdk::EmbeddingFacet>().scatter_add(ids, out, dtable, 0.0f);
  try {
    gpu().synchronize();
    FAIL() << "no error for id 12 of 10 rows";
  } catch (const sdk::BackendError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("backend_cuda.scatter_add"), std::string::npos) << what;
    EXPECT_NE(what.find("id 12 at row 3"), std::string::npos) << what;
  }
  EXPECT_EQ(dtable.get(), std::vector<float>(vocab * width, 7.0f));
  // The record was cleared: good ids work again.
  ids.set({1, 2, 3, 9, 4, 0});
  gpu<sdk::EmbeddingFacet>().gather(ids, table, out, false);
  EXPECT_NO_THROW(gpu().synchronize());
}

TEST_F(backend_cuda_vs_cpu, DropoutBitForBit) {
  const std::int64_t n = 100'003;
  const sdk::DropoutKey key{0xC0FFEE, 17};
  for (DType it : kStorage)
    for (DType ot : kStorage)
      for (float p : {0.0f, 0.1f, 0.5f}) {
        const auto x = random_values(n, 12);
        Tensor gx(gpu(), it, {n}, x), cx(cpu(), it, {n}, x);
        Tensor gy(gpu(), ot, {n}), cy(cpu(), ot, {n});
        gpu<sdk::DropoutFacet>().dropout_forward(gx, gy, p, key);
        sdk::facet<sdk::DropoutFacet>(cpu())->dropout_forward(cx, cy, p, key);
        EXPECT_EQ(gy.raw(), cy.raw())
            << "forward " << name_of(it) << " -> " << name_of(ot) << " p " << p;
        gpu<sdk::DropoutFacet>().dropout_backward(gx, gy, p, key);
        sdk::facet<sdk::DropoutFacet>(cpu())->dropout_backward(cx, cy, p, key);
        EXPECT_EQ(gy.raw(), cy.raw()) << "backward " << name_of(it) << " -> " << name_of(ot);
      }
}

TEST_F(backend_cuda_vs_cpu, GemmStridedBatchedIsOneCublasLtMatmul) {
  // Attention's shapes: S = q·kᵀ (fp32 C) and O = P·v (C in the activation dtype), [bh, t, d].
  const std::int64_t bh = 12, t = 37, d = 16;
  for (DType g : {DType::fp32, DType::bf16, DType::fp16})
    for (DType c_t : {DType::fp32, DType::bf16}) {
      const std::string what = "A/B " + name_of(g) + " C " + name_of(c_t);
      const auto qv = random_values(bh * t * d, 13), kv = random_values(bh * t * d, 14);
      Tensor gq(gpu(), g, {bh * t * d}, qv), cq(cpu(), g, {bh * t * d}, qv);
      Tensor gk(gpu(), g, {bh * t * d}, kv), ck(cpu(), g, {bh * t * d}, kv);
      Tensor gs(gpu(), c_t, {bh * t * t}), cs(cpu(), c_t, {bh * t * t});
      auto args = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
        sdk::GemmBatchedArgs ba;
        ba.gemm.a.view = {a.view().data, g, Shape{t, d}};
        ba.gemm.b.view = {b.view().data, g, Shape{t, d}};
        ba.gemm.b.transpose = true;
        ba.gemm.c = {c.view().data, c_t, Shape{t, t}};
        ba.batch = bh;
        ba.stride_a = ba.stride_b = t * d;
        ba.stride_c = t * t;
        return ba;
      };
      const std::size_t plans_before = gpu().cached_gemm_plans();
      const std::vector<std::string> report_before = gpu().gemm_plan_report();
      gpu<sdk::GemmFacet>().gemm_strided_batched(args(gq, gk, gs));
      sdk::facet<sdk::GemmFacet>(cpu())->gemm_strided_batched(args(cq, ck, cs));
      const double rel = c_t == DType::fp32 ? 1e-5 : ulp_rel(c_t);
      expect_close(gs.get(), cs.get(), rel, 1e-5 * d + (g == DType::fp32 ? 0 : 1e-3), what);
      // At most a plan per route tried, and the one that ran (its line's run count changed) is
      // a batched plan: one matmul for all 12 batches, not 12.
      EXPECT_LE(gpu().cached_gemm_plans(), plans_before + 2) << what;
      bool batched = false;
      for (const std::string& line : gpu().gemm_plan_report())
        if (std::find(report_before.begin(), report_before.end(), line) == report_before.end() &&
            line.find("batch=" + std::to_string(bh)) != std::string::npos &&
            line.find(": usable,") != std::string::npos)
          batched = true;
      EXPECT_TRUE(batched) << what << ": no usable strided-batched plan";
    }
}

TEST_F(backend_cuda_vs_cpu, ForeachOpsOverManyTensorsInOneLaunch) {
  std::vector<std::vector<float>> values;
  for (int t = 0; t < 9; ++t)
    values.push_back(random_values(static_cast<std::size_t>(1 + t * 57), 40 + t));
  values.push_back(random_values(50'000, 50, -3.0f, 3.0f));  // several chunks
  auto make = [&](sdk::DeviceBackend& be, int seed_shift) {
    std::vector<std::unique_ptr<Tensor>> ts;
    for (std::size_t i = 0; i < values.size(); ++i) {
      auto v = values[i];
      for (auto& x : v) x = x * 0.5f + static_cast<float>(seed_shift);
      ts.push_back(
          std::make_unique<Tensor>(be, DType::fp32, Shape{static_cast<std::int64_t>(v.size())}, v));
    }
    return ts;
  };
  auto g0 = make(gpu(), 0), g1 = make(gpu(), 1), g2 = make(gpu(), 2);
  auto c0 = make(cpu(), 0), c1 = make(cpu(), 1), c2 = make(cpu(), 2);
  auto views = [](const std::vector<std::unique_ptr<Tensor>>& ts) {
    std::vector<TensorView> v;
    for (const auto& t : ts) v.push_back(*t);
    return v;
  };
  const auto gx = views(g0), ga = views(g1), gb = views(g2);
  const auto cx = views(c0), ca = views(c1), cb = views(c2);
  gpu<sdk::ForeachFacet>().foreach_mul_scalar(gx, 0.7f);
  sdk::facet<sdk::ForeachFacet>(cpu())->foreach_mul_scalar(cx, 0.7f);
  gpu<sdk::ForeachFacet>().foreach_add(gx, ga, -0.3f);
  sdk::facet<sdk::ForeachFacet>(cpu())->foreach_add(cx, ca, -0.3f);
  gpu<sdk::ForeachFacet>().foreach_addcmul(gx, ga, gb, 0.25f);
  sdk::facet<sdk::ForeachFacet>(cpu())->foreach_addcmul(cx, ca, cb, 0.25f);
  gpu<sdk::ForeachFacet>().foreach_lerp(gx, gb, 0.1f);
  sdk::facet<sdk::ForeachFacet>(cpu())->foreach_lerp(cx, cb, 0.1f);
  gpu<sdk::ForeachFacet>().foreach_clamp(gx, -1.0f, 2.0f);
  sdk::facet<sdk::ForeachFacet>(cpu())->foreach_clamp(cx, -1.0f, 2.0f);
  gpu<sdk::ForeachFacet>().foreach_mul(gx, ga);
  sdk::facet<sdk::ForeachFacet>(cpu())->foreach_mul(cx, ca);
  gpu<sdk::ForeachFacet>().foreach_add_scalar(gx, 1.5f);
  sdk::facet<sdk::ForeachFacet>(cpu())->foreach_add_scalar(cx, 1.5f);
  gpu<sdk::ForeachFacet>().foreach_sqrt(gx);
  sdk::facet<sdk::ForeachFacet>(cpu())->foreach_sqrt(cx);
  for (std::size_t i = 0; i < g0.size(); ++i)
    expect_close(g0[i]->get(), c0[i]->get(), 1e-6, 1e-7,
                 "foreach chain, tensor " + std::to_string(i));
  gpu<sdk::ForeachFacet>().foreach_sign(ga);
  sdk::facet<sdk::ForeachFacet>(cpu())->foreach_sign(ca);
  for (std::size_t i = 0; i < g1.size(); ++i)
    expect_same_values(g1[i]->get(), c1[i]->get(), "foreach_sign, tensor " + std::to_string(i));
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
