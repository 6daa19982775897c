// `mixtrain sample`: continues a prompt with a trained language model, token by token over a KV
// cache (core/include/mixtrain/core/generate/text_generation.h).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "mixtrain/core/generate/text_generation.h"
#include "model_session.h"

namespace mixtrain::cli {

int run_sample(const ConfigArgs& cfg, const SampleArgs& args) {
  // The arguments first: a typo costs nothing to report, loading the data and model does.
  if (!std::isfinite(args.temperature) || args.temperature < 0.0)
    throw sdk::UserError(
        "--temperature " + std::to_string(args.temperature) + " is not a finite number >= 0",
        "use 0 (greedy) or a positive temperature such as 0.8");
  auto session = open_model_session(cfg, SessionWeights::from_checkpoint);
  auto& trainer = *session.trainer;
  const auto& model = trainer.model();
  // Byte-level models read the prompt's bytes as ids; a larger vocabulary needs its tokenizer,
  // which mixtrain does not ship.
  if (model.classes() != 256)
    throw sdk::UserError(
        "sample reads the prompt as bytes (a vocabulary of 256), but this model's "
        "vocabulary has " +
            std::to_string(model.classes()) + " tokens",
        "sample from a byte-level model (data.source = \"text\")");
  trainer.load_checkpoint(session.checkpoint_path(args.checkpoint),
                          /*weights_only=*/true, core::parse_weight_layout(args.layout));
  std::vector<std::int32_t> prompt;
  for (unsigned char c : args.prompt) prompt.push_back(c);
  core::SamplingOptions o;
  o.tokens = args.tokens;
  o.temperature = args.temperature;
  o.top_k = args.top_k;
  o.seed = args.seed;
  std::fwrite(args.prompt.data(), 1, args.prompt.size(), stdout);
  // The model as loaded: a checkpoint of a run that escalated replans it (a new Model object).
  core::generate(trainer.model(), prompt, o, [](std::int32_t id) {
    std::fputc(static_cast<unsigned char>(id), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace mixtrain::cli
