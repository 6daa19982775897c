// `mixtrain export`: writes a checkpoint's weights in another format (safetensors for PyTorch),
// or, with --initial, the weights a config's training starts from.

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "cli_registry.h"
#include "commands.h"
#include "exported_weights.h"
#include "lora_export.h"
#include "mixtrain/core/checkpoint/format_set.h"
#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/core/checkpoint/hf_folder.h"
#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/core/checkpoint/peft_adapter.h"
#include "mixtrain/core/checkpoint/weights_read.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/dtype.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "model_session.h"
#include "output_file.h"
#include "staged_folder.h"

namespace mixtrain::cli {

namespace {

namespace fs = std::filesystem;
using Formats = std::vector<std::pair<std::string, std::shared_ptr<sdk::CheckpointFormat>>>;

std::shared_ptr<sdk::CheckpointFormat> create_format(core::PluginRegistry& registry,
                                                     const core::LoadedComponent& c,
                                                     std::vector<sdk::RawOption> raw,
                                                     const std::string& table = "export") {
  auto options = sdk::Options::resolve(table, c.info.options, raw, {"command line"});
  return registry.create<sdk::CheckpointFormat>(c, options);
}

// --format with --dtype as its option.
std::shared_ptr<sdk::CheckpointFormat> create_writer(core::PluginRegistry& registry,
                                                     const ExportArgs& args) {
  std::vector<sdk::RawOption> options;
  if (!args.dtype.empty()) options.push_back({"dtype", args.dtype, {"--dtype"}});
  return create_format(
      registry, registry.require(sdk::ComponentKind::checkpoint_format, args.format, "--format"),
      options);
}

std::string known_formats(const Formats& formats) {
  std::string known;
  for (const auto& [name, f] : formats)
    known += (known.empty() ? "" : ", ") + name + " (" + f->file_extension() + ")";
  return known.empty() ? "none" : known;
}

// The run a checkpoint belongs to, as `train --resume RUN` finds it: its config.toml, whose
// [plugins] paths load the plugin of the format that wrote its checkpoints and whose
// checkpoint.format (with its [checkpoint.NAME] options) reads them. Empty when there is none.
struct RunRecord {
  std::optional<core::Config> config;
  std::string format;                   // checkpoint.format
  std::vector<sdk::RawOption> options;  // [checkpoint.<format>]
};

RunRecord run_record_of(const fs::path& source) {
  RunRecord run;
  std::error_code ec;
  if (!fs::exists(source, ec)) return run;
  const fs::path file = core::run_folder_of(source) / "config.toml";
  if (!fs::is_regular_file(file, ec)) return run;
  try {
    run.config = core::Config::from_file(file, {}, {});
    for (const auto& o : run.config->table_options("checkpoint"))
      if (const auto* name = std::get_if<std::string>(&o.value); name && o.key == "format")
        run.format = *name;
    if (!run.format.empty() && run.config->has_table("checkpoint." + run.format))
      run.options = run.config->table_options("checkpoint." + run.format);
  } catch (const sdk::UserError& e) {
    // A checkpoint of mixtrain's own formats is read without it.
    core::core_logger("export").warn("cannot read " + file.string() +
                                     " for the run's plugins and checkpoint.format: " + e.what());
    run = {};
  }
  return run;
}

// Where a format's plugin is loaded from, for the hint of a file no loaded format reads.
std::string how_to_load(const RunRecord& run) {
  return "load the plugin that provides it: MIXTRAIN_PLUGIN_PATH=<folder of its "
         "libmixtrain_*.so> mixtrain export ...," +
         std::string(run.config ? " or the run's config.toml [plugins] paths (" +
                                      run.config->source_name() + "), which export reads"
                                : " or a config.toml in the run folder with [plugins] paths") +
         "; `mixtrain plugins` lists the formats loaded";
}

// The format of `file` (a step-N or best file) as far as the run says: its checkpoint.format when
// that is not loaded, which the file's extension then most likely belongs to.
std::string unloaded_format_of(const fs::path& file, const RunRecord& run, const Formats& formats) {
  const bool loaded = std::any_of(formats.begin(), formats.end(),
                                  [&](const auto& f) { return f.first == run.format; });
  if (!run.format.empty() && !loaded)
    return "its format '" + run.format + "' (the run's checkpoint.format) is not loaded";
  return "no loaded checkpoint format reads '" + file.extension().string() +
         "' files (loaded: " + known_formats(formats) + ")";
}

// A folder (a run, its checkpoints/): its newest checkpoint, chosen as `eval --checkpoint` and
// `train --resume` choose it, in the first format (the run's own first, then registry order) that
// has one.
std::pair<fs::path, std::shared_ptr<sdk::CheckpointFormat>> newest_in_folder(const fs::path& folder,
                                                                             const Formats& formats,
                                                                             const RunRecord& run) {
  for (const auto& [name, f] : formats) {
    try {
      return {core::resolve_checkpoint_path(folder, f->file_extension(), ""), f};
    } catch (const sdk::CheckpointError&) {
      // none of this format's files here; try the next format
    }
  }
  const fs::path where = fs::is_directory(folder / "checkpoints") ? folder / "checkpoints" : folder;
  // Step checkpoints of a format no loaded plugin provides: say whose they are and how to load it.
  std::optional<fs::path> newest;
  std::int64_t newest_step = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(where, ec)) {
    const fs::path& p = entry.path();
    if (!entry.is_regular_file(ec) || !p.has_extension()) continue;
    const auto step = core::checkpoint_step(p, p.extension().string());
    if (step && *step > newest_step) newest_step = *step, newest = p;
  }
  if (newest)
    throw sdk::CheckpointError(
        "no checkpoint in " + where.string() + " that a loaded format reads: step-*" +
            newest->extension().string() + " found (the newest " + newest->filename().string() +
            "); " + unloaded_format_of(*newest, run, formats),
        how_to_load(run));
  std::string patterns;
  for (const auto& [name, f] : formats)
    patterns += (patterns.empty() ? "step-*" : ", step-*") + f->file_extension();
  throw sdk::CheckpointError(
      "no checkpoint (" + patterns + ") in " + folder.string() +
          (fs::is_directory(folder / "checkpoints") ? " or " + (folder / "checkpoints").string()
                                                    : std::string()),
      "pass a checkpoint file, a run folder or its checkpoints/ folder");
}

bool hf_layout(const ExportArgs& args) {
  return args.layout == "hf";
}

bool peft_layout(const ExportArgs& args) {
  return args.layout == "peft";
}

// What killed exports left where this one writes, removed (no live writer holds it) and said,
// before the output is checked: a file export's temporary file beside --out (a checkpoint's
// size), a folder export's staging folder inside it (a partial weights file, which would make an
// empty folder look written).
void remove_abandoned_outputs(const ExportArgs& args, const fs::path& out) {
  if (hf_layout(args) || peft_layout(args)) {
    for (const auto& stale : remove_abandoned_staging_folders(out))
      std::cerr << "removed " << stale.string()
                << ", the staging folder of an export that was killed" << std::endl;
  } else {
    for (const auto& stale : remove_abandoned_temp_files(out))
      std::cerr << "removed " << stale.string()
                << ", the temporary file of a writer that was killed" << std::endl;
  }
}

// The output, checked before anything is read: a folder for --layout hf and peft, else a file.
void check_output(const ExportArgs& args, const fs::path& out, const CommandInput& input) {
  if (hf_layout(args))
    check_output_folder(out, {std::string(core::kHfWeightsFile), std::string(core::kHfConfigFile)},
                        {input}, args.force);
  else if (peft_layout(args))
    check_output_folder(out,
                        {std::string(core::kPeftWeightsFile), std::string(core::kPeftConfigFile)},
                        {input}, args.force);
  else
    check_output_file(out, {input}, args.force, "--out", "exported.safetensors");
}

// Every checkpoint format the registry knows, for the extensions they claim.
Formats all_formats(core::PluginRegistry& registry) {
  Formats formats;
  for (const auto& c : registry.components())
    if (c.info.kind == sdk::ComponentKind::checkpoint_format)
      formats.emplace_back(c.info.name, create_format(registry, c, {}));
  return formats;
}

// A file export's --out against the bytes --format writes. Another format's extension is refused:
// export, eval --checkpoint and train --resume choose a file's reader by its extension, so
// safetensors bytes named .mxt would be read as a native checkpoint and fail (or a run folder's
// newest step-N.mxt would be that file). Any other name is written with a warning, as predict
// warns for an --out not named .npy: what reads it is told the format some other way.
void check_out_extension(const ExportArgs& args, const fs::path& out,
                         const sdk::CheckpointFormat& writer, const Formats& formats) {
  if (hf_layout(args) || peft_layout(args)) return;
  const std::string extension = out.extension().string(), wanted = writer.file_extension();
  if (extension == wanted) return;
  for (const auto& [name, f] : formats)
    if (f->file_extension() == extension && !extension.empty())
      throw sdk::UserError("--out " + out.string() + " is named as a " + name + " checkpoint (" +
                               extension + "), but --format " + args.format + " writes " + wanted +
                               " files: readers choose the format by the extension",
                           "name it " + wanted + ", e.g. --out " +
                               fs::path(out).replace_extension(wanted).string() +
                               ", or pass --format " + name + " to write that format");
  std::cerr << "warning: --out " << out.string() << " is written as --format " << args.format
            << " (" << wanted << ") whatever its name; name it " << wanted
            << " to say so (mixtrain reads a checkpoint's format from its extension, or from "
               "--from)"
            << std::endl;
}

void create_folder(const fs::path& out) {
  std::error_code ec;
  fs::create_directory(out, ec);
  if (ec)
    throw sdk::UserError("cannot create the folder " + out.string() + ": " + ec.message(),
                         "choose another --out");
}

void write_text_file(const fs::path& file, const std::string& text, const std::string& what) {
  sdk::AtomicFileWriter config(file, /*durable=*/true, what);
  config.write(text.data(), text.size());
  if (const auto warning = config.commit(); !warning.empty())
    std::cerr << "warning: " << warning << std::endl;
}

// A PEFT adapter folder: adapter_model.safetensors and adapter_config.json (StagedFolder).
void write_peft_folder(const sdk::CheckpointFormat& writer, sdk::TrainingState state,
                       const fs::path& source, const fs::path& out, const std::string& from) {
  auto peft = in_peft_layout(std::move(state), source);
  create_folder(out);
  {
    const StagedFolder staged(out);
    writer.write(staged.staged(core::kPeftWeightsFile), peft.state);
    write_text_file(staged.staged(core::kPeftConfigFile), peft.config_json, "PEFT adapter config");
    staged.publish({core::kPeftWeightsFile, core::kPeftConfigFile});
  }
  std::cout << "wrote " << out.string() << " (PEFT LoRA adapter folder: " << core::kPeftConfigFile
            << ", " << core::kPeftWeightsFile << "; " << from << ", " << peft.adapters
            << " adapted modules, " << peft.state.tensors.size() << " tensors, fp32)" << std::endl;
}

// The tokenizer files beside the weights a run started from, when those are a Hugging Face
// folder's (from_pretrained): the tokenizer the model was fine-tuned with.
std::vector<std::string_view> tokenizer_files_beside(const fs::path& initial_weights) {
  std::vector<std::string_view> found;
  if (initial_weights.filename() != core::kHfWeightsFile) return found;
  std::error_code ec;
  for (const std::string_view name : core::kHfTokenizerFiles)
    if (fs::is_regular_file(initial_weights.parent_path() / name, ec)) found.push_back(name);
  return found;
}

// A Hugging Face model folder: model.safetensors and config.json (StagedFolder), and the
// tokenizer files of the folder the run started from, so AutoTokenizer loads it as it did that.
void write_hf_folder(const ExportArgs& args, const sdk::CheckpointFormat& writer,
                     sdk::TrainingState state, const fs::path& source, const fs::path& out,
                     const std::string& from) {
  const sdk::DType stored = args.dtype.empty()
                                ? sdk::DType::fp32
                                : sdk::parse_dtype(args.dtype).value_or(sdk::DType::fp32);
  const fs::path initial = initial_weights_of(state);
  const auto tokenizer = tokenizer_files_beside(initial);
  auto folder = in_hf_folder(std::move(state), source, stored);
  create_folder(out);
  {
    const StagedFolder staged(out);
    writer.write(staged.staged(core::kHfWeightsFile), folder.state);
    write_text_file(staged.staged(core::kHfConfigFile), folder.config_json,
                    "Hugging Face config");
    std::vector<std::string_view> files = {core::kHfWeightsFile, core::kHfConfigFile};
    for (const std::string_view name : tokenizer) {
      std::error_code ec;
      fs::copy_file(initial.parent_path() / name, staged.staged(name), ec);
      if (ec)
        throw sdk::UserError("cannot copy " + (initial.parent_path() / name).string() +
                                 " into the export: " + ec.message(),
                             "check that it is readable and the disk has room");
      files.push_back(name);
    }
    staged.publish(files);
  }
  std::string zeros;
  if (!folder.zero_biases.empty())
    zeros = ", " + std::to_string(folder.zero_biases.size()) +
            " zero biases added: the model has bias = false and GPT-2 has biases";
  std::string carried;
  for (const std::string_view name : tokenizer) carried += ", " + std::string(name);
  std::cout << "wrote " << out.string() << " (Hugging Face GPT-2 folder: " << core::kHfConfigFile
            << ", " << core::kHfWeightsFile << carried << "; " << from << ", "
            << weight_tensor_count(folder.state) << " weight tensors, " << sdk::dtype_name(stored)
            << zeros << ")" << std::endl;
}

// The exported weights in --layout, written and reported; `from` says where they came from.
void write_export(const ExportArgs& args, const sdk::CheckpointFormat& writer,
                  sdk::TrainingState state, const fs::path& source, const fs::path& out,
                  const std::string& from) {
  if (peft_layout(args)) return write_peft_folder(writer, std::move(state), source, out, from);
  if (args.merge_lora) {
    if (!has_lora_adapters(state))
      throw sdk::UserError("--merge-lora: " + source.string() + " holds no LoRA adapters",
                           "drop --merge-lora; it merges the adapters of a run with [model.lora]");
    state = merge_lora(std::move(state), source);
  } else if (args.layout != "native" && has_lora_adapters(state)) {
    throw sdk::UserError(
        "--layout " + args.layout + ": " + source.string() +
            " holds LoRA adapters, which a Hugging Face GPT-2 has no place for",
        "add --merge-lora to merge them into the base weights, or write them apart with "
        "--layout peft");
  }
  if (hf_layout(args)) return write_hf_folder(args, writer, std::move(state), source, out, from);
  const bool gpt2 = core::parse_weight_layout(args.layout) == core::WeightLayout::gpt2;
  state = gpt2 ? in_gpt2_layout(std::move(state), source) : only_weights(std::move(state));
  writer.write(out, state);
  std::cout << "wrote " << out.string() << " (" << args.format << ", " << from << ", "
            << weight_tensor_count(state) << " weight tensors"
            << (args.dtype.empty() ? "" : ", " + args.dtype)
            << (gpt2 ? ", Hugging Face GPT-2 layout" : "") << ")" << std::endl;
}

int export_checkpoint(const ExportArgs& args) {
  if (!args.sets.empty())
    throw sdk::UserError("--set changes a config, but a checkpoint is exported as it was trained",
                         "drop --set, or export a config's initial weights with --initial");
  // A run's checkpoints may be a plugin format's: the run's config.toml loads it, as it does for
  // `train --resume RUN` without a config.
  const RunRecord run = run_record_of(args.source);
  auto registry = make_registry(run.config ? &*run.config : nullptr);
  auto writer = create_writer(*registry, args);
  const auto& writer_component =
      registry->require(sdk::ComponentKind::checkpoint_format, args.format, "--format");
  // A config given without --initial: no format reads it, and the formats' own refusals (or a
  // --from's) would say nothing of the flag that exports what a config holds.
  if (const fs::path given = args.source;
      given.extension() == ".toml" && !fs::is_directory(given)) {
    const auto formats = all_formats(*registry);
    if (std::none_of(formats.begin(), formats.end(),
                     [](const auto& f) { return f.second->file_extension() == ".toml"; }))
      throw sdk::UserError(
          given.string() +
              " is a config, not a checkpoint: export reads a checkpoint file, a run folder or "
              "its checkpoints/, and a config only with --initial",
          "to export the weights this config's training starts from, add --initial and --out "
          "(`mixtrain export " +
              given.string() + " --initial --out initial" + writer->file_extension() +
              (args.format == "safetensors" ? "" : " --format " + args.format) +
              "`); to export a trained run, pass its run folder");
  }

  Formats readers;
  std::vector<std::string> warnings;
  if (!args.from.empty()) {
    readers.emplace_back(
        args.from,
        create_format(*registry,
                      registry->require(sdk::ComponentKind::checkpoint_format, args.from, "--from"),
                      {}));
  } else {
    // The run's own format with its options first (its files are its own, whatever another
    // format claims), then every other in registry order; --format's own extension may be no
    // other's, as checkpoint.format's may not (format_set.h).
    std::vector<core::NamedFormat> others;
    if (const auto* own = registry->find(sdk::ComponentKind::checkpoint_format, run.format);
        own != nullptr && run.format != args.format) {
      try {
        others.push_back(core::named_format(
            *own, create_format(*registry, *own, run.options, "checkpoint." + run.format)));
      } catch (const sdk::UserError& e) {
        core::core_logger("export").warn("the run's checkpoint.format '" + run.format +
                                         "' is read with its defaults: " + e.what());
        others.push_back(core::named_format(*own, create_format(*registry, *own, {})));
      }
    }
    for (const auto& c : registry->components()) {
      if (c.info.kind != sdk::ComponentKind::checkpoint_format || c.info.name == args.format ||
          c.info.name == run.format)
        continue;
      try {
        others.push_back(core::named_format(c, create_format(*registry, c, {})));
      } catch (const sdk::UserError& e) {
        warnings.push_back("checkpoint format '" + c.info.name +
                           "' is not used to read files: " + e.what());
      }
    }
    auto kept = core::formats_by_extension(core::named_format(writer_component, writer),
                                           std::move(others), "--format", warnings);
    // Folders are searched in the run's format first, then in registry order, --format's
    // included (mixtrain's own native before safetensors), as before --format was checked first.
    const auto rank = [&](const core::NamedFormat& f) {
      if (f.name == run.format) return -1L;
      const auto& all = registry->components();
      return static_cast<long>(std::find_if(all.begin(), all.end(),
                                            [&](const auto& c) {
                                              return c.info.kind ==
                                                         sdk::ComponentKind::checkpoint_format &&
                                                     c.info.name == f.name;
                                            }) -
                               all.begin());
    };
    std::stable_sort(kept.begin(), kept.end(),
                     [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
    for (auto& f : kept) readers.emplace_back(f.name, f.format);
  }
  for (const auto& w : warnings) core::core_logger("export").warn(w);

  fs::path source = args.source;
  std::shared_ptr<sdk::CheckpointFormat> reader;
  std::error_code ec;
  if (fs::is_directory(source, ec)) {
    std::tie(source, reader) = newest_in_folder(source, readers, run);
  } else {
    source = core::resolve_checkpoint_path(source, source.extension().string(), "");  // must exist
    if (!args.from.empty()) reader = readers.front().second;
    for (const auto& [name, f] : readers)
      if (!reader && f->file_extension() == source.extension().string()) reader = f;
    if (!reader)
      throw sdk::CheckpointError(
          source.string() + ": " + unloaded_format_of(source, run, readers),
          how_to_load(run) + "; or name a loaded format that reads it with --from");
  }
  std::string reader_label = "the checkpoint format that read it";
  std::string reader_plugin;  // its label when a plugin outside mixtrain's folder provides it
  for (const auto& c : registry->components())
    if (c.info.kind == sdk::ComponentKind::checkpoint_format)
      for (const auto& [name, f] : readers)
        if (f == reader && name == c.info.name) {
          const auto named = core::named_format(c, f);
          reader_label = named.label();
          if (!named.builtin) reader_plugin = reader_label;
        }

  // By default beside the run, never inside checkpoints/ (the trainer's rotation owns that).
  fs::path default_out = source.filename();
  if (hf_layout(args) || peft_layout(args))
    default_out = default_out.replace_extension().string() + "-" + args.layout;
  else
    default_out.replace_extension(writer->file_extension());
  const fs::path out =
      args.out.empty() ? core::run_folder_of(source) / default_out : fs::path(args.out);
  remove_abandoned_outputs(args, out);
  check_output(args, out, {"source", source});
  check_out_extension(args, out, *writer, all_formats(*registry));

  // An export holds weights (and their EMA), never the optimizer's slots: they stay on disk.
  auto state = core::read_checkpoint_with(*reader, source, /*weights_only=*/true, reader_plugin);
  core::refuse_repeated_tensors(state, source, reader_label);
  // The weights the run started from (a Hugging Face folder's model.safetensors, which a PEFT
  // adapter of the run names as its base) are an input too, known once the checkpoint is read.
  if (const auto from = initial_weights_of(state); !from.empty())
    check_output(args, out, {"checkpoint.init_from (the run's)", from});
  if (peft_layout(args)) refuse_training_beyond_adapters(state, source);  // reads "resume"
  // The weights eval, predict and sample use, unless --weights says otherwise.
  const std::string weights = args.weights.empty() ? evaluated_weights(state) : args.weights;
  std::string from = "from " + source.string();
  // A file without EMA tensors under eval.weights = "ema" (an export, which holds the average
  // already, or a checkpoint format that keeps weights only) is written as it is, as eval reads it.
  const bool averages = weights == "ema" && (!args.weights.empty() || has_ema_weights(state));
  if (averages) {
    state = with_ema_weights(std::move(state), source);
    from +=
        args.weights.empty() ? ", its EMA weights (eval.weights = \"ema\")" : ", its EMA weights";
  }
  // Anything but a mixtrain checkpoint (e.g. another safetensors file) keeps its metadata. A
  // checkpoint's export says which of its weights it holds.
  if (state.metadata.count("mixtrain.state_version")) {
    state.metadata = exported_metadata(state.metadata);
    state.metadata["mixtrain.weights"] = averages ? "ema" : "master";
  }
  write_export(args, *writer, std::move(state), source, out, from);
  return 0;
}

// --initial reads a config: a checkpoint or a run folder given instead would otherwise be parsed
// as TOML ("invalid utf-8 sequence" about a binary file), which says nothing of the mix-up.
void refuse_checkpoint_as_config(const fs::path& config) {
  std::error_code ec;
  if (fs::is_directory(config, ec))
    throw sdk::UserError("export --initial reads a config, but " + config.string() + " is a folder",
                         "give a config file (a run folder's is " +
                             (config / "config.toml").string() +
                             "), or drop --initial to export the folder's newest checkpoint");
  auto registry = make_registry(nullptr);
  for (const auto& [name, f] : all_formats(*registry))
    if (config.extension() == f->file_extension())
      throw sdk::UserError("export --initial reads a config, but " + config.string() +
                               " looks like a checkpoint (" + name + ", " + f->file_extension() +
                               ")",
                           "drop --initial to export the checkpoint's weights, or give --initial "
                           "the config (.toml) whose initial weights you want");
}

// The config's model as `train` builds it, before its first step: the trainer's own checkpoint
// state, weights part, so the names and bits are those a checkpoint of the run would hold.
int export_initial(const ExportArgs& args) {
  const fs::path config = args.source, out = args.out;
  if (!args.from.empty())
    throw sdk::UserError(
        "--from names the format of a checkpoint to read; --initial reads a config, " +
            config.string(),
        "drop --from");
  if (!args.weights.empty())
    throw sdk::UserError(
        "--weights chooses a run's master or EMA weights; --initial writes the "
        "weights training starts from, where the EMA starts too",
        "drop --weights");
  refuse_checkpoint_as_config(config);
  if (args.out.empty())
    throw sdk::UserError(
        "export --initial needs --out: a config's weights have no run folder to go beside",
        hf_layout(args) || peft_layout(args)
            ? "name the output folder, e.g. --out initial-" + args.layout
            : std::string("name the output file, e.g. --out initial.safetensors"));
  remove_abandoned_outputs(args, out);
  check_output(args, out, {"config", config});

  // Initial weights depend on the model's shape and the seed: a language model's token files are
  // not opened.
  auto session =
      open_model_session({args.source, args.sets, {}}, SessionWeights::as_training_starts,
                         /*rehearses=*/false, core::DataSplits::none);
  const auto& init_from = session.experiment.checkpoint.init_from;
  // The init_from file is an input too, known once the config is read.
  check_output(args, out, {"checkpoint.init_from", init_from});
  auto writer = create_writer(*session.registry, args);
  check_out_extension(args, out, *writer, all_formats(*session.registry));
  auto state = session.trainer->training_state(/*weights_only=*/true);
  state.metadata = exported_metadata(state.metadata);
  write_export(args, *writer, std::move(state), config, out,
               "initial weights of " + config.string() + ", run.seed " +
                   std::to_string(session.experiment.run.seed) +
                   (init_from.empty() ? std::string() : ", then " + init_from) +
                   (session.experiment.from_peft.enabled()
                        ? ", then the adapters of " + session.experiment.from_peft.folder.string()
                        : std::string()));
  return 0;
}

}  // namespace

int run_export(const ExportArgs& input) {
  ExportArgs args = input;
  // A Hugging Face folder's weights are model.safetensors, and so are a config's initial weights
  // by default (for PyTorch); a checkpoint's conversion needs the format named.
  if (args.format.empty() && (hf_layout(args) || peft_layout(args) || args.initial))
    args.format = "safetensors";
  if (peft_layout(args) && args.merge_lora)
    throw sdk::UserError("--merge-lora writes the merged model; --layout peft the adapters apart",
                         "drop one: --merge-lora with --layout hf, or --layout peft alone");
  if (peft_layout(args) && !args.dtype.empty() && args.dtype != "fp32")
    throw sdk::UserError("--layout peft writes the adapters in fp32, not --dtype " + args.dtype,
                         "drop --dtype");
  if (hf_layout(args) || peft_layout(args)) {
    if (args.format != "safetensors")
      throw sdk::UserError("--layout " + args.layout + " writes a " +
                               (hf_layout(args) ? "Hugging Face" : "PEFT adapter") +
                               " folder, whose weights are safetensors, not --format " +
                               args.format,
                           "drop --format, or pass --format safetensors");
  } else if (args.format.empty()) {
    throw sdk::UserError("export needs --format: the format to write",
                         "e.g. --format safetensors (PyTorch, Hugging Face), or --layout hf for a "
                         "Hugging Face model folder");
  }
  return args.initial ? export_initial(args) : export_checkpoint(args);
}

}  // namespace mixtrain::cli
