#include "train/resume_terms.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <iterator>
#include <limits>
#include <optional>
#include <string_view>
#include <system_error>
#include <variant>
#include <vector>

#include "checkpoint/state.h"
#include "config/resolved_values.h"
#include "mixtrain/core/config/component_section.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/graph/lora.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace {

// An integer option of `table` in a resolved config, or 0.
std::int64_t config_int(const Config& config, const std::string& table, const std::string& key) {
  for (const auto& o : config.table_options(table))
    if (o.key == key && std::holds_alternative<std::int64_t>(o.value))
      return std::get<std::int64_t>(o.value);
  return 0;
}

// An integer or number option's value as a double (TOML keeps 1024 and 1024.0 apart), else none.
std::optional<double> as_number(const sdk::OptionValue& v) {
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&v)) return *d;
  return std::nullopt;
}

std::string lr_text(double lr) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", lr);
  return text;
}

// A list of parameter names for a message: all of them up to a screenful, then a count.
std::string names_text(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 8;
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kShown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kShown) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

std::string frozen_text(const std::vector<std::string>& names) {
  return names.empty() ? "no frozen parameters" : "frozen parameters [" + names_text(names) + "]";
}

// The names in `a` that are not in `b` (both sorted).
std::vector<std::string> missing_from(const std::vector<std::string>& a,
                                      const std::vector<std::string>& b) {
  std::vector<std::string> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// The values of `now` that a resolved config's table `saved` records otherwise, each
// "PREFIXkey = old -> new", integers and numbers alike compared by value; a key the table lacks
// (written before the option existed) or `skip` names is passed over.
template <typename Skip>
void collect_changed(const std::vector<sdk::RawOption>& saved,
                     const std::vector<std::pair<std::string, sdk::OptionValue>>& now,
                     const std::string& prefix, Skip skip, std::vector<std::string>& changed) {
  for (const auto& option : now) {
    const std::string& key = option.first;  // named: a lambda may not capture a binding (C++20)
    const auto was = std::find_if(saved.begin(), saved.end(),
                                  [&](const sdk::RawOption& r) { return r.key == key; });
    if (was == saved.end() || skip(key)) continue;
    const auto a = as_number(was->value), b = as_number(option.second);
    const bool same = a && b ? *a == *b : was->value == option.second;
    if (!same)
      changed.push_back(prefix + key + " = " + sdk::option_value_to_string(was->value) + " -> " +
                        sdk::option_value_to_string(option.second));
  }
}

// The checkpoint's resolved config (its "config" entry); none when it has none or this build
// cannot read it: nothing to compare against then.
std::optional<Config> recorded_config(const std::map<std::string, std::string>& metadata) {
  const auto it = metadata.find("config");
  if (it == metadata.end()) return std::nullopt;
  try {
    return Config::from_string(it->second, "the checkpoint's config");
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

nlohmann::json resume_terms_to_json(const ResumeTerms& terms) {
  nlohmann::json j = {{"batch_size", terms.batch_size},
                      {"accumulate", terms.accumulate},
                      {"schedule_steps", terms.schedule_steps}};
  // Only when something is frozen: a run without freezing writes what it wrote before.
  if (terms.frozen && !terms.frozen->empty()) j["frozen"] = *terms.frozen;
  if (terms.lora && *terms.lora != "none") j["lora"] = *terms.lora;
  if (terms.frozen_format && *terms.frozen_format != "compute")
    j["frozen_format"] = *terms.frozen_format;
  return j;
}

ResumeTerms read_resume_terms(const std::map<std::string, std::string>& metadata,
                              const std::filesystem::path& file) {
  ResumeTerms t;
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  if (const auto it = metadata.find("resume"); it != metadata.end()) {
    const auto j = nlohmann::json::parse(it->second, nullptr, false);
    if (!j.is_object())
      throw sdk::CheckpointError(file.string() + ": the 'resume' entry is not a JSON object",
                                 "the checkpoint is damaged; use an earlier one");
    auto field = [&](const char* key) {
      if (!j.contains(key))
        throw sdk::CheckpointError(file.string() + ": resume." + key + " is missing",
                                   "the checkpoint is damaged; use an earlier one");
      return read_checkpoint_int(j.at(key), std::string("resume.") + key, 1, kMax, file);
    };
    t.batch_size = field("batch_size");
    t.accumulate = field("accumulate");
    t.schedule_steps = field("schedule_steps");
    t.frozen.emplace();
    if (j.contains("frozen")) {
      const auto& list = j.at("frozen");
      if (!list.is_array())
        throw sdk::CheckpointError(file.string() + ": resume.frozen is not a list of names",
                                   "the checkpoint is damaged; use an earlier one");
      for (const auto& name : list) {
        if (!name.is_string())
          throw sdk::CheckpointError(
              file.string() + ": resume.frozen holds " + name.dump() + ", not a parameter name",
              "the checkpoint is damaged; use an earlier one");
        t.frozen->push_back(name.get<std::string>());
      }
      std::sort(t.frozen->begin(), t.frozen->end());
    }
    t.lora = "none";
    if (j.contains("lora")) {
      if (!j.at("lora").is_string())
        throw sdk::CheckpointError(file.string() + ": resume.lora is not a string",
                                   "the checkpoint is damaged; use an earlier one");
      t.lora = j.at("lora").get<std::string>();
    }
    t.frozen_format = "compute";
    if (j.contains("frozen_format")) {
      if (!j.at("frozen_format").is_string())
        throw sdk::CheckpointError(file.string() + ": resume.frozen_format is not a string",
                                   "the checkpoint is damaged; use an earlier one");
      t.frozen_format = j.at("frozen_format").get<std::string>();
    }
    return t;
  }
  // Written before the entry existed: the run's resolved config says the same.
  const auto it = metadata.find("config");
  if (it == metadata.end()) return t;
  try {
    const auto config = Config::from_string(it->second, file.string() + " (its config)");
    t.batch_size = config_int(config, "data", "batch_size");
    t.accumulate = config_int(config, "run", "accumulate");
    t.schedule_steps = config_int(config, "run", "steps");
  } catch (const std::exception&) {
    return {};  // a config this build cannot read: nothing to check against
  }
  t.frozen.emplace();           // written before parameters could be frozen
  t.lora = "none";              // or have adapters
  t.frozen_format = "compute";  // or be stored as NF4
  return t;
}

std::vector<std::string> changed_policy_options(const std::map<std::string, std::string>& metadata,
                                                const Experiment& e) {
  const auto it = metadata.find("config");
  const auto config = recorded_config(metadata);
  if (!config) return {};
  try {
    const auto policy = section_selector(
        *config, "precision", "policy", "",
        host_tables_given_as_arrays(*config, "precision", {"override", "escalate"}));
    if (policy != e.policy_name) return {};  // a switch: restore_policy says so
  } catch (const std::exception&) {
    return {};  // a config this build cannot read: nothing to compare
  }
  // Every [precision] value but the policy's name, whichever policy: the resolved config holds
  // them all, defaults included. A key of one side only was written before it existed, except in
  // an override or [precision.escalate], where one side's key is one side's entry.
  const std::string now = resolved_toml(e);
  const auto entries = [](std::string_view key) {
    return key.starts_with("precision.override[") || key.starts_with("precision.escalate");
  };
  auto changed = changed_values(
      it->second, now,
      [&](std::string_view key) {
        return key.starts_with("precision.") && key != "precision.policy" && !entries(key);
      },
      /*one_sided=*/false);
  // An entry one side lacks is named once, with the values it set: "precision.override[0] =
  // (none) -> {layers = \"head\", weight = \"fp32\"}".
  std::vector<std::string> whole;  // "precision.override[0]", in order
  std::map<std::string, std::pair<std::string, std::string>> sides;
  for (const auto& c : changed_values(it->second, now, entries, /*one_sided=*/true)) {
    const auto eq = c.find(" = "), arrow = c.find(" -> ", eq);
    const std::string key = c.substr(0, eq), was = c.substr(eq + 3, arrow - eq - 3),
                      is = c.substr(arrow + 4);
    const auto close = key.find("].");
    if (close == std::string::npos || (was != "(none)" && is != "(none)")) {
      changed.push_back(c);
      continue;
    }
    const std::string entry = key.substr(0, close + 1), field = key.substr(close + 2);
    if (!sides.count(entry)) whole.push_back(entry);
    auto& [a, b] = sides[entry];
    auto& side = was == "(none)" ? b : a;
    const std::string& value = was == "(none)" ? is : was;
    if (value != "\"\"") side += (side.empty() ? "" : ", ") + field + " = " + value;
  }
  for (const auto& entry : whole) {
    const auto& [a, b] = sides[entry];
    changed.push_back(entry + " = " + (a.empty() ? "(none)" : "{" + a + "}") + " -> " +
                      (b.empty() ? "(none)" : "{" + b + "}"));
  }
  return changed;
}

std::vector<std::string> changed_update_options(const std::map<std::string, std::string>& metadata,
                                                const Experiment& e) {
  const auto recorded = recorded_config(metadata);
  if (!recorded) return {};
  const Config& config = *recorded;
  std::vector<std::string> changed;
  try {
    const auto never = [](const std::string&) { return false; };
    // Another optimizer or scaler starts afresh or is refused (checkpoint_load.cpp): only the
    // same one's options compare.
    if (section_selector(config, "optimizer", "type", "", {"milestones"}) == e.optimizer_type)
      collect_changed(
          config.table_options("optimizer." + e.optimizer_type), e.optimizer_options.effective(),
          "optimizer." + e.optimizer_type + ".",
          [](const std::string& key) { return key == "lr"; },  // changed_schedule's
          changed);
    collect_changed(config.table_options("optimizer", {"milestones"}),
                    {{"clip_grad_norm", e.schedule.clip_grad_norm}}, "optimizer.", never, changed);
    // A scaler's starting scale is not a setting of the steps to come: the dynamic scaler resumes
    // from its saved scale whatever init_scale says (calibrate's --merge file sets one), and the
    // static scaler says itself when its scale changed.
    if (section_selector(config, "scaler", "type", "") == e.scaler_type)
      collect_changed(
          config.table_options("scaler." + e.scaler_type), e.scaler_options.effective(),
          "scaler." + e.scaler_type + ".",
          [](const std::string& key) { return key == "init_scale" || key == "scale"; }, changed);
  } catch (const std::exception&) {
    return {};  // a config this build cannot read: nothing to compare
  }
  return changed;
}

std::optional<double> saved_ema_decay(const std::map<std::string, std::string>& metadata) {
  const auto config = recorded_config(metadata);
  if (!config) return std::nullopt;
  try {
    for (const auto& o : config->table_options("ema"))
      if (o.key == "decay") return as_number(o.value);
  } catch (const std::exception&) {  // unreadable: nothing recorded
  }
  return std::nullopt;
}

std::optional<ScheduleChange> changed_schedule(const std::map<std::string, std::string>& metadata,
                                               const Experiment& e, const LrSchedule& now,
                                               std::int64_t schedule_steps) {
  const auto recorded = recorded_config(metadata);
  if (!recorded) return std::nullopt;
  const Config& config = *recorded;
  ScheduleChange change{{}, now};
  LrSchedule& was = change.was;
  if (schedule_steps > 0) was.total_steps = schedule_steps;
  try {
    const auto saved = config.table_options("optimizer", {"milestones"});
    // The recorded value of `key` into `field` (left as it is when the config has none: written
    // before the key existed), and the change when it is not `current`'s.
    const auto number = [&](const std::string& key, const sdk::OptionValue& current,
                            double& field) {
      const auto o = std::find_if(saved.begin(), saved.end(),
                                  [&](const sdk::RawOption& r) { return r.key == key; });
      const auto value = o == saved.end() ? std::nullopt : as_number(o->value);
      if (!value) return;
      field = *value;
      if (*value != as_number(current))
        change.changed.push_back("optimizer." + key + " = " +
                                 sdk::option_value_to_string(o->value) + " -> " +
                                 sdk::option_value_to_string(current));
    };
    const auto integer = [&](const std::string& key, std::int64_t current, std::int64_t& field) {
      double value = static_cast<double>(current);
      number(key, current, value);
      field = static_cast<std::int64_t>(value);
    };
    for (const auto& o : saved) {
      if (o.key != "schedule" || !std::holds_alternative<std::string>(o.value)) continue;
      const auto& name = std::get<std::string>(o.value);
      const auto* kind = find_choice(name, kLrScheduleKinds);
      if (kind == nullptr) return std::nullopt;  // a schedule this build does not know
      was.kind = *kind;
      if (*kind != now.kind)
        change.changed.push_back("optimizer.schedule = \"" + name + "\" -> \"" +
                                 lr_schedule_name(now.kind) + "\"");
    }
    integer("warmup_steps", now.warmup_steps, was.warmup_steps);
    number("min_lr", now.min_lr, was.min_lr);
    integer("step_size", now.step_size, was.step_size);
    number("gamma", now.gamma, was.gamma);
    number("pct_start", now.pct_start, was.pct_start);
    number("div_factor", now.div_factor, was.div_factor);
    number("final_div_factor", now.final_div_factor, was.final_div_factor);
    if (config.is_array("optimizer.milestones")) {
      was.milestones = config.integer_array("optimizer.milestones");
      if (was.milestones != now.milestones) {
        const auto list = [](const std::vector<std::int64_t>& v) {
          std::string out;
          for (const auto m : v) out += (out.empty() ? "" : ", ") + std::to_string(m);
          return "[" + out + "]";
        };
        change.changed.push_back("optimizer.milestones = " + list(was.milestones) + " -> " +
                                 list(now.milestones));
      }
    }
    // The peak rate is the optimizer's own option, compared when the optimizer is the same one.
    const auto type = std::find_if(saved.begin(), saved.end(),
                                   [](const sdk::RawOption& r) { return r.key == "type"; });
    if (type != saved.end() && type->value == sdk::OptionValue(e.optimizer_type)) {
      const auto options = config.table_options("optimizer." + e.optimizer_type);
      const auto lr = std::find_if(options.begin(), options.end(),
                                   [](const sdk::RawOption& r) { return r.key == "lr"; });
      if (const auto value = lr == options.end() ? std::nullopt : as_number(lr->value)) {
        was.base_lr = *value;
        if (was.base_lr != now.base_lr)
          change.changed.push_back("optimizer." + e.optimizer_type +
                                   ".lr = " + sdk::option_value_to_string(lr->value) + " -> " +
                                   sdk::option_value_to_string(now.base_lr));
      }
    }
  } catch (const std::exception&) {
    return std::nullopt;  // a config this build cannot read: nothing to compare
  }
  if (change.changed.empty()) return std::nullopt;
  return change;
}

std::string start_from_weights_route(const Experiment& e, const std::filesystem::path& checkpoint,
                                     bool merge_lora) {
  const std::string merge = merge_lora ? " --merge-lora" : "";
  // A run's config.toml records from_pretrained as its weights in the gpt2 layout.
  if (e.from_pretrained.enabled() || e.checkpoint.init_layout == WeightLayout::gpt2)
    return std::string(merge_lora ? "fold the adapters into the weights of a Hugging Face folder"
                                  : "write the weights as a Hugging Face folder") +
           " (mixtrain export " + checkpoint.string() + merge +
           " --layout hf --out start-hf), then [model] from_pretrained = \"start-hf\" in place "
           "of the config's initial weights";
  if (!merge_lora) return "checkpoint.init_from = \"" + checkpoint.string() + "\"";
  return "fold the adapters into the weights first (mixtrain export " + checkpoint.string() +
         merge +
         " --format safetensors --out merged.safetensors), then checkpoint.init_from = "
         "\"merged.safetensors\"";
}

namespace {
// LoRA terms as a message prints them: the "%.17g" numbers checkpoints store (and compare as
// text) in the shortest form that reads back the same, "dropout = 0.10000000000000001" as 0.1.
std::string readable_lora_terms(std::string terms) {
  for (const std::string_view key : {"alpha = ", "dropout = "}) {
    const auto at = terms.find(key);
    if (at == std::string::npos) continue;
    const std::size_t begin = at + key.size();
    const std::size_t end = std::min(terms.find(',', begin), terms.size());
    double v = 0;
    const auto [read, read_ec] = std::from_chars(terms.data() + begin, terms.data() + end, v);
    if (read_ec != std::errc() || read != terms.data() + end) continue;
    char shortest[32];
    const auto [wrote, ec] = std::to_chars(shortest, shortest + sizeof shortest, v);
    if (ec == std::errc()) terms.replace(begin, end - begin, std::string(shortest, wrote));
  }
  return terms;
}
}  // namespace

void keep_lora_terms(const ResumeTerms& terms, const Experiment& e,
                     const std::filesystem::path& file) {
  auto lora_text = [](const std::string& t) {
    return t == "none" ? std::string("no LoRA") : "LoRA " + readable_lora_terms(t);
  };
  if (const std::string now = lora_terms(e.model.lora); terms.lora && *terms.lora != now)
    throw sdk::CheckpointError(
        file.string() + ": the run was trained with " + lora_text(*terms.lora) + ", this one has " +
            lora_text(now),
        "a resumed run keeps its adapters: resume with the [model.lora] the run was trained with "
        "(its config.toml holds it), or start a new run from these weights: " +
            // Its adapters fit no other [model.lora]: folded into the weights, they carry over.
            start_from_weights_route(e, file, *terms.lora != "none"));
}

void keep_frozen_format(const ResumeTerms& terms, const Experiment& e,
                        const std::filesystem::path& file) {
  const std::string now = frozen_format_terms(e.model.freeze);
  if (!terms.frozen_format || *terms.frozen_format == now) return;
  throw sdk::CheckpointError(
      file.string() + ": the run was trained with train.frozen_format = " + *terms.frozen_format +
          ", this one has train.frozen_format = " + now,
      "a resumed run keeps its frozen base as it was stored: resume with the [train] "
      "frozen_format and frozen_block_size the run was trained with (its config.toml holds "
      "them), or start a new run from these weights (checkpoint.init_from = the checkpoint)");
}

void keep_resume_terms(const ResumeTerms& terms, const Experiment& e,
                       const std::vector<std::string>& frozen, LrSchedule& schedule,
                       std::int64_t applied, sdk::Logger& log, const std::filesystem::path& file) {
  auto refuse = [&](const std::string& key, std::int64_t was, std::int64_t now) {
    throw sdk::CheckpointError(
        file.string() + ": the run was trained with " + key + " = " + std::to_string(was) +
            ", this one has " + key + " = " + std::to_string(now),
        "a resumed run keeps its batches: resume with --set " + key + "=" + std::to_string(was) +
            ", or start a new run from these weights (checkpoint.init_from = the checkpoint)");
  };
  if (terms.batch_size > 0 && terms.batch_size != e.data.batch_size)
    refuse("data.batch_size", terms.batch_size, e.data.batch_size);
  if (terms.accumulate > 0 && terms.accumulate != e.run.accumulate)
    refuse("run.accumulate", terms.accumulate, e.run.accumulate);
  if (terms.frozen && *terms.frozen != frozen) {
    std::string change;
    if (const auto now = missing_from(frozen, *terms.frozen); !now.empty())
      change += "; frozen now, trained then: " + names_text(now);
    if (const auto then = missing_from(*terms.frozen, frozen); !then.empty())
      change += "; trained now, frozen then: " + names_text(then);
    throw sdk::CheckpointError(
        file.string() + ": the run was trained with " + frozen_text(*terms.frozen) +
            ", this one has " + frozen_text(frozen) + change,
        "a resumed run keeps what trains (the optimizer's state is per trainable parameter): "
        "resume with the [train] trainable / frozen the run was trained with (its config.toml "
        "holds them), or start a new run from these weights (checkpoint.init_from = the "
        "checkpoint)");
  }
  if (terms.schedule_steps == 0 || terms.schedule_steps == e.run.steps) return;

  LrSchedule kept = schedule, stretched = schedule;
  kept.total_steps = terms.schedule_steps;
  stretched.total_steps = e.run.steps;
  // Only a schedule that ends somewhere has a horizon to keep or stretch; with no step left, the
  // choice changes nothing either.
  if (!lr_schedule_has_horizon(schedule.kind) || applied >= e.run.steps) {
    schedule = e.run.stretch_schedule ? stretched : kept;
    return;
  }
  const std::string horizon = std::to_string(terms.schedule_steps);
  const std::string steps = "run.steps = " + std::to_string(e.run.steps);
  if (e.run.stretch_schedule) {
    schedule = stretched;
    log.warn("resuming with " + steps + " (the checkpoint's schedule spans " + horizon +
             " steps): run.stretch_schedule re-plans the " + lr_schedule_name(schedule.kind) +
             " schedule over " + std::to_string(e.run.steps) + " steps, so the next step's lr is " +
             lr_text(stretched.lr_at(applied)) + " where the kept horizon gives " +
             lr_text(kept.lr_at(applied)));
  } else {
    schedule = kept;
    log.warn(
        "resuming with " + steps + ": the " + lr_schedule_name(schedule.kind) +
        " schedule keeps the checkpoint's horizon of " + horizon + " steps (next lr " +
        lr_text(kept.lr_at(applied)) + "); set run.stretch_schedule = true to re-plan it over " +
        std::to_string(e.run.steps) + " steps (next lr " + lr_text(stretched.lr_at(applied)) + ")");
  }
}

}  // namespace mixtrain::core
