// `mixtrain sample`: continues a prompt with a trained language model, token by token over a KV
// cache (core/include/mixtrain/core/generate/text_generation.h).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "cli_registry.h"
#include "commands.h"
#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/generate/text_generation.h"
#include "mixtrain/core/train/trainer.h"

namespace mixtrain::cli {

int run_sample(const ConfigArgs& cfg, const SampleArgs& args) {
  auto config = core::Config::from_file(cfg.config, cfg.sets);
  auto registry = make_registry(&config);
  auto experiment = core::parse_experiment(config, *registry);
  auto components = core::create_components(experiment, *registry);
  const auto ext = components.checkpoint_format->file_extension();
  core::TrainOptions opt;
  opt.write_outputs = false;
  core::Trainer trainer(experiment, std::move(components), opt);
  auto& model = trainer.model();
  // Byte-level models read the prompt's bytes as ids; a larger vocabulary needs its tokenizer,
  // which mixtrain does not ship.
  if (model.classes() != 256)
    throw sdk::UserError(
        "sample reads the prompt as bytes (a vocabulary of 256), but this model's "
        "vocabulary has " +
            std::to_string(model.classes()) + " tokens",
        "sample from a byte-level model (data.source = \"text\")");
  if (args.tokens < 0)
    throw sdk::UserError("--tokens " + std::to_string(args.tokens) + " is negative",
                         "ask for 0 or more tokens");
  if (args.top_k < 0)
    throw sdk::UserError("--top-k " + std::to_string(args.top_k) + " is negative",
                         "use 0 (every token) or a positive k");
  trainer.load_checkpoint(core::resolve_checkpoint_path(args.checkpoint, ext),
                          /*weights_only=*/true, core::parse_weight_layout(args.layout));
  std::vector<std::int32_t> prompt;
  for (unsigned char c : args.prompt) prompt.push_back(c);
  core::SamplingOptions o;
  o.tokens = args.tokens;
  o.temperature = args.temperature;
  o.top_k = args.top_k;
  o.seed = args.seed;
  std::fwrite(args.prompt.data(), 1, args.prompt.size(), stdout);
  core::generate(model, prompt, o, [](std::int32_t id) {
    std::fputc(static_cast<unsigned char>(id), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace mixtrain::cli
