// The option schemas of the keys the host itself reads from a config: [run], [data] (common keys
// and one schema per data source), the host's keys in [optimizer] and [checkpoint], model layers
// and [[precision.override]]. Plugins declare their own schemas; these are the core's.
//
// Each schema is a declared list (name, type, range, default, doc), so unknown keys get a
// "did you mean" and resolved configs list every effective value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/config/setting_choices.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

// The default `schema` declares for `key`. The settings structs (config/experiment.h,
// train/lr_schedule.h) initialise their members from these, so each default is written once, in
// the schema. A key the schema does not declare, or declares without a default of that type, is
// std::logic_error.
std::int64_t schema_default_int(const sdk::OptionSchema& schema, std::string_view key);
double schema_default_number(const sdk::OptionSchema& schema, std::string_view key);
bool schema_default_bool(const sdk::OptionSchema& schema, std::string_view key);
std::string schema_default_string(const sdk::OptionSchema& schema, std::string_view key);
template <class E, std::size_t N>
E schema_default_choice(const sdk::OptionSchema& schema, std::string_view key,
                        const ChoiceTable<E, N>& table) {
  if (const E* value = find_choice(schema_default_string(schema, key), table)) return *value;
  throw std::logic_error("schema_default_choice: the default of " + std::string(key) +
                         " is not one of its choices");
}

sdk::OptionSchema run_schema();
// run.metrics' choices: the names of kMetricsSinks (runs/metrics_log.h opens them).
const std::vector<std::string>& metrics_sinks();
sdk::OptionSchema ema_schema();   // [ema]
sdk::OptionSchema eval_schema();  // [eval]
// [train]: trainable and frozen, lists of parameter patterns (graph/freezing.h).
sdk::OptionSchema train_schema();
sdk::OptionSchema lora_schema();  // [model.lora] (graph/lora.h)
sdk::OptionSchema data_common_schema();
const std::vector<std::string>& data_sources();  // the names of kDataSources
sdk::OptionSchema data_source_schema(DataSource source);
std::string data_source_summary(DataSource source);              // one line, for `describe`
bool is_path_option(DataSource source, const std::string& key);  // file keys
// [data.normalize] and [data.augment]: image tables only. normalize's mean and std are lists of
// numbers, declared here as strings for the key list and read with Config::number_array.
sdk::OptionSchema data_normalize_schema();
sdk::OptionSchema data_augment_schema();
// File keys that also take a list of files (text's path and eval, cifar10's train and eval).
bool is_path_list_option(DataSource source, const std::string& key);
sdk::OptionSchema schedule_schema();         // host keys in [optimizer]
sdk::OptionSchema checkpoint_core_schema();  // host keys in [checkpoint]
sdk::OptionSchema model_schema();            // [model] scalar keys
// [model]'s keys that hold lists (the nodes, the blocks, recompute), read beside its schema: a
// reader of its scalars (Config::table_options) skips them.
const std::vector<std::string>& model_list_keys();
sdk::OptionSchema gpt_preset_schema();       // [model.gpt] (preset = "gpt")
sdk::OptionSchema resnet_preset_schema();    // [model.resnet] (preset = "resnet")
// The ops of the op table (core/src/graph/ops/op_registry.cpp). A node's `inputs` and a reshape's
// `shape` are arrays, read beside these schemas (the sdk's options are scalars).
const std::vector<std::string>& layer_types();
sdk::OptionSchema layer_schema(const std::string& type);
sdk::OptionSchema precision_override_schema();
sdk::OptionSchema escalate_schema();     // [precision.escalate]
sdk::OptionSchema distributed_schema();  // host keys in [distributed]

}  // namespace mixtrain::core
