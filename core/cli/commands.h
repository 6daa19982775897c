// The subcommands of the `mixtrain` executable. Each returns the process exit code and lets
// sdk::UserError (exit 2) and other exceptions (exit 1) reach main(), which prints them once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace mixtrain::cli {

struct ConfigArgs {
  std::string config;  // empty: the embedded quickstart
  std::vector<std::string> sets;
  std::vector<std::filesystem::path> merges;  // --merge: applied in order, before `sets`
};

// Exit code of a run that diverged (every step skipped, a non-finite loss on each of the last 3
// steps, or stopped by run.on_nonfinite = "stop"), and of eval and predict whose loss is not
// finite (their output written all the same); an interrupted run exits with
// core::interrupted_exit_code() (130 for Ctrl-C, 143 for SIGTERM).
inline constexpr int kExitDiverged = 3;
// profile: the backend is wrapped in a ProfilingBackend (profiling/profiling_backend.h) that
// records from the end of the first step (primitive creation, first-touch allocation) to the end of
// the last.
// With `resume` and no config, the resumed run's own config.toml (in its folder) is the config.
// Under an MPI launch every rank reports its own errors: main() puts with_rank()'s prefix
// ("rank 1: ", none on rank 0 or in one process) before them, once.
int run_train(const ConfigArgs& cfg, const std::string& run_dir,
              const std::optional<std::string>& resume, bool profile = false);
// rehearse: the memory section rehearses a training step (Trainer::memory_report).
int run_check(const ConfigArgs& cfg, bool rehearse);
// Lists components, failed libraries and the search path (a missing entry is a warning); with
// a non-empty `describe` (NAME or KIND/NAME), prints that component's option schema instead;
// data/NAME and host/TABLE print the section as run_describe() does.
int run_plugins(const std::string& describe);
// Bare: every config section, one line each; with a SECTION ("run", "data.npy",
// "scaler.dynamic", "layer.conv2d"), its keys with type, default, range and doc.
int run_describe(const std::string& section);
// `layout`: "native" or "gpt2" (a Hugging Face GPT-2 file, core/gpt2_layout.h).
int run_eval(const ConfigArgs& cfg, const std::string& checkpoint, const std::string& layout);
// What eval and predict say on stderr of a loss that is not finite (their JSON prints it as null)
// before they exit with kExitDiverged.
void report_nonfinite_loss(const std::string& policy_name);
// `message` with this process's rank prefix (core::rank_prefix()) before it, once.
std::string with_rank(const std::string& message);
// Parity table of runs against the first; writes compare.{json,md,svg} into out_dir (empty: the
// first run's folder).
int run_compare(const std::vector<std::string>& run_dirs, const std::string& out_dir);

// A million bytes of text per `sample` call: generation streams, but a typo's 10^12 would run
// for days.
inline constexpr std::int64_t kMaxSampleTokens = 1'000'000;

struct SampleArgs {
  std::string checkpoint;  // a file, or a run's checkpoints/ folder (its newest)
  // Exactly one of the two: text whose bytes are the ids (a byte-level model), or token ids
  // (token_ids.h) from the model's own tokenizer.
  std::optional<std::string> prompt;
  std::optional<std::string> prompt_ids;
  bool print_ids = false;           // print ids (token_ids.h's form), not bytes: any vocabulary
  std::int64_t tokens = 256;        // [0, kMaxSampleTokens]; the integer flags are range-checked as
                                    // they are parsed (integer_flag.h)
  double temperature = 1.0;         // 0: greedy
  std::int64_t top_k = 0;           // 0: the whole vocabulary
  double top_p = 1.0;               // (0, 1]; 1: the whole vocabulary
  double repetition_penalty = 1.0;  // > 0; 1: off
  std::optional<std::string> stop_ids;  // token ids (token_ids.h) that end the generation
  bool ignore_eos = false;              // without stop_ids: do not stop at [model.gpt] eos_token_id
  std::uint64_t seed = 0;
  std::string layout = "native";  // of the checkpoint: native or gpt2
};
// Continues the prompt with the config's language model loaded from `checkpoint`, printing the
// prompt and each generated token as it comes: as bytes (a byte-level model, vocabulary 256) or,
// with `print_ids`, as comma-separated ids. A prompt or output the model's vocabulary cannot
// take, or an id outside it, is a UserError.
int run_sample(const ConfigArgs& cfg, const SampleArgs& args);

struct ExportArgs {
  std::string source;             // a checkpoint file, or a run / checkpoints/ folder (its newest
                                  // checkpoint); with `initial`, a config file
  bool initial = false;           // the config's weights as training starts, not a checkpoint's
  std::vector<std::string> sets;  // the config's --set lines (`initial` only)
  std::string format;  // the checkpoint_format to write, e.g. "safetensors"; empty: none given
                       // (safetensors with layout hf or `initial`, else an error)
  std::string from;    // the format to read; empty: chosen by the checkpoint's extension
  std::string dtype;   // the writer's `dtype` option when given
  std::string out;     // empty: the checkpoint's name with the writer's extension (layout hf:
                       // with "-hf", a folder), in the run folder (never inside checkpoints/);
                       // required with `initial`
  bool force = false;  // overwrite an existing output file / write into a non-empty folder
  std::string layout = "native";  // gpt2: Hugging Face GPT-2 names and Conv1D weights; hf: a
                                  // Hugging Face model folder (core/checkpoint/hf_folder.h);
                                  // peft: a PEFT adapter folder (lora_export.h)
  bool merge_lora = false;        // merge [model.lora]'s adapters into the base weights first
  std::string weights;            // master | ema; empty: the run's eval.weights (what eval,
                                  // predict and sample use)
};
// Writes a checkpoint's weights in another format (weights for other tools: safetensors), or with
// `initial` the weights step 1 of `train` starts from (seeded initialisation, then
// checkpoint.init_from), taken from the Trainer as its checkpoints take them: the tensor names
// and metadata (step 0) of a checkpoint's export. Never overwrites an existing file without
// `force`, nor its input (the checkpoint, the config, checkpoint.init_from) with it. An existing
// output, a missing output folder, `initial` without `out` or with `from`,
// and `sets` without `initial` are sdk::UserError before anything is read. Layout gpt2 writes the
// weights of a gpt-preset model as GPT2Model's state dict (core/gpt2_layout.h) with its sizes in
// the metadata (n_layer, n_head, n_embd, vocab_size, n_positions); any other model is refused,
// naming what it lacks. Layout hf writes the folder `out` (created; an existing non-empty one
// needs `force`) with config.json and model.safetensors that transformers' GPT2LMHeadModel
// loads; a model that is not the gpt preset is refused naming its kind.
int run_export(const ExportArgs& args);

struct PredictArgs {
  std::string checkpoint;          // a file, or a run / checkpoints/ folder: its newest checkpoint
  std::string input;               // the inputs (core/data/prediction_input.h)
  std::string labels;              // optional labels of a table input
  std::string out;                 // the .npy to write
  std::string values = "logits";   // or probabilities
  std::int64_t top_k = 0;          // > 0: the k best classes and their scores
  std::string positions = "last";  // language models: last, or all positions
  std::string image_layout = "auto";  // images: auto, nchw or nhwc
  std::int64_t stride = 0;            // language models: tokens between windows (0: the block)
  std::string layout = "native";      // of the checkpoint: native or gpt2
  bool force = false;                 // overwrite an existing output file
};
// Runs the config's model, loaded from `checkpoint`, in evaluation mode over the inputs and
// writes its predictions (core/predict/prediction_file.h); prints one JSON line: the file, its
// shape and, with labelled inputs, the loss and accuracy (`eval`'s numbers on the same data).
// Refuses, before loading anything, an --out in a missing folder, an existing one without `force`
// or one of its inputs (config, --merge, --input, --labels, --checkpoint; with or without
// `force`); then the newest checkpoint of a --checkpoint folder as --out, a --top-k above the
// classes, a checkpoint of another model and inputs the model cannot read, each naming the fix.
int run_predict(const ConfigArgs& cfg, const PredictArgs& args);

struct CalibrateArgs {
  std::int64_t steps = 50;  // FP32 training steps measured (>= 1, checked as --steps is parsed)
  std::string output;       // the TOML to write; empty: <config stem>.precision.toml here
  bool force = false;       // overwrite an existing output file
  bool blocks = false;      // the block report under any policy (precision/calibration.h)
};
// Trains `steps` FP32 steps of the config (precision/calibration.h), prints the range of every
// op's tensors and the recommendation (precision/calibration_table.h), and writes the
// recommended precision block (precision/recommendation.h) for `mixtrain train --merge`.
// Refuses, before loading anything, an output that check_output_file refuses (one of its inputs,
// the config or a --merge file, even with `force`).
int run_calibrate(const ConfigArgs& cfg, const CalibrateArgs& args);

}  // namespace mixtrain::cli
