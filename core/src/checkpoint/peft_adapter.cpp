// PEFT's LoRA adapter folder; see checkpoint/peft_adapter.h for the contract.
#include "mixtrain/core/checkpoint/peft_adapter.h"

#include <cmath>
#include <regex>

#include <nlohmann/json.hpp>

#include "checkpoint/saved_folder.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace {

using Json = nlohmann::json;

constexpr std::string_view kGptModulePrefix = "transformer.";

const char* kResave =
    "PEFT writes LoraConfig's fields in adapter_config.json: save the adapter again with "
    "PeftModel.save_pretrained, or correct the field by hand";

const char* kSaveSafetensors =
    "save it again as safetensors: PeftModel.save_pretrained(folder, safe_serialization=True) "
    "(in the Python peers venv, ~/.cache/mixtrain/peers)";

// The regular expressions a target_modules string is read as: libstdc++'s compiler recurses per
// character and its default matcher backtracks, so an adapter's file could overflow the stack or
// take exponential time. Names are matched by the polynomial (breadth-first) matcher, and an
// expression longer than any target list needs is refused.
constexpr std::size_t kMaxTargetRegex = 1000;
std::regex target_regex(const std::string& pattern) {
  return std::regex(pattern, std::regex::ECMAScript | std::regex_constants::__polynomial);
}

// Whether a field is absent or says "nothing": null, false, an empty list or object.
bool says_nothing(const Json& c, const char* field) {
  const auto it = c.find(field);
  if (it == c.end() || it->is_null()) return true;
  if (it->is_boolean()) return !it->get<bool>();
  if (it->is_array() || it->is_object()) return it->empty();
  return false;
}

double read_number(const Json& c, const char* field, const sdk::SourceLocation& at) {
  const auto it = c.find(field);
  if (it == c.end())
    throw sdk::ConfigError(at, field, "absent",
                           "PEFT writes r, lora_alpha and target_modules in adapter_config.json; "
                           "save the adapter again with save_pretrained");
  if (!it->is_number())
    throw sdk::ConfigError(at, field, "expected a number, got " + json_shown(*it), kResave);
  return it->get<double>();
}

}  // namespace

std::string peft_adapter_route(const std::string& folder) {
  return "start a run's adapters from it with [model.lora] from_peft = \"" +
         (folder.empty() ? std::string(".") : folder) +
         "\", beside the base model it was trained on ([model] from_pretrained), or merge it in "
         "PEFT (PeftModel.from_pretrained(base, adapter).merge_and_unload().save_pretrained("
         "\"merged\", safe_serialization=True)) and start from that folder ([model] "
         "from_pretrained = \"merged\")";
}

PeftAdapterConfig parse_peft_adapter_config(std::string_view text, const std::string& origin) {
  const sdk::SourceLocation at{origin, 0, 0};
  const Json c = parse_saved_config<Json>(
      text, at, "a PEFT adapter_config.json is a JSON object (save_pretrained writes it)");
  if (!c.is_object())
    throw sdk::ConfigError(at, "", "expected a JSON object, got " + std::string(c.type_name()),
                           "a PEFT adapter_config.json is a JSON object of LoraConfig's fields");
  const auto type = c.find("peft_type");
  if (type == c.end() || *type != "LORA")
    throw sdk::ConfigError(
        at, "peft_type",
        (type == c.end() ? std::string("absent") : "is " + json_shown(*type)) +
            ": mixtrain reads LoRA adapters (peft_type \"LORA\") only",
        "train the adapter with PEFT's LoraConfig, or merge it into its base model in PEFT "
        "(merge_and_unload) and start from that folder ([model] from_pretrained)");

  PeftAdapterConfig out;
  const double r = read_number(c, "r", at);
  // In range before the integer cast: a double past int64's is undefined behaviour to convert.
  if (!(r >= 1 && r <= 65536) || r != std::floor(r))
    throw sdk::ConfigError(at, "r", "is " + c["r"].dump() + ", expected an integer in [1, 65536]",
                           kResave);
  out.r = static_cast<std::int64_t>(r);
  out.alpha = read_number(c, "lora_alpha", at);
  if (!(out.alpha > 0))
    throw sdk::ConfigError(at, "lora_alpha", "is " + c["lora_alpha"].dump() + ", expected > 0",
                           kResave);
  if (const auto it = c.find("lora_dropout"); it != c.end() && !it->is_null()) {
    out.dropout = read_number(c, "lora_dropout", at);
    if (!(out.dropout >= 0 && out.dropout < 1))
      throw sdk::ConfigError(at, "lora_dropout",
                             "is " + json_shown(*it) + ", expected a number in [0, 1)", kResave);
  }

  const auto targets = c.find("target_modules");
  if (targets == c.end() || targets->is_null() || targets->empty())
    throw sdk::ConfigError(
        at, "target_modules",
        targets == c.end() ? std::string("absent") : "is " + json_shown(*targets),
        "PEFT writes the modules it adapted in target_modules; save the "
        "adapter again with save_pretrained");
  out.targets_text = json_shown(*targets);
  if (targets->is_string()) {
    out.target_regex = targets->get<std::string>();
    if (out.target_regex->size() > kMaxTargetRegex)
      throw sdk::ConfigError(
          at, "target_modules",
          "is a regular expression of " + std::to_string(out.target_regex->size()) +
              " characters, more than the " + std::to_string(kMaxTargetRegex) + " read here",
          "give target_modules as a list of module names");
    // Python's anchors, which ECMAScript reads as the letters A and Z.
    for (const char* anchor : {"\\A", "\\Z", "\\z"})
      if (out.target_regex->find(anchor) != std::string::npos)
        throw sdk::ConfigError(at, "target_modules",
                               "is the regular expression " + json_shown(*targets) + ", whose " +
                                   anchor + " is Python's alone",
                               "drop it: the expression is matched against whole module names "
                               "(re.fullmatch), so it is anchored already");
    // libstdc++ reads a count or back-reference number into a long without an overflow check
    // (undefined behaviour past 19 digits): a number of more than 9 digits is no module's.
    std::size_t digits = 0;
    for (const char ch : *out.target_regex) {
      digits = ch >= '0' && ch <= '9' ? digits + 1 : 0;
      if (digits > 9)
        throw sdk::ConfigError(at, "target_modules",
                               "is a regular expression with a number of more than 9 digits",
                               "give target_modules as a list of module names");
    }
    try {
      // A match, too: the polynomial matcher refuses back-references only when it runs.
      std::regex_match(std::string(), target_regex(*out.target_regex));
    } catch (const std::regex_error& e) {
      throw sdk::ConfigError(at, "target_modules",
                             "is the regular expression " + json_shown(*targets) +
                                 ", which cannot be read here: " + e.what(),
                             "give target_modules as a list of module names");
    }
  } else if (targets->is_array()) {
    for (const auto& t : *targets) {
      if (!t.is_string() || t.get<std::string>().empty())
        throw sdk::ConfigError(at, "target_modules",
                               "holds " + json_shown(t) + ", expected module names",
                               "give target_modules as a list of module names");
      out.target_names.push_back(t.get<std::string>());
    }
  } else {
    throw sdk::ConfigError(at, "target_modules",
                           "is " + json_shown(*targets) +
                               ", expected a list of module names or a "
                               "regular expression",
                           kResave);
  }

  if (const auto bias = c.find("bias"); bias != c.end() && !bias->is_null() && *bias != "none")
    throw sdk::ConfigError(at, "bias",
                           "is " + json_shown(*bias) +
                               ": the adapter trained biases of the base model, which mixtrain's "
                               "adapters do not carry",
                           "train the adapter with bias = \"none\", or merge it into its base "
                           "model in PEFT (merge_and_unload) and start from that folder ([model] "
                           "from_pretrained)");
  // Each of these adapts modules otherwise, or stores tensors beside lora_A and lora_B.
  static constexpr const char* kUnsupported[] = {
      "modules_to_save", "layers_to_transform", "exclude_modules", "layer_replication",
      "rank_pattern",    "alpha_pattern",       "use_rslora",      "use_dora",
      "lora_bias",       "target_parameters"};
  for (const char* field : kUnsupported)
    if (!says_nothing(c, field))
      throw sdk::ConfigError(at, field,
                             "is " + json_shown(c[field]) +
                                 ": mixtrain's adapters are lora_A and lora_B alone, one r and "
                                 "one alpha, on every module target_modules names",
                             "merge the adapter into its base model in PEFT "
                             "(PeftModel.from_pretrained(base, adapter).merge_and_unload()"
                             ".save_pretrained(\"merged\", safe_serialization=True)) and start "
                             "from that folder ([model] from_pretrained = \"merged\")");
  if (const auto base = c.find("base_model_name_or_path"); base != c.end() && base->is_string())
    out.base_model = base->get<std::string>();
  return out;
}

PeftAdapterFolder open_peft_adapter(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string text = read_saved_folder_config(
      folder, kPeftConfigFile,
      "name a PEFT adapter folder (adapter_config.json and adapter_model.safetensors, as "
      "PeftModel.save_pretrained writes it)",
      "a PEFT adapter folder holds adapter_config.json beside its weights "
      "(PeftModel.save_pretrained writes both)");
  PeftAdapterFolder out;
  out.config_file = folder / kPeftConfigFile;
  out.weights_file = folder / kPeftWeightsFile;
  out.config = parse_peft_adapter_config(text, out.config_file.string());
  if (fs::is_regular_file(out.weights_file, ec)) return out;
  if (fs::exists(folder / kPeftPickleWeightsFile, ec))
    throw sdk::UserError(folder.string() + " holds its weights only in " +
                             std::string(kPeftPickleWeightsFile) +
                             ", a Python pickle, which mixtrain does not read (unpickling runs "
                             "arbitrary code)",
                         kSaveSafetensors);
  throw sdk::UserError(folder.string() + " has no " + std::string(kPeftWeightsFile),
                       std::string("PEFT keeps the adapter's weights in adapter_model.safetensors "
                                   "beside adapter_config.json; ") +
                           kSaveSafetensors);
}

std::string peft_base_model_text(const PeftAdapterConfig& config) {
  return config.base_model.empty() ? std::string("the base model it was trained on")
                                   : "the base model it was trained on (its "
                                     "base_model_name_or_path: \"" +
                                         config.base_model + "\")";
}

bool peft_targets(const PeftAdapterConfig& config, const std::string& module) {
  if (config.target_regex) return std::regex_match(module, target_regex(*config.target_regex));
  for (const auto& t : config.target_names)
    if (module.ends_with(t)) return true;
  return false;
}

std::string peft_module_name(const std::string& node, bool gpt) {
  return gpt && node != "lm_head" ? std::string(kGptModulePrefix) + node : node;
}

std::string peft_tensor_name(const std::string& module, LoraFactor factor) {
  return std::string(kPeftTensorPrefix) + module +
         (factor == LoraFactor::a ? ".lora_A.weight" : ".lora_B.weight");
}

}  // namespace mixtrain::core
