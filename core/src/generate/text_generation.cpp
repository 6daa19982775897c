#include "mixtrain/core/generate/text_generation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "mixtrain/core/graph/decoder.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

std::int32_t sample_token(std::span<const float> logits, double temperature, std::int64_t top_k,
                          DataRng& rng) {
  if (logits.empty()) throw std::logic_error("sample_token: no logits");
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  if (temperature == 0.0) return static_cast<std::int32_t>(best);
  // The k-th largest logit bounds the candidates (ties at it stay in).
  float floor = -std::numeric_limits<float>::infinity();
  if (top_k > 0 && static_cast<std::size_t>(top_k) < logits.size()) {
    std::vector<float> sorted(logits.begin(), logits.end());
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                     std::greater<float>());
    floor = sorted[static_cast<std::size_t>(top_k - 1)];
  }
  std::vector<double> p(logits.size(), 0.0);
  double sum = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (logits[i] >= floor) {
      p[i] = std::exp((static_cast<double>(logits[i]) - logits[best]) / temperature);
      sum += p[i];
    }
  double u = rng.uniform() * sum;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0.0) continue;
    if (u < p[i]) return static_cast<std::int32_t>(i);
    u -= p[i];
  }
  return static_cast<std::int32_t>(best);  // rounding left u at the very end
}

std::vector<std::int32_t> generate(Model& model, std::span<const std::int32_t> prompt,
                                   const SamplingOptions& o,
                                   const std::function<void(std::int32_t)>& on_token) {
  if (prompt.empty())
    throw sdk::UserError("the prompt is empty", "give --prompt some text to continue");
  if (!std::isfinite(o.temperature) || o.temperature < 0.0)
    throw sdk::UserError("temperature " + std::to_string(o.temperature) +
                             (std::isnan(o.temperature) ? " is not a number"
                              : o.temperature < 0.0     ? " is negative"
                                                        : " is infinite"),
                         "use 0 (greedy) or a positive, finite temperature");
  const std::int64_t block = model.input_features();
  std::vector<std::int32_t> context(prompt.begin(), prompt.end());
  std::vector<std::int32_t> out;
  DataRng rng(o.seed, 0x73616d706c65ull);  // "sample"
  // Prefill the last `block` prompt tokens; later tokens one at a time.
  Decoder decoder(model, block);
  auto restart = [&](std::size_t keep) {
    decoder.reset();
    const std::size_t from = context.size() - std::min(context.size(), keep);
    return decoder.decode(std::span<const std::int32_t>(context).subspan(from));
  };
  std::vector<float> logits = restart(static_cast<std::size_t>(block));
  for (std::int64_t i = 0; i < o.tokens; ++i) {
    const std::int32_t next = sample_token(logits, o.temperature, o.top_k, rng);
    out.push_back(next);
    context.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == o.tokens) break;
    if (decoder.length() < block) {
      const std::int32_t one[1] = {next};
      logits = decoder.decode(one);
    } else {
      logits = restart(static_cast<std::size_t>(std::max<std::int64_t>(block / 2, 1)));
    }
  }
  return out;
}

}  // namespace mixtrain::core
