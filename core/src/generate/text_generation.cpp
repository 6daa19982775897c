#include "mixtrain/core/generate/text_generation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <unordered_set>

#include "mixtrain/core/graph/decoder.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::size_t argmax(std::span<const float> logits) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

// Unnormalised candidate weights (0 outside), and their sum: sample_token draws from these
// directly, so that without top_p its draws are the ones it made before top_p existed.
struct Weights {
  std::vector<double> w;
  double sum = 0.0;
};

Weights candidate_weights(std::span<const float> logits, const SamplingOptions& o) {
  if (logits.empty()) throw std::logic_error("sampling: no logits");
  const float top = logits[argmax(logits)];
  // The k-th largest logit bounds the candidates (ties at it stay in).
  float floor = -std::numeric_limits<float>::infinity();
  if (o.top_k > 0 && static_cast<std::size_t>(o.top_k) < logits.size()) {
    std::vector<float> sorted(logits.begin(), logits.end());
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(),
                     std::greater<float>());
    floor = sorted[static_cast<std::size_t>(o.top_k - 1)];
  }
  Weights out;
  out.w.assign(logits.size(), 0.0);
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (logits[i] >= floor) {
      out.w[i] = std::exp((static_cast<double>(logits[i]) - top) / o.temperature);
      out.sum += out.w[i];
    }
  if (o.top_p >= 1.0) return out;
  // The nucleus: walk the candidates from the likeliest; a run of equal logits is kept or
  // dropped whole, so the result does not depend on a sort's order among ties.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (out.w[i] > 0.0) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  const double limit = o.top_p * out.sum;
  double before = 0.0;
  double kept = 0.0;
  std::size_t i = 0;
  while (i < order.size() && before < limit) {
    std::size_t j = i;
    double run = 0.0;
    for (; j < order.size() && logits[order[j]] == logits[order[i]]; ++j) run += out.w[order[j]];
    before += run;
    kept += run;
    i = j;
  }
  for (; i < order.size(); ++i) out.w[order[i]] = 0.0;
  out.sum = kept;
  return out;
}

}  // namespace

void check_sampling_options(const SamplingOptions& o) {
  if (!std::isfinite(o.temperature) || o.temperature < 0.0)
    throw sdk::UserError("temperature " + number(o.temperature) + " is not a finite number >= 0",
                         "use 0 (greedy) or a positive temperature such as 0.8");
  if (!(o.top_p > 0.0 && o.top_p <= 1.0))
    throw sdk::UserError("top_p " + number(o.top_p) + " is outside (0, 1]",
                         "use a probability mass such as 0.9 (1 keeps every token)");
  // Checked as the float it is applied as (apply_repetition_penalty): 1e-320 is 0 there, and
  // 1e39 infinite.
  const auto penalty = static_cast<float>(o.repetition_penalty);
  if (!(penalty > 0.0f) || !std::isfinite(penalty))
    throw sdk::UserError("repetition_penalty " + number(o.repetition_penalty) +
                             " is not a finite number > 0 as a float (it is applied in float)",
                         "use 1 (off) or a value such as 1.2 (above 1 discourages repeats)");
  if (o.top_k < 0)
    throw sdk::UserError("top_k " + std::to_string(o.top_k) + " is negative",
                         "use 0 (every token) or a positive count");
  if (o.vocabulary < 0)
    throw sdk::UserError("vocabulary " + std::to_string(o.vocabulary) + " is negative",
                         "use 0 (every id the model outputs) or the data's vocabulary size");
}

namespace {

// The penalty on ids given each once (and within `logits`), in float, as Hugging Face's processor
// computes it on fp32 scores.
void penalize_distinct(std::span<float> logits, std::span<const std::int32_t> distinct,
                       double penalty) {
  if (penalty == 1.0) return;
  const auto p = static_cast<float>(penalty);
  for (const std::int32_t id : distinct) {
    float& l = logits[static_cast<std::size_t>(id)];
    l = l < 0.0f ? l * p : l / p;
  }
}

}  // namespace

void apply_repetition_penalty(std::span<float> logits, std::span<const std::int32_t> context,
                              double penalty) {
  if (penalty == 1.0) return;
  std::unordered_set<std::int32_t> seen;
  std::vector<std::int32_t> distinct;
  for (const std::int32_t id : context)
    if (id >= 0 && static_cast<std::size_t>(id) < logits.size() && seen.insert(id).second)
      distinct.push_back(id);
  penalize_distinct(logits, distinct, penalty);
}

std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingOptions& o) {
  if (!(o.temperature > 0.0)) throw std::logic_error("sampling_distribution: temperature 0");
  auto weights = candidate_weights(logits, o);
  for (double& w : weights.w) w /= weights.sum;
  return weights.w;
}

std::int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, DataRng& rng) {
  if (logits.empty()) throw std::logic_error("sample_token: no logits");
  const std::size_t best = argmax(logits);
  if (o.temperature == 0.0) return static_cast<std::int32_t>(best);
  const auto weights = candidate_weights(logits, o);
  double u = rng.uniform() * weights.sum;
  for (std::size_t i = 0; i < weights.w.size(); ++i) {
    if (weights.w[i] == 0.0) continue;
    if (u < weights.w[i]) return static_cast<std::int32_t>(i);
    u -= weights.w[i];
  }
  return static_cast<std::int32_t>(best);  // rounding left u at the very end
}

namespace {

// The ids the context holds, each once, with a flag per candidate id: the repetition penalty
// reads them each step, so keeping them as tokens arrive makes a step cost the distinct ids,
// not the whole context (quadratic over a long output).
class SeenIds {
 public:
  explicit SeenIds(std::size_t candidates) : seen_(candidates, 0) {}
  void add(std::int32_t id) {
    if (id < 0 || static_cast<std::size_t>(id) >= seen_.size() ||
        seen_[static_cast<std::size_t>(id)] != 0)
      return;
    seen_[static_cast<std::size_t>(id)] = 1;
    ids_.push_back(id);
  }
  std::span<const std::int32_t> ids() const { return ids_; }

 private:
  std::vector<char> seen_;
  std::vector<std::int32_t> ids_;
};

// Sampling from NaN or infinite logits draws nothing meaningful (Hugging Face raises): the
// weights hold non-finite values, or the forward overflowed its precision.
void check_finite_logits(std::span<const float> logits, std::int64_t token) {
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      throw sdk::UserError(
          "the model's logits for generated token " + std::to_string(token + 1) +
              " are not finite (id " + std::to_string(i) + ": " +
              number(static_cast<double>(logits[i])) +
              "): nothing can be sampled from them",
          "the checkpoint's weights hold NaN or infinity, or the forward overflows its "
          "precision: check the checkpoint with `mixtrain eval`, or sample under "
          "--set precision.policy=fp32");
}

}  // namespace

std::vector<std::int32_t> generate(Model& model, std::span<const std::int32_t> prompt,
                                   const SamplingOptions& o,
                                   const std::function<void(std::int32_t)>& on_token) {
  if (prompt.empty())
    throw sdk::UserError("the prompt is empty", "give --prompt some text to continue");
  check_sampling_options(o);
  if (o.vocabulary > model.classes())
    throw sdk::UserError("vocabulary " + std::to_string(o.vocabulary) + " is larger than the " +
                             std::to_string(model.classes()) + " ids the model outputs",
                         "use at most the model's vocab_size (0 keeps every id)");
  const auto drawn = static_cast<std::size_t>(o.vocabulary > 0 ? o.vocabulary : model.classes());
  const std::int64_t block = model.input_features();
  std::vector<std::int32_t> context(prompt.begin(), prompt.end());
  SeenIds seen(drawn);
  for (const std::int32_t id : prompt) seen.add(id);
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
    // Ids past `drawn` (a padded output layer's) are never candidates.
    const std::span<float> candidates = std::span<float>(logits).first(drawn);
    check_finite_logits(candidates, i);
    penalize_distinct(candidates, seen.ids(), o.repetition_penalty);  // ids each once, in range
    const std::int32_t next = sample_token(candidates, o, rng);
    out.push_back(next);
    context.push_back(next);
    seen.add(next);
    // Only the last `block` tokens are read again (a restart's window; the penalty reads `seen`):
    // trimmed in halves, so a long output holds at most twice that.
    if (context.size() > 2 * static_cast<std::size_t>(block))
      context.erase(context.begin(),
                    context.end() - static_cast<std::ptrdiff_t>(block));
    if (on_token) on_token(next);
    if (i + 1 == o.tokens ||
        std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end())
      break;
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
