// A Hugging Face GPT-2 folder (core/checkpoint/hf_folder.h) from named host tensors:
// save_pretrained's names, zero biases for a bias-free model in its dtype, the config.json keys,
// and what is refused: a model that is not the gpt preset, metadata without a head count, heads
// that do not divide the width, a dtype torch has no name for. And back: config.json read as the
// preset's sizes, every field the preset cannot compute refused by name.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/core/checkpoint/hf_folder.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

sdk::HostTensor tensor(std::string name, std::vector<std::int64_t> shape,
                       sdk::DType dtype = sdk::DType::fp32) {
  sdk::HostTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.assign(static_cast<std::size_t>(t.numel()) * sdk::dtype_size(dtype), std::byte{1});
  return t;
}

// A gpt-preset model's weights in the gpt2 layout (Conv1D [in, out]), biases optional.
std::vector<sdk::HostTensor> gpt2_weights(std::int64_t layers, std::int64_t c, bool bias,
                                          sdk::DType dtype = sdk::DType::fp32) {
  std::vector<sdk::HostTensor> out = {tensor("wte.weight", {10, c}, dtype),
                                      tensor("wpe.weight", {6, c}, dtype)};
  auto norm = [&](const std::string& n) {
    out.push_back(tensor(n + ".weight", {c}, dtype));
    out.push_back(tensor(n + ".bias", {c}, dtype));
  };
  auto conv1d = [&](const std::string& n, std::int64_t in, std::int64_t o) {
    out.push_back(tensor(n + ".weight", {in, o}, dtype));
    if (bias) out.push_back(tensor(n + ".bias", {o}, dtype));
  };
  for (std::int64_t i = 0; i < layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    norm(h + "ln_1");
    conv1d(h + "attn.c_attn", c, 3 * c);
    conv1d(h + "attn.c_proj", c, c);
    norm(h + "ln_2");
    conv1d(h + "mlp.c_fc", c, 4 * c);
    conv1d(h + "mlp.c_proj", 4 * c, c);
  }
  norm("ln_f");
  return out;
}

std::map<std::string, std::string> metadata_of(const std::string& model_toml) {
  return {{"mixtrain.config", model_toml}};
}

const char* kGptConfig =
    "[model]\npreset = \"gpt\"\n[model.gpt]\nn_layer = 2\nn_head = 2\n"
    "n_embd = 8\nbias = false\n";

template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const sdk::UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no sdk::UserError";
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(HfFolder, NamesAreSavePretrainedsAndTheConfigStatesTheModel) {
  const auto model = hf_gpt2_model(metadata_of(kGptConfig), "ckpt");
  EXPECT_EQ(model.n_head, 2);
  const auto weights = gpt2_weights(2, 8, true);
  const auto folder = hf_gpt2_folder(weights, model, sdk::DType::fp32, "ckpt");
  ASSERT_EQ(folder.tensors.size(), weights.size());
  for (std::size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(folder.tensors[i].name, "transformer." + weights[i].name);
    EXPECT_EQ(folder.tensors[i].shape, weights[i].shape);
    EXPECT_TRUE(folder.tensors[i].bytes == weights[i].bytes) << weights[i].name;
  }
  EXPECT_TRUE(folder.zero_biases.empty());
  const auto c = nlohmann::json::parse(folder.config_json);
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(c["model_type"], "gpt2");
  EXPECT_EQ(c["n_layer"], 2);
  EXPECT_EQ(c["n_head"], 2);
  EXPECT_EQ(c["n_embd"], 8);
  EXPECT_EQ(c["n_inner"], 32);
  EXPECT_EQ(c["n_positions"], 6);
  EXPECT_EQ(c["n_ctx"], 6);
  EXPECT_EQ(c["vocab_size"], 10);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["activation_function"], "gelu_new");
  EXPECT_EQ(c["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(c["scale_attn_by_inverse_layer_idx"], false);
  EXPECT_EQ(c["torch_dtype"], "float32");
  EXPECT_EQ(c["resid_pdrop"], 0.0);
}

TEST(HfFolder, ABiasFreeModelGetsZeroBiasesInItsDtypeAfterTheirWeights) {
  const auto model = hf_gpt2_model(metadata_of(kGptConfig), "ckpt");
  const auto folder =
      hf_gpt2_folder(gpt2_weights(1, 8, false, sdk::DType::bf16), model, sdk::DType::bf16, "c");
  EXPECT_EQ(folder.zero_biases,
            (std::vector<std::string>{"h.0.attn.c_attn.bias", "h.0.attn.c_proj.bias",
                                      "h.0.mlp.c_fc.bias", "h.0.mlp.c_proj.bias"}));
  for (std::size_t i = 0; i < folder.tensors.size(); ++i) {
    const auto& t = folder.tensors[i];
    if (t.name != "transformer.h.0.mlp.c_fc.bias") continue;
    EXPECT_EQ(folder.tensors[i - 1].name, "transformer.h.0.mlp.c_fc.weight");
    EXPECT_EQ(t.shape, (std::vector<std::int64_t>{32}));
    EXPECT_EQ(t.dtype, sdk::DType::bf16);
    EXPECT_EQ(t.bytes, std::vector<std::byte>(64, std::byte{0}));
  }
  EXPECT_EQ(nlohmann::json::parse(folder.config_json)["torch_dtype"], "bfloat16");
}

TEST(HfFolder, OtherModelsMissingHeadsAndMisfitsAreUserErrors) {
  auto e = user_error_of([] {
    hf_gpt2_model(metadata_of("[model]\npreset = \"resnet\"\n[model.resnet]\nblocks = [1]\n"),
                  "ckpt");
  });
  EXPECT_TRUE(contains(e, "the \"resnet\" preset")) << e;
  e = user_error_of([] { hf_gpt2_model(metadata_of("[model]\nloss = \"mse\"\n"), "ckpt"); });
  EXPECT_TRUE(contains(e, "layers/nodes")) << e;
  e = user_error_of([] { hf_gpt2_model({{"format", "pt"}}, "file.safetensors"); });
  EXPECT_TRUE(contains(e, "no n_head")) << e;
  // A file written elsewhere that states its head count; its own "config" is not read.
  EXPECT_EQ(hf_gpt2_model({{"n_head", "4"}, {"config", "{}"}}, "f").n_head, 4);
  // A mixtrain checkpoint's own metadata names the config "config".
  EXPECT_EQ(hf_gpt2_model({{"mixtrain.state_version", "1"}, {"config", kGptConfig}}, "c").n_head,
            2);

  HfGpt2Model three;
  three.n_head = 3;
  e = user_error_of(
      [&] { hf_gpt2_folder(gpt2_weights(1, 8, true), three, sdk::DType::fp32, "c"); });
  EXPECT_TRUE(contains(e, "not a multiple of n_head 3")) << e;
  HfGpt2Model two;
  two.n_head = 2;
  e = user_error_of(
      [&] { hf_gpt2_folder(gpt2_weights(1, 8, true), two, sdk::DType::fp8_e4m3, "c"); });
  EXPECT_TRUE(contains(e, "not fp8_e4m3")) << e;
}

// ---- config.json -> [model.gpt] sizes -----------------------------------------------------

std::string config_of(std::int64_t n_head) {
  HfGpt2Model model;
  model.n_head = n_head;
  return hf_gpt2_folder(gpt2_weights(3, 8, true), model, sdk::DType::fp32, "ckpt").config_json;
}

// config_of(2) with `edit` applied to its JSON.
template <typename Edit>
std::string edited(Edit&& edit) {
  auto c = nlohmann::json::parse(config_of(2));
  edit(c);
  return c.dump();
}

template <typename F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const sdk::ConfigError& e) {
    return e.full_message();
  }
  ADD_FAILURE() << "no sdk::ConfigError";
  return {};
}

TEST(HfFolder, ReadingAWrittenConfigGivesBackTheSizesUnderPresetNames) {
  const auto config = parse_hf_gpt2_config(config_of(4), "hf/config.json");
  const std::vector<std::tuple<std::string, std::string, std::int64_t>> expected = {
      {"n_layer", "n_layer", 3},
      {"n_head", "n_head", 4},
      {"n_embd", "n_embd", 8},
      {"vocab_size", "vocab_size", 10},
      {"block_size", "n_positions", 6}};
  ASSERT_EQ(config.sizes.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(config.sizes[i].key, std::get<0>(expected[i]));
    EXPECT_EQ(config.sizes[i].field, std::get<1>(expected[i]));
    EXPECT_EQ(config.sizes[i].value, std::get<2>(expected[i])) << config.sizes[i].key;
  }
  EXPECT_TRUE(config.notes.empty());
}

TEST(HfFolder, GPT2ConfigsDefaultsStandInForAbsentFieldsAndDropoutIsOnlyNoted) {
  // What save_pretrained leaves out when it equals PretrainedConfig's default, and a GPT-2
  // checkpoint's dropout.
  const auto config = parse_hf_gpt2_config(
      edited([](nlohmann::json& c) {
        for (const char* f : {"n_ctx", "n_inner", "tie_word_embeddings", "add_cross_attention",
                              "activation_function", "layer_norm_epsilon", "embd_pdrop"})
          c.erase(f);
        c["attn_pdrop"] = 0.1;
      }),
      "hf/config.json");
  EXPECT_EQ(config.sizes[2].value, 8);
  ASSERT_EQ(config.notes.size(), 2u);
  EXPECT_TRUE(contains(config.notes[0], "attn_pdrop = 0.1 is not applied")) << config.notes[0];
  EXPECT_TRUE(contains(config.notes[1], "embd_pdrop = 0.1 (GPT2Config's default)"))
      << config.notes[1];
}

// transformers computes the tanh GELU under two names: "gelu_new" and "gelu_pytorch_tanh"
// (torch's gelu(approximate="tanh")); both are the preset's gelu.
TEST(HfFolder, EitherNameOfTheTanhGeluIsThePresetsGelu) {
  const auto config = parse_hf_gpt2_config(
      edited([](nlohmann::json& c) { c["activation_function"] = "gelu_pytorch_tanh"; }),
      "hf/config.json");
  EXPECT_EQ(config.sizes[2].value, 8);
  EXPECT_TRUE(config.notes.empty());
}

TEST(HfFolder, AConfigThePresetCannotBuildIsRefusedNamingTheFieldAndValue) {
  using Json = nlohmann::json;
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& c) { c["model_type"] = "gpt_neo"; }, "'model_type': is \"gpt_neo\""},
      {[](Json& c) { c.erase("model_type"); }, "'model_type': absent"},
      {[](Json& c) { c.erase("n_embd"); }, "'n_embd': absent"},
      {[](Json& c) { c["n_layer"] = "3"; }, "'n_layer': expected an integer, got \"3\""},
      {[](Json& c) { c["n_layer"] = 3.5; }, "'n_layer': expected an integer, got 3.5"},
      {[](Json& c) { c["vocab_size"] = 0; }, "'vocab_size': is 0, expected at least 1"},
      {[](Json& c) { c["n_layer"] = 5000; }, "'n_layer': value 5000 is out of range"},
      {[](Json& c) { c["n_positions"] = 4000000; }, "'n_positions': value 4000000 is out"},
      {[](Json& c) { c["n_head"] = 3; }, "'n_head': n_embd = 8 is not divisible by n_head = 3"},
      {[](Json& c) { c["n_ctx"] = 12; }, "'n_ctx': is 12 but n_positions is 6"},
      {[](Json& c) { c["n_inner"] = 16; },
       "'n_inner': is 16: the gpt preset's MLP is 4·n_embd = 32"},
      {[](Json& c) { c["activation_function"] = "gelu"; }, "'activation_function': is \"gelu\""},
      {[](Json& c) { c["layer_norm_epsilon"] = 1e-6; }, "'layer_norm_epsilon': is 1e-06"},
      {[](Json& c) { c["scale_attn_by_inverse_layer_idx"] = true; },
       "'scale_attn_by_inverse_layer_idx': is true"},
      {[](Json& c) { c["scale_attn_weights"] = false; }, "'scale_attn_weights': is false"},
      {[](Json& c) { c["tie_word_embeddings"] = false; }, "'tie_word_embeddings': is false"},
      {[](Json& c) { c["add_cross_attention"] = true; }, "'add_cross_attention': is true"},
      {[](Json& c) { c["resid_pdrop"] = "none"; }, "'resid_pdrop': expected a number"},
  };
  // Not a structured binding: clang 14 cannot capture one in a lambda.
  for (const auto& edit_case : cases) {
    const auto& edit = edit_case.first;
    const auto e = config_error_of([&] { parse_hf_gpt2_config(edited(edit), "hf/config.json"); });
    EXPECT_TRUE(contains(e, "hf/config.json: " + edit_case.second)) << e;
  }
  // A file nested deep enough to overflow nlohmann's recursive copies and printers is refused
  // before any (the text is built by hand: dump() itself would overflow).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string nested = edited([](Json& c) { c["n_layer"] = "NESTED"; });
  nested.replace(nested.find("\"NESTED\""), 8, deep);
  EXPECT_TRUE(contains(config_error_of([&] { parse_hf_gpt2_config(nested, "hf/config.json"); }),
                       "nests deeper than 32 levels"));
  // A number no double holds: nlohmann's out_of_range, read as invalid JSON.
  EXPECT_TRUE(contains(config_error_of([] {
                         parse_hf_gpt2_config("{\"layer_norm_epsilon\": 1e99999}",
                                              "hf/config.json");
                       }),
                       "not valid JSON"));
  auto e = config_error_of([] { parse_hf_gpt2_config("{\"model_type\": ", "hf/config.json"); });
  EXPECT_TRUE(contains(e, "hf/config.json: not valid JSON")) << e;
  e = config_error_of([] { parse_hf_gpt2_config("[2]", "hf/config.json"); });
  EXPECT_TRUE(contains(e, "hf/config.json: expected a JSON object, got array")) << e;
}

}  // namespace
}  // namespace mixtrain::core
