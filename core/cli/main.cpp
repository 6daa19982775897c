// mixtrain — config-driven mixed-precision training. See README.md for the commands.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_registry.h"
#include "commands.h"
#include "integer_flag.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/plugin_fault.h"
#include "mixtrain/core/train/interrupt.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/options.h"
#include "token_ids.h"

namespace {

constexpr const char* kMergeHelp =
    "merge a TOML file over the config, before --set: tables key by key, arrays whole "
    "(repeatable; e.g. the precision block `mixtrain calibrate` writes)";

// Every subcommand with the arguments it fills in.
struct CommandLine {
  std::string log_level = "info";
  mixtrain::cli::ConfigArgs cfg;
  std::string run_dir, checkpoint;
  std::optional<std::string> resume;
  bool profile = false;
  bool skip_rehearsal = false;
  std::string describe, describe_section;
  std::string eval_layout = "native";
  std::vector<std::string> compare_dirs;
  std::string compare_out;
  mixtrain::cli::ExportArgs export_args;
  mixtrain::cli::CalibrateArgs calibrate_args;
  mixtrain::cli::SampleArgs sample_args;
  mixtrain::cli::PredictArgs predict_args;
  CLI::App *train = nullptr, *check = nullptr, *plugins = nullptr, *describe_cmd = nullptr,
           *eval = nullptr, *compare = nullptr, *exp = nullptr, *calibrate = nullptr,
           *sample = nullptr, *predict = nullptr;
};

using mixtrain::cli::integer_flag;
using mixtrain::cli::unsigned_flag;

CLI::IsMember weight_layouts() {
  return CLI::IsMember({"native", "gpt2"});
}

// --set and --merge: one value per flag, repeatable. CLI11's vector options otherwise take every
// argument that follows, so `train --merge m.toml cfg.toml` would merge cfg.toml too and train
// the embedded quickstart.
void add_config_overrides(CLI::App& command, mixtrain::cli::ConfigArgs& cfg) {
  command.add_option("--set", cfg.sets, "override a config value: key=value (repeatable)")
      ->allow_extra_args(false);
  command.add_option("--merge", cfg.merges, kMergeHelp)->allow_extra_args(false);
}

void add_train(CLI::App& app, CommandLine& a) {
  a.train = app.add_subcommand("train", "train a model described by a TOML config");
  a.train->add_option("config", a.cfg.config, "config file (default: the embedded quickstart)");
  add_config_overrides(*a.train, a.cfg);
  a.train->add_option("--run-dir", a.run_dir,
                      "folder for config.toml, metrics.jsonl, checkpoints/");
  a.train->add_option("--resume", a.resume,
                      "checkpoint file, a run folder or its checkpoints/ folder (newest); without "
                      "CONFIG, the run's own config.toml");
  a.train->add_flag("--profile", a.profile,
                    "time every backend op after the first step; print the breakdown and write "
                    "profile.json to the run folder");
}

void add_check(CLI::App& app, CommandLine& a) {
  a.check = app.add_subcommand("check", "validate a config and print it resolved");
  a.check->add_option("config", a.cfg.config, "config file")->required();
  add_config_overrides(*a.check, a.cfg);
  a.check->add_flag("--skip-rehearsal", a.skip_rehearsal,
                    "do not rehearse a training step: quicker, but the memory section then lists "
                    "only what is allocated before the first step, without the step's buffers, "
                    "the backend's scratch and the predicted peak");
}

void add_plugins(CLI::App& app, CommandLine& a) {
  a.plugins =
      app.add_subcommand("plugins", "list plugin libraries, their components and load errors");
  a.plugins->add_option("--describe", a.describe,
                        "print the option schema of one component (NAME or KIND/NAME), or of a "
                        "data source (data/NAME) or a host table (host/TABLE), as `mixtrain "
                        "describe` prints them");
}

void add_describe(CLI::App& app, CommandLine& a) {
  a.describe_cmd = app.add_subcommand(
      "describe",
      "list the sections a config may hold, or the keys of one with their types, "
      "defaults and ranges");
  a.describe_cmd->add_option(
      "section", a.describe_section,
      "a section: run, data, data.npy, model.gpt, optimizer, scaler.dynamic, "
      "layer.conv2d, ... (none: list them all)");
}

void add_eval(CLI::App& app, CommandLine& a) {
  a.eval = app.add_subcommand("eval", "evaluate a checkpoint on the config's held-out data");
  a.eval->add_option("config", a.cfg.config, "config file")->required();
  a.eval->add_option("--checkpoint", a.checkpoint, "checkpoint file or checkpoints/ folder")
      ->required();
  add_config_overrides(*a.eval, a.cfg);
  a.eval
      ->add_option("--layout", a.eval_layout,
                   "how the checkpoint stores its weights: native, or gpt2 (Hugging Face GPT-2)")
      ->check(weight_layouts())
      ->capture_default_str();
}

void add_compare(CLI::App& app, CommandLine& a) {
  a.compare = app.add_subcommand("compare",
                                 "parity table and chart of runs against the first (the baseline)");
  a.compare->add_option("run_dirs", a.compare_dirs, "run folders; the first is the baseline")
      ->required();
  a.compare->add_option(
      "--out", a.compare_out,
      "folder for compare.svg, compare.json, compare.md (default: the first run's)");
}

void add_export(CLI::App& app, CommandLine& a) {
  a.exp = app.add_subcommand(
      "export",
      "convert a checkpoint for other tools (e.g. safetensors weights for PyTorch), or write a "
      "config's initial weights (--initial)");
  a.exp
      ->add_option("source", a.export_args.source,
                   "checkpoint file, or a run folder or its checkpoints/ folder (newest "
                   "checkpoint); with --initial, a config file")
      ->required();
  a.exp->add_flag(
      "--initial", a.export_args.initial,
      "write the weights `train` starts from: the seeded initialisation (run.seed), "
      "then checkpoint.init_from; needs --out; safetensors unless --format says otherwise");
  a.exp
      ->add_option("--set", a.export_args.sets,
                   "with --initial: override a config value: key=value (repeatable)")
      ->allow_extra_args(false);  // as add_config_overrides: the source path is never taken
  a.exp->add_option(
      "--format", a.export_args.format,
      "checkpoint format to write, e.g. safetensors (required to convert a checkpoint; "
      "safetensors by default with --initial and with --layout hf or peft)");
  a.exp->add_option("--from", a.export_args.from,
                    "checkpoint format to read (default: chosen by the file's extension)");
  a.exp->add_option("--dtype", a.export_args.dtype,
                    "dtype of the written weights: fp32, bf16, fp16");
  a.exp->add_option("--out", a.export_args.out,
                    "output file, or folder with --layout hf or peft (default: in the run "
                    "folder, the checkpoint's name with the new format's extension, or with -hf "
                    "or -peft; required with --initial)");
  a.exp->add_flag("--force", a.export_args.force,
                  "overwrite an existing output file (--layout hf or peft: write into a "
                  "non-empty folder, replacing the files the export writes)");
  a.exp
      ->add_option("--layout", a.export_args.layout,
                   "native (mixtrain's names, [out, in] linears), gpt2 (Hugging Face GPT-2's "
                   "state dict, Conv1D [in, out] weights; gpt-preset models) or hf (a Hugging "
                   "Face model folder, config.json + model.safetensors, that "
                   "GPT2LMHeadModel.from_pretrained loads; gpt-preset models) or peft (a PEFT "
                   "adapter folder, adapter_config.json + adapter_model.safetensors, that "
                   "PeftModel.from_pretrained loads; models with [model.lora])")
      ->check(CLI::IsMember({"native", "gpt2", "hf", "peft"}))
      ->capture_default_str();
  a.exp
      ->add_option("--weights", a.export_args.weights,
                   "master or ema: which weights of a run with [ema] to write (default: the "
                   "run's eval.weights, the ones eval, predict and sample use)")
      ->check(CLI::IsMember({"master", "ema"}));
  a.exp->add_flag("--merge-lora", a.export_args.merge_lora,
                  "merge the [model.lora] adapters into the base weights (W + alpha/r·B·A), "
                  "writing the plain model (e.g. with --layout hf)");
}

void add_calibrate(CLI::App& app, CommandLine& a) {
  a.calibrate = app.add_subcommand(
      "calibrate",
      "train a few FP32 steps, measure every op's tensors and write the precision overrides and "
      "loss scale the config's policy needs (a file for `mixtrain train --merge`)");
  a.calibrate->add_option("config", a.cfg.config, "config file")->required();
  add_config_overrides(*a.calibrate, a.cfg);
  a.calibrate->add_option("--steps", a.calibrate_args.steps, "FP32 training steps to measure")
      ->check(integer_flag(1))
      ->capture_default_str();
  a.calibrate->add_option("-o,--output,--out", a.calibrate_args.output,
                          "the TOML file to write (default: <config name>.precision.toml in the "
                          "current folder)");
  a.calibrate->add_flag("--force", a.calibrate_args.force, "overwrite an existing output file");
  a.calibrate->add_flag("--blocks", a.calibrate_args.blocks,
                        "report what per-block scaling (fp8-block, mxfp8, nvfp4) does to the "
                        "linears' GEMM operands under any policy (on by default under FP8 and "
                        "block-scaled policies)");
}

void add_sample(CLI::App& app, CommandLine& a) {
  a.sample =
      app.add_subcommand("sample", "continue a prompt with a trained language model (KV cache)");
  a.sample->add_option("config", a.cfg.config, "config file of the model")->required();
  a.sample
      ->add_option("--checkpoint", a.sample_args.checkpoint,
                   "checkpoint file or checkpoints/ folder")
      ->required();
  auto* prompt = a.sample->add_option(
      "--prompt", a.sample_args.prompt,
      "text to continue, its bytes the token ids (a byte-level model, vocabulary 256)");
  a.sample
      ->add_option("--prompt-ids", a.sample_args.prompt_ids,
                   "the prompt as token ids, comma-separated (from the model's own tokenizer)")
      ->check(mixtrain::cli::token_ids_flag())
      ->excludes(prompt);
  a.sample->add_flag("--print-ids", a.sample_args.print_ids,
                     "print the prompt's and the generated tokens' ids, comma-separated, not "
                     "bytes (what a model of any vocabulary can print)");
  a.sample
      ->add_option("--tokens", a.sample_args.tokens,
                   "tokens to generate (at most a million per call: continue from the output for "
                   "more)")
      ->check(integer_flag(0, mixtrain::cli::kMaxSampleTokens))
      ->capture_default_str();
  a.sample->add_option("--temperature", a.sample_args.temperature, "0: greedy; higher: more random")
      ->capture_default_str();
  a.sample->add_option("--top-k", a.sample_args.top_k, "sample among the k likeliest (0: all)")
      ->check(integer_flag(0))
      ->capture_default_str();
  a.sample
      ->add_option("--top-p", a.sample_args.top_p,
                   "sample among the likeliest tokens whose probabilities sum to p (nucleus "
                   "sampling; 1: all)")
      ->capture_default_str();
  a.sample
      ->add_option("--repetition-penalty", a.sample_args.repetition_penalty,
                   "divide the logits of tokens already in the context by this (Hugging Face's "
                   "rule; 1: off)")
      ->capture_default_str();
  a.sample
      ->add_option("--stop-ids", a.sample_args.stop_ids,
                   "token ids, comma-separated, that end the generation once produced (a byte "
                   "model's ids are bytes: 10 is a newline); without it, the model's "
                   "[model.gpt] eos_token_id")
      ->check(mixtrain::cli::token_ids_flag());
  a.sample->add_flag("--ignore-eos", a.sample_args.ignore_eos,
                     "generate past the model's eos_token_id (--stop-ids still stops)");
  a.sample->add_option("--seed", a.sample_args.seed, "random seed of the draws")
      ->check(unsigned_flag())
      ->capture_default_str();
  add_config_overrides(*a.sample, a.cfg);
  a.sample
      ->add_option("--layout", a.sample_args.layout,
                   "how the checkpoint stores its weights: native, or gpt2 (Hugging Face GPT-2)")
      ->check(weight_layouts())
      ->capture_default_str();
}

void add_predict(CLI::App& app, CommandLine& a) {
  a.predict = app.add_subcommand(
      "predict", "run a trained model on new inputs and write its predictions (.npy)");
  a.predict->add_option("config", a.cfg.config, "config file of the model")->required();
  a.predict
      ->add_option("--checkpoint", a.predict_args.checkpoint,
                   "checkpoint file, or a run folder or its checkpoints/ folder (newest)")
      ->required();
  a.predict
      ->add_option("--input", a.predict_args.input,
                   "inputs: .npy features or images (either layout), IDX or CIFAR-10 batch "
                   "files; JPEG/PNG files, a folder of them or of class folders for a model "
                   "trained on an image folder; a token file or text for a language model")
      ->required();
  a.predict->add_option("--out", a.predict_args.out, "the .npy file to write")->required();
  a.predict->add_option(
      "--labels", a.predict_args.labels,
      "labels of the inputs (.npy or IDX, as the inputs are): also print the loss and accuracy");
  a.predict
      ->add_option("--output", a.predict_args.values,
                   "logits (FP32) or probabilities (softmax) per class")
      ->check(CLI::IsMember({"logits", "probabilities"}))
      ->capture_default_str();
  a.predict
      ->add_option("--top-k", a.predict_args.top_k,
                   "keep the k best classes per prediction, as fields class and score (0: all)")
      ->check(integer_flag(0))
      ->capture_default_str();
  a.predict
      ->add_option("--positions", a.predict_args.positions,
                   "language models: last (the next token after each window) or all positions")
      ->check(CLI::IsMember({"last", "all"}))
      ->capture_default_str();
  a.predict
      ->add_option("--image-layout", a.predict_args.image_layout,
                   "images in the .npy: auto (the one that fits the model), nchw or nhwc")
      ->check(CLI::IsMember({"auto", "nchw", "nhwc"}))
      ->capture_default_str();
  a.predict
      ->add_option("--stride", a.predict_args.stride,
                   "language models: tokens between window starts (0: the block size)")
      ->check(integer_flag(0))
      ->capture_default_str();
  add_config_overrides(*a.predict, a.cfg);
  a.predict
      ->add_option("--layout", a.predict_args.layout,
                   "how the checkpoint stores its weights: native, or gpt2 (Hugging Face GPT-2)")
      ->check(weight_layouts())
      ->capture_default_str();
  a.predict->add_flag("--force", a.predict_args.force, "overwrite an existing output file");
}

// The command line, every subcommand in the order --help lists them.
void add_commands(CLI::App& app, CommandLine& a) {
  app.set_version_flag("--version", std::string("mixtrain ") + MIXTRAIN_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 success, 1 internal error, 2 bad input (config, data, checkpoint, plugin),\n"
      "3 the run diverged (train) or the loss is not finite (eval, predict of labelled rows), 130\n"
      "interrupted by Ctrl-C after a clean stop (train; 143 for SIGTERM, 129 for SIGHUP).");
  app.add_option("--log-level", a.log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  add_train(app, a);
  add_check(app, a);
  add_plugins(app, a);
  add_describe(app, a);
  add_eval(app, a);
  add_compare(app, a);
  add_export(app, a);
  add_calibrate(app, a);
  add_sample(app, a);
  add_predict(app, a);
  // Accepted after the subcommand too (`mixtrain train cfg.toml --log-level debug`), and listed in
  // each subcommand's --help.
  for (auto* sub : app.get_subcommands({}))
    sub->add_option("--log-level", a.log_level, "trace, debug, info, warn, error or off");
}

// A command line CLI11 refuses: the same shape as every other error, "error: what", then how to
// fix it. --help and --version end here too, with their own exit code.
int report_parse_error(CLI::App& app, const CLI::ParseError& e, int argc, char** argv) {
  if (e.get_exit_code() == 0) return app.exit(e);
  // `mixtrain trian …`: CLI11 says only that a subcommand is required. Name the word and the
  // commands, with the nearest one.
  if (app.get_subcommands().empty() && argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const auto* sub : app.get_subcommands({})) names.push_back(sub->get_name());
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    const std::string word = argv[1];
    const auto near = mixtrain::sdk::closest_match(word, names);
    const bool config = word.ends_with(".toml");
    std::cerr << "error: '" << word << "' is not a mixtrain command"
              << "\n  HINT: "
              << (config ? "to train that config: mixtrain train " + word + "; "
                         : (near.empty() ? "" : "did you mean '" + near + "'? "))
              << "the commands are " << list << "; `mixtrain --help` says what each does"
              << std::endl;
    return 2;
  }
  std::string help = "mixtrain --help";
  for (const auto* sub : app.get_subcommands()) help = "mixtrain " + sub->get_name() + " --help";
  // `--set a=1 b=2 cfg.toml`: b=2 became the config and cfg.toml an extra argument.
  const bool overrides = std::any_of(argv + 1, argv + argc, [](const char* word) {
    const std::string_view w(word);
    return w == "--set" || w == "--merge";
  });
  // Only where the extra arguments are values (b=2, cfg.toml): an extra flag (`--checkpoint` to
  // train, `--merge` to export) is one the command does not take, and the list in --help says so.
  const std::string_view what = e.what();
  const auto listed = what.find(": ");
  const bool extra_flag =
      listed != std::string_view::npos && (what.find(" -", listed) != std::string_view::npos ||
                                           what.substr(listed + 2).starts_with("-"));
  const std::string repeat =
      e.get_exit_code() == static_cast<int>(CLI::ExitCodes::ExtrasError) && overrides && !extra_flag
          ? "; --set and --merge take one value each: repeat the flag "
            "(--set a=1 --set b=2)"
          : "";
  std::cerr << "error: " << e.what() << "\n  HINT: `" << help << "` lists the arguments" << repeat
            << std::endl;
  return 2;
}

int run_command(const CommandLine& a) {
  namespace cli = mixtrain::cli;
  if (a.train->parsed()) return cli::run_train(a.cfg, a.run_dir, a.resume, a.profile);
  // Only train runs on several ranks. The others are refused under mpirun, for the reason that
  // applies: those that write files (compare --out too) would race each other to the same
  // outputs; the rest would only repeat themselves on every rank.
  for (const CLI::App* command : {a.check, a.plugins, a.describe_cmd, a.eval, a.compare, a.exp,
                                  a.calibrate, a.sample, a.predict})
    if (command->parsed()) {
      const bool writes = command == a.compare || command == a.exp || command == a.calibrate ||
                          command == a.predict;
      if (const auto why = mixtrain::core::one_process_requirement(command->get_name(), writes);
          !why.empty())
        throw mixtrain::sdk::UserError(why, "run it without mpirun, in one process");
    }
  if (a.check->parsed()) return cli::run_check(a.cfg, !a.skip_rehearsal);
  if (a.calibrate->parsed()) return cli::run_calibrate(a.cfg, a.calibrate_args);
  if (a.eval->parsed()) return cli::run_eval(a.cfg, a.checkpoint, a.eval_layout);
  if (a.compare->parsed()) return cli::run_compare(a.compare_dirs, a.compare_out);
  if (a.exp->parsed()) return cli::run_export(a.export_args);
  if (a.sample->parsed()) return cli::run_sample(a.cfg, a.sample_args);
  if (a.predict->parsed()) return cli::run_predict(a.cfg, a.predict_args);
  if (a.describe_cmd->parsed()) return cli::run_describe(a.describe_section);
  return cli::run_plugins(a.describe);
}

}  // namespace

int main(int argc, char** argv) {
  // A write past the file-size limit (ulimit -f) then fails with EFBIG, which every writer
  // reports with its file and hint, instead of SIGXFSZ killing the process mid-write and leaving
  // a temporary file behind.
  std::signal(SIGXFSZ, SIG_IGN);
  // Ctrl-C and SIGTERM taken by a thread of their own before any other starts, never by a thread
  // that may be running oneDNN's kernels (mixtrain/core/train/interrupt.h says why).
  mixtrain::core::take_stop_signals_on_a_watcher();
  CLI::App app{"mixtrain: mixed-precision training from plugins, driven by TOML configs"};
  CommandLine a;
  add_commands(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return report_parse_error(app, e, argc, argv);
  }
  try {
    mixtrain::core::set_log_level(a.log_level);
    return run_command(a);
  } catch (const mixtrain::sdk::UserError& e) {
    // Under an MPI launch each rank prints its own: the ranks but 0 say which they are, each in
    // one write, so mpirun cannot interleave another rank's line into it.
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", mixtrain::cli::with_rank(e.full_message()).c_str());
    return 2;
  } catch (const mixtrain::core::PluginFault& e) {
    // A plugin's internal error where the host knows what it interrupted: exit 1, with the hint.
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", mixtrain::cli::with_rank(e.full_message()).c_str());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the OS refuses (a name too long, no permission): the user's to fix, as a UserError.
    std::fflush(stdout);
    std::fprintf(stderr,
                 "\nerror: %s\n  HINT: check the path named above: its length, that its "
                 "folders exist, and that you may read or write there\n",
                 mixtrain::cli::with_rank(e.what()).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nerror: %s\n", mixtrain::cli::with_rank(e.what()).c_str());
    // Not one of mixtrain's own errors, which name what to fix: where it may have come from.
    if (const auto& outside = mixtrain::cli::outside_plugins(); !outside.empty()) {
      std::string names;
      for (const auto& p : outside) names += (names.empty() ? "" : ", ") + p;
      std::fprintf(stderr,
                   "  HINT: not one of mixtrain's own errors; this command loaded plugins from "
                   "outside mixtrain's plugin folder, whose code may have thrown it: %s. Run "
                   "without them to tell (docs/writing-plugins.md: a plugin throws "
                   "sdk::UserError subclasses for what a user can fix)\n",
                   names.c_str());
    }
    return 1;
  } catch (...) {
    // Not ours to name: only a plugin's code can throw what no std::exception is.
    std::fflush(stdout);
    std::cerr << "\nerror: an exception that is not a std::exception ended the command; a "
                 "plugin's code threw it (mixtrain's own errors derive from std::exception)\n"
                 "  HINT: run `mixtrain plugins` to see which plugins are loaded; a plugin must "
                 "throw sdk::UserError or another std::exception (docs/writing-plugins.md)"
              << std::endl;
    return 1;
  }
}
