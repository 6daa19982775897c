// The gpt preset at test sizes, for the core's unit tests: its graph (n_layer blocks of width
// n_embd in n_head heads over a vocabulary of `vocab`, the LM head tied to wte;
// config/model_presets.h), and a model of it on the test CPU backend in FP32.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "config/model_presets.h"
#include "cpu_test_backend.h"
#include "layer_gradient_check.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/graph/model_spec.h"

namespace mixtrain::core::test_support {

inline ModelSpec tiny_gpt_spec(std::int64_t n_layer = 2, std::int64_t n_head = 2,
                               std::int64_t n_embd = 8, std::int64_t vocab = 11,
                               bool fused_attention = true) {
  GptPreset p;
  p.fused_attention = fused_attention;
  p.n_layer = n_layer;
  p.n_head = n_head;
  p.n_embd = n_embd;
  p.vocab_size = vocab;
  ModelSpec spec;
  spec.layers = gpt_preset(p);
  spec.graph = true;
  return spec;
}

// `spec` over `tokens` token ids per sample, allocated for `batch` samples, every op in
// `precision` (FP32 unless given; the all-FP32 pass's gradients reserved with reserve_fp32),
// initialised from seed 5 and then moved by uniform noise in
// [-noise, noise] (seed 17): weights large enough that the logits differ clearly from one token to
// the next, which GPT-2's 0.02 does not give.
inline std::unique_ptr<Model> tiny_gpt_model(const ModelSpec& spec, std::int64_t tokens,
                                             std::int64_t vocab, std::int64_t batch, float noise,
                                             const sdk::OpPrecision& precision = {},
                                             bool reserve_fp32 = false,
                                             std::optional<std::int64_t> train_rows = {},
                                             std::shared_ptr<sdk::DeviceBackend> backend = cpu()) {
  auto m = std::make_unique<Model>(backend, spec, tokens, static_cast<std::int32_t>(vocab),
                                   InputSpec{sdk::DType::int32, tokens, {}, {}});
  for (auto& l : m->layers()) l->set_precision(precision);
  // `batch` rows for both passes, or a training step of train_rows and an evaluation of batch.
  m->allocate(Executor::PassRows{train_rows.value_or(batch), batch}, reserve_fp32);
  m->init_parameters(5);
  for (auto* param : m->parameters()) {
    // Every kind of parameter: a master, or a frozen one's one copy in its dtype (LoRA's base).
    auto v = parameter_to_host_fp32(backend, *param);
    const auto moves = random_vector(v.size(), 17, -noise, noise);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += moves[i];
    set_parameter_from_fp32(backend, *param, v.data());
  }
  m->refresh_working_copies();
  return m;
}

}  // namespace mixtrain::core::test_support
