// The GPT-2 layout conversion (core/gpt2_layout.h) on named host tensors: native -> gpt2 ->
// native is bit-identical, only the four Conv1D weights are transposed, Hugging Face's extras
// (transformer. prefix, mask buffers, the tied lm_head.weight) are handled, and what does not fit
// is an sdk::CheckpointError naming the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mixtrain/core/checkpoint/gpt2_layout.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

// Random bytes, so every bit pattern (NaN payloads, -0, denormals) must survive the trip.
sdk::HostTensor random_tensor(std::string name, std::vector<std::int64_t> shape, std::mt19937& rng,
                              sdk::DType dtype = sdk::DType::fp32) {
  sdk::HostTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(static_cast<std::size_t>(t.numel()) * sdk::dtype_size(dtype));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : t.bytes) b = static_cast<std::byte>(byte(rng));
  return t;
}

// A gpt-preset model's parameters in mixtrain's order and layout (linear weights [out, in]).
std::vector<sdk::HostTensor> native_gpt(int layers, std::int64_t c, std::int64_t vocab,
                                        std::int64_t positions, std::mt19937& rng, bool bias = true,
                                        sdk::DType dtype = sdk::DType::fp32) {
  std::vector<sdk::HostTensor> out;
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
    out.push_back(random_tensor(name, std::move(shape), rng, dtype));
  };
  auto linear = [&](const std::string& name, std::int64_t in, std::int64_t o) {
    add(name + ".weight", {o, in});
    if (bias) add(name + ".bias", {o});
  };
  auto norm = [&](const std::string& name) {
    add(name + ".weight", {c});
    add(name + ".bias", {c});
  };
  add("wte.weight", {vocab, c});
  add("wpe.weight", {positions, c});
  for (int i = 0; i < layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    norm(h + "ln_1");
    linear(h + "attn.c_attn", c, 3 * c);
    linear(h + "attn.c_proj", c, c);
    norm(h + "ln_2");
    linear(h + "mlp.c_fc", c, 4 * c);
    linear(h + "mlp.c_proj", 4 * c, c);
  }
  norm("ln_f");
  return out;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_conv1d_name(const std::string& name) {
  for (const char* k :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (ends_with(name, k)) return true;
  return false;
}

void expect_same(const std::vector<sdk::HostTensor>& a, const std::vector<sdk::HostTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].dtype, b[i].dtype) << a[i].name;
    EXPECT_EQ(a[i].shape, b[i].shape) << a[i].name;
    EXPECT_TRUE(a[i].bytes == b[i].bytes) << a[i].name << " changed";
  }
}

// The message of the CheckpointError `f` throws; fails the test when it throws nothing.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const sdk::CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no sdk::CheckpointError";
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Gpt2Layout, NativeToGpt2ToNativeIsBitIdentical) {
  std::mt19937 rng(1);
  for (auto dtype : {sdk::DType::fp32, sdk::DType::bf16, sdk::DType::fp16}) {
    const auto native = native_gpt(3, 8, 11, 5, rng, true, dtype);
    const auto back = from_gpt2_layout(to_gpt2_layout(native, "test"), "test");
    expect_same(back.tensors, native);
    EXPECT_TRUE(back.dropped.empty());
    for (std::size_t i = 0; i < native.size(); ++i) EXPECT_EQ(back.file_names[i], native[i].name);
  }
}

TEST(Gpt2Layout, TransposesTheFourConv1dWeightsAndNothingElse) {
  std::mt19937 rng(2);
  const auto native = native_gpt(2, 6, 13, 7, rng);
  const auto gpt2 = to_gpt2_layout(native, "test");
  ASSERT_EQ(gpt2.size(), native.size());
  int transposed = 0;
  for (std::size_t i = 0; i < native.size(); ++i) {
    const auto& in = native[i];
    const auto& out = gpt2[i];
    EXPECT_EQ(out.name, in.name);
    EXPECT_EQ(out.dtype, in.dtype);
    if (!is_conv1d_name(in.name)) {
      EXPECT_EQ(out.shape, in.shape) << in.name;
      EXPECT_TRUE(out.bytes == in.bytes) << in.name;
      continue;
    }
    ++transposed;
    ASSERT_EQ(in.shape.size(), 2u);
    const auto rows = static_cast<std::size_t>(in.shape[0]);
    const auto cols = static_cast<std::size_t>(in.shape[1]);
    ASSERT_EQ(out.shape, (std::vector<std::int64_t>{in.shape[1], in.shape[0]})) << in.name;
    // out[c][r] == in[r][c], compared as FP32 bit patterns.
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        ASSERT_EQ(std::memcmp(out.bytes.data() + (c * rows + r) * 4,
                              in.bytes.data() + (r * cols + c) * 4, 4),
                  0)
            << in.name << " [" << r << ", " << c << "]";
  }
  EXPECT_EQ(transposed, 2 * 4);
}

TEST(Gpt2Layout, ReadsAGpt2LmHeadModelStateDict) {
  std::mt19937 rng(3);
  const std::int64_t positions = 5;
  const auto native = native_gpt(2, 8, 11, positions, rng);
  // As GPT2LMHeadModel.state_dict() holds it: every name under transformer., the causal-mask
  // buffers of each block, and lm_head.weight, the same tensor as wte.weight.
  std::vector<sdk::HostTensor> file;
  for (auto t : to_gpt2_layout(native, "test")) {
    t.name = "transformer." + t.name;
    file.push_back(std::move(t));
    if (ends_with(file.back().name, "ln_1.bias")) {
      const std::string h = file.back().name.substr(0, file.back().name.size() - 9);
      file.push_back(random_tensor(h + "attn.bias", {1, 1, positions, positions}, rng));
      file.push_back(random_tensor(h + "attn.masked_bias", {}, rng));
    }
  }
  sdk::HostTensor head = native.front();  // wte.weight
  head.name = "lm_head.weight";
  file.push_back(head);

  const auto back = from_gpt2_layout(file, "test");
  expect_same(back.tensors, native);
  for (std::size_t i = 0; i < native.size(); ++i)
    EXPECT_EQ(back.file_names[i], "transformer." + native[i].name);
  EXPECT_EQ(back.dropped, (std::vector<std::string>{
                              "transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias",
                              "transformer.h.1.attn.bias", "transformer.h.1.attn.masked_bias",
                              "lm_head.weight"}));
}

TEST(Gpt2Layout, AnUntiedHeadIsRefused) {
  std::mt19937 rng(4);
  auto file = to_gpt2_layout(native_gpt(1, 4, 9, 3, rng), "test");
  sdk::HostTensor head = file.front();
  head.name = "lm_head.weight";
  head.bytes[5] ^= std::byte{1};  // one bit off wte.weight
  file.push_back(head);
  auto message = error_of([&] { from_gpt2_layout(file, "model.safetensors"); });
  EXPECT_TRUE(contains(message, "model.safetensors")) << message;
  EXPECT_TRUE(contains(message, "lm_head.weight")) << message;
  EXPECT_TRUE(contains(message, "untied")) << message;

  // No wte.weight to compare the head with.
  file.erase(file.begin());
  message = error_of([&] { from_gpt2_layout(file, "test"); });
  EXPECT_TRUE(contains(message, "lm_head.weight")) << message;
  EXPECT_TRUE(contains(message, "wte.weight")) << message;
}

TEST(Gpt2Layout, ReadingRefusesWhatIsNotAGpt2WeightNamingIt) {
  std::mt19937 rng(5);
  const auto gpt2 = to_gpt2_layout(native_gpt(1, 4, 9, 3, rng), "test");
  auto with = [&](sdk::HostTensor extra) {
    auto file = gpt2;
    file.push_back(std::move(extra));
    return file;
  };
  for (const char* name : {"fc1.weight", "h.0.attn.c_attn.scale", "h.01.ln_1.weight",
                           "param/wte.weight", "transformer.lm_head.bias"}) {
    const auto message =
        error_of([&] { from_gpt2_layout(with(random_tensor(name, {4}, rng)), "f"); });
    EXPECT_TRUE(contains(message, std::string("'") + name + "'")) << message;
  }
  // One weight under two names.
  auto message = error_of([&] {
    from_gpt2_layout(with(random_tensor("transformer.wte.weight", {9, 4}, rng)), "f");
  });
  EXPECT_TRUE(contains(message, "'wte.weight'")) << message;
  EXPECT_TRUE(contains(message, "'transformer.wte.weight'")) << message;
  // A Conv1D weight must be 2-D to transpose.
  auto file = gpt2;
  for (auto& t : file)
    if (t.name == "h.0.mlp.c_fc.weight") t.shape = {4, 4, 4};
  message = error_of([&] { from_gpt2_layout(file, "f"); });
  EXPECT_TRUE(contains(message, "'h.0.mlp.c_fc.weight'")) << message;
  EXPECT_TRUE(contains(message, "2-D")) << message;
}

TEST(Gpt2Layout, WritingRefusesAModelThatIsNotAGptNamingWhatIsMissing) {
  std::mt19937 rng(6);
  // quickstart's MLP
  std::vector<sdk::HostTensor> mlp;
  for (const char* name : {"fc1.weight", "fc1.bias", "head.weight", "head.bias"})
    mlp.push_back(random_tensor(name, {4}, rng));
  auto message = error_of([&] { to_gpt2_layout(mlp, "step-5.mxt"); });
  EXPECT_TRUE(contains(message, "step-5.mxt")) << message;
  EXPECT_TRUE(contains(message, "'wte.weight'")) << message;

  // A GPT whose second block lacks its MLP input projection.
  auto gpt = native_gpt(2, 4, 9, 3, rng);
  std::erase_if(gpt, [](const sdk::HostTensor& t) { return t.name == "h.1.mlp.c_fc.weight"; });
  message = error_of([&] { to_gpt2_layout(gpt, "f"); });
  EXPECT_TRUE(contains(message, "'h.1.mlp.c_fc.weight'")) << message;

  // A GPT with a tensor GPT-2 has no place for.
  gpt = native_gpt(1, 4, 9, 3, rng);
  gpt.push_back(random_tensor("probe.weight", {2, 4}, rng));
  message = error_of([&] { to_gpt2_layout(gpt, "f"); });
  EXPECT_TRUE(contains(message, "'probe.weight'")) << message;

  // The preset without biases is a GPT all the same.
  const auto biasless = native_gpt(2, 4, 9, 3, rng, /*bias=*/false);
  expect_same(from_gpt2_layout(to_gpt2_layout(biasless, "f"), "f").tensors, biasless);

  // Weights in the gpt2 layout already (a GPT2Model state dict without the metadata that says
  // so): a second transposition would scramble the square c_proj silently; refused, saying why.
  message =
      error_of([&] { to_gpt2_layout(to_gpt2_layout(native_gpt(1, 4, 9, 3, rng), "f"), "g"); });
  EXPECT_TRUE(contains(message, "g: 'h.0.attn.c_attn.weight' is [4, 12], not a linear's [out, in]"))
      << message;
  EXPECT_TRUE(contains(message, "GPT-2's Conv1D [in, out] weights already")) << message;
}

TEST(Gpt2Layout, NamesTheConv1dWeightsAndTheSizes) {
  EXPECT_TRUE(is_conv1d_weight("h.0.attn.c_attn.weight"));
  EXPECT_TRUE(is_conv1d_weight("h.11.attn.c_proj.weight"));
  EXPECT_TRUE(is_conv1d_weight("h.3.mlp.c_fc.weight"));
  EXPECT_TRUE(is_conv1d_weight("h.3.mlp.c_proj.weight"));
  for (const char* name :
       {"h.0.attn.c_attn.bias", "h.0.ln_1.weight", "wte.weight", "transformer.h.0.mlp.c_fc.weight",
        "h.x.mlp.c_fc.weight", "lm_head.weight", "fc1.weight"})
    EXPECT_FALSE(is_conv1d_weight(name)) << name;

  std::mt19937 rng(7);
  const auto sizes = gpt2_sizes(native_gpt(3, 8, 11, 5, rng));
  EXPECT_EQ(sizes.n_layer, 3);
  EXPECT_EQ(sizes.n_embd, 8);
  EXPECT_EQ(sizes.vocab_size, 11);
  EXPECT_EQ(sizes.n_positions, 5);

  for (auto layout : {WeightLayout::native, WeightLayout::gpt2})
    EXPECT_EQ(parse_weight_layout(weight_layout_name(layout)), layout);
  EXPECT_THROW(parse_weight_layout("conv1d"), std::invalid_argument);
}

}  // namespace
}  // namespace mixtrain::core
