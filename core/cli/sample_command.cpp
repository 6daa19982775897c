// `mixtrain sample`: continues a prompt with a trained language model, token by token over a KV
// cache (core/include/mixtrain/core/generate/text_generation.h). Text in and out only for a
// byte-level model; any other vocabulary takes and prints token ids (token_ids.h), which the
// model's own tokenizer makes and reads outside mixtrain (README, "Tokens for a pretrained GPT-2").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "commands.h"
#include "mixtrain/core/checkpoint/hf_folder.h"
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

// An integer key of the resolved [model.gpt]; none for a model that is not the gpt preset.
std::optional<std::int64_t> gpt_key(const core::Experiment& e, const std::string& name) {
  for (const auto& section : e.core_sections)
    if (section.name == "model.gpt")
      for (const auto& [key, value] : section.values)
        if (key == name && std::holds_alternative<std::int64_t>(value))
          return std::get<std::int64_t>(value);
  return std::nullopt;
}

// What the context window leaves out, said: the model is built for the data's block_size, which
// may be shorter than the positions it learned (a fine-tune on short windows), and a longer
// prompt keeps only its last `block` tokens.
void warn_of_context(const core::Experiment& e, std::int64_t block, std::size_t prompt) {
  if (const auto positions = gpt_key(e, "block_size"); positions && *positions > block)
    std::cerr << "warning: the context is data.block_size = " << block << " tokens, but the model "
              << "has " << *positions << " positions ([model.gpt] block_size): --set "
              << "data.block_size=" << *positions << " samples with all of them" << std::endl;
  if (static_cast<std::int64_t>(prompt) > block)
    std::cerr << "warning: the prompt's first " << static_cast<std::int64_t>(prompt) - block
              << " of " << prompt << " tokens are left out: the context holds " << block
              << " (data.block_size)" << std::endl;
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

  // Whether the model can decode at all, before its vocabulary or its weights are looked at.
  const auto decodes = [](core::Model& model) { const core::Decoder probe(model, 1); };
  auto session = open_model_session(cfg, SessionWeights::from_checkpoint, /*rehearses=*/false,
                                    core::DataSplits::none,
                                    {.path = args.checkpoint,
                                     .layout = args.layout,
                                     .records_shape = false,
                                     .check_model = decodes});
  auto& trainer = *session.trainer;
  const std::int64_t vocab = trainer.model().classes();
  const bool bytes = byte_level(session.experiment, vocab);
  check_prompt_fits(args, vocab, bytes, prompt);
  // A padded byte-level model never emits an id past the bytes.
  if (bytes) o.vocabulary = kByteVocabulary;
  check_in_vocabulary(o.stop_ids, bytes ? kByteVocabulary : vocab, "--stop-ids");
  // As Hugging Face's generate() does: the model's end-of-text id ends the output, unless the
  // caller names its own stops or asks for none.
  const auto stated_eos = gpt_key(session.experiment, "eos_token_id");
  const auto eos = stated_eos ? core::gpt2_token_id(stated_eos, vocab) : std::nullopt;
  // -1: no stop at the end-of-text id.
  const std::int64_t eos_stop = !args.stop_ids && !args.ignore_eos ? eos.value_or(-1) : -1;
  if (eos_stop >= 0) o.stop_ids = {static_cast<std::int32_t>(eos_stop)};
  warn_of_context(session.experiment, trainer.model().input_features(), prompt.size());
  // Ids come out in --prompt-ids' own form, so an output continues as the next call's prompt.
  const bool ids = args.print_ids;
  if (ids) {
    std::fputs(format_token_ids(prompt).c_str(), stdout);
  } else {
    for (std::int32_t id : prompt) std::fputc(static_cast<unsigned char>(id), stdout);
  }
  // The model as loaded: a checkpoint of a run that escalated replans it (a new Model object).
  const auto generated = core::generate(trainer.model(), prompt, o, [ids](std::int32_t id) {
    if (ids)
      std::fprintf(stdout, ",%d", static_cast<int>(id));
    else
      std::fputc(static_cast<unsigned char>(id), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  if (eos_stop >= 0 && !generated.empty() && generated.back() == eos_stop &&
      static_cast<std::int64_t>(generated.size()) < o.tokens)
    std::cerr << "stopped at the model's eos_token_id " << eos_stop << " after " << generated.size()
              << " of " << o.tokens << " tokens ([model.gpt] eos_token_id; --ignore-eos generates "
              << "past it)" << std::endl;
  return 0;
}

}  // namespace mixtrain::cli
