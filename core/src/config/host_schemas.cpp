#include "mixtrain/core/config/host_schemas.h"

#include "graph/ops/op_registry.h"
#include "mixtrain/core/train/lr_schedule.h"

#include <stdexcept>

namespace mixtrain::core {

using sdk::OptionSpec;
using sdk::OptionType;

namespace {
// GEMM dimensions are 32-bit in BLAS and cuBLAS, and labels are int32: a width, a batch or a
// class count past this cannot run, and its element counts could overflow before allocation.
constexpr double kMaxDim = 2147483647.0;
// The schedule's floor is a learning rate too: the optimizers cap theirs at 10.
constexpr double kMaxLr = 10.0;
}  // namespace

namespace {

template <class T>
T schema_default(const sdk::OptionSchema& schema, std::string_view key) {
  for (const auto& spec : schema)
    if (spec.name == key) {
      if (const T* value = std::get_if<T>(&spec.default_value)) return *value;
      break;
    }
  throw std::logic_error("the schema declares no default of this type for " + std::string(key));
}

}  // namespace

std::int64_t schema_default_int(const sdk::OptionSchema& schema, std::string_view key) {
  return schema_default<std::int64_t>(schema, key);
}

double schema_default_number(const sdk::OptionSchema& schema, std::string_view key) {
  return schema_default<double>(schema, key);
}

bool schema_default_bool(const sdk::OptionSchema& schema, std::string_view key) {
  return schema_default<bool>(schema, key);
}

std::string schema_default_string(const sdk::OptionSchema& schema, std::string_view key) {
  return schema_default<std::string>(schema, key);
}

const std::vector<std::string>& metrics_sinks() {
  static const std::vector<std::string> names = choice_names(kMetricsSinks);
  return names;
}

sdk::OptionSchema run_schema() {
  return {
      OptionSpec::string("name", "mixtrain", "run name, used in logs and the default run folder"),
      OptionSpec::integer("seed", 0, "seed for data, initialisation and shuffling").at_least(0),
      // The optimizers' step counters stop at INT64_MAX - 1 (AdamW's bias correction uses
      // step + 1); more steps than that would fail the counter check on resume.
      OptionSpec::integer("steps", 1000, "optimizer steps to run (skipped steps count)")
          .at_least(1)
          .at_most(9.2e18),
      OptionSpec::integer("log_every", 10, "steps between metric records").at_least(1),
      OptionSpec::integer("eval_every", 0, "steps between evaluations; 0 = at the end only")
          .at_least(0),
      OptionSpec::string("on_nonfinite", "skip",
                         "non-finite loss with no scaler to absorb it: skip the step or stop")
          .one_of(choice_names(kNonfiniteActions)),
      OptionSpec::string("dir", "",
                         "run folder when --run-dir is not given (relative to this file, or to the "
                         "current folder from --set); default runs/<name> in the current folder"),
      OptionSpec::integer("underflow_every", 100,
                          "steps between per-layer gradient-underflow reports (fp16 and FP8 "
                          "gradients; bf16 has fp32's range); 0 = never")
          .at_least(0),
      // Bounded so that steps x accumulate batches stay countable by the sampler.
      OptionSpec::integer("accumulate", 1,
                          "micro-batches of data.batch_size rows per optimizer step (gradient "
                          "accumulation); the effective batch is accumulate x batch_size")
          .at_least(1)
          .at_most(1048576),
      OptionSpec::integer("early_stopping_patience", 0,
                          "stop after this many evaluations in a row (run.eval_every) without "
                          "an improvement of early_stopping_metric; the final checkpoint is "
                          "written; 0 = off")
          .at_least(0),
      OptionSpec::string("early_stopping_metric", "eval_loss",
                         "the evaluation number early stopping watches: eval_loss (lower is "
                         "better), eval_accuracy or eval_top<k>_accuracy ([eval] top_k; higher "
                         "is better)"),
      OptionSpec::number("early_stopping_min_delta", 0.0,
                         "an evaluation improves only when it beats the best by more than this")
          .at_least(0.0),
      OptionSpec::boolean("step_graphs", false,
                          "record forward, loss and backward once and replay them with one launch "
                          "(CUDA graphs) where the backend offers it and the step is static: one "
                          "micro-batch, no dropout, no FP8 scaling; true says why when it cannot; "
                          "unset: on where it can (the CUDA backend), silently off elsewhere"),
      OptionSpec::boolean("gated_update", true,
                          "queue the optimizer's update before the host reads the gradient check, "
                          "skipped and clipped on the device from the check's status, where the "
                          "backend and the optimizer offer it (one process, no FP8 scaling); "
                          "false: the host waits for the check first (same bits, one drain of "
                          "the device per step)"),
      // A list (read beside the schema, as optimizer.milestones); each entry is checked against
      // these choices.
      OptionSpec::string("metrics", "jsonl",
                         "where metric records go, a list of: jsonl (metrics.jsonl, always "
                         "written: compare and resume read it), tensorboard (event files in the "
                         "run folder for tensorboard --logdir), csv (metrics.csv); e.g. metrics = "
                         "[\"jsonl\", \"tensorboard\", \"csv\"]")
          .one_of(metrics_sinks()),
      OptionSpec::boolean("stretch_schedule", false,
                          "resuming with a changed run.steps: false keeps the checkpoint's "
                          "learning-rate schedule horizon (lr stays at its final value past it), "
                          "true re-plans the schedule over the new run.steps (the lr jumps)"),
  };
}

sdk::OptionSchema ema_schema() {
  return {
      OptionSpec::number("decay", 0.0,
                         "EMA of the FP32 master weights after every applied step: ema = decay * "
                         "ema + (1 - decay) * master; 0 = no EMA")
          .at_least(0.0)
          .at_most(1.0),
  };
}

sdk::OptionSchema train_schema() {
  // Lists of patterns, read beside the schema (as run.metrics); "" is the empty list.
  return {
      OptionSpec::string("trainable", "",
                         "the parameters that train, as names or fnmatch globs over "
                         "\"<node>.<param>\" or node names, e.g. [\"h.*.attn.*\"]; [] = all"),
      OptionSpec::string("frozen", "",
                         "parameters taken out of trainable: no weight gradient, no FP32 master, "
                         "no optimizer state; gradients still flow through them, e.g. "
                         "[\"embed\", \"h.0.*\"]"),
      OptionSpec::string(
          "frozen_format", "compute",
          "how frozen linear weights are stored: compute (in their op's compute "
          "dtype), nf4 (QLoRA's 4-bit NormalFloat, bitsandbytes' "
          "bnb_4bit_quant_type = \"nf4\"), fp8-block (E4M3 in 128x128 blocks, "
          "power-of-two fp32 scales) or mxfp8 (E4M3 in 1x32 blocks along the "
          "inputs, E8M0 scales that saturate nothing); each decoded into the compute dtype before "
          "each GEMM; biases, norms and embeddings stay as they are")
          .one_of({"compute", "nf4", "fp8-block", "mxfp8"}),
      OptionSpec::integer("frozen_block_size", 64,
                          "elements per NF4 block, each with one fp32 absmax (QLoRA's and "
                          "bitsandbytes' 64); a weight it does not divide ends in a partial "
                          "block; nf4 only (the FP8 block formats' blocks are fixed)")
          .at_least(1)
          .at_most(1 << 20),
  };
}

sdk::OptionSchema lora_schema() {
  // targets is a list of globs, read beside the schema (as train.trainable).
  return {
      OptionSpec::integer("r", 8, "the adapters' rank: lora_A is [r, in], lora_B [out, r]")
          .at_least(1)
          .at_most(65536),
      OptionSpec::number("alpha", 8.0, "lora_B's output is scaled by alpha / r (PEFT's lora_alpha)")
          .greater_than(0.0),
      OptionSpec::number("dropout", 0.0, "dropout on the adapters' input, in [0, 1)")
          .at_least(0.0)
          .at_most(1.0),
      OptionSpec::string("targets", "",
                         "the linear nodes that get adapters, as names or fnmatch globs over node "
                         "names, e.g. [\"h.*.attn.c_attn\", \"h.*.mlp.*\"]"),
      OptionSpec::string("from_peft", "",
                         "a PEFT LoRA adapter folder (adapter_config.json, "
                         "adapter_model.safetensors) whose adapters a new run starts from; r, "
                         "alpha, dropout and targets default to its"),
  };
}

sdk::OptionSchema eval_schema() {
  return {
      OptionSpec::string("weights", "master",
                         "weights evaluation runs with: the master weights, or their EMA ([ema])")
          .one_of(choice_names(kEvalWeights)),
      OptionSpec::integer("top_k", 0,
                          "also report top-k accuracy (eval_top<k>_accuracy: the label among the "
                          "k largest logits; a language model's at every position); 0 = off, "
                          "at most the classes")
          .at_least(0)
          .at_most(kMaxDim),
  };
}

sdk::OptionSchema data_common_schema() {
  return {
      OptionSpec::integer("batch_size", 128, "training rows per step").at_least(1).at_most(kMaxDim),
      OptionSpec::integer("eval_batch_size", 0, "rows per evaluation batch; 0 = batch_size")
          .at_least(0)
          .at_most(kMaxDim),
      OptionSpec::boolean("shuffle", true, "reshuffle the training rows every epoch (seeded)"),
      OptionSpec::boolean("prefetch", true,
                          "gather and augment the next training batch on a loader thread while "
                          "the step computes (the same batches either way)"),
      OptionSpec::boolean("pin_memory", true,
                          "prepare batches in the backend's page-locked host memory, which its "
                          "uploads read in place (CUDA; the same batches either way; a backend "
                          "without it ignores this)"),
      OptionSpec::string("pixels", "auto",
                         "how image pixels are held and sent to the device: uint8 (as image "
                         "files store them, decoded on the device; synthetic images rounded to "
                         "bytes), float32 (decoded when loaded), auto (uint8 where the source "
                         "stores bytes)")
          .one_of({"auto", "uint8", "float32"}),
      OptionSpec::number("eval_fraction", 0.1,
                         "share of rows held out for evaluation (tokens, text: of the tokens, "
                         "from the end)")
          .at_least(0.0)
          .at_most(0.9),
      OptionSpec::integer("classes", 0,
                          "number of classes; 0 = max label + 1 (tables; token sources take "
                          "vocab_size); never below the data's (a larger value pads the head)")
          .at_least(0)
          .at_most(kMaxDim),
  };
}

namespace {

sdk::OptionSchema synthetic_source_schema() {
  return {
      OptionSpec::string("kind", "clusters",
                         "synthetic task: clusters (Gaussian blobs), teacher (random-MLP "
                         "labels), images (shifted stroke templates, [channels, height, width])")
          .one_of({"clusters", "teacher", "images"}),
      OptionSpec::integer("rows", 8192, "rows generated (train + eval)").at_least(2),
      OptionSpec::integer("features", 32, "input features (clusters, teacher; images: C·H·W)")
          .at_least(1)
          .at_most(kMaxDim),
      OptionSpec::integer("num_classes", 10, "classes generated").at_least(2).at_most(kMaxDim),
      OptionSpec::number("noise", 1.0,
                         "noise standard deviation (images: per pixel, templates in [0, 1]; "
                         "0.5 is a good start)")
          .at_least(0.0),
      OptionSpec::number("feature_scale", 1.0,
                         "multiplies every feature after the labels are drawn (raw, "
                         "unnormalised measurements: 1e4 puts them past fp16's range)")
          .greater_than(0.0),
      OptionSpec::integer("channels", 1, "images: channels C").at_least(1).at_most(4096),
      OptionSpec::integer("height", 16, "images: height H").at_least(4).at_most(4096),
      OptionSpec::integer("width", 16, "images: width W").at_least(4).at_most(4096),
      OptionSpec::integer("max_shift", 3,
                          "images: a sample's template moves by up to this many pixels in each "
                          "direction; below min(height, width) / 2")
          .at_least(0)
          .at_most(2047),
  };
}

sdk::OptionSchema npy_source_schema() {
  return {
      OptionSpec::required("features", OptionType::string,
                           ".npy of float32, float64 or uint8 (scaled by /255) features: [N, D] "
                           "rows, [N, H, W] one-channel images, [N, C, H, W] or [N, H, W, C] "
                           "images (see layout), or [N, d1, ..., dk] flattened"),
      OptionSpec::required("labels", OptionType::string,
                           ".npy of integer [N] (or [N, 1]) class indices"),
      OptionSpec::string("layout", "nchw",
                         "rank-4 features: nchw ([N, C, H, W], PyTorch's) or nhwc ([N, H, W, "
                         "C], e.g. torchvision's CIFAR-10 .data), permuted to channels-first")
          .one_of({"nchw", "nhwc"}),
  };
}

sdk::OptionSchema idx_source_schema() {
  return {
      OptionSpec::required("images", OptionType::string,
                           "IDX unsigned-byte image file [N, H, W] (MNIST's format, plain or "
                           "gzip), scaled by /255"),
      OptionSpec::required("labels", OptionType::string,
                           "IDX unsigned-byte label file [N] (plain or gzip)"),
  };
}

sdk::OptionSchema cifar10_source_schema() {
  return {
      OptionSpec::string("path", "",
                         "folder of the CIFAR-10 binary batches: trains on the data_batch_1..5.bin "
                         "present, evaluates on test_batch.bin"),
      OptionSpec::string("train", "",
                         "CIFAR-10 binary batch file(s) to train on, a string or a list; "
                         "overrides path's training batches"),
      OptionSpec::string("eval", "",
                         "held-out batch file(s), a string or a list; overrides path's "
                         "test_batch.bin; with neither, eval_fraction of the training records"),
  };
}

sdk::OptionSchema image_folder_source_schema() {
  return {
      OptionSpec::required("train", OptionType::string,
                           "folder of class folders of images (.jpg, .jpeg, .png), as "
                           "torchvision's ImageFolder reads it: a class per folder, numbered in "
                           "the order of their names"),
      OptionSpec::string("eval", "",
                         "held-out folder with the same class folders (ImageNet's val/); \"\" = "
                         "eval_fraction of the training images"),
      OptionSpec::integer("size", 224, "side of the square crops the model sees (H = W)")
          .at_least(1)
          .at_most(4096),
      OptionSpec::integer("resize", 0,
                          "held-out images: the shorter side resized to this, then the center "
                          "size x size crop; 0 = round(size * 8 / 7), 256 for 224 (torchvision's "
                          "ImageNet recipe)")
          .at_least(0)
          .at_most(8192),
      OptionSpec::number("scale_min", 0.08,
                         "training crops (RandomResizedCrop): smallest fraction of the image's "
                         "area a crop covers")
          .greater_than(0.0)
          .at_most(1.0),
      OptionSpec::number("scale_max", 1.0, "training crops: largest fraction of the area")
          .greater_than(0.0)
          .at_most(1.0),
      OptionSpec::number("ratio_min", 3.0 / 4.0,
                         "training crops: smallest aspect ratio (width / height), drawn "
                         "log-uniformly")
          .greater_than(0.0)
          .at_most(100.0),
      OptionSpec::number("ratio_max", 4.0 / 3.0, "training crops: largest aspect ratio")
          .greater_than(0.0)
          .at_most(100.0),
      OptionSpec::integer("threads", 0,
                          "threads decoding a batch's images; 0 = one per hardware thread")
          .at_least(0)
          .at_most(1024),
      OptionSpec::boolean("check_files", true,
                          "read every image's header, up to its image data, when loading, so "
                          "a file that is no image, whose header is damaged or that ends before "
                          "its image data stops the run before its first step rather than "
                          "mid-epoch (damage inside the image data shows when the file's batch "
                          "is drawn)"),
  };
}

// Token sources: rows are windows of block_size + 1 tokens (inputs and next-token targets).
OptionSpec block_size_option() {
  return OptionSpec::required("block_size", OptionType::integer,
                              "tokens of context per window (T); a window predicts T "
                              "next tokens (at least 2: a model of one position is a "
                              "classifier to the graph)")
      .at_least(2)
      .at_most(kMaxDim);
}

sdk::OptionSchema tokens_source_schema() {
  return {
      OptionSpec::required("train", OptionType::string,
                           "llm.c token file (.bin: 256 int32 header, uint16 tokens) to train on"),
      OptionSpec::string("eval", "",
                         "llm.c token file held out for evaluation; \"\" = the last "
                         "eval_fraction of the train tokens"),
      block_size_option(),
      OptionSpec::required("vocab_size", OptionType::integer,
                           "vocabulary size V, every token below it (GPT-2: 50257; more pads "
                           "the output layer)")
          .at_least(1)
          .at_most(kMaxDim),
  };
}

sdk::OptionSchema text_source_schema() {
  return {
      OptionSpec::required("path", OptionType::string,
                           "text file, or a list of files read one after another; every byte is "
                           "a token"),
      OptionSpec::string("eval", "",
                         "held-out text file(s), a string or a list; \"\" = the last "
                         "eval_fraction of the text"),
      block_size_option(),
      OptionSpec::integer("vocab_size", 256,
                          "vocabulary size: bytes are 0..255, a larger value pads the output "
                          "layer")
          .at_least(256)
          .at_most(kMaxDim),
  };
}

}  // namespace

sdk::OptionSchema data_source_schema(DataSource source) {
  switch (source) {
    case DataSource::synthetic:
      return synthetic_source_schema();
    case DataSource::npy:
      return npy_source_schema();
    case DataSource::idx:
      return idx_source_schema();
    case DataSource::cifar10:
      return cifar10_source_schema();
    case DataSource::image_folder:
      return image_folder_source_schema();
    case DataSource::tokens:
      return tokens_source_schema();
    case DataSource::text:
      return text_source_schema();
  }
  throw std::logic_error("data_source_schema: a source without a schema");
}

std::string data_source_summary(DataSource source) {
  switch (source) {
    case DataSource::synthetic:
      return "generated rows (clusters, a teacher MLP's labels, or images): no files needed";
    case DataSource::npy:
      return "NumPy .npy features (rows or images) and integer labels";
    case DataSource::idx:
      return "MNIST-style IDX image and label files, plain or gzip";
    case DataSource::cifar10:
      return "the CIFAR-10 binary batches (data_batch_*.bin, test_batch.bin)";
    case DataSource::image_folder:
      return "folders of JPEG and PNG images, a folder per class (ImageNet's layout), decoded "
             "and cropped per batch as torchvision's transforms do";
    case DataSource::tokens:
      return "llm.c token files (.bin, uint16 tokens) cut into next-token windows";
    case DataSource::text:
      return "text files as bytes (a byte-level language model's windows)";
  }
  throw std::logic_error("data_source_summary: a source without a summary");
}

sdk::OptionSchema data_normalize_schema() {
  return {
      OptionSpec::string("mean", "",
                         "per-channel means, a list of numbers (one per channel) subtracted "
                         "from the [0, 1] pixels"),
      OptionSpec::string("std", "",
                         "per-channel standard deviations (> 0), one per channel, dividing "
                         "after the mean"),
      OptionSpec::boolean("from_training", false,
                          "compute mean and std per channel from the training split (instead "
                          "of mean / std)"),
  };
}

sdk::OptionSchema data_augment_schema() {
  return {
      OptionSpec::integer("crop_padding", 0,
                          "random crop: pad each side by this many black pixels, take a random "
                          "H x W window; 0 = off")
          .at_least(0)
          .at_most(4096),
      OptionSpec::boolean("horizontal_flip", false, "mirror left-right with probability 1/2"),
  };
}

sdk::OptionSchema schedule_schema() {
  return {
      OptionSpec::string("schedule", "constant",
                         "learning-rate schedule over applied steps (skipped steps do not "
                         "advance it); peak = the optimizer's lr")
          .one_of(lr_schedule_kinds()),
      OptionSpec::integer("warmup_steps", 0,
                          "linear warm-up from lr / warmup_steps to lr; the schedule starts its "
                          "own clock after it (every schedule but constant and onecycle; "
                          "inverse_sqrt needs >= 1)")
          .at_least(0),
      OptionSpec::number("min_lr", 0.0, "learning rate the decay ends at (warmup_cosine, linear)")
          .at_least(0.0)
          .at_most(kMaxLr),
      OptionSpec::integer("step_size", 1, "step: multiply by gamma every step_size steps")
          .at_least(1),
      OptionSpec::number("gamma", 0.1, "step, multistep: the factor of each decay")
          .greater_than(0.0),
      // A list of integers: declared as a string for the key list, read with
      // Config::integer_array (ComponentSection::host_lists).
      OptionSpec::string("milestones", "",
                         "multistep: steps after warm-up at which lr is multiplied by gamma, a "
                         "strictly increasing list of integers >= 1 ([100, 200])"),
      OptionSpec::number("pct_start", 0.3,
                         "onecycle: share of run.steps spent rising to lr, in (0, 1)")
          .greater_than(0.0)
          .at_most(1.0),
      OptionSpec::number("div_factor", 25.0, "onecycle: it starts at lr / div_factor")
          .greater_than(0.0),
      OptionSpec::number("final_div_factor", 1e4,
                         "onecycle: it ends at lr / (div_factor * final_div_factor)")
          .greater_than(0.0),
      OptionSpec::number("clip_grad_norm", 0.0,
                         "clip the global L2 norm of unscaled gradients; 0 = off")
          .at_least(0.0),
  };
}

sdk::OptionSchema checkpoint_core_schema() {
  return {
      OptionSpec::integer("every", 0, "steps between checkpoints; 0 = only the final one")
          .at_least(0),
      OptionSpec::boolean("final", true,
                          "write a checkpoint when the run ends, interrupted or not; false: none "
                          "(benchmarks whose weights nobody keeps; `every` still writes its own)"),
      OptionSpec::integer("keep", 3, "how many recent checkpoints to keep").at_least(1),
      OptionSpec::string("init_from", "", "checkpoint whose weights initialise the model"),
      OptionSpec::string("init_layout", "native",
                         "how init_from stores the weights: native (mixtrain's names and [out, in] "
                         "linears) or gpt2 (a Hugging Face GPT-2 state dict, Conv1D [in, out])")
          .one_of({"native", "gpt2"}),
      OptionSpec::string("keep_best", "",
                         "also keep checkpoints/best.<ext>, the checkpoint of the evaluation with "
                         "the best value of this metric: eval_loss (lowest), eval_accuracy or "
                         "eval_top<k>_accuracy (highest); \"\" = none"),
  };
}

sdk::OptionSchema layer_schema(const std::string& type) {
  sdk::OptionSchema s = {OptionSpec::string("name", "", "unique layer name")};
  if (const OpDefinition* op = find_op(type); op != nullptr && op->schema != nullptr)
    for (auto& spec : op->schema()) s.push_back(std::move(spec));
  return s;
}

// "" means "not overridden"; the resolved config writes it back, so it must parse again.
sdk::OptionSchema precision_override_schema() {
  const std::vector<std::string> dtypes = {"",     "fp32",     "tf32",    "fp16",
                                           "bf16", "fp8_e4m3", "fp8_e5m2"};
  return {
      OptionSpec::required("layers", OptionType::string, "layer name or glob (\"fc*\")"),
      OptionSpec::string("compute", "", "sets weight, gemm_input, activation and activation_grad")
          .one_of(dtypes),
      OptionSpec::string("weight", "", "working weight dtype").one_of(dtypes),
      OptionSpec::string("gemm_input", "", "GEMM operand dtype").one_of(dtypes),
      OptionSpec::string("activation", "", "activation storage dtype").one_of(dtypes),
      OptionSpec::string("activation_grad", "", "activation-gradient dtype").one_of(dtypes),
  };
}

sdk::OptionSchema escalate_schema() {
  return {
      OptionSpec::integer("after", 3,
                          "non-finite steps blamed on the same op within `window` steps that "
                          "promote it one format wider (fp8 -> bf16 -> fp32, fp16 -> fp32)")
          .at_least(1)
          .at_most(1000000),
      OptionSpec::integer("window", 200, "steps a blame is remembered; at least `after`")
          .at_least(1)
          .at_most(1000000000),
      OptionSpec::integer("deescalate_after", 0,
                          "applied steps in a row without a skip that undo the latest promotion "
                          "(one rung); 0 = never")
          .at_least(0)
          .at_most(1000000000),
  };
}

sdk::OptionSchema distributed_schema() {
  return {
      OptionSpec::boolean("shard_optimizer", false,
                          "ZeRO stage 1: each rank keeps and updates 1/N of the optimizer state; "
                          "gradients are reduce-scattered and the weights all-gathered"),
      OptionSpec::number("bucket_mb", 25.0,
                         "gradients are averaged in buckets of at most this many MiB, each started "
                         "as soon as its gradients are final")
          .greater_than(0.0)
          .at_most(4096.0),
      OptionSpec::boolean("overlap", true,
                          "start each bucket during backward; false: all of them after it"),
      OptionSpec::string("batch_norm", "local",
                         "batch-norm statistics: each rank's own batch (local, PyTorch's "
                         "default) or the global batch's, all-reduced (sync, SyncBatchNorm)")
          .one_of(choice_names(kBatchNormStats)),
  };
}

const std::vector<std::string>& data_sources() {
  static const std::vector<std::string> sources = choice_names(kDataSources);
  return sources;
}

bool is_path_option(DataSource source, const std::string& key) {
  switch (source) {
    case DataSource::npy:
      return key == "features" || key == "labels";
    case DataSource::idx:
      return key == "images" || key == "labels";
    case DataSource::cifar10:
      return key == "path" || key == "train" || key == "eval";
    case DataSource::image_folder:
      return key == "train" || key == "eval";
    case DataSource::tokens:
      return key == "train" || key == "eval";
    case DataSource::text:
      return key == "path" || key == "eval";
    case DataSource::synthetic:
      break;
  }
  return false;
}

bool is_path_list_option(DataSource source, const std::string& key) {
  if (source == DataSource::cifar10) return key == "train" || key == "eval";
  return source == DataSource::text && (key == "path" || key == "eval");
}

const std::vector<std::string>& model_list_keys() {
  static const std::vector<std::string> keys = {"layers", "nodes", "blocks", "recompute"};
  return keys;
}

sdk::OptionSchema model_schema() {
  return {OptionSpec::string("loss", "softmax_cross_entropy", "training loss")
              .one_of({"softmax_cross_entropy"}),
          OptionSpec::number("label_smoothing", 0.0,
                             "training targets (1 - e)·onehot + e / classes, as "
                             "torch.nn.CrossEntropyLoss(label_smoothing=e); eval_loss stays plain "
                             "cross-entropy; 0 = off")
              .at_least(0.0)
              .at_most(1.0),
          OptionSpec::string("preset", "",
                             "a whole architecture from a few sizes instead of layers/nodes: "
                             "\"gpt\" (sizes in [model.gpt]) or \"resnet\" (sizes in "
                             "[model.resnet])")
              .one_of(choice_names(kModelPresets)),
          OptionSpec::string("from_pretrained", "",
                             "a Hugging Face GPT-2 folder (config.json, model.safetensors): the "
                             "gpt preset sized by its config.json, starting from its weights; "
                             "relative to this file"),
          OptionSpec::boolean("fuse_epilogues", true,
                              "run each relu/gelu that follows a linear layer as that GEMM's "
                              "epilogue (a gelu after bf16 GEMMs apart where the backend runs "
                              "them faster so: the CPU on AMX), and each batch norm read only by "
                              "an add inside the add (one rounding, one pass less)"),
          OptionSpec::string("recompute", "",
                             "op types whose outputs are not kept for the backward but computed "
                             "again from their inputs just before the first backward that reads "
                             "them: [\"gelu\", \"layernorm\"] (llm.c's -r 2) for an element-wise "
                             "pass more each, or [\"layernorm\", \"linear\", \"attention\", "
                             "\"gelu\"] to compute each transformer block again from its "
                             "residual stream (Hugging Face's gradient checkpointing); only the "
                             "op types the op table marks recomputable"),
          OptionSpec::boolean("fp32_gradient_sums", true,
                              "a tensor read by several ops (a residual block's input) sums its "
                              "gradient in FP32; false sums it in its readers' gradient dtype "
                              "when they share one (bf16 under bf16-mixed), as PyTorch AMP's "
                              "autograd does: half the bytes of the sum, rounded at each add"),
          OptionSpec::integer("loss_chunk_rows", 1024,
                              "compute the classifier (a language model's LM head) and the loss "
                              "this many rows at a time, so the whole [rows, classes] logits and "
                              "their gradient never exist; 0 = the whole batch at once; unset: "
                              "for a model of 4096 classes or more, 512 on a backend whose GEMMs "
                              "reach their rate at a few hundred rows (the CPU) and 1024 on "
                              "others (CUDA), else 0")
              .at_least(0)
              .at_most(2147483647),
          OptionSpec::integer("loss_pad_classes", 0,
                              "pad the chunked loss's logits to a multiple of this many classes "
                              "(llm.c's padded vocabulary: 64 for GPT-2's 50257), so that GPU "
                              "GEMMs get rows 16 bytes apart; the padded classes have probability "
                              "0, so the loss and gradients are the unpadded ones; 0 or 1 = none; "
                              "ignored with label smoothing, without loss_chunk_rows or when the "
                              "head has a bias; unset: 64 on a backend whose GEMMs want rows 16 "
                              "bytes apart (CUDA) for a class count that is not a multiple of 8, "
                              "else 0")
              .at_least(0)
              .at_most(4096)};
}

sdk::OptionSchema gpt_preset_schema() {
  return {OptionSpec::required("n_layer", sdk::OptionType::integer, "transformer blocks")
              .at_least(1)
              .at_most(1024),
          OptionSpec::required("n_head", sdk::OptionType::integer, "attention heads per block")
              .at_least(1)
              .at_most(1024),
          OptionSpec::required("n_embd", sdk::OptionType::integer,
                               "residual stream width; a multiple of n_head")
              .at_least(1)
              .at_most(65536),
          OptionSpec::integer("vocab_size", 0, "token ids; 0: the data's vocab_size")
              .at_least(0)
              .at_most(2147483647),
          OptionSpec::integer("block_size", 0,
                              "positions the model learns (wpe rows); 0: the data's block_size")
              .at_least(0)
              .at_most(1048576),
          OptionSpec::boolean("bias", true, "biases in the linear layers (GPT-2 has them)"),
          OptionSpec::integer("bos_token_id", -2,
                              "the id a sequence starts with, for a Hugging Face export's "
                              "config.json (from_pretrained copies its folder's); -1: none; "
                              "-2: GPT-2's <|endoftext|> (50256) when the vocabulary has it")
              .at_least(-2)
              .at_most(2147483647),
          OptionSpec::integer("eos_token_id", -2,
                              "the id `sample` stops at (unless --stop-ids or --ignore-eos) "
                              "and a Hugging Face export's config.json names (from_pretrained "
                              "copies its folder's); -1: none; "
                              "-2: GPT-2's <|endoftext|> (50256) when the vocabulary has it")
              .at_least(-2)
              .at_most(2147483647),
          OptionSpec::boolean("fused_attention", true,
                              "flash attention where the backend offers it (no [T, T] tensor "
                              "kept for the backward); false: the unfused attention, for "
                              "comparison (the attention node's `fused` option)")};
}

sdk::OptionSchema resnet_preset_schema() {
  // blocks and widths are integer arrays, read beside this schema.
  return {OptionSpec::string("block", "basic",
                             "\"basic\": torchvision's BasicBlock (two 3×3 convs: ResNet-18/34, "
                             "CIFAR ResNets); \"bottleneck\": its Bottleneck, ResNet v1.5 (1×1, "
                             "3×3 with the stride, 1×1 to 4·width: ResNet-50/101/152)")
              .one_of(choice_names(kResNetBlocks)),
          OptionSpec::string("stem", "cifar",
                             "\"cifar\": 3×3 conv, stride 1; \"imagenet\": 7×7 conv, stride 2, "
                             "and a 3×3 max pool, stride 2")
              .one_of(choice_names(kResNetStems)),
          OptionSpec::integer("stem_width", 0, "channels of the stem conv; 0: widths[0]")
              .at_least(0)
              .at_most(65536),
          OptionSpec::integer("classes", 10, "outputs of the fc head (the data's classes)")
              .at_least(1)
              .at_most(2147483647)};
}

const std::vector<std::string>& layer_types() {
  return op_types();
}

}  // namespace mixtrain::core
