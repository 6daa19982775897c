// The Trainer's checkpoints back in (load_checkpoint): a full resume, or weights only for
// checkpoint.init_from, eval, predict and sample. What a checkpoint holds is capture_state's
// (trainer_state.h, written in checkpoint_save.cpp).
//
// Weights-only loads also accept plain "<node>.<param>" / "<node>.<buffer>" names (safetensors
// exported for or by other tools), and, in the gpt2 layout (checkpoint.init_layout), Hugging Face
// GPT-2 state dicts (checkpoint/gpt2_layout.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/state.h"
#include "config/resolved_values.h"
#include "console/short_list.h"
#include "graph/ops/op_support.h"
#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/core/checkpoint/hf_folder.h"
#include "mixtrain/core/checkpoint/path.h"
#include "mixtrain/core/checkpoint/peft_adapter.h"
#include "mixtrain/core/checkpoint/weights_read.h"
#include "mixtrain/core/data/data_shape.h"
#include "mixtrain/core/graph/lora.h"
#include "runs/component_history_json.h"
#include "train/host_tensor.h"
#include "train/planned_model.h"
#include "train/restore_flags.h"
#include "train/resume_terms.h"
#include "train/trainer_state.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// h holds what v expects: its dtype, shape and bytes.
// `blame`: what to add to a hint that blames another model, when a plugin's format read the file
// (CheckpointFile::format_blame).
void check_host_tensor(const sdk::HostTensor& h, sdk::DType dtype, const sdk::Shape& shape,
                       const fs::path& file, const std::string& blame) {
  const std::size_t want = static_cast<std::size_t>(shape.numel()) * sdk::dtype_size(dtype);
  // The dtype and shape the model expects, but not their bytes: the file's fault (damaged, or a
  // checkpoint format that read it wrong), not another model's.
  if (h.dtype == dtype && h.shape == shape.to_vector() && h.bytes.size() != want)
    throw sdk::CheckpointError(
        file.string() + ": tensor '" + h.name + "' is " + std::string(sdk::dtype_name(dtype)) +
            " " + shape.to_string() + ", which takes " + std::to_string(want) +
            " bytes, but the file gave " + std::to_string(h.bytes.size()),
        blame.empty() ? "the file is damaged, or the checkpoint format that read it "
                        "(checkpoint.format) read it wrong; use an earlier checkpoint"
                      : "the file is damaged: use an earlier checkpoint" + blame);
  if (h.dtype != dtype || h.shape != shape.to_vector())
    throw sdk::CheckpointError(
        file.string() + ": tensor '" + h.name + "' is " + std::string(sdk::dtype_name(h.dtype)) +
            " " + sdk::Shape::from_vector(h.shape).to_string() + " but the model expects " +
            std::string(sdk::dtype_name(dtype)) + " " + shape.to_string(),
        "the checkpoint belongs to a different model; use the config it was trained with" + blame);
}

void from_host(sdk::DeviceBackend& b, const sdk::HostTensor& h, sdk::TensorView v,
               const fs::path& file, const std::string& blame) {
  check_host_tensor(h, v.dtype, v.shape, file, blame);
  b.copy_from_host(v, h.bytes.data());
}

// Weights are FP32 in a file whatever the parameter's stored dtype (NF4 included).
void check_fp32_weights(const sdk::HostTensor& h, const ModelParameter& p, const fs::path& file,
                        const std::string& blame) {
  check_host_tensor(h, sdk::DType::fp32, p.shape(), file, blame);
}

// The watched metrics' state from a checkpoint's optional "watch" entry (checkpoint/state.h).
// A checkpoint without one (older, or of a run that watched nothing), or one that watched
// another metric, leaves the watch starting afresh, and says so.
void restore_watch(Trainer::State& s, const std::map<std::string, std::string>& metadata,
                   std::int64_t step, const fs::path& file) {
  json all = json::object();
  if (auto it = metadata.find("watch"); it != metadata.end()) {
    all = json::parse(it->second, nullptr, false);
    if (!all.is_object())
      throw sdk::CheckpointError(file.string() + ": the 'watch' entry is not a JSON object",
                                 "the checkpoint is damaged; use an earlier one");
  }
  auto restore = [&](std::optional<MetricWatch>& watch, const std::string& name,
                     const std::string& what) {
    if (!watch) return;
    if (!all.contains(name)) {
      s.log.info(file.string() + " holds no " + what + " state; it starts afresh");
      return;
    }
    auto state = read_watched_metric(all[name], "watch." + name, step, file);
    if (state.metric != watch->state.metric) {
      s.log.warn(file.string() + ": " + what + " watched " + state.metric + ", this run " +
                 watch->state.metric + "; it starts afresh");
      return;
    }
    watch->state = state;
  };
  restore(s.metrics.early_stopping, "early_stopping", "early stopping");
  restore(s.metrics.keep_best, "keep_best", "checkpoint.keep_best");
}

}  // namespace

// trainer_state.h
const sdk::CheckpointFormat& weights_format_for(const Components& c, const fs::path& path) {
  const auto ext = path.extension().string();
  if (c.checkpoint_format->file_extension() == ext) return *c.checkpoint_format;
  for (const auto& f : c.weight_formats)
    if (f.format->file_extension() == ext) return *f.format;
  return *c.checkpoint_format;
}

// trainer_state.h
const NamedFormat* named_format_of(const Components& c, const sdk::CheckpointFormat& format) {
  for (const auto& f : c.weight_formats)
    if (f.format.get() == &format) return &f;
  return nullptr;
}

namespace {

// The hint for a tensor whose shape does not fit its parameter: when the transposed shape would
// fit a Conv1D weight, the file is in the other layout.
std::string shape_hint(const sdk::HostTensor& t, const std::string& parameter,
                       const std::vector<std::int64_t>& expected, bool weights_only,
                       WeightLayout layout, const std::string& fold_route,
                       const std::string& model_hint) {
  const bool transposed_fits = t.shape.size() == 2 && expected.size() == 2 &&
                               t.shape[0] == expected[1] && t.shape[1] == expected[0];
  if (weights_only && transposed_fits && is_conv1d_weight(parameter)) {
    const auto other = layout == WeightLayout::gpt2 ? WeightLayout::native : WeightLayout::gpt2;
    const std::string name(weight_layout_name(other));
    return std::string("the file stores linear weights ") +
           (other == WeightLayout::gpt2 ? "[in, out], Hugging Face GPT-2's Conv1D layout"
                                        : "[out, in], mixtrain's native layout") +
           ": load it in the " + name + " layout (checkpoint.init_layout = \"" + name +
           "\"; eval and sample: --layout " + name + ")";
  }
  if (weights_only &&
      (parameter.ends_with(".lora_A.weight") || parameter.ends_with(".lora_B.weight")))
    return "the file's adapters have another rank than [model.lora] r: " + fold_route +
           ", or use the checkpoint's r";
  return "the file belongs to a different model; " + model_hint;
}

// A checkpoint file as read for a load: in the gpt2 layout its tensors are already converted to
// mixtrain's names and layout, and file_names keeps each one's name in the file for the messages.
struct CheckpointFile {
  fs::path path;
  sdk::TrainingState st;
  bool gpt2 = false;
  std::vector<std::string> file_names;
  // Why a tensor would not fit, when the file says more than "another model": [model]
  // from_pretrained's weights were sized by their own folder's config.json.
  std::string misfit_hint;
  // How to start from this file's weights with its adapters folded in (start_from_weights_route).
  std::string fold_route;
  // What of the config sizes the model: a preset's table ([model.gpt]), or [model] layers.
  std::string model_hint;
  // Features per sample of a table source's data (0 for other sources): they size the first
  // linear's input, so a file whose only misfit is there was trained on other [data].
  std::int64_t input_features = 0;
  // Added to the hints that blame another model or the user (a tensor missing, of another dtype
  // or shape, no training-state metadata) when a plugin's format read the file: what it gave may
  // be its own fault. Empty for mixtrain's own formats, whose files the hints describe as they are.
  std::string format_blame;

  // A resume's optimizer slots, left on disk by the read (read_checkpoint_deferring_slots): their
  // names, and the read of one. find_slot() gives a slot whether it was read with the rest or
  // is read now; one read now lives until the next call, so the host holds one at a time.
  std::vector<std::string> deferred_slots;
  std::function<sdk::HostTensor(const std::string&)> read_slot;
  mutable sdk::HostTensor slot_read;
  const sdk::HostTensor* find_slot(const std::string& name) const {
    if (const auto* t = st.find(name)) return t;
    if (std::find(deferred_slots.begin(), deferred_slots.end(), name) == deferred_slots.end())
      return nullptr;
    slot_read = sdk::HostTensor{};  // the last one's bytes go before the next one's come
    slot_read = read_slot(name);
    return &slot_read;
  }

  std::string name_in_file(const sdk::HostTensor& t) const {
    return gpt2 ? file_names[static_cast<std::size_t>(&t - st.tensors.data())] : t.name;
  }
  std::string read_as() const { return gpt2 ? ", reading the gpt2 layout" : ""; }
};

// The label of a format a plugin outside mixtrain's own folder provides; empty for mixtrain's
// own (and a test's wrapper), whose errors need no one else named.
std::string plugin_label(const NamedFormat* named) {
  return named != nullptr && !named->builtin ? named->label() : std::string();
}

CheckpointFile read_checkpoint_file(Trainer::State& s, const fs::path& path, bool weights_only,
                                    WeightLayout layout) {
  CheckpointFile file;
  file.path = path;
  const sdk::CheckpointFormat& reader =
      weights_only ? weights_format_for(s.c, path) : *s.c.checkpoint_format;
  const NamedFormat* named = named_format_of(s.c, reader);
  if (weights_only && s.shape_checkpoint && s.shape_checkpoint->first == path) {
    file.st = std::move(s.shape_checkpoint->second);  // read once, for the data's shape
    s.shape_checkpoint.reset();
  } else if (weights_only || layout != WeightLayout::native) {
    file.st = read_checkpoint_with(reader, path, weights_only, plugin_label(named));
  } else {
    file.st =
        read_checkpoint_deferring_slots(reader, path, plugin_label(named), file.deferred_slots);
    file.read_slot = [&reader, path, label = plugin_label(named)](const std::string& name) {
      return read_checkpoint_tensor(reader, path, label, name);
    };
  }
  if (named != nullptr && !named->builtin)
    file.format_blame = "; or the format plugin '" + named->name + "' that read the file (" +
                        named->origin + ") read it wrong";
  refuse_repeated_tensors(file.st, path,
                          named != nullptr ? named->label() : "the checkpoint format that read it");
  file.gpt2 = layout == WeightLayout::gpt2;
  file.fold_route = start_from_weights_route(s.e, path, /*merge_lora=*/true);
  file.model_hint = "check [model] layers";
  if (!is_token_source(s.e.data.source) && s.e.data.source != DataSource::cifar10)
    file.input_features = s.train.features > 0 ? s.train.features : s.eval.features;
  if (s.e.from_pretrained.enabled())
    file.model_hint = "this config's model is sized by " +
                      (s.e.from_pretrained.folder / kHfConfigFile).string() +
                      "; run the checkpoint with the config it was trained with (its run's "
                      "config.toml)";
  else
    for (const auto& layer : s.e.model.layers)
      if (!layer.preset_keys.empty()) {
        const std::string& key = layer.preset_keys.begin()->second;  // "model.gpt.vocab_size"
        file.model_hint = "check the sizes in [" + key.substr(0, key.rfind('.')) +
                          "] against the run's config.toml";
        break;
      }
  if (s.e.from_pretrained.enabled() && path == s.e.from_pretrained.weights)
    file.misfit_hint = "the model is sized by " +
                       (s.e.from_pretrained.folder / kHfConfigFile).string() +
                       ", and these weights do not fit it: the folder's config.json and "
                       "model.safetensors are of different models; save both again with "
                       "save_pretrained";
  if (file.gpt2) {
    Gpt2Import imported;
    try {
      imported = from_gpt2_layout(std::move(file.st.tensors), path.string());
    } catch (const sdk::CheckpointError& e) {
      if (file.misfit_hint.empty()) throw;
      throw sdk::CheckpointError(e.what(),
                                 "from_pretrained reads GPT2LMHeadModel's weights as "
                                 "save_pretrained writes them: transformer.wte, .wpe, .h.<i>.*, "
                                 ".ln_f, and an lm_head.weight only when tied to wte");
    }
    file.st.tensors = std::move(imported.tensors);
    file.file_names = std::move(imported.file_names);
    for (const auto& name : imported.dropped)
      s.log.debug(path.string() + ": '" + name +
                  "' is a causal-mask buffer or the tied head; not loaded");
  }
  return file;
}

// The checkpoint's "normalization" record: empty stats when it has none, nullopt when the entry
// is not the {"mean": [...], "std": [...]} mixtrain writes (another tool's: not ours to judge).
std::optional<ChannelStats> recorded_normalization(
    const std::map<std::string, std::string>& metadata) {
  ChannelStats stats;
  const auto it = metadata.find("normalization");
  if (it == metadata.end()) return stats;
  const auto j = json::parse(it->second, nullptr, false);
  if (!j.is_object() || !j.contains("mean") || !j.contains("std")) return std::nullopt;
  try {
    stats.mean = j["mean"].get<std::vector<double>>();
    stats.std = j["std"].get<std::vector<double>>();
  } catch (const json::exception&) {
    return std::nullopt;
  }
  // Only statistics normalize_channels() can apply.
  if (stats.std.size() != stats.mean.size()) return std::nullopt;
  for (std::size_t c = 0; c < stats.mean.size(); ++c)
    if (!std::isfinite(stats.mean[c]) || !std::isfinite(stats.std[c]) || !(stats.std[c] > 0.0))
      return std::nullopt;
  return stats;
}

// A run that escalated trained its later steps under a wider plan: a resume continues under it,
// and so does a session that only evaluates (eval, predict, sample, export write no run).
// checkpoint.init_from starts a new run from the config's plan.
void restore_escalation(Trainer::State& s, const CheckpointFile& file, bool weights_only) {
  const auto it = file.st.metadata.find("escalation");
  if (it == file.st.metadata.end() || (weights_only && s.opt.write_outputs)) return;
  const auto j = json::parse(it->second, nullptr, false);
  if (j.is_discarded())
    throw sdk::CheckpointError(file.path.string() + ": the 'escalation' entry is not valid JSON",
                               "the checkpoint is damaged; use an earlier one");
  s.precision.escalation = Escalation::from_json(j, s.e.escalate, file.path.string());
  // The model is planned by this config alone so far: a node it plans otherwise than the plan
  // escalation started from keeps the config's plan.
  const auto replanned = s.precision.escalation.drop_replanned(
      [&](const std::string& node) -> std::optional<sdk::OpPrecision> {
        for (const auto& l : s.model->layers())
          if (l->name() == node) return l->precision();
        return std::nullopt;
      });
  for (const auto& r : replanned)
    s.log.warn(file.path.string() + ": escalation had promoted node '" + r.node + "' from " +
               precision_text(r.started_from) + " to " + precision_text(r.promoted) +
               ", but this config plans it " + precision_text(r.planned_now) +
               ": the config's plan stands, and the node's escalation starts afresh");
  if (s.precision.escalation.any_promoted()) {
    replan_model(s);
    s.log.info(file.path.string() + ": " +
               std::to_string(s.precision.escalation.promotions_standing()) +
               " op(s) promoted by escalation; planned as trained");
  }
}

// The checkpoint records the normalisation its weights were trained on (metadata
// "normalization", written only when there was one); a run or a prediction that normalises its
// inputs otherwise feeds the model inputs it never saw. A session that runs the weights (eval,
// predict) normalises as they were trained: the config's [data.normalize] may differ only by
// accident (from_training computes it from whatever data the config names now), and the record
// is the model's. A resumed run keeps the config's (new data may be meant), said.
// checkpoint.init_from starts a new run, whose data may rightly differ: nothing is said.
void keep_trained_normalization(Trainer::State& s, const CheckpointFile& file, bool weights_only) {
  if (weights_only && s.opt.write_outputs) return;
  const auto recorded = recorded_normalization(file.st.metadata);
  if (!recorded) return;  // not ours to judge
  const ChannelStats& trained = *recorded;
  auto close = [](const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::abs(a[i] - b[i]) > 1e-9 * std::max(1.0, std::abs(b[i]))) return false;
    return true;
  };
  const ChannelStats& now = s.normalization;
  if (close(trained.mean, now.mean) && close(trained.std, now.std)) return;
  auto text = [](const ChannelStats& c) {
    return c.mean.empty() ? std::string("no normalisation") : describe_normalization(c);
  };
  const bool runs_weights = weights_only && !s.loading_initial_weights;
  if (runs_weights && !trained.mean.empty() && s.train.is_image() &&
      trained.mean.size() == static_cast<std::size_t>(s.train.channels()) &&
      trained.std.size() == trained.mean.size()) {
    s.log.warn(file.path.string() + " was trained on inputs with " + text(trained) +
               ", and this session's config gives " + text(now) +
               ": this session normalises as the model was trained; set [data.normalize] to "
               "the run's (its normalization.json) to say so");
    normalize_data_as(s, trained);
    return;
  }
  s.log.warn(file.path.string() + " was trained on inputs with " + text(trained) + ", and this " +
             (weights_only ? "session" : "run") + " gives it " + text(now) +
             ": the model sees inputs unlike those it learned from; set [data.normalize] as the "
             "run that wrote it did (its normalization.json)");
}

// The file's 'data_shape' record, or nullopt where it has none or one that cannot be read (a
// damaged record is said where the shape is read for the model, take_recorded_shape).
std::optional<DataShape> recorded_data_shape(const CheckpointFile& file) {
  const auto entry = file.st.metadata.find("data_shape");
  if (entry == file.st.metadata.end()) return std::nullopt;
  try {
    return parse_data_shape(entry->second, file.path.string());
  } catch (const sdk::CheckpointError&) {
    return std::nullopt;
  }
}

// An image folder numbers its classes by their folders' names (data/data_shape.h records them): a
// class folder added, removed or renamed since the checkpoint renumbers the labels, and a resumed
// run or an evaluation would then score the model against classes it never learned, without an
// error. Refused, naming the difference. checkpoint.init_from starts a new run, which may fine-tune
// toward other classes: nothing is said.
void refuse_renumbered_classes(const Trainer::State& s, const CheckpointFile& file,
                               bool weights_only) {
  if (weights_only && s.opt.write_outputs) return;
  const auto recorded = recorded_data_shape(file);
  if (!recorded) return;
  const std::vector<std::string>& trained = recorded->class_names;
  const auto& now = !s.train.class_names.empty() ? s.train.class_names : s.eval.class_names;
  if (trained.empty() || now.empty() || trained == now) return;
  const auto missing_from = [](const std::vector<std::string>& a,
                               const std::vector<std::string>& b) {
    std::vector<std::string> out;
    for (const auto& name : a)
      if (std::find(b.begin(), b.end(), name) == b.end()) out.push_back(name);
    return out;
  };
  const auto added = missing_from(now, trained), gone = missing_from(trained, now);
  std::string change;
  if (!added.empty()) change += "class folders added since: " + quoted_short_list(added, 5);
  if (!gone.empty())
    change += std::string(change.empty() ? "" : "; ") + "gone: " + quoted_short_list(gone, 5);
  if (change.empty()) change = "the same names in another order";
  throw sdk::DataError(
      file.path.string() + " was trained on " + std::to_string(trained.size()) +
          " classes numbered by their folders' names, and the image folder now has " +
          std::to_string(now.size()) + " (" + change +
          "): every label would name another class than the model learned",
      "put the class folders back as they were (the run's classes.json lists them), or train "
      "a new run from these weights (--set checkpoint.init_from=" +
          file.path.string() + ")");
}

// An evaluation feeds the model its config's inputs, and a CNN that ends in a global pool takes
// images of any size: a checkpoint loads into the model built for a changed data.image_folder.size
// (or synthetic images' height) and would be scored on inputs unlike those it learned from.
// Refused, as a held-out folder's crops of another size are (load_image_folder_held_out), whether
// the held-out rows are a folder of their own or eval_fraction of the training images. A new run
// from these weights (checkpoint.init_from) may change the size: nothing is said there.
void refuse_resized_inputs(const Trainer::State& s, const CheckpointFile& file, bool weights_only) {
  if (!weights_only || s.opt.write_outputs || s.loading_initial_weights || !s.evaluates) return;
  const auto recorded = recorded_data_shape(file);
  if (!recorded) return;
  const std::vector<std::int64_t>& trained = recorded->sample_shape;
  const Dataset& now = s.eval.rows > 0 ? s.eval : s.train;
  if (trained.empty() || now.sample_shape.empty() || trained == now.sample_shape) return;
  const bool folder = s.e.data.source == DataSource::image_folder;
  throw sdk::DataError(
      file.path.string() + " records a model of input " + ops::shape_text(trained) +
          ", but this session's config gives it inputs of " + ops::shape_text(now.sample_shape) +
          (folder ? " (data.image_folder.size = " + std::to_string(s.e.data.crop_size) + ")"
                  : std::string()) +
          ": it would be scored on inputs unlike those it learned from",
      "evaluate the checkpoint with the config it was trained with (its run's config.toml)" +
          (folder && trained.size() == 3
               ? ", or --set data.image_folder.size=" + std::to_string(trained[1])
               : std::string()));
}

[[noreturn]] void throw_missing_parameter(const CheckpointFile& file, const std::string& name) {
  const auto& st = file.st;
  std::string have;
  for (std::size_t i = 0; i < st.tensors.size() && i < 8; ++i)
    have += (i ? ", " : "") + file.name_in_file(st.tensors[i]);
  if (st.tensors.size() > 8) have += ", ...";
  const std::string looked_for = file.gpt2 ? "'" + name + "' and 'transformer." + name + "'"
                                           : "'param/" + name + "' and '" + name + "'";
  const bool hf_names = !file.gpt2 && st.find("transformer." + name) != nullptr;
  const bool peft = !st.tensors.empty() && st.tensors.front().name.starts_with(kPeftTensorPrefix);
  throw sdk::CheckpointError(
      file.path.string() + ": no tensor for parameter '" + name + "' (looked for " + looked_for +
          file.read_as() + ")",
      hf_names ? "the file holds 'transformer." + name +
                     "', a Hugging Face GPT-2 state dict: load it in the gpt2 layout "
                     "(checkpoint.init_layout = \"gpt2\"; eval and sample: --layout gpt2)"
      : peft
          ? "the file is a PEFT adapter's: " + peft_adapter_route(file.path.parent_path().string())
      : !file.misfit_hint.empty() ? file.misfit_hint + file.format_blame
                                  : "the file belongs to a different model; it holds: " +
                                        (have.empty() ? "no tensors" : have) + file.format_blame);
}

// A linear weight [out, in] that differs only in `in`, where `in` is the data's features: the
// model is the same, the data another.
bool reads_other_features(const CheckpointFile& file, const std::vector<std::int64_t>& stored,
                          const std::vector<std::int64_t>& expected) {
  return file.input_features > 0 && stored.size() == 2 && expected.size() == 2 &&
         stored[0] == expected[0] && stored[1] != expected[1] && expected[1] == file.input_features;
}

[[noreturn]] void throw_misshapen_parameter(const CheckpointFile& file, const sdk::HostTensor& t,
                                            const std::string& name,
                                            const std::vector<std::int64_t>& expected,
                                            bool weights_only, WeightLayout layout) {
  const bool transposed = file.gpt2 && is_conv1d_weight(t.name);
  const auto stored = transposed ? std::vector<std::int64_t>{t.shape[1], t.shape[0]} : t.shape;
  throw sdk::CheckpointError(
      file.path.string() + ": tensor '" + file.name_in_file(t) + "' has shape " +
          ops::shape_text(stored) +
          (transposed ? " (the gpt2 layout reads it as Conv1D [in, out]: " +
                            ops::shape_text(t.shape) + " as [out, in])"
                      : std::string()) +
          " but parameter '" + name + "' expects " + ops::shape_text(expected),
      (!file.misfit_hint.empty() ? file.misfit_hint
       : reads_other_features(file, stored, expected)
           ? "the file's model reads " + std::to_string(stored[1]) +
                 " features per sample, and this config's data give " +
                 std::to_string(expected[1]) +
                 ": [data] sizes the model's input, so use the run's [data] settings (its "
                 "config.toml's)"
           : shape_hint(t, name, expected, weights_only, layout, file.fold_route,
                        file.model_hint)) +
          file.format_blame);
}

// One parameter's weights from tensor t: shape-checked, into its master, or rounded into a frozen
// parameter's one (narrower or quantized) copy.
void load_parameter(Trainer::State& s, const CheckpointFile& file, const sdk::HostTensor& t,
                    ModelParameter& p, bool weights_only, WeightLayout layout) {
  const auto expected = p.shape().to_vector();
  if (t.shape != expected)
    throw_misshapen_parameter(file, t, p.name, expected, weights_only, layout);
  // Training from weights that are not finite skips every step (no loss scale helps), so a run
  // refuses them here; eval, predict and export read them and say what their loss shows.
  if ((s.loading_initial_weights && s.opt.write_outputs) || !weights_only)
    if (const auto bad = first_nonfinite_fp32(t))
      throw sdk::CheckpointError(
          file.path.string() + ": tensor '" + file.name_in_file(t) + "' holds " + *bad +
              ": training from weights that are not finite would skip every step",
          "use a checkpoint written before the weights went bad (mixtrain writes none of "
          "weights that are not finite)");
  if (!p.master.empty()) {
    from_host(*s.c.backend, t, p.master.view(), file.path, file.format_blame);
    return;
  }
  check_fp32_weights(t, p, file.path, file.format_blame);
  try {
    set_parameter_from_fp32(s.c.backend, p, reinterpret_cast<const float*>(t.bytes.data()));
  } catch (const std::invalid_argument& e) {  // a quantized base refuses a non-finite weight
    const std::string format = format_label(p.quant.format);
    throw sdk::CheckpointError(
        file.path.string() + ": tensor '" + file.name_in_file(t) + "' cannot be stored as " +
            format + " for parameter '" + p.name + "': " + e.what(),
        format +
            " encodes finite weights only: use a checkpoint without infinities or NaNs, "
            "or train.frozen_format = \"compute\"");
  }
}

// Weights are "param/<layer>.<weight|bias>" in mixtrain's checkpoints and plain
// "<layer>.<weight|bias>" in files exported for (or written by) other tools; buffers likewise.
// Adds the tensors it loaded to `used`.
void load_parameters(Trainer::State& s, const CheckpointFile& file, bool weights_only,
                     WeightLayout layout, std::set<const sdk::HostTensor*>& used) {
  const auto& st = file.st;
  for (auto* p : s.model->parameters()) {
    const auto* t = file.gpt2 ? nullptr : st.find("param/" + p->name);
    if (t == nullptr) t = st.find(p->name);
    // A base model's weights (checkpoint.init_from, from_pretrained) have no adapters: they keep
    // their init, B = 0, so the run starts from the base model's outputs.
    if (t == nullptr && weights_only && s.e.model.lora.enabled() && is_lora_parameter(p->name))
      continue;
    if (t == nullptr) throw_missing_parameter(file, p->name);
    if (s.loading_initial_weights && is_lora_parameter(p->name))
      s.initial_adapters_from = file.path;
    load_parameter(s, file, *t, *p, weights_only, layout);
    used.insert(t);
  }
}

void load_buffers(Trainer::State& s, const CheckpointFile& file,
                  std::set<const sdk::HostTensor*>& used) {
  const auto& st = file.st;
  for (auto* buf : s.model->buffers()) {
    const auto* t = file.gpt2 ? nullptr : st.find("buffer/" + buf->name);
    if (t == nullptr) t = st.find(buf->name);
    if (t == nullptr)
      throw sdk::CheckpointError(
          file.path.string() + ": no tensor for buffer '" + buf->name + "' (looked for " +
              (file.gpt2 ? "'" + buf->name + "'"
                         : "'buffer/" + buf->name + "' and '" + buf->name + "'") +
              file.read_as() + ")",
          "the file was written for a model without this node's state; "
          "use a checkpoint of this model" +
              file.format_blame);
    from_host(*s.c.backend, *t, buf->value.view(), file.path, file.format_blame);
    used.insert(t);
  }
}

// A GPT-2 file is a whole model: a tensor left over means the sizes differ (more layers, biases
// the model has not).
void check_whole_gpt2(const CheckpointFile& file, const std::set<const sdk::HostTensor*>& used) {
  if (!file.gpt2) return;
  for (const auto& t : file.st.tensors)
    if (!used.count(&t))
      throw sdk::CheckpointError(
          file.path.string() + ": tensor '" + file.name_in_file(t) +
              "' matches no parameter of the model (reading the gpt2 layout)",
          !file.misfit_hint.empty()
              ? file.misfit_hint
              : "the file holds a different GPT: match [model.gpt] (n_layer, n_embd, bias) and "
                "the vocabulary and block size to it");
}

// A full resume continues the same model: a parameter or buffer in the file that the model lacks
// (a layer removed from the config) would be dropped silently with its optimizer state.
void refuse_what_the_model_lacks(const CheckpointFile& file,
                                 const std::set<const sdk::HostTensor*>& used) {
  for (const auto& t : file.st.tensors)
    if (!used.count(&t) && (t.name.rfind("param/", 0) == 0 || t.name.rfind("buffer/", 0) == 0))
      throw sdk::CheckpointError(
          file.path.string() + ": tensor '" + t.name +
              "' matches no parameter or buffer of the model, so resuming would drop it",
          "resume with the [model] the run was trained with; to start a changed model from "
          "these weights, begin a new run with checkpoint.init_from (which warns of what the "
          "model lacks and ignores it)" +
              file.format_blame);
}

// What the checkpoint's run had that this config's model and precision give otherwise, from the
// resolved config the checkpoint carries: "key = then -> now", empty without one. Keys of one
// side only were written before the key existed. No difference either: where the weights come
// from or how they start (model.from_pretrained, the initialisation; the checkpoint's weights
// replace them), what an export alone reads (the token ids), and recomputing outputs (the same
// model, the same numbers). What only training reads (label smoothing, dropout) is a difference
// to a resume, whose objective it changes (`training`), and none to eval or predict.
std::vector<std::string> model_changes_since(const Trainer::State& s, const CheckpointFile& file,
                                             bool training) {
  // A checkpoint carries its run's config as "config", an export as "mixtrain.config".
  auto saved = file.st.metadata.find("config");
  if (saved == file.st.metadata.end()) saved = file.st.metadata.find("mixtrain.config");
  if (saved == file.st.metadata.end()) return {};
  static constexpr std::string_view kNoNumber[] = {
      "init_std", "zero_init", "from_pretrained", "bos_token_id", "eos_token_id", "recompute"};
  static constexpr std::string_view kTrainingOnly[] = {"label_smoothing", "dropout", "p"};
  const auto among = [](const auto& keys, std::string_view key) {
    return std::find(std::begin(keys), std::end(keys), key) != std::end(keys);
  };
  return changed_values(
      saved->second, resolved_toml(s.e),
      [&](std::string_view key) {
        if (key == "precision.policy") return true;
        if (!key.starts_with("model.")) return false;
        const std::string_view last = key.substr(key.rfind('.') + 1);
        return !among(kNoNumber, last) && (training || !among(kTrainingOnly, last));
      },
      /*one_sided=*/false);
}

std::string changes_text(const std::vector<std::string>& changes) {
  return short_list(changes, 6);
}

// How to keep what a warned change replaces: the --set flags of the old values (the run folder's
// config.toml holds the new ones once the run starts, so pointing at it would not help), and the
// changes no flag undoes (a key only one side has) to undo by hand. `what`: "the old schedule".
std::string to_keep_the_old(const std::vector<std::string>& changes, const std::string& what) {
  const std::string flags = restore_flags(changes);
  std::vector<std::string> by_hand;  // "leave out precision.override[0]"
  for (const auto& c : changes) {
    const auto eq = c.find(" = "), arrow = c.find(" -> ", eq == std::string::npos ? 0 : eq);
    if (eq == std::string::npos || arrow == std::string::npos || !restore_flags({c}).empty())
      continue;
    const std::string key = c.substr(0, eq), was = c.substr(eq + 3, arrow - eq - 3);
    by_hand.push_back(was == "(none)" ? "leave out " + key : "give back " + key + " = " + was);
  }
  std::string out = "To keep " + what;
  if (!flags.empty()) out += ", resume with " + flags;
  if (!by_hand.empty())
    out += std::string(flags.empty() ? ", " : " and ") + changes_text(by_hand) +
           " in the config (no --set undoes that)";
  return flags.empty() && by_hand.empty() ? std::string() : out;
}

// eval, predict and sample run the checkpoint's model: a parameter or buffer of the file with no
// place in this config's model means the two differ (a layer removed), and the numbers would be
// another model's; refused, naming the config keys that differ. Other config differences with
// the same tensors (heads, an activation, the policy) are a warning: they may be deliberate.
void check_inference_model(const Trainer::State& s, const CheckpointFile& file,
                           const std::set<const sdk::HostTensor*>& used) {
  const auto changes = model_changes_since(s, file, /*training=*/false);
  const std::string since =
      changes.empty() ? std::string() : " (its run had " + changes_text(changes) + ")";
  for (const auto& t : file.st.tensors)
    if (!used.count(&t) && (t.name.find('/') == std::string::npos ||
                            t.name.rfind("param/", 0) == 0 || t.name.rfind("buffer/", 0) == 0))
      throw sdk::CheckpointError(
          file.path.string() + ": tensor '" + t.name +
              "' matches no parameter or buffer of this config's model" + since,
          "run it with the config it was trained with (its run folder's config.toml)");
  if (!changes.empty())
    s.log.warn(file.path.string() + " was trained with another model or precision: " +
               changes_text(changes) + "; the numbers are this config's. For the run's, add " +
               (restore_flags(changes).empty() ? "the values of the config it was trained with"
                                               : restore_flags(changes)));
}

// A resume whose [model] differs with the same tensors (heads, an activation) trains another
// model from the step on: allowed, as a deliberate change may be, but said (the policy has its
// own rule: restore_policy).
void warn_of_another_model(const Trainer::State& s, const CheckpointFile& file) {
  auto changes = model_changes_since(s, file, /*training=*/true);
  std::erase_if(changes, [](const std::string& c) { return c.starts_with("precision."); });
  if (!changes.empty())
    s.log.warn(file.path.string() + " was trained with another model: " + changes_text(changes) +
               "; the steps from here train this config's. " +
               to_keep_the_old(changes, "the old model"));
}

void finish_initial_weights(Trainer::State& s, const CheckpointFile& file,
                            const std::set<const sdk::HostTensor*>& used) {
  // Trained adapters the model has no place for (no [model.lora], or other targets or rank)
  // would be dropped, and the run would start from the base model: refuse, as resume does.
  const bool inference = !s.opt.write_outputs && !s.loading_initial_weights;
  // A training state names them param/…; a weights-only file (an export, safetensors) plainly.
  for (const auto& t : file.st.tensors)
    if (!used.count(&t) &&
        (t.name.rfind("param/", 0) == 0 || t.name.find('/') == std::string::npos) &&
        (t.name.ends_with(".lora_A.weight") || t.name.ends_with(".lora_B.weight")))
      throw sdk::CheckpointError(
          file.path.string() + ": tensor '" + t.name +
              "' is a trained LoRA adapter that this model has no place for, so " +
              (inference ? "the base weights would run without it"
                         : "the run would start from the base weights without it"),
          file.fold_route + ", or use the [model.lora] the checkpoint was trained with");
  reset_ema(s);  // the EMA of initial weights starts at them
  if (inference) {
    check_inference_model(s, file, used);
  } else {
    for (const auto& t : file.st.tensors)
      if (!used.count(&t) && (t.name.find('/') == std::string::npos ||
                              t.name.rfind("param/", 0) == 0 || t.name.rfind("buffer/", 0) == 0))
        s.log.warn(file.path.string() + ": tensor '" + t.name +
                   "' matches no parameter or buffer; ignored");
  }
  s.log.info("initial weights loaded from " + file.path.string() +
             (file.gpt2 ? " (Hugging Face GPT-2 layout)" : ""));
}

// A metadata entry of a full training state, parsed. Read only once the file passed for one (it
// has 'mixtrain.state_version'), so a missing entry is a state kept in part (damaged, or a format
// that dropped it), not a weights-only file: said with every entry it lacks.
json metadata_entry(const CheckpointFile& file, const std::string& key) {
  auto it = file.st.metadata.find(key);
  if (it == file.st.metadata.end()) {
    std::string lacks;
    for (const char* entry : {"progress", "sampler", "optimizer", "scaler", "policy"})
      if (!file.st.metadata.count(entry))
        lacks += (lacks.empty() ? "'" : ", '") + std::string(entry) + "'";
    const bool slots =
        !file.deferred_slots.empty() ||
        std::any_of(file.st.tensors.begin(), file.st.tensors.end(),
                    [](const sdk::HostTensor& t) { return t.name.starts_with("optimizer/"); });
    throw sdk::CheckpointError(
        file.path.string() + ": no '" + key +
            "' entry: the file holds a training state ('mixtrain.state_version'" +
            (slots ? " and the optimizer's slots" : "") +
            ") without all of its metadata (it lacks " + lacks + ")",
        "the file is damaged, or its format kept the state in part: resume from an earlier "
        "checkpoint, or start a new run from its weights with checkpoint.init_from" +
            file.format_blame);
  }
  auto j = json::parse(it->second, nullptr, false);
  if (j.is_discarded())
    throw sdk::CheckpointError(file.path.string() + ": the '" + key + "' entry is not valid JSON");
  return j;
}

// The sampler's order is drawn from the row count and the seed: other ones cannot continue it.
// Refused naming the keys of [data] and run.seed that differ (from the checkpoint's resolved
// config; a checkpoint without one names the counts alone), with the flags that resume as the
// run was, and the way to start from the weights instead.
void check_same_data(const Trainer::State& s, const CheckpointFile& file, const json& sampler) {
  const fs::path& path = file.path;
  const auto rows = read_checkpoint_int(sampler.at("rows"), "sampler.rows", 0,
                                        std::numeric_limits<std::int64_t>::max(), path);
  const bool seed_known = sampler.at("seed").is_number_unsigned();
  const std::uint64_t seed = seed_known ? sampler.at("seed").get<std::uint64_t>() : 0;
  if (rows == s.train.rows && seed_known && seed == s.e.run.seed) return;
  std::vector<std::string> changes;
  if (const auto saved = file.st.metadata.find("config"); saved != file.st.metadata.end()) {
    // The loader's keys leave the rows as they are (data.batch_size has its own refusal).
    static constexpr std::string_view kLoaderOnly[] = {
        "data.prefetch",   "data.pin_memory",           "data.eval_batch_size",
        "data.batch_size", "data.image_folder.threads", "data.image_folder.check_files"};
    changes = changed_values(
        saved->second, resolved_toml(s.e),
        [](std::string_view key) {
          return key == "run.seed" || (key.starts_with("data.") &&
                                       std::find(std::begin(kLoaderOnly), std::end(kLoaderOnly),
                                                 key) == std::end(kLoaderOnly));
        },
        /*one_sided=*/false);
  }
  const std::string counts = " (" + std::to_string(rows) + " training rows and seed " +
                             (seed_known ? std::to_string(seed) : std::string("unknown")) +
                             " then, " + std::to_string(s.train.rows) + " and " +
                             std::to_string(s.e.run.seed) + " now)";
  const std::string flags = restore_flags(changes);
  throw sdk::CheckpointError(
      path.string() + ": the checkpoint was trained on other data" + counts +
          (changes.empty() ? std::string() : ": " + changes_text(changes)),
      "a resumed run keeps its data order: resume with " +
          (flags.empty() ? std::string("the [data] and run.seed the run was trained with")
                         : flags) +
          ", or start a new run from these weights: " +
          start_from_weights_route(s.e, path, /*merge_lora=*/false));
}

// A resume whose data differ with the same row count and seed (another file of the same shape,
// another synthetic noise, data.shuffle turned off) trains on other data from the step on:
// allowed, as a deliberate change may be, but said, naming the [data] keys that differ and, when
// the values themselves differ, the checksums (data/data_fingerprint.h; checkpoints before them
// have none). Keys that leave the batches as they were (the loader's) are no change.
void warn_of_other_data(const Trainer::State& s, const CheckpointFile& file, const json& sampler) {
  std::vector<std::string> changes;
  // data.pixels holds the same values as bytes or as floats: the checksums differ, the data not.
  bool same_form = true;
  if (const auto saved = file.st.metadata.find("config"); saved != file.st.metadata.end()) {
    static constexpr std::string_view kLoaderOnly[] = {"data.prefetch", "data.pin_memory",
                                                       "data.eval_batch_size", "data.batch_size"};
    const std::string now = resolved_toml(s.e);
    changes = changed_values(
        saved->second, now,
        [](std::string_view key) {
          return key.starts_with("data.") && key != "data.pixels" &&
                 std::find(std::begin(kLoaderOnly), std::end(kLoaderOnly), key) ==
                     std::end(kLoaderOnly);
        },
        /*one_sided=*/false);
    same_form = changed_values(
                    saved->second, now, [](std::string_view key) { return key == "data.pixels"; },
                    /*one_sided=*/false)
                    .empty();
  }
  const auto differs = [&](const char* key, const std::string& now, const char* split) {
    const auto then = sampler.find(key);
    if (same_form && then != sampler.end() && then->is_string() && then->get<std::string>() != now)
      changes.push_back(std::string(split) + " rows " + then->get<std::string>() + " -> " + now);
  };
  differs("train_data", s.train_fingerprint, "training");
  differs("eval_data", s.eval_fingerprint, "held-out");
  if (changes.empty()) return;
  s.log.warn(
      file.path.string() + " was trained on other data or data settings: " + changes_text(changes) +
      "; the steps from here train on this config's (and evaluations, best checkpoints and "
      "early stopping measure its held-out rows). " +
      (restore_flags(changes).empty() ? std::string("Resume on the run's data to keep the old")
                                      : "To keep the old, resume with " + restore_flags(changes) +
                                            " (and the run's data files)"));
}

bool holds_ema(const CheckpointFile& file) {
  return std::any_of(file.st.tensors.begin(), file.st.tensors.end(),
                     [](const sdk::HostTensor& t) { return t.name.rfind("ema/", 0) == 0; });
}

// The EMA continues where it was; a run that starts keeping one on resume starts it at the
// resumed masters. Dropping a checkpoint's EMA (no [ema] now) or changing its decay is allowed
// but said, as a changed schedule is: the next checkpoint no longer holds what the run averaged.
void restore_ema(Trainer::State& s, const CheckpointFile& file) {
  if (s.ema.empty()) {
    if (holds_ema(file))
      s.log.warn(file.path.string() +
                 " holds an EMA of the weights, which this config keeps none of ([ema] decay "
                 "is 0 or absent): the run continues without it and its next checkpoints drop "
                 "it. To keep it, resume with " +
                 (saved_ema_decay(file.st.metadata)
                      ? "--set ema.decay=" +
                            sdk::option_value_to_string(*saved_ema_decay(file.st.metadata))
                      : std::string("the [ema] decay the run had")));
    return;
  }
  const auto was = saved_ema_decay(file.st.metadata);
  if (was && *was != s.e.ema.decay && holds_ema(file))
    s.log.warn(file.path.string() + ": the EMA was kept with decay " +
               sdk::option_value_to_string(*was) + " and continues with " +
               sdk::option_value_to_string(s.e.ema.decay) + " (ema.decay)");
  const auto params = s.model->trainable_parameters();
  for (std::size_t i = 0; i < s.ema.size(); ++i) {
    const auto* h = file.st.find("ema/" + params[i]->name);
    if (h == nullptr) {
      reset_ema(s);
      s.log.warn(file.path.string() +
                 ": the checkpoint holds no EMA of the weights; [ema] starts "
                 "one at the resumed weights");
      return;
    }
    from_host(*s.c.backend, *h, s.ema[i].view(), file.path, file.format_blame);
  }
}

// A component's state; the components range-check their own entries, and their messages gain
// the file's name.
template <typename Component>
void restore_component(const CheckpointFile& file, const char* what, const std::string& type,
                       const TrainingProgress& progress, Component& component) {
  auto state = component_state_from_json(metadata_entry(file, what), what, type, file.path);
  check_component_counters(state, what, progress, file.path);
  try {
    component.load_state(state);
  } catch (const sdk::CheckpointError& e) {
    const std::string message = e.what();
    const bool says_role = message.rfind(what, 0) == 0;  // "scaler 'dynamic' state ..."
    throw sdk::CheckpointError(
        file.path.string() + ": " + (says_role ? "" : what + std::string(": ")) + message,
        e.hint());
  }
}

// A resume that changes the schedule's keys or peak rate: the rate jumps at the next step (warm-up
// starting over, a decay cut short), which is allowed, but said with both rates, as a changed
// horizon is.
void warn_of_changed_schedule(Trainer::State& s, const CheckpointFile& file,
                              const ResumeTerms& terms, std::int64_t applied) {
  const auto change = changed_schedule(file.st.metadata, s.e, s.schedule, terms.schedule_steps);
  if (!change) return;
  std::string list;
  for (const auto& c : change->changed) list += (list.empty() ? "" : ", ") + c;
  char rates[96];
  std::snprintf(rates, sizeof rates, "%.6g where the checkpoint's schedule gives %.6g",
                s.schedule.lr_at(applied), change->was.lr_at(applied));
  s.log.warn(file.path.string() + " was trained with another learning-rate schedule: " + list +
             "; the next step's lr is " + rates + ". " +
             to_keep_the_old(change->changed, "the old schedule"));
}

// A resume that changes the optimizer's or the scaler's options (Adam's betas, weight decay, the
// growth interval) or the clipping: allowed, as a changed schedule is, and said.
void warn_of_changed_update(Trainer::State& s, const CheckpointFile& file) {
  const auto changed = changed_update_options(file.st.metadata, s.e);
  if (changed.empty()) return;
  std::string list;
  for (const auto& c : changed) list += (list.empty() ? "" : ", ") + c;
  s.log.warn(file.path.string() + " was trained with other optimizer or scaler settings: " + list +
             "; the steps from here use the new ones. " + to_keep_the_old(changed, "the old ones"));
}

// An optimizer slot the file lacks: when the checkpoint's optimizer is another one, its refusal
// (written by 'adamw', this run uses 'sgd') says why; when it is the same one with other options
// (SGD's momentum from 0, which keeps no buffer), the new options need state the run never kept,
// refused naming the options and the ways on. Otherwise returns, and the slot's own error stands.
void refuse_state_the_options_lack(const Trainer::State& s, const CheckpointFile& file,
                                   const sdk::CheckpointError& missing) {
  const json saved = metadata_entry(file, "optimizer");
  component_state_from_json(saved, "optimizer", s.e.optimizer_type, file.path);  // the same one
  auto changed = changed_update_options(file.st.metadata, s.e);
  const std::string own = "optimizer." + s.e.optimizer_type + ".";
  std::erase_if(changed, [&](const std::string& c) { return !c.starts_with(own); });
  if (changed.empty()) return;
  // The slot the reducer named ("no optimizer state 'fc1.weight.momentum_buffer'"), if it did.
  constexpr std::string_view kLead = "no optimizer state '";
  const std::string what = missing.what();
  const auto slot = what.find(kLead);
  const auto end = slot == std::string::npos ? slot : what.find('\'', slot + kLead.size());
  const std::string lacks =
      end == std::string::npos ? std::string() : " (" + what.substr(slot, end + 1 - slot) + ")";
  throw sdk::CheckpointError(
      file.path.string() + ": this run gives the optimizer other options (" +
          changes_text(changed) + "), which need state the checkpoint's run never kept" + lacks,
      "resume with the options it kept state for: " + restore_flags(changed) +
          ", or start a new run from these weights: " +
          start_from_weights_route(s.e, file.path, /*merge_lora=*/false));
}

// The policy a choosing policy (auto) chose when the checkpoint was written; empty for one that
// is itself, or a checkpoint written before the choice was recorded.
std::string chosen_then(const json& saved) {
  return saved.is_object() && saved.contains("resolved") && saved["resolved"].is_string()
             ? saved["resolved"].get<std::string>()
             : std::string();
}

// `auto` chooses in adapt_to() from the backend's capabilities, so a resume on another machine
// (or with another backend option) may choose another plan: the run would go on under it without
// a word, and no longer repeat itself. Refused with both ways on, as a policy switch is.
void check_same_choice(const Trainer::State& s, const CheckpointFile& file, const json& saved) {
  const std::string then = chosen_then(saved);
  const std::string now = s.c.policy->resolved_name();
  if (then.empty() || now.empty() || then == now) return;
  throw sdk::CheckpointError(file.path.string() + ": precision policy '" + s.e.policy_name +
                                 "' chose '" + then + "' for the run, and on this backend (" +
                                 s.c.backend->capabilities().kind + ") it chooses '" + now + "' (" +
                                 s.e.policy_where.to_string() + ")",
                             "continue as trained, bit for bit: --set precision.policy=" + then +
                                 "; or switch deliberately: --set precision.policy=" + now);
}

// A component a resume may swap (README, --resume): the precision policy, the loss scaler, the
// optimizer.
struct SwappableComponent {
  const char* what;                  // its metadata entry: "scaler"
  const char* noun;                  // for messages: "loss scaler"
  const char* trained;               // "was trained <trained> '<type>'": "with loss scaler"
  const char* key;                   // its config key: "scaler.type"
  const std::string& now;            // this run's
  const sdk::SourceLocation& where;  // where this run's was given
  const char* not_carried;           // what of the old one's state is lost by a switch
};

// The run's counters when the checkpoint's component state began (run_position.h), each within
// the checkpoint's own.
StateOrigin read_origin(const json& saved, const char* what, const TrainingProgress& progress,
                        const fs::path& file) {
  StateOrigin since;
  const auto field = [&](const char* name, std::int64_t most, std::int64_t& out) {
    if (saved.contains(name))
      out = read_checkpoint_int(saved[name], std::string(what) + "." + name, 0, most, file);
  };
  field("since_step", progress.step, since.step);
  field("since_applied", progress.applied, since.applied);
  field("since_skipped", progress.skipped, since.skipped);
  return since;
}

// Whether the checkpoint's state of `c` (`saved`, its metadata entry) is this run's to restore.
// The same component's is (true),
// its counters checked from where its state began (`since`, read from the checkpoint). Another
// one named by a --set of c.key is a deliberate switch (false): the new component starts from its
// initial state, its counters from this step (`since`), and a warning says so. Another named any
// other way (an edited config, a --merge) is a CheckpointError naming both, where this run's was
// given, and the --set of either that resumes.
bool keeps_state(Trainer::State& s, const CheckpointFile& file, const SwappableComponent& c,
                 const json& saved, const TrainingProgress& progress, StateOrigin& since) {
  const std::string before =
      saved.is_object() && saved.contains("component") && saved["component"].is_string()
          ? saved["component"].get<std::string>()
          : std::string();
  if (before.empty() || before == c.now) {
    since = saved.is_object() ? read_origin(saved, c.what, progress, file.path) : StateOrigin{};
    return true;
  }
  if (c.where.file.rfind("--set ", 0) == 0) {
    s.log.warn(file.path.string() + " was trained " + c.trained + " '" + before + "'; " +
               c.where.file + " switches to '" + c.now +
               "', which starts from its initial state (" + c.not_carried + ")");
    since = {progress.step, progress.applied, progress.skipped};
    return false;
  }
  throw sdk::CheckpointError(
      file.path.string() + ": the " + c.what + " state was written by '" + before +
          "' but this run uses '" + c.now + "' (" + c.where.to_string() + ")",
      "resume with the checkpoint's " + std::string(c.noun) + " (--set " + c.key + "=" + before +
          "), or switch deliberately on the command line: --set " + c.key + "=" + c.now);
}

// The counters a component that began at `since` has heard of.
TrainingProgress heard_since(TrainingProgress progress, const StateOrigin& since) {
  progress.step -= since.step;
  progress.applied -= since.applied;
  progress.skipped -= since.skipped;
  return progress;
}

// The policy's state (a deliberate switch drops it: keeps_state); FP8 scales and histories are
// the old policy's. The same policy with other options is said.
void restore_policy(Trainer::State& s, const CheckpointFile& file,
                    const TrainingProgress& progress) {
  const SwappableComponent policy{"policy",
                                  "precision policy",
                                  "under precision policy",
                                  "precision.policy",
                                  s.e.policy_name,
                                  s.e.policy_where,
                                  "the old policy's state is not carried"};
  const json saved = metadata_entry(file, "policy");
  // The policy `auto` chose, named: the same plan, so the run continues (a choosing policy keeps
  // no state of its own to carry).
  if (const std::string chose = chosen_then(saved);
      !chose.empty() && chose == s.e.policy_name &&
      (!saved.contains("values") || saved["values"].empty())) {
    const std::string chooser = saved.contains("component") && saved["component"].is_string()
                                    ? saved["component"].get<std::string>()
                                    : std::string("its policy");
    s.log.info(file.path.string() + " was trained under '" + chooser + "', which chose '" +
               s.e.policy_name + "': the run continues under it");
    s.position.policy_since = read_origin(saved, "policy", progress, file.path);
    return;
  }
  if (!keeps_state(s, file, policy, saved, progress, s.position.policy_since)) return;
  check_same_choice(s, file, saved);
  if (const auto changed = changed_policy_options(file.st.metadata, s.e); !changed.empty()) {
    std::string list;
    for (const auto& c : changed) list += (list.empty() ? "" : ", ") + c;
    s.log.warn(file.path.string() + " was trained with other [precision] options: " + list +
               "; the steps from here use the new ones. " +
               to_keep_the_old(changed, "the old ones"));
  }
  restore_component(file, "policy", s.e.policy_name, heard_since(progress, s.position.policy_since),
                    *s.c.policy);
}

// The loss scaler's state; a deliberate switch (keeps_state) starts the new one at its initial
// scale.
void restore_scaler(Trainer::State& s, const CheckpointFile& file,
                    const TrainingProgress& progress) {
  const SwappableComponent scaler{
      "scaler",
      "loss scaler",
      "with loss scaler",
      "scaler.type",
      s.e.scaler_type,
      s.e.scaler_where,
      "its scale and counters start afresh; the old scaler's are not carried"};
  if (!keeps_state(s, file, scaler, metadata_entry(file, "scaler"), progress,
                   s.position.scaler_since))
    return;
  restore_component(file, "scaler", s.e.scaler_type, heard_since(progress, s.position.scaler_since),
                    *s.c.scaler);
}

// The optimizer's slots and state; a deliberate switch (keeps_state) starts the new one with
// fresh slots (no moments, no momentum), while the learning-rate schedule, the host's, goes on.
void restore_optimizer(Trainer::State& s, const CheckpointFile& file,
                       const TrainingProgress& progress) {
  const SwappableComponent optimizer{
      "optimizer",
      "optimizer",
      "with optimizer",
      "optimizer.type",
      s.e.optimizer_type,
      s.e.optimizer_where,
      "fresh slots: the old optimizer's moments or momentum are not carried; the learning-rate "
      "schedule goes on from this step"};
  if (!keeps_state(s, file, optimizer, metadata_entry(file, "optimizer"), progress,
                   s.position.optimizer_since))
    return;
  try {
    s.reducer->load_optimizer_state(
        *s.c.optimizer,
        [&](const std::string& name) { return file.find_slot("optimizer/" + name); },
        [&](const sdk::HostTensor& whole, sdk::TensorView slot) {
          from_host(*s.c.backend, whole, slot, file.path, file.format_blame);
        },
        file.path.string());
  } catch (const sdk::CheckpointError& e) {
    refuse_state_the_options_lack(s, file, e);
    throw;
  }
  restore_component(file, "optimizer", s.e.optimizer_type,
                    heard_since(progress, s.position.optimizer_since), *s.c.optimizer);
}

// A Trainer that writes nothing (eval, predict, sample) runs a checkpoint as its run evaluated
// it: with the EMA as the weights under eval.weights = "ema" (weights taken from "ema/<name>":
// the session never trains, so they may stand in), and with the policy's own state (delayed FP8
// scaling's amax histories) when the checkpoint's policy is the config's. Without them the
// numbers would be the raw weights' under scales of 1.
// The EMA covers the parameters the run trained, whichever ones this config freezes: each one
// the file has an EMA of takes it, the others (frozen in the run, so never moved) keep param/.
void restore_for_inference(Trainer::State& s, const CheckpointFile& file) {
  if (s.e.eval.weights == EvalWeights::ema && !s.ema.empty()) {
    std::size_t taken = 0;
    for (auto* p : s.model->parameters())
      if (const auto* h = file.st.find("ema/" + p->name)) {
        load_parameter(s, file, *h, *p, /*weights_only=*/true, WeightLayout::native);
        ++taken;
      }
    if (taken > 0) {
      s.model->refresh_working_copies();
      reset_ema(s);
    } else if (const auto kind = file.st.metadata.find("mixtrain.weights");
               kind == file.st.metadata.end()) {
      s.log.warn(file.path.string() + " holds no EMA of the weights; eval.weights = \"ema\" " +
                 "evaluates its weights as they are");
    } else if (kind->second != "ema") {
      // An export holds one set, and says which (export_command.cpp): its EMA is silent.
      s.log.warn(file.path.string() + " is an export of the run's " + kind->second +
                 " weights, not an EMA; eval.weights = \"ema\" evaluates them as they are (a "
                 "run with [ema] exports its average with --weights ema)");
    }
  }
  // A checkpoint keeps the policy's state as "policy"; an export names the policy there for other
  // tools and keeps the state as "mixtrain.policy_state".
  auto saved = file.st.metadata.find("mixtrain.policy_state");
  if (saved == file.st.metadata.end()) saved = file.st.metadata.find("policy");
  if (saved == file.st.metadata.end()) return;
  const json j = json::parse(saved->second, nullptr, false);
  if (!j.is_object() || !j.contains("component") || j["component"] != s.e.policy_name) return;
  try {
    s.c.policy->load_state(component_state_from_json(j, "policy", s.e.policy_name, file.path));
  } catch (const sdk::CheckpointError& e) {
    throw sdk::CheckpointError(file.path.string() + ": policy: " + e.what(), e.hint());
  }
}

// Everything of a full training state besides the weights: the counters, the optimizer's
// slots, the EMA, the components' states, the sampler's cursor and the watched metrics.
void restore_training_state(Trainer::State& s, const CheckpointFile& file) {
  const fs::path& path = file.path;
  auto progress = read_progress(metadata_entry(file, "progress"), s.e.run.steps, path);
  // Before the sampler's cursor, whose check a changed batch size would fail less clearly.
  const ResumeTerms terms = read_resume_terms(file.st.metadata, path);
  keep_resume_terms(terms, s.e, frozen_names(*s.model), s.schedule, progress.applied, s.log, path);
  auto sampler = metadata_entry(file, "sampler");
  check_same_data(s, file, sampler);
  warn_of_other_data(s, file, sampler);
  restore_optimizer(s, file, progress);
  restore_ema(s, file);
  restore_scaler(s, file, progress);
  // Said once the state they change was taken: a refused swap of the optimizer or the scaler is
  // not announced as applied first.
  warn_of_changed_schedule(s, file, terms, progress.applied);
  warn_of_changed_update(s, file);
  restore_policy(s, file, progress);
  // Each step draws run.accumulate batches.
  s.data.sampler->set_cursor(read_sampler_cursor(sampler, progress.step * s.e.run.accumulate,
                                                 s.data.sampler->batches_per_epoch(), path));
  restore_watch(s, file.st.metadata, progress.step, path);
  s.position.step = progress.step;
  s.position.applied = progress.applied;
  s.position.skipped = progress.skipped;
  s.metrics.note_loss(progress.last_loss, progress.step);
  s.history = history_of_checkpoint(file.st.metadata);
  s.history_first_step = progress.step + 1;
}

}  // namespace

// trainer_state.h
void refuse_another_format(const Trainer::State& s, const fs::path& resume) {
  const std::string extension = s.c.checkpoint_format->file_extension();
  // The file the resume means, when another format wrote it; its format.
  fs::path file;
  const NamedFormat* other = nullptr;
  std::error_code ec;
  if (fs::is_directory(resume, ec)) {
    const fs::path folder =
        fs::is_directory(resume / "checkpoints", ec) ? resume / "checkpoints" : resume;
    if (!step_checkpoints(folder, extension).empty()) return;
    std::int64_t newest = -1;
    for (const auto& f : s.c.weight_formats) {
      const std::string theirs = f.format->file_extension();
      if (theirs == extension) continue;
      const auto files = step_checkpoints(folder, theirs);
      if (files.empty()) continue;
      const std::int64_t step = checkpoint_step(files.back(), theirs).value_or(-1);
      if (step > newest) newest = step, file = files.back(), other = &f;
    }
  } else if (resume.extension() != extension) {
    for (const auto& f : s.c.weight_formats)
      if (f.format->file_extension() == resume.extension().string()) file = resume, other = &f;
  }
  if (other == nullptr) return;
  // A weights-only file is refused as such, whatever the format: its read says so.
  check_training_state_version(
      read_checkpoint_with(*other->format, file, /*weights_only=*/true, plugin_label(other))
          .metadata,
      file);
  throw sdk::CheckpointError(
      file.string() + " was written by checkpoint format '" + other->name +
          "', and this run's checkpoint.format is \"" + s.e.checkpoint.format +
          "\": a run cannot change its checkpoint format on resume",
      "resume it in its own format: --set checkpoint.format=" + other->name +
          " (mixtrain export writes a file of another format from any checkpoint); or start a "
          "new run in this format from its weights: --set checkpoint.init_from=" +
          file.string() + " without --resume");
}

// trainer_state.h
bool take_recorded_shape(Trainer::State& s, const fs::path& checkpoint) {
  // Kept whatever it records: the load that follows takes it rather than reading the file again.
  const sdk::CheckpointFormat& reader = weights_format_for(s.c, checkpoint);
  s.shape_checkpoint.emplace(checkpoint,
                             read_checkpoint_with(reader, checkpoint, /*weights_only=*/true,
                                                  plugin_label(named_format_of(s.c, reader))));
  const auto& metadata = s.shape_checkpoint->second.metadata;
  const auto it = metadata.find("data_shape");
  if (it == metadata.end()) return false;
  // A record that cannot be read (damaged, or another tool's) leaves the shape to the files.
  DataShape shape;
  try {
    shape = parse_data_shape(it->second, checkpoint.string());
  } catch (const sdk::CheckpointError& e) {
    s.log.warn(std::string(e.what()) + "; the model's input is read from the data files instead");
    return false;
  }
  const auto recorded = recorded_normalization(metadata);
  if (!recorded) {
    s.log.warn(checkpoint.string() +
               ": the 'normalization' entry cannot be read; the model's input is read from the "
               "data files instead");
    return false;
  }
  // Two entries of one file that disagree (a damaged or hand-edited file): neither is trusted.
  if (!recorded->mean.empty() &&
      (shape.sample_shape.size() != 3 ||
       recorded->mean.size() != static_cast<std::size_t>(shape.sample_shape[0]))) {
    s.log.warn(checkpoint.string() + ": the 'normalization' entry has " +
               std::to_string(recorded->mean.size()) +
               " channels, which the 'data_shape' entry's input does not; the model's input is "
               "read from the data files instead");
    return false;
  }
  // The config's keys must fit the data as loading them would require.
  check_data_settings_fit(s.e.data, dataset_of_shape(shape, {}));
  // The config's own statistics, so that load_checkpoint() compares them with the record as it
  // does for loaded data; from_training means the training split's, which the record holds.
  const auto& normalize = s.e.data.normalize;
  ChannelStats stats;
  if (normalize.from_training) {
    stats = *recorded;
    if (stats.mean.empty())
      s.log.warn(checkpoint.string() +
                 " was trained without normalisation, and this session's config computes it "
                 "from the training split (data.normalize.from_training): this session "
                 "normalises as the model was trained; remove [data.normalize] to say so");
  } else if (normalize.enabled()) {
    stats = {normalize.mean, normalize.std};
  }
  s.recorded_shape = shape;
  s.normalization = stats;
  return true;
}

void Trainer::load_checkpoint(const fs::path& path, bool weights_only, WeightLayout layout) {
  if (!weights_only && layout != WeightLayout::native)
    throw std::invalid_argument(
        "load_checkpoint: a resumed training state is in the native layout");
  auto& s = *s_;
  const CheckpointFile file = read_checkpoint_file(s, path, weights_only, layout);
  if (!weights_only) {
    const ResumeTerms terms = read_resume_terms(file.st.metadata, path);
    keep_lora_terms(terms, s.e, path);
    keep_frozen_format(terms, s.e, path);
  }
  restore_escalation(s, file, weights_only);
  keep_trained_normalization(s, file, weights_only);
  refuse_renumbered_classes(s, file, weights_only);
  refuse_resized_inputs(s, file, weights_only);
  std::set<const sdk::HostTensor*> used;
  load_parameters(s, file, weights_only, layout, used);
  load_buffers(s, file, used);
  check_whole_gpt2(file, used);
  s.model->refresh_working_copies();
  if (weights_only) {
    finish_initial_weights(s, file, used);
    if (!s.opt.write_outputs && !s.loading_initial_weights) restore_for_inference(s, file);
    return;
  }
  try {
    check_training_state_version(file.st.metadata, path);
  } catch (const sdk::CheckpointError& e) {
    if (file.format_blame.empty()) throw;
    throw sdk::CheckpointError(e.what(), e.hint() + file.format_blame);
  }
  refuse_what_the_model_lacks(file, used);
  warn_of_another_model(s, file);
  try {
    restore_training_state(s, file);
  } catch (const json::exception& e) {
    throw sdk::CheckpointError(path.string() + ": malformed training state: " + e.what(),
                               "the checkpoint is damaged; use an earlier one");
  }
  s.log.info("resumed from " + path.string() + " at step " + std::to_string(s.position.step));
}

}  // namespace mixtrain::core
