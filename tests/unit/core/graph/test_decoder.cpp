// The Decoder: KV-cache decoding gives what a full forward over the whole prefix gives, and the
// cache is the Decoder's own: the model trains a step while a Decoder is alive, bit for bit as it
// would without one, and the Decoder then goes on decoding as if nothing had happened.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cpu_test_backend.h"
#include "layer_gradient_check.h"
#include "mixtrain/core/graph/decoder.h"
#include "mixtrain/core/graph/model.h"
#include "tiny_gpt.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using test_support::cpu;
using test_support::random_vector;
using test_support::read;
using test_support::write;

constexpr std::int64_t kTokens = 6, kVocab = 11, kBatch = 2;

// A 2-layer GPT from the preset (width 8 in 2 heads) with weights large enough that the logits
// differ clearly from one token to the next (GPT-2's 0.02 gives near-uniform ones).
std::unique_ptr<Model> tiny_gpt() {
  return test_support::tiny_gpt_model(test_support::tiny_gpt_spec(2, 2, 8, kVocab), kTokens, kVocab,
                                      kBatch, 0.4f);
}

// The logits after `prefix` without a cache: the whole sequence through a training-layout
// forward of one sample (positions after the prefix hold 0; attention is causal).
std::vector<float> full_forward_logits(Model& m, const std::vector<std::int32_t>& prefix) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(kTokens), 0);
  std::copy(prefix.begin(), prefix.end(), ids.begin());
  cpu()->copy_from_host(m.input(1), ids.data());
  m.forward(1);
  const auto all = read(m.logits(1));
  const auto row = static_cast<std::ptrdiff_t>((prefix.size() - 1) * kVocab);
  return {all.begin() + row, all.begin() + row + kVocab};
}

std::int32_t argmax(const std::vector<float>& v) {
  return static_cast<std::int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// One training step's loss and every parameter gradient, on a fixed batch.
std::vector<float> train_step(Model& m) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(kBatch * kTokens)), next(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 7) % 11);
  for (std::size_t i = 0; i < ids.size(); ++i) next[i] = ids[(i + 1) % ids.size()];
  cpu()->copy_from_host(m.input(kBatch), ids.data());
  cpu()->copy_from_host(m.labels(kBatch), next.data());
  m.begin_micro_batch(0, 1);
  m.forward(kBatch);
  std::vector<float> out = {m.loss(kBatch, 1.0f, true).loss};
  m.backward(kBatch);
  for (auto* p : m.parameters()) {
    const auto g = read(p->grad.view());
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

TEST(Decoder, GreedyTokensAndLogitsMatchAFullForwardOverThePrefix) {
  auto m = tiny_gpt();
  Decoder decoder(*m, kTokens);
  std::vector<std::int32_t> context = {3, 9, 4};
  std::vector<float> logits = decoder.decode(context);  // the prompt at once (prefill)
  std::vector<std::int32_t> cached;
  while (true) {
    const auto want = full_forward_logits(*m, context);
    ASSERT_EQ(logits.size(), want.size());
    for (std::size_t k = 0; k < want.size(); ++k)
      EXPECT_NEAR(logits[k], want[k], 1e-5f * std::max(1.0f, std::abs(want[k])))
          << "position " << context.size() - 1 << ", logit " << k;
    const std::int32_t next = argmax(logits);
    EXPECT_EQ(next, argmax(want)) << "position " << context.size() - 1;
    cached.push_back(next);
    if (static_cast<std::int64_t>(context.size()) == kTokens) break;
    context.push_back(next);
    const std::int32_t one[1] = {next};
    logits = decoder.decode(one);
  }
  EXPECT_EQ(decoder.length(), kTokens);
  // The cache is full: one more token is refused, and reset() starts again from position 0.
  const std::int32_t one[1] = {0};
  EXPECT_THROW(decoder.decode(one), sdk::UserError);
  decoder.reset();
  const std::vector<std::int32_t> prompt = {3, 9, 4};
  const auto again = decoder.decode(prompt);
  EXPECT_EQ(argmax(again), cached.front());
}

TEST(Decoder, AModelTrainsAStepWhileADecoderIsAliveAndDecodingGoesOn) {
  auto trained = tiny_gpt(), alone = tiny_gpt();
  const std::vector<std::int32_t> prompt = {1, 2, 3}, more = {7, 5};

  // The same step with and without a live Decoder that has filled part of its cache.
  Decoder decoder(*trained, kTokens);
  decoder.decode(prompt);
  EXPECT_EQ(trained->mode(), Model::Mode::train) << "a decode step gives the mode back";
  const auto with_decoder = train_step(*trained);
  const auto without = train_step(*alone);
  ASSERT_EQ(with_decoder.size(), without.size());
  for (std::size_t i = 0; i < without.size(); ++i)
    ASSERT_EQ(with_decoder[i], without[i]) << "value " << i << " of the loss and gradients";

  // No optimizer step was applied, so the weights are unchanged: the decoder goes on as a
  // decoder that never saw the training step.
  Decoder fresh(*alone, kTokens);
  fresh.decode(prompt);
  EXPECT_EQ(decoder.decode(more), fresh.decode(more));
  EXPECT_EQ(decoder.length(), 5);
}

TEST(Decoder, TwoDecodersOfOneModelKeepTheirOwnCaches) {
  auto m = tiny_gpt();
  const std::vector<std::int32_t> a = {1, 2}, b = {8, 8, 8}, next = {4};
  Decoder alone(*m, kTokens);
  alone.decode(a);
  const auto want = alone.decode(next);

  Decoder first(*m, kTokens), second(*m, kTokens);
  first.decode(a);
  second.decode(b);
  second.decode(next);
  EXPECT_EQ(first.decode(next), want);
}

// Decoding in one op (attention 1.3's flash_decode, which the CPU backend offers) against the
// unfused decode (the preset's fused_attention = false) from the same weights: every step's
// logits within FP32 reordering and the same greedy tokens, and only the fused model calls
// flash_decode (with neither scores nor a softmax).
TEST(Decoder, DecodingInOneOpGivesTheUnfusedDecodesGreedyTokens) {
  auto model_on = [](bool fused, const std::shared_ptr<sdk::DeviceBackend>& backend) {
    GptPreset p;
    p.n_layer = 2;
    p.n_head = 2;
    p.n_embd = 8;
    p.vocab_size = kVocab;
    p.fused_attention = fused;
    ModelSpec spec;
    spec.layers = gpt_preset(p);
    spec.graph = true;
    auto m = std::make_unique<Model>(backend, spec, kTokens, static_cast<std::int32_t>(kVocab),
                                     InputSpec{DType::int32, kTokens, {}, {}});
    for (auto& l : m->layers()) l->set_precision({});
    m->allocate(kBatch);
    m->init_parameters(5);
    for (auto* param : m->parameters()) {
      auto v = read(param->master.view());
      const auto moves = random_vector(v.size(), 17, -0.4f, 0.4f);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] += moves[i];
      write(param->master.view(), v);
    }
    return m;
  };
  auto counting = std::make_shared<test_support::CallCountingBackend>();
  auto flash = model_on(true, counting);
  auto unfused = model_on(false, cpu());
  Decoder a(*flash, kTokens), b(*unfused, kTokens);
  counting->counting = true;
  std::vector<std::int32_t> prompt = {3, 9, 4};
  auto la = a.decode(prompt), lb = b.decode(prompt);
  for (std::int64_t pos = 3; pos < kTokens; ++pos) {
    ASSERT_EQ(la.size(), lb.size());
    for (std::size_t k = 0; k < lb.size(); ++k)
      EXPECT_NEAR(la[k], lb[k], 1e-5f * std::max(1.0f, std::abs(lb[k])))
          << "position " << pos - 1 << ", logit " << k;
    ASSERT_EQ(argmax(la), argmax(lb)) << "position " << pos - 1;
    const std::int32_t next[1] = {argmax(la)};
    la = a.decode(next);
    lb = b.decode(next);
  }
  for (std::size_t k = 0; k < lb.size(); ++k)
    EXPECT_NEAR(la[k], lb[k], 1e-5f * std::max(1.0f, std::abs(lb[k]))) << "the last, logit " << k;
  EXPECT_EQ(argmax(la), argmax(lb)) << "the last position";
  // Two attention nodes, one call per decode step each: the prompt and three more tokens.
  EXPECT_EQ(counting->count("flash_decode"), 2 * 4);
  EXPECT_EQ(counting->count("softmax_forward"), 0);
  EXPECT_EQ(counting->count("merge_heads"), 0);
}

}  // namespace
}  // namespace mixtrain::core
