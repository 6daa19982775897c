// `mixtrain export`: converts a checkpoint to another format (safetensors weights for PyTorch).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli_registry.h"
#include "commands.h"
#include "exported_weights.h"
#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/sdk/checkpoint_format.h"

namespace mixtrain::cli {

namespace {

namespace fs = std::filesystem;
using Formats = std::vector<std::pair<std::string, std::shared_ptr<sdk::CheckpointFormat>>>;

// Where an export goes by default: the run folder, not its checkpoints/ folder (which belongs to
// the trainer's checkpoint rotation); any other checkpoint's own folder.
fs::path beside_run(const fs::path& checkpoint) {
  const fs::path folder = checkpoint.parent_path();
  return folder.filename() == "checkpoints" ? folder.parent_path() : folder;
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

}  // namespace

int run_export(const ExportArgs& args) {
  auto registry = make_registry(nullptr);
  const sdk::SourceLocation cli_where{"command line"};
  auto create_format = [&](const core::LoadedComponent& c, std::vector<sdk::RawOption> raw) {
    auto options = sdk::Options::resolve("export", c.info.options, raw, cli_where);
    return registry->create<sdk::CheckpointFormat>(c, options);
  };

  std::vector<sdk::RawOption> writer_options;
  if (!args.dtype.empty()) writer_options.push_back({"dtype", args.dtype, {"--dtype"}});
  auto writer = create_format(
      registry->require(sdk::ComponentKind::checkpoint_format, args.format, "--format"),
      writer_options);

  Formats readers;
  if (!args.from.empty())
    readers.emplace_back(
        args.from,
        create_format(registry->require(sdk::ComponentKind::checkpoint_format, args.from, "--from"),
                      {}));
  else
    for (const auto& c : registry->components())
      if (c.info.kind == sdk::ComponentKind::checkpoint_format)
        readers.emplace_back(c.info.name, create_format(c, {}));

  fs::path source = args.checkpoint;
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

  fs::path out = args.out.empty()
                     ? beside_run(source) /
                           fs::path(source.filename()).replace_extension(writer->file_extension())
                     : fs::path(args.out);
  if (fs::equivalent(out, source, ec))
    throw sdk::UserError("export would overwrite its input " + source.string(),
                         "choose another file with --out");
  if (fs::exists(out, ec) && !args.force)
    throw sdk::UserError(out.string() + " already exists",
                         "pass --force to overwrite it, or --out");

  auto state = reader->read(source);
  // Anything but a mixtrain checkpoint (e.g. another safetensors file) keeps its metadata.
  if (state.metadata.count("mixtrain.state_version"))
    state.metadata = exported_metadata(state.metadata);
  const bool gpt2 = core::parse_weight_layout(args.layout) == core::WeightLayout::gpt2;
  if (gpt2) state = in_gpt2_layout(std::move(state), source);
  writer->write(out, state);
  std::cout << "wrote " << out.string() << " (" << args.format << ", from " << source.string()
            << ", " << weight_tensor_count(state) << " weight tensors"
            << (args.dtype.empty() ? "" : ", " + args.dtype)
            << (gpt2 ? ", Hugging Face GPT-2 layout" : "") << ")" << std::endl;
  return 0;
}

}  // namespace mixtrain::cli
