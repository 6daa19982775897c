// `mixtrain sample`: continues a prompt with a trained language model, token by token over a KV
// cache (core/include/mixtrain/core/generate/text_generation.h). Text in and out only for a
// byte-level model; any other vocabulary takes and prints token ids (token_ids.h), which the
// model's own tokenizer makes and reads outside mixtrain (README, "Tokens for a pretrained GPT-2").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "mixtrain/core/generate/text_generation.h"
#include "mixtrain/core/graph/decoder.h"
#include "model_session.h"
#include "token_ids.h"

namespace mixtrain::cli {

namespace {

constexpr std::int64_t kByteVocabulary = 256;
constexpr const char* kTokensSection =
    "README, \"Tokens for a pretrained GPT-2\", has the one-line encode and decode";

// A model trained on data.source = "text" reads bytes whatever its vocab_size (a larger one only
// pads the output layer); any other model whose vocabulary is 256 is taken to be byte-level too.
bool byte_level(const core::Experiment& e, std::int64_t vocab) {
  return vocab == kByteVocabulary || e.data.source == core::DataSource::text;
}

// The vocabulary decides what the prompt and the output may be; checked before any weight loads.
void check_prompt_fits(const SampleArgs& args, std::int64_t vocab, bool bytes,
                       const std::vector<std::int32_t>& prompt) {
  if (args.prompt && !bytes)
    throw sdk::UserError(
        "--prompt is read as bytes, the token ids of a byte-level model (data.source = \"text\" "
        "or a vocabulary of 256), but this model's vocabulary has " +
            std::to_string(vocab) + " tokens",
        "give the prompt as ids from the model's tokenizer: --prompt-ids ID,ID,... --print-ids (" +
            std::string(kTokensSection) + ")");
  check_in_vocabulary(prompt, bytes ? kByteVocabulary : vocab,
                      args.prompt ? "--prompt" : "--prompt-ids");
  if (!args.print_ids && !bytes)
    throw sdk::UserError(
        "sample prints text only for a byte-level model (data.source = \"text\" or a vocabulary "
        "of 256), but this model's vocabulary has " +
            std::to_string(vocab) + " tokens",
        "add --print-ids and decode the ids with the model's tokenizer (" +
            std::string(kTokensSection) + ")");
}

// The sampling flags as generate() takes them; their ranges are checked here, before anything
// loads, with the flag's name.
core::SamplingOptions sampling_options(const SampleArgs& args) {
  core::SamplingOptions o;
  o.tokens = args.tokens;
  o.temperature = args.temperature;
  o.top_k = args.top_k;
  o.top_p = args.top_p;
  o.repetition_penalty = args.repetition_penalty;
  o.seed = args.seed;
  if (args.stop_ids) o.stop_ids = parse_token_ids(*args.stop_ids, "--stop-ids");
  try {
    core::check_sampling_options(o);
  } catch (const sdk::UserError& e) {
    // The message starts with the option's name (top_p): name the flag (--top-p) instead.
    std::string what = e.what();
    std::replace(what.begin(), what.begin() + static_cast<std::ptrdiff_t>(what.find(' ')), '_',
                 '-');
    throw sdk::UserError("--" + what, e.hint());
  }
  return o;
}

}  // namespace

int run_sample(const ConfigArgs& cfg, const SampleArgs& args) {
  // The arguments first: a typo costs nothing to report, loading the data and model does.
  core::SamplingOptions o = sampling_options(args);
  if (!args.prompt && !args.prompt_ids)
    throw sdk::UserError("sample needs a prompt to continue",
                         "give --prompt TEXT (a byte-level model) or --prompt-ids ID,ID,... (the "
                         "ids of the model's own tokenizer)");
  std::vector<std::int32_t> prompt;
  if (args.prompt)
    for (unsigned char c : *args.prompt) prompt.push_back(c);
  else
    prompt = parse_token_ids(*args.prompt_ids, "--prompt-ids");
  if (prompt.empty())
    throw sdk::UserError("the prompt is empty", "give --prompt some text to continue");

  auto session = open_model_session(cfg, SessionWeights::from_checkpoint);
  auto& trainer = *session.trainer;
  // Whether the model can decode at all, before its vocabulary or its weights are looked at.
  { const core::Decoder probe(trainer.model(), 1); }
  const std::int64_t vocab = trainer.model().classes();
  const bool bytes = byte_level(session.experiment, vocab);
  check_prompt_fits(args, vocab, bytes, prompt);
  // A padded byte-level model never emits an id past the bytes.
  if (bytes) o.vocabulary = kByteVocabulary;
  check_in_vocabulary(o.stop_ids, bytes ? kByteVocabulary : vocab, "--stop-ids");
  trainer.load_checkpoint(session.checkpoint_path(args.checkpoint),
                          /*weights_only=*/true, core::parse_weight_layout(args.layout));
  // Ids come out in --prompt-ids' own form, so an output continues as the next call's prompt.
  const bool ids = args.print_ids;
  if (ids) {
    std::fputs(format_token_ids(prompt).c_str(), stdout);
  } else {
    for (std::int32_t id : prompt) std::fputc(static_cast<unsigned char>(id), stdout);
  }
  // The model as loaded: a checkpoint of a run that escalated replans it (a new Model object).
  core::generate(trainer.model(), prompt, o, [ids](std::int32_t id) {
    if (ids)
      std::fprintf(stdout, ",%d", static_cast<int>(id));
    else
      std::fputc(static_cast<unsigned char>(id), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace mixtrain::cli
