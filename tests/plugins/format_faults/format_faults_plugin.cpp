// Checkpoint formats from outside mixtrain's plugin folder, for the tests of how the host treats
// a format plugin: where it finds one (a run folder's config.toml), what extensions it accepts,
// and whom it blames when a read or a write goes wrong. Both wrap the native format's bytes under
// an extension of their own (option `ext`); option `mode` makes them misbehave in one way.
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>

#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/plugin.h"
#include "native_checkpoint_format.h"

namespace {

using namespace mixtrain;

class FaultyFormat final : public sdk::CheckpointFormat {
 public:
  static sdk::OptionSchema schema(const std::string& default_ext) {
    return {sdk::OptionSpec::string("ext", default_ext, "the file extension it claims"),
            sdk::OptionSpec::string("mode", "ok", "how it misbehaves")
                .one_of({"ok", "dup_tensor", "lose_tensor", "drop_metadata", "wrong_dtype",
                         "extra_tensor", "short_bytes", "drop_progress", "throw_read",
                         "throw_second_write", "refuse_second_write", "torn_second_write",
                         "plant_then_torn_second_write"})};
  }

  FaultyFormat(const sdk::Options& options, const sdk::PluginContext& context)
      : native_(std::make_unique<checkpoint_native::NativeCheckpointFormat>(
            sdk::Options::resolve(
                "checkpoint", checkpoint_native::NativeCheckpointFormat::option_schema(), {}, {}),
            context)),
        ext_(options.get_string("ext")),
        mode_(options.get_string("mode")) {}

  std::string file_extension() const override { return ext_; }

  void write(const std::filesystem::path& path, const sdk::TrainingState& state) const override {
    // The host's probe of what the format keeps (a hidden file in checkpoints/, written when a
    // run starts) is no checkpoint: the modes count the run's saves.
    if (path.filename().string().starts_with(".")) return native_->write(path, state);
    ++writes_;
    // A format that writes in place, not through sdk::AtomicFileWriter: a failure midway leaves
    // the first bytes at `path`.
    const bool torn = mode_ == "torn_second_write" || mode_ == "plant_then_torn_second_write";
    if (writes_ == 2 && torn) {
      std::ofstream(path, std::ios::binary) << "torn";
      throw std::runtime_error("faulty: simulated I/O failure after 4 bytes");
    }
    // A file already at the second save's path (a run checkpointing every 5 steps: step 10's),
    // as another writer could have left it.
    if (writes_ == 1 && mode_ == "plant_then_torn_second_write") {
      std::string planted = path.filename().string();
      if (const auto at = planted.find("00000005"); at != std::string::npos) {
        planted.replace(at, 8, "00000010");
        native_->write(path.parent_path() / planted, state);
      }
    }
    if (writes_ == 2 && mode_ == "throw_second_write")
      throw std::runtime_error("faulty: simulated I/O failure");
    if (writes_ == 2 && mode_ == "refuse_second_write")
      throw sdk::CheckpointError("faulty: simulated full disk", "free some disk space");
    native_->write(path, state);
  }

  sdk::TrainingState read(const std::filesystem::path& path) const override {
    if (mode_ == "throw_read") throw std::runtime_error("faulty: simulated read failure");
    sdk::TrainingState st = native_->read(path);
    sdk::HostTensor* param = nullptr;
    for (auto& t : st.tensors)
      if (t.name.starts_with("param/")) {
        param = &t;
        break;
      }
    if (param == nullptr) return st;
    if (mode_ == "dup_tensor") {
      st.tensors.push_back(*param);
    } else if (mode_ == "lose_tensor") {
      param->name += "_lost";
    } else if (mode_ == "drop_metadata") {
      st.metadata.clear();
    } else if (mode_ == "drop_progress") {
      st.metadata.erase("progress");
      st.metadata.erase("sampler");
    } else if (mode_ == "extra_tensor") {
      sdk::HostTensor ghost = *param;
      ghost.name = "param/ghost.weight";
      st.tensors.push_back(std::move(ghost));
    } else if (mode_ == "short_bytes") {
      param->bytes.resize(param->bytes.size() - 4);
    } else if (mode_ == "wrong_dtype") {
      param->dtype = sdk::DType::bf16;
      param->bytes.resize(param->bytes.size() / 2);
    }
    return st;
  }

 private:
  std::unique_ptr<checkpoint_native::NativeCheckpointFormat> native_;
  std::string ext_, mode_;
  mutable int writes_ = 0;
};

std::vector<sdk::ComponentInfo> components() {
  return {{sdk::ComponentKind::checkpoint_format, "faulty",
           "the native format's bytes as .flt, misbehaving as `mode` says",
           FaultyFormat::schema(".flt"), &sdk::make_component<FaultyFormat>},
          {sdk::ComponentKind::checkpoint_format, "faulty2", "another one, as .flt2",
           FaultyFormat::schema(".flt2"), &sdk::make_component<FaultyFormat>}};
}

}  // namespace

MIXTRAIN_PLUGIN("format_faults", "0.1.0", components)
