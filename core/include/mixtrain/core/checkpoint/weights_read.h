// A checkpoint file read for its weights: what a weights-only load (eval, predict, sample,
// checkpoint.init_from) and `mixtrain export` take from a full training state.
//
// Contract: read_checkpoint_weights(format, path) is format.read(path) without the optimizer's
// slots ("optimizer/<slot>"), where the format offers partial_read 1.x (sdk/format_partial_read.h)
// and so leaves them on disk: two thirds of an AdamW run's file and of the memory its read takes;
// a format without it reads the whole file. Metadata, weights ("param/", "buffer/", plain names)
// and EMA ("ema/") are all kept. Errors: the format's (sdk::CheckpointError).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "mixtrain/sdk/checkpoint_format.h"

namespace mixtrain::core {

sdk::TrainingState read_checkpoint_weights(const sdk::CheckpointFormat& format,
                                           const std::filesystem::path& path);

// format.read(path), or read_checkpoint_weights() when `weights_only`, for a format from a plugin
// outside mixtrain's own folder (`plugin`: its label, "checkpoint format 'tbck' (plugin tb_ckpt
// 1.0.0, libmixtrain_tb_ckpt.so)"): an exception of it that is no sdk::UserError (its internal
// error, not the user's input) becomes a core::PluginFault naming the file and the plugin, so the
// command still exits 1 but says what failed where, as a failed save does. An empty `plugin`
// (mixtrain's own format) leaves every error as it is.
sdk::TrainingState read_checkpoint_with(const sdk::CheckpointFormat& format,
                                        const std::filesystem::path& path, bool weights_only,
                                        const std::string& plugin);

// A full training state for a resume, its optimizer slots ("optimizer/<slot>", two thirds of an
// AdamW state) left on disk where the format offers partial_read 1.x: `slots` gets their names, in
// the file's order, and read_checkpoint_tensor() reads each when the optimizer takes it, so a
// resume holds one slot on the host at a time instead of the whole file. A format without the
// facet reads the whole file (`slots` stays empty). `plugin` as for read_checkpoint_with.
sdk::TrainingState read_checkpoint_deferring_slots(const sdk::CheckpointFormat& format,
                                                   const std::filesystem::path& path,
                                                   const std::string& plugin,
                                                   std::vector<std::string>& slots);
// The tensor `name` of the file, read alone through partial_read (the format must offer it);
// sdk::CheckpointError naming the file when it holds no such tensor.
sdk::HostTensor read_checkpoint_tensor(const sdk::CheckpointFormat& format,
                                       const std::filesystem::path& path, const std::string& plugin,
                                       const std::string& name);

// Throws sdk::CheckpointError when `state` holds a tensor name twice: a file holds each tensor
// once, so the format that read it (`format`: "checkpoint format 'tbck' (plugin ...)") gave one
// twice, and which of the two is the file's is anybody's guess. Named as that format's fault, not
// as a tensor the model lacks.
void refuse_repeated_tensors(const sdk::TrainingState& state, const std::filesystem::path& path,
                             const std::string& format);

}  // namespace mixtrain::core
