// `mixtrain export`: writes a checkpoint's weights in another format (safetensors for PyTorch),
// or, with --initial, the weights a config's training starts from.
#include <iostream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cli_registry.h"
#include "commands.h"
#include "exported_weights.h"
#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/sdk/checkpoint_format.h"
#include "model_session.h"
#include "output_file.h"

namespace mixtrain::cli {

namespace {

namespace fs = std::filesystem;
using Formats = std::vector<std::pair<std::string, std::shared_ptr<sdk::CheckpointFormat>>>;

std::shared_ptr<sdk::CheckpointFormat> create_format(core::PluginRegistry& registry,
                                                     const core::LoadedComponent& c,
                                                     std::vector<sdk::RawOption> raw) {
  auto options = sdk::Options::resolve("export", c.info.options, raw, {"command line"});
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

// A folder (a run, its checkpoints/): its newest checkpoint, chosen as `eval --checkpoint` and
// `train --resume` choose it, in the first format (registry order) that has one.
std::pair<fs::path, std::shared_ptr<sdk::CheckpointFormat>> newest_in_folder(
    const fs::path& folder, const Formats& formats) {
  for (const auto& [name, f] : formats) {
    try {
      return {core::resolve_checkpoint_path(folder, f->file_extension()), f};
    } catch (const sdk::CheckpointError&) {
      // none of this format's files here; try the next format
    }
  }
  std::string patterns;
  for (const auto& [name, f] : formats)
    patterns += (patterns.empty() ? "step-*" : ", step-*") + f->file_extension();
  throw sdk::CheckpointError(
      "no checkpoint (" + patterns + ") in " + folder.string() +
          (fs::is_directory(folder / "checkpoints") ? " or " + (folder / "checkpoints").string()
                                                    : std::string()),
      "pass a checkpoint file, a run folder or its checkpoints/ folder");
}

// The exported weights in --layout, written and reported; `from` says where they came from.
void write_export(const ExportArgs& args, const sdk::CheckpointFormat& writer,
                  sdk::TrainingState state, const fs::path& source, const fs::path& out,
                  const std::string& from) {
  const bool gpt2 = core::parse_weight_layout(args.layout) == core::WeightLayout::gpt2;
  if (gpt2) state = in_gpt2_layout(std::move(state), source);
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
  auto registry = make_registry(nullptr);
  auto writer = create_writer(*registry, args);

  Formats readers;
  if (!args.from.empty())
    readers.emplace_back(
        args.from,
        create_format(*registry,
                      registry->require(sdk::ComponentKind::checkpoint_format, args.from, "--from"),
                      {}));
  else
    for (const auto& c : registry->components())
      if (c.info.kind == sdk::ComponentKind::checkpoint_format)
        readers.emplace_back(c.info.name, create_format(*registry, c, {}));

  fs::path source = args.source;
  std::shared_ptr<sdk::CheckpointFormat> reader;
  std::error_code ec;
  if (fs::is_directory(source, ec)) {
    std::tie(source, reader) = newest_in_folder(source, readers);
  } else {
    source = core::resolve_checkpoint_path(source, source.extension().string());  // must exist
    if (!args.from.empty()) reader = readers.front().second;
    for (const auto& [name, f] : readers)
      if (!reader && f->file_extension() == source.extension().string()) reader = f;
    if (!reader)
      throw sdk::CheckpointError(
          "no checkpoint format reads '" + source.extension().string() + "' files (" +
              source.string() + ")",
          "name the format with --from; known formats: " + known_formats(readers));
  }

  // By default beside the run, never inside checkpoints/ (the trainer's rotation owns that).
  const fs::path out =
      args.out.empty() ? core::run_folder_of(source) /
                             fs::path(source.filename()).replace_extension(writer->file_extension())
                       : fs::path(args.out);
  check_output_file(out, source, args.force);

  auto state = reader->read(source);
  // Anything but a mixtrain checkpoint (e.g. another safetensors file) keeps its metadata.
  if (state.metadata.count("mixtrain.state_version"))
    state.metadata = exported_metadata(state.metadata);
  write_export(args, *writer, std::move(state), source, out, "from " + source.string());
  return 0;
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
  if (args.out.empty())
    throw sdk::UserError(
        "export --initial needs --out: a config's weights have no run folder to go beside",
        "name the output file, e.g. --out initial.safetensors");
  check_output_file(out, config, args.force);

  auto session = open_model_session({args.source, args.sets}, SessionWeights::as_training_starts);
  auto writer = create_writer(*session.registry, args);
  auto state = session.trainer->training_state(/*weights_only=*/true);
  state.metadata = exported_metadata(state.metadata);
  const auto& init_from = session.experiment.checkpoint.init_from;
  write_export(args, *writer, std::move(state), config, out,
               "initial weights of " + config.string() + ", run.seed " +
                   std::to_string(session.experiment.run.seed) +
                   (init_from.empty() ? std::string() : ", then " + init_from));
  return 0;
}

}  // namespace

int run_export(const ExportArgs& args) {
  return args.initial ? export_initial(args) : export_checkpoint(args);
}

}  // namespace mixtrain::cli
