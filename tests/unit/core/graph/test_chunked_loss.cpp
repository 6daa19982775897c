// The chunked loss (graph/chunked_loss.h): the LM head and the cross-entropy a block of rows at a
// time give the whole-logits loss, correct count and every gradient, without the logits or their
// gradient in the memory plan; the whole logits still come when asked for; the non-finite replay
// names the block; a logits node that cannot compute blocks says why and runs whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "layer_gradient_check.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/backend_scratch.h"
#include "mixtrain/sdk/support/backend_features.h"
#include "tiny_gpt.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using test_support::cpu;
using test_support::op;
using test_support::random_vector;
using test_support::read;
using test_support::write;

constexpr std::int64_t kTokens = 6, kVocab = 37, kBatch = 3;  // 18 rows: blocks of 5, 5, 5, 3

// A 1-layer GPT (tied LM head) from the preset, the loss in blocks of `block` rows (0: whole),
// with the same weights for every `block`.
std::unique_ptr<Model> tiny_gpt(std::int64_t block, float label_smoothing = 0.0f,
                                std::int64_t pad_classes = 0) {
  ModelSpec spec = test_support::tiny_gpt_spec(1, 2, 8, kVocab);
  spec.label_smoothing = label_smoothing;
  spec.loss_chunk_rows = block;
  spec.loss_pad_classes = pad_classes;
  return test_support::tiny_gpt_model(spec, kTokens, kVocab, kBatch, 0.3f);
}

void feed(Model& m, std::uint32_t seed) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(kBatch * kTokens)), labels(ids.size());
  const auto r = random_vector(2 * ids.size(), seed, 0.0f, static_cast<float>(kVocab) - 0.01f);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int32_t>(r[i]);
    labels[i] = static_cast<std::int32_t>(r[ids.size() + i]);
  }
  cpu()->copy_from_host(m.input(kBatch), ids.data());
  cpu()->copy_from_host(m.labels(kBatch), labels.data());
}

// Largest |a - b| relative to the largest |b|.
double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double gap = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? gap / scale : gap;
}

// Two micro-batches (feed seeds `seed`, seed + 1) into one step's gradients on `want` and `got`,
// the second's blocks adding to the first's: the same losses (to 2e-6), correct counts and
// parameter gradients (to 1e-5, relative).
void expect_same_step(Model& want, Model& got, std::uint32_t seed, const std::string& what) {
  std::vector<LossValues> losses[2];
  Model* models[2] = {&want, &got};
  for (int k = 0; k < 2; ++k)
    for (int which = 0; which < 2; ++which) {
      Model& m = *models[which];
      feed(m, seed + static_cast<std::uint32_t>(k));
      m.begin_micro_batch(k, 2);
      m.forward(kBatch);
      losses[which].push_back(m.loss(kBatch, 8.0f, true));
      m.backward(kBatch);
    }
  for (int k = 0; k < 2; ++k) {
    EXPECT_NEAR(losses[1][k].loss, losses[0][k].loss, 2e-6 * std::abs(losses[0][k].loss)) << what;
    EXPECT_EQ(losses[1][k].correct, losses[0][k].correct) << what;
  }
  const auto pw = want.parameters(), pg = got.parameters();
  ASSERT_EQ(pw.size(), pg.size());
  for (std::size_t i = 0; i < pw.size(); ++i)
    EXPECT_LT(relative_gap(read(pg[i]->grad.view()), read(pw[i]->grad.view())), 1e-5)
        << pw[i]->name << ", " << what;
}

TEST(ChunkedLoss, BlocksGiveTheWholeLogitsLossCountAndGradients) {
  for (const float smoothing : {0.0f, 0.1f}) {
    auto whole = tiny_gpt(0, smoothing), blocks = tiny_gpt(5, smoothing);
    ASSERT_EQ(whole->loss_chunking().rows, 0);
    ASSERT_EQ(blocks->loss_chunking().rows, 5);
    expect_same_step(*whole, *blocks, 40, "label smoothing " + std::to_string(smoothing));
  }
}

// Padded classes (model.loss_pad_classes): 37 classes in blocks of 40 columns give the unpadded
// blocks' loss, correct counts and gradients; with label smoothing the model does not pad.
TEST(ChunkedLoss, PaddedClassesGiveTheUnpaddedLossCountAndGradients) {
  auto plain = tiny_gpt(5), padded = tiny_gpt(5, 0.0f, 8);
  ASSERT_EQ(plain->loss_chunking().columns, kVocab);
  ASSERT_EQ(padded->loss_chunking().columns, 40);
  ASSERT_EQ(padded->loss_chunking().classes, kVocab);
  EXPECT_EQ(tiny_gpt(5, 0.1f, 8)->loss_chunking().columns, kVocab);
  EXPECT_EQ(tiny_gpt(5, 0.0f, 37)->loss_chunking().columns, kVocab);  // already a multiple
  expect_same_step(*plain, *padded, 60, "padded to 40 classes");
  // The evaluation loss, and the whole logits when asked for, are the unpadded ones too.
  EXPECT_NEAR(padded->evaluation_loss(kBatch).loss, plain->evaluation_loss(kBatch).loss, 2e-6);
  const auto want = read(plain->logits(kBatch)), have = read(padded->logits(kBatch));
  ASSERT_EQ(have.size(), want.size());
  EXPECT_LT(relative_gap(have, want), 1e-6);
}

// The CPU backend with sdk::kFeatureGemmWantsAlignedRows added to its features, as the CUDA
// backend declares it.
class AlignedRowsBackend final : public test_support::ForwardingBackend {
 public:
  sdk::BackendCapabilities capabilities() const override {
    auto caps = ForwardingBackend::capabilities();
    caps.features.emplace_back(sdk::kFeatureGemmWantsAlignedRows);
    return caps;
  }
};

// model.loss_pad_classes unset pads to 64 only on a backend that wants aligned GEMM rows, and only
// a class count that is not a multiple of 8; set, 0 included, it is what it says.
TEST(ChunkedLoss, UnsetPaddingPadsOnlyWhereTheBackendWantsAlignedRows) {
  const auto aligned = std::make_shared<AlignedRowsBackend>();
  EXPECT_EQ(default_loss_pad_classes(*cpu(), kVocab), 0);
  EXPECT_EQ(default_loss_pad_classes(*aligned, kVocab), kLossPadClasses);
  EXPECT_EQ(default_loss_pad_classes(*aligned, 40), 0);
  EXPECT_EQ(default_loss_pad_classes(*aligned, 50257), kLossPadClasses);
  const auto columns = [&](std::shared_ptr<sdk::DeviceBackend> backend,
                           std::optional<std::int64_t> pad, float label_smoothing = 0.0f) {
    ModelSpec spec = test_support::tiny_gpt_spec(1, 2, 8, kVocab);
    spec.loss_chunk_rows = 5;
    spec.loss_pad_classes = pad;
    spec.label_smoothing = label_smoothing;
    Model m(std::move(backend), spec, kTokens, kVocab, InputSpec{DType::int32, kTokens, {}, {}});
    for (auto& l : m.layers()) l->set_precision({});
    m.allocate(kBatch);
    return m.loss_chunking().columns;
  };
  EXPECT_EQ(columns(aligned, {}), 64);
  EXPECT_EQ(columns(aligned, 0), kVocab);
  EXPECT_EQ(columns(aligned, 8), 40);
  EXPECT_EQ(columns(aligned, {}, 0.1f), kVocab);  // label smoothing: never padded
  EXPECT_EQ(columns(cpu(), {}), kVocab);
}

TEST(ChunkedLoss, TheLogitsAndTheirGradientLeaveTheMemoryPlan) {
  auto whole = tiny_gpt(0), blocks = tiny_gpt(5);
  const std::size_t logits = kBatch * kTokens * kVocab * 4, block = 5 * kVocab * 4;
  // The activations lose the logits and gain two blocks (logits, gradient); the gradients lose
  // the logits' gradient. Buffers are 64-byte aligned, hence the slack.
  EXPECT_LE(blocks->activation_plan().sum_bytes + logits,
            whole->activation_plan().sum_bytes + 2 * block + 3 * 64);
  EXPECT_GE(blocks->activation_plan().sum_bytes + logits + 3 * 64,
            whole->activation_plan().sum_bytes + 2 * block);
  EXPECT_LE(blocks->gradient_plan().sum_bytes + logits, whole->gradient_plan().sum_bytes + 64);
}

TEST(ChunkedLoss, TheWholeLogitsComeWhenAskedFor) {
  auto whole = tiny_gpt(0), blocks = tiny_gpt(5);
  for (Model* m : {whole.get(), blocks.get()}) {
    feed(*m, 7);
    m->forward(kBatch);
  }
  const auto want = read(whole->logits(kBatch)), got = read(blocks->logits(kBatch));
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kBatch * kTokens * kVocab));
  EXPECT_EQ(got, want);
  // Evaluation's loss after that (no gradient) is the blocks' again.
  EXPECT_NEAR(blocks->evaluation_loss(kBatch).loss, whole->evaluation_loss(kBatch).loss, 2e-6);
}

// A classifier of 6 rows, its loss in blocks of 2.
std::unique_ptr<Model> tiny_classifier(std::vector<LayerSpec> layers) {
  ModelSpec spec;
  spec.graph = true;
  spec.loss_chunk_rows = 2;
  spec.layers = std::move(layers);
  auto m = std::make_unique<Model>(cpu(), spec, 3, 4);
  for (auto& l : m->layers()) l->set_precision({});
  m->allocate(6);
  m->init_parameters(1);
  const std::vector<std::int32_t> y = {0, 1, 2, 3, 0, 1};
  write(m->input(6), random_vector(18, 2, -1.0f, 1.0f));
  cpu()->copy_from_host(m->labels(6), y.data());
  return m;
}

TEST(ChunkedLoss, TheReplayNamesTheFirstBlockWithANonFiniteValue) {
  auto m = tiny_classifier(
      {op("linear", "fc1", {{"out", 5}}, {"input"}), op("linear", "head", {{"out", 4}}, {"fc1"})});
  ASSERT_EQ(m->loss_chunking().rows, 2);
  m->forward(6);
  EXPECT_EQ(locate_first_nonfinite(*m, 6, 1.0f).where, "");
  // Row 4's input at 1e30: fc1's output stays finite (about 1e30), the head's product with
  // weights of 1e10 overflows — in the block of rows 4 and 5 only.
  std::vector<float> x = read(m->input(6));
  x[12] = 1e30f;
  write(m->input(6), x);
  for (auto* p : m->parameters())
    if (p->name == "head.weight") write(p->master.view(), std::vector<float>(20, 1e10f));
  const NonfiniteSite site = locate_first_nonfinite(*m, 6, 1.0f);
  EXPECT_EQ(site.where, "forward head.output (the loss block from row 4)");
  EXPECT_EQ(site.node, "head");
}

TEST(ChunkedLoss, ALogitsNodeWithoutBlocksSaysWhyAndRunsWhole) {
  // The logits are an add's output: an add computes its output whole.
  auto m = tiny_classifier({op("linear", "a", {{"out", 4}}, {"input"}),
                            op("linear", "b", {{"out", 4}}, {"input"}),
                            op("add", "sum", {}, {"a", "b"})});
  EXPECT_EQ(m->loss_chunking().rows, 0);
  EXPECT_EQ(m->loss_chunking().refusal, "a add node computes its output whole");
  m->forward(6);
  EXPECT_TRUE(std::isfinite(m->loss(6, 1.0f, true).loss));
  m->backward(6);
}

// A backend declaring its bf16 GEMMs native (a GPU's, an AMX CPU's) over another CPU backend:
// the head's blocks then read the bf16 W in every GEMM, which the CPU decodes there.
class NativeBf16Backend final : public test::ForwardingBackend {
 public:
  NativeBf16Backend() : test::ForwardingBackend(std::make_shared<backend_cpu::CpuBackend>(1)) {}
  sdk::BackendCapabilities capabilities() const override {
    auto caps = test::ForwardingBackend::capabilities();
    for (auto& s : caps.gemm_inputs)
      if (s.dtype == DType::bf16) s.native = true;
    return caps;
  }
};

// Where the backend's bf16 GEMMs decode their operands (the CPU without AMX), the chunked head
// decodes W to fp32 once per loss pass instead of at every block's forward and data gradient (a
// tied head rounds the embedding's fp32 weight to bf16 a 4 MiB slice of rows at a time on the
// way): the same products, so a bf16 step is the bits of the one that reads the bf16 W in each
// GEMM. At width 8 the GEMMs' own scratch no longer holds a decoded W (4096 × 8 fp32: 128 KiB;
// the pass's copy is freed at its end); at width 576 the weight is rounded in two slices.
TEST(ChunkedLoss, AWeightDecodedOncePerPassGivesTheBitsOfOneDecodedInEveryGemm) {
  if (cpu()->capabilities().native(DType::bf16))
    GTEST_SKIP() << "this CPU's bf16 GEMMs are native: nothing is decoded";
  constexpr std::int64_t kWide = 4096;
  for (const std::int64_t width : {8, 576}) {
    auto decoding = std::make_shared<backend_cpu::CpuBackend>(1);
    auto native = std::make_shared<NativeBf16Backend>();
    ModelSpec spec = test_support::tiny_gpt_spec(1, 2, width, kWide);
    spec.loss_chunk_rows = 5;
    const sdk::OpPrecision bf16{DType::bf16, DType::bf16, DType::bf16, DType::bf16};
    auto once =
        test_support::tiny_gpt_model(spec, kTokens, kWide, kBatch, 0.3f, bf16, false, {}, decoding);
    auto every =
        test_support::tiny_gpt_model(spec, kTokens, kWide, kBatch, 0.3f, bf16, false, {}, native);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(kBatch * kTokens)), labels(ids.size());
    const auto r = random_vector(2 * ids.size(), 44, 0.0f, static_cast<float>(kWide) - 0.01f);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<std::int32_t>(r[i]);
      labels[i] = static_cast<std::int32_t>(r[ids.size() + i]);
    }
    LossValues loss[2];
    Model* models[2] = {once.get(), every.get()};
    for (int k = 0; k < 2; ++k) {
      Model& m = *models[k];
      cpu()->copy_from_host(m.input(kBatch), ids.data());
      cpu()->copy_from_host(m.labels(kBatch), labels.data());
      m.forward(kBatch);
      loss[k] = m.loss(kBatch, 8.0f, true);
      m.backward(kBatch);
    }
    const std::string what = "width " + std::to_string(width);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(loss[0].loss),
              std::bit_cast<std::uint32_t>(loss[1].loss))
        << what;
    const auto po = once->parameters(), pe = every->parameters();
    ASSERT_EQ(po.size(), pe.size());
    for (std::size_t i = 0; i < po.size(); ++i)
      EXPECT_EQ(read(po[i]->grad.view()), read(pe[i]->grad.view())) << po[i]->name << ", " << what;
    if (width != 8) continue;
    // Less by W's fp32 bytes but for the largest other operand its B-side scratch keeps (the
    // block's other GEMMs are small at this width).
    const auto scratch = [](sdk::DeviceBackend& b) {
      return sdk::facet<sdk::ScratchFacet>(b)->scratch_bytes();
    };
    const std::size_t w_bytes = kWide * 8 * sizeof(float);
    EXPECT_GE(scratch(*native), scratch(*decoding) + w_bytes * 9 / 10);
  }
}

// The CPU backend without sdk::kFeatureGemmFullRateAtFewRows, as a GPU backend declares its
// features: a GEMM of a few hundred rows is not at its rate there.
class GpuLikeRowsBackend final : public test_support::ForwardingBackend {
 public:
  sdk::BackendCapabilities capabilities() const override {
    auto caps = ForwardingBackend::capabilities();
    std::erase(caps.features, std::string(sdk::kFeatureGemmFullRateAtFewRows));
    return caps;
  }
};

// Unset, the block is 512 rows on the CPU (its GEMMs are at their rate there, and the logits and
// the GEMMs' copies take half of 1024 rows' bytes), 1024 on a backend without the feature,
// for a model of 4096 classes or more (a vocabulary); the logits of fewer classes are computed
// whole. Set, 0 included, it is what it says.
TEST(ChunkedLoss, UnsetBlocksOnlyAVocabularyOfLogitsByTheBackendsGemmRate) {
  const auto gpu_like = std::make_shared<GpuLikeRowsBackend>();
  EXPECT_EQ(default_loss_chunk_rows(*cpu(), 4096), kLossChunkRowsFewRows);
  EXPECT_EQ(default_loss_chunk_rows(*gpu_like, 4096), kLossChunkRows);
  EXPECT_EQ(default_loss_chunk_rows(*cpu(), 4095), 0);
  EXPECT_EQ(default_loss_chunk_rows(*gpu_like, 4095), 0);
  for (const std::int32_t classes : {4095, 4096}) {
    ModelSpec spec;
    spec.layers = {op("linear", "head", {{"out", static_cast<int>(classes)}})};
    Model m(cpu(), spec, 2, classes);
    for (auto& l : m.layers()) l->set_precision({});
    m.allocate(1025);
    EXPECT_EQ(m.loss_chunking().rows, classes == 4096 ? kLossChunkRowsFewRows : 0) << classes;
    Model g(gpu_like, spec, 2, classes);
    for (auto& l : g.layers()) l->set_precision({});
    g.allocate(1025);
    EXPECT_EQ(g.loss_chunking().rows, classes == 4096 ? kLossChunkRows : 0) << classes;
  }
  ModelSpec set;
  set.layers = {op("linear", "head", {{"out", 4096}})};
  set.loss_chunk_rows = 0;
  Model whole(cpu(), set, 2, 4096);
  for (auto& l : whole.layers()) l->set_precision({});
  whole.allocate(1025);
  EXPECT_EQ(whole.loss_chunking().rows, 0);
}

}  // namespace
}  // namespace mixtrain::core
