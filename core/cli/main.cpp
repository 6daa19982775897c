// mixtrain — config-driven mixed-precision training. See README.md for the commands.
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/sdk/error.h"

namespace {
constexpr const char* kMergeHelp =
    "merge a TOML file over the config, before --set: tables key by key, arrays whole "
    "(repeatable; e.g. the precision block `mixtrain calibrate` writes)";
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mixtrain: mixed-precision training from plugins, driven by TOML configs"};
  app.set_version_flag("--version", std::string("mixtrain ") + MIXTRAIN_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 success, 1 internal error, 2 bad input (config, data, checkpoint, plugin),\n"
      "3 the run diverged (train), 130 interrupted by Ctrl-C after a clean stop (train).");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();

  mixtrain::cli::ConfigArgs cfg;
  std::string run_dir, checkpoint;
  std::optional<std::string> resume;
  std::vector<std::string> compare_dirs;
  std::string compare_out;

  auto* train = app.add_subcommand("train", "train a model described by a TOML config");
  train->add_option("config", cfg.config, "config file (default: the embedded quickstart)");
  train->add_option("--set", cfg.sets, "override a config value: key=value (repeatable)");
  train->add_option("--merge", cfg.merges, kMergeHelp);
  train->add_option("--run-dir", run_dir, "folder for config.toml, metrics.jsonl, checkpoints/");
  train->add_option("--resume", resume,
                    "checkpoint file, a run folder or its checkpoints/ folder (newest); without "
                    "CONFIG, the run's own config.toml");
  bool profile = false;
  train->add_flag("--profile", profile,
                  "time every backend op after the first step; print the breakdown and write "
                  "profile.json to the run folder");

  auto* check = app.add_subcommand("check", "validate a config and print it resolved");
  check->add_option("config", cfg.config, "config file")->required();
  check->add_option("--set", cfg.sets, "override a config value: key=value (repeatable)");
  check->add_option("--merge", cfg.merges, kMergeHelp);

  std::string describe;
  auto* plugins =
      app.add_subcommand("plugins", "list plugin libraries, their components and load errors");
  plugins->add_option("--describe", describe,
                      "print the option schema of one component (NAME or KIND/NAME), or of a "
                      "data source (data/NAME) or a host table (host/TABLE), as `mixtrain "
                      "describe` prints them");

  std::string describe_section;
  auto* describe_cmd = app.add_subcommand(
      "describe",
      "list the sections a config may hold, or the keys of one with their types, "
      "defaults and ranges");
  describe_cmd->add_option("section", describe_section,
                           "a section: run, data, data.npy, model.gpt, optimizer, scaler.dynamic, "
                           "layer.conv2d, ... (none: list them all)");

  auto* eval = app.add_subcommand("eval", "evaluate a checkpoint on the config's held-out data");
  eval->add_option("config", cfg.config, "config file")->required();
  eval->add_option("--checkpoint", checkpoint, "checkpoint file or checkpoints/ folder")
      ->required();
  eval->add_option("--set", cfg.sets, "override a config value: key=value (repeatable)");
  eval->add_option("--merge", cfg.merges, kMergeHelp);
  std::string eval_layout = "native";
  const auto layouts = CLI::IsMember({"native", "gpt2"});
  eval->add_option("--layout", eval_layout,
                   "how the checkpoint stores its weights: native, or gpt2 (Hugging Face GPT-2)")
      ->check(layouts)
      ->capture_default_str();

  auto* compare = app.add_subcommand(
      "compare", "parity table and chart of runs against the first (the baseline)");
  compare->add_option("run_dirs", compare_dirs, "run folders; the first is the baseline")
      ->required();
  compare->add_option(
      "--out", compare_out,
      "folder for compare.svg, compare.json, compare.md (default: the first run's)");

  mixtrain::cli::ExportArgs export_args;
  auto* exp = app.add_subcommand(
      "export",
      "convert a checkpoint for other tools (e.g. safetensors weights for PyTorch), or write a "
      "config's initial weights (--initial)");
  exp->add_option("source", export_args.source,
                  "checkpoint file, or a run folder or its checkpoints/ folder (newest "
                  "checkpoint); with --initial, a config file")
      ->required();
  exp->add_flag("--initial", export_args.initial,
                "write the weights `train` starts from: the seeded initialisation (run.seed), "
                "then checkpoint.init_from; needs --out");
  exp->add_option("--set", export_args.sets,
                  "with --initial: override a config value: key=value (repeatable)");
  exp->add_option(
      "--format", export_args.format,
      "checkpoint format to write, e.g. safetensors (required, except with --layout hf, "
      "whose weights are safetensors)");
  exp->add_option("--from", export_args.from,
                  "checkpoint format to read (default: chosen by the file's extension)");
  exp->add_option("--dtype", export_args.dtype, "dtype of the written weights: fp32, bf16, fp16");
  exp->add_option("--out", export_args.out,
                  "output file, or folder with --layout hf (default: in the run folder, the "
                  "checkpoint's name with the new format's extension, or with -hf; required "
                  "with --initial)");
  exp->add_flag("--force", export_args.force,
                "overwrite an existing output file (--layout hf: write into a non-empty folder)");
  exp->add_option("--layout", export_args.layout,
                  "native (mixtrain's names, [out, in] linears), gpt2 (Hugging Face GPT-2's "
                  "state dict, Conv1D [in, out] weights; gpt-preset models) or hf (a Hugging "
                  "Face model folder, config.json + model.safetensors, that "
                  "GPT2LMHeadModel.from_pretrained loads; gpt-preset models)")
      ->check(CLI::IsMember({"native", "gpt2", "hf"}))
      ->capture_default_str();

  mixtrain::cli::CalibrateArgs calibrate_args;
  auto* calibrate = app.add_subcommand(
      "calibrate",
      "train a few FP32 steps, measure every op's tensors and write the precision overrides and "
      "loss scale the config's policy needs (a file for `mixtrain train --merge`)");
  calibrate->add_option("config", cfg.config, "config file")->required();
  calibrate->add_option("--merge", cfg.merges, kMergeHelp);
  calibrate->add_option("--set", cfg.sets, "override a config value: key=value (repeatable)");
  calibrate->add_option("--steps", calibrate_args.steps, "FP32 training steps to measure")
      ->capture_default_str();
  calibrate->add_option("-o,--output,--out", calibrate_args.output,
                        "the TOML file to write (default: <config name>.precision.toml in the "
                        "current folder)");
  calibrate->add_flag("--force", calibrate_args.force, "overwrite an existing output file");

  mixtrain::cli::SampleArgs sample_args;
  auto* sample =
      app.add_subcommand("sample", "continue a prompt with a trained language model (KV cache)");
  sample->add_option("config", cfg.config, "config file of the model")->required();
  sample
      ->add_option("--checkpoint", sample_args.checkpoint, "checkpoint file or checkpoints/ folder")
      ->required();
  sample->add_option("--prompt", sample_args.prompt, "text to continue")->required();
  sample->add_option("--tokens", sample_args.tokens, "tokens to generate")->capture_default_str();
  sample->add_option("--temperature", sample_args.temperature, "0: greedy; higher: more random")
      ->capture_default_str();
  sample->add_option("--top-k", sample_args.top_k, "sample among the k likeliest (0: all)")
      ->capture_default_str();
  sample->add_option("--seed", sample_args.seed, "random seed of the draws")->capture_default_str();
  sample->add_option("--set", cfg.sets, "override a config value: key=value (repeatable)");
  sample->add_option("--merge", cfg.merges, kMergeHelp);
  sample
      ->add_option("--layout", sample_args.layout,
                   "how the checkpoint stores its weights: native, or gpt2 (Hugging Face GPT-2)")
      ->check(layouts)
      ->capture_default_str();

  mixtrain::cli::PredictArgs predict_args;
  auto* predict = app.add_subcommand(
      "predict", "run a trained model on new inputs and write its predictions (.npy)");
  predict->add_option("config", cfg.config, "config file of the model")->required();
  predict
      ->add_option("--checkpoint", predict_args.checkpoint,
                   "checkpoint file, or a run folder or its checkpoints/ folder (newest)")
      ->required();
  predict
      ->add_option("--input", predict_args.input,
                   "inputs: .npy features or images (either layout), IDX or CIFAR-10 batch "
                   "files; a token file or text for a language model")
      ->required();
  predict->add_option("--out", predict_args.out, "the .npy file to write")->required();
  predict->add_option("--labels", predict_args.labels,
                      "labels of the inputs (.npy or IDX): also print the loss and accuracy");
  predict
      ->add_option("--output", predict_args.values,
                   "logits (FP32) or probabilities (softmax) per class")
      ->check(CLI::IsMember({"logits", "probabilities"}))
      ->capture_default_str();
  predict
      ->add_option("--top-k", predict_args.top_k,
                   "keep the k best classes per prediction, as fields class and score (0: all)")
      ->capture_default_str();
  predict
      ->add_option("--positions", predict_args.positions,
                   "language models: last (the next token after each window) or all positions")
      ->check(CLI::IsMember({"last", "all"}))
      ->capture_default_str();
  predict
      ->add_option("--image-layout", predict_args.image_layout,
                   "images in the .npy: auto (the one that fits the model), nchw or nhwc")
      ->check(CLI::IsMember({"auto", "nchw", "nhwc"}))
      ->capture_default_str();
  predict
      ->add_option("--stride", predict_args.stride,
                   "language models: tokens between window starts (0: the block size)")
      ->capture_default_str();
  predict->add_option("--set", cfg.sets, "override a config value: key=value (repeatable)");
  predict->add_option("--merge", cfg.merges, kMergeHelp);
  predict
      ->add_option("--layout", predict_args.layout,
                   "how the checkpoint stores its weights: native, or gpt2 (Hugging Face GPT-2)")
      ->check(layouts)
      ->capture_default_str();
  predict->add_flag("--force", predict_args.force, "overwrite an existing output file");

  // Accepted after the subcommand too (`mixtrain train cfg.toml --log-level debug`), and listed in
  // each subcommand's --help.
  for (auto* sub : app.get_subcommands({}))
    sub->add_option("--log-level", log_level, "trace, debug, info, warn, error or off");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // The same shape as every other error: "error: what", then how to fix it.
    std::string help = "mixtrain --help";
    for (const auto* sub : app.get_subcommands()) help = "mixtrain " + sub->get_name() + " --help";
    std::cerr << "error: " << e.what() << "\n  HINT: `" << help << "` lists the arguments"
              << std::endl;
    return 2;
  }

  try {
    mixtrain::core::set_log_level(log_level);
    if (train->parsed()) return mixtrain::cli::run_train(cfg, run_dir, resume, profile);
    if (check->parsed()) return mixtrain::cli::run_check(cfg);
    if (calibrate->parsed()) return mixtrain::cli::run_calibrate(cfg, calibrate_args);
    if (eval->parsed()) return mixtrain::cli::run_eval(cfg, checkpoint, eval_layout);
    if (compare->parsed()) return mixtrain::cli::run_compare(compare_dirs, compare_out);
    if (exp->parsed()) return mixtrain::cli::run_export(export_args);
    if (sample->parsed()) return mixtrain::cli::run_sample(cfg, sample_args);
    if (predict->parsed()) return mixtrain::cli::run_predict(cfg, predict_args);
    if (describe_cmd->parsed()) return mixtrain::cli::run_describe(describe_section);
    return mixtrain::cli::run_plugins(describe);
  } catch (const mixtrain::sdk::UserError& e) {
    std::fflush(stdout);
    std::cerr << "\nerror: " << e.full_message() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "\nerror: " << e.what() << std::endl;
    return 1;
  }
}
