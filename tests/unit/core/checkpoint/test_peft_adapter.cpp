// PEFT's adapter folder read (core/checkpoint/peft_adapter.h): a LoraConfig's r, alpha, dropout
// and targets; PEFT 0.4's target rule (a list by name suffix, a string as a whole-name regular
// expression); the module and tensor names of a node; and every field that would make the adapter
// compute something else refused by name. The folder: a pickle-only or weight-less one refused
// with the way to save safetensors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "mixtrain/core/checkpoint/peft_adapter.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

using Json = nlohmann::json;

// PEFT 0.4's save_pretrained of a GPT-2 LoraConfig.
Json lora_config() {
  return Json::parse(R"({"base_model_name_or_path": "gpt2", "bias": "none",
    "fan_in_fan_out": true, "inference_mode": true, "init_lora_weights": true,
    "layers_pattern": null, "layers_to_transform": null, "lora_alpha": 16.0,
    "lora_dropout": 0.05, "modules_to_save": null, "peft_type": "LORA", "r": 8,
    "revision": null, "target_modules": ["c_attn", "c_proj"], "task_type": "CAUSAL_LM"})");
}

// The message of the ConfigError parsing `c` raises; "" when it parses.
std::string refusal(const Json& c) {
  try {
    parse_peft_adapter_config(c.dump(), "a/adapter_config.json");
  } catch (const sdk::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(PeftAdapter, ReadsALoraConfigAndAdaptsAsPeftDoes) {
  const auto c = parse_peft_adapter_config(lora_config().dump(), "a/adapter_config.json");
  EXPECT_EQ(c.r, 8);
  EXPECT_EQ(c.alpha, 16.0);
  EXPECT_EQ(c.dropout, 0.05);
  EXPECT_EQ(c.base_model, "gpt2");
  // A list adapts every module whose name ends with an entry (PEFT 0.4: str.endswith).
  EXPECT_TRUE(peft_targets(c, "transformer.h.0.attn.c_attn"));
  EXPECT_TRUE(peft_targets(c, "transformer.h.11.mlp.c_proj"));
  EXPECT_FALSE(peft_targets(c, "transformer.h.0.mlp.c_fc"));
  EXPECT_FALSE(peft_targets(c, "lm_head"));
  // A string is a regular expression over the whole name.
  auto regex = lora_config();
  regex["target_modules"] = R"(.*\.h\.[01]\.attn\.c_attn)";
  const auto r = parse_peft_adapter_config(regex.dump(), "a/adapter_config.json");
  EXPECT_TRUE(peft_targets(r, "transformer.h.1.attn.c_attn"));
  EXPECT_FALSE(peft_targets(r, "transformer.h.2.attn.c_attn"));
  EXPECT_FALSE(peft_targets(r, "transformer.h.1.attn.c_attn.x"));  // matched whole, not searched
  // Absent and null dropouts are PEFT's 0; newer PEFT's fields at their defaults are accepted.
  auto newer = lora_config();
  newer.erase("lora_dropout");
  newer["use_rslora"] = false;
  newer["use_dora"] = false;
  newer["rank_pattern"] = Json::object();
  newer["alpha_pattern"] = Json::object();
  newer["layer_replication"] = nullptr;
  EXPECT_EQ(parse_peft_adapter_config(newer.dump(), "a").dropout, 0.0);

  EXPECT_EQ(peft_module_name("h.0.attn.c_attn", true), "transformer.h.0.attn.c_attn");
  EXPECT_EQ(peft_module_name("lm_head", true), "lm_head");
  EXPECT_EQ(peft_module_name("fc1", false), "fc1");
  EXPECT_EQ(peft_tensor_name("transformer.h.0.attn.c_attn", LoraFactor::a),
            "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
  EXPECT_EQ(peft_tensor_name("fc1", LoraFactor::b), "base_model.model.fc1.lora_B.weight");
}

TEST(PeftAdapter, WhatChangesTheAdaptersFunctionIsRefusedByName) {
  const auto with = [](const char* field, Json value) {
    auto c = lora_config();
    c[field] = std::move(value);
    return refusal(c);
  };
  EXPECT_EQ(refusal(lora_config()), "");
  EXPECT_NE(with("peft_type", "IA3").find("peft_type"), std::string::npos);
  EXPECT_NE(with("r", 0).find("'r'"), std::string::npos);
  EXPECT_NE(with("r", 2.5).find("expected an integer"), std::string::npos);
  EXPECT_NE(with("r", 4.2e68).find("expected an integer"), std::string::npos);  // no int64 holds it
  EXPECT_NE(with("lora_alpha", "16").find("expected a number"), std::string::npos);
  EXPECT_NE(with("lora_alpha", 0).find("expected > 0"), std::string::npos);
  EXPECT_NE(with("lora_dropout", 1.0).find("[0, 1)"), std::string::npos);
  EXPECT_NE(with("target_modules", nullptr).find("target_modules"), std::string::npos);
  EXPECT_NE(with("target_modules", Json::array({1})).find("module names"), std::string::npos);
  EXPECT_NE(with("target_modules", "(unclosed").find("regular expression"), std::string::npos);
  // An expression the regex engine would overflow the stack compiling, or backtrack
  // exponentially matching, is refused (a back-reference needs the backtracking matcher).
  EXPECT_NE(with("target_modules", std::string(50000, '(') + "c_attn" + std::string(50000, ')'))
                .find("more than the 1000 read here"),
            std::string::npos);
  EXPECT_NE(with("target_modules", R"((c_)\1attn)").find("cannot be read here"), std::string::npos);
  EXPECT_NE(with("target_modules", R"((c_)\22222222222222222222attn)").find("more than 9 digits"),
            std::string::npos);
  EXPECT_NE(with("target_modules", "a{99999999999999999999}").find("more than 9 digits"),
            std::string::npos);
  {
    auto c = lora_config();
    c["target_modules"] = "(a|a)*(a|a)*(a|a)*(a|a)*(a|a)*(a|a)*(a|a)*(a|a)*b";
    const auto exponential = parse_peft_adapter_config(c.dump(), "a");
    EXPECT_FALSE(peft_targets(exponential, std::string(60, 'a')));  // polynomial: returns
  }
  // A nested value is quoted by its kind; a file nested deep enough to overflow nlohmann's
  // recursive copies and printers is refused before any.
  EXPECT_NE(with("target_modules", Json::parse(R"([[["c_attn"]]])"))
                .find("holds a nested list of 1 entry"),
            std::string::npos);
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  try {  // the text by hand: dump() itself would overflow
    parse_peft_adapter_config(
        R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": )" + deep + "}", "a");
    ADD_FAILURE() << "a nested target_modules parsed";
  } catch (const sdk::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nests deeper than 32 levels"), std::string::npos)
        << e.what();
  }
  // Python's anchors would be read as letters.
  EXPECT_NE(with("target_modules", R"(\A.*c_attn\Z)").find("Python's alone"), std::string::npos);
  EXPECT_NE(with("bias", "all").find("trained biases"), std::string::npos);
  for (const auto& [field, value] :
       std::vector<std::pair<const char*, Json>>{{"modules_to_save", Json::array({"lm_head"})},
                                                 {"layers_to_transform", Json::array({0})},
                                                 {"rank_pattern", Json{{"c_attn", 4}}},
                                                 {"alpha_pattern", Json{{"c_attn", 4}}},
                                                 {"use_rslora", true},
                                                 {"use_dora", true},
                                                 {"exclude_modules", Json::array({"c_fc"})}}) {
    const std::string message = with(field, value);
    EXPECT_NE(message.find(field), std::string::npos) << field << ": " << message;
  }
  auto missing = lora_config();
  missing.erase("r");
  EXPECT_NE(refusal(missing).find("absent"), std::string::npos);
  EXPECT_THROW(parse_peft_adapter_config("not json", "a"), sdk::ConfigError);
  // nlohmann throws out_of_range, not parse_error, for a number no double holds.
  EXPECT_THROW(parse_peft_adapter_config(R"({"r": 1e99999})", "a"), sdk::ConfigError);
  EXPECT_THROW(parse_peft_adapter_config("[1]", "a"), sdk::ConfigError);
}

TEST(PeftAdapter, AFolderWithoutSafetensorsWeightsSaysHowToSaveThem) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("peft-adapter-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto message = [&] {
    try {
      open_peft_adapter(dir);
    } catch (const sdk::UserError& e) {
      return std::string(e.what()) + " | " + e.hint();
    }
    return std::string();
  };
  EXPECT_NE(message().find("does not exist"), std::string::npos);
  fs::create_directories(dir);
  EXPECT_NE(message().find("has no adapter_config.json"), std::string::npos);
  std::ofstream(dir / "adapter_config.json") << lora_config().dump();
  EXPECT_NE(message().find("has no adapter_model.safetensors"), std::string::npos);
  std::ofstream(dir / "adapter_model.bin") << "pickle";
  EXPECT_NE(message().find("a Python pickle"), std::string::npos);
  EXPECT_NE(message().find("safe_serialization=True"), std::string::npos);
  std::ofstream(dir / "adapter_model.safetensors") << "x";
  const auto opened = open_peft_adapter(dir);
  EXPECT_EQ(opened.weights_file, dir / "adapter_model.safetensors");
  EXPECT_EQ(opened.config.r, 8);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mixtrain::core
