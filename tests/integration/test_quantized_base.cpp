// [train] frozen_format = "nf4" (QLoRA's frozen base), "fp8-block" and "mxfp8" through the
// `mixtrain` executable, on a 2-layer GPT with LoRA adapters. NF4:
// - the frozen linear weights hold NF4 values (per block of frozen_block_size: every element is a
//   code book level times the block's absmax), also where the block does not divide the weight;
//   biases, layer norms and the embedding keep their values; the adapters train and the loss
//   falls; the base leaves the run as it entered;
// - a run interrupted and resumed from its config.toml continues bit for bit (losses and final
//   tensors); a resume with another frozen_format or block size is refused naming both;
// - `check` and summary.json give bytes per parameter (NF4: 0.5 + 4 / 64 = 0.5625);
// - bad settings exit 2 at their file:line:col: an unknown format, a block < 1, NF4 with no frozen
//   linear weight.
// fp8-block and mxfp8: the base holds the SDK's block quantization of the plain init, bit for bit;
// the run resumes bit for bit; bytes per parameter; another format refused on resume; a
// frozen_block_size (NF4's) beside them exits 2.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpt_torch_support.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "safetensors_test_support.h"

namespace mixtrain::test {
namespace {

const char* kGpt = R"(
[run]
name = "gpt"
seed = 4
steps = 6
log_every = 1
eval_every = 0
[backend]
type = "cpu"
[precision]
policy = "fp32"
[scaler]
type = "none"
[optimizer]
type = "adamw"
[optimizer.adamw]
lr = 0.05
[model]
preset = "gpt"
[model.gpt]
n_layer = 2
n_head = 2
n_embd = 32
[data]
source = "tokens"
train = "train.bin"
eval = "eval.bin"
block_size = 16
vocab_size = 64
batch_size = 4
shuffle = false
[checkpoint]
fsync = false
every = 2
keep = 5
[model.lora]
r = 4
alpha = 8
targets = ["h.*.attn.c_attn", "h.*.mlp.c_fc"]
)";

const char* kNf4 = R"(
[train]
frozen_format = "nf4"
)";

// QLoRA's levels (sdk/support/nf4.h lists them exactly; the unit test holds them to it).
constexpr double kLevels[16] = {-1.0,
                                -0.6961928009986877,
                                -0.5250730514526367,
                                -0.39491748809814453,
                                -0.28444138169288635,
                                -0.18477343022823334,
                                -0.09105003625154495,
                                0.0,
                                0.07958029955625534,
                                0.16093020141124725,
                                0.24611230194568634,
                                0.33791524171829224,
                                0.44070982933044434,
                                0.5626170039176941,
                                0.7229568362236023,
                                1.0};

// Whether every block of `block` elements (the last one partial) holds only levels · absmax.
bool holds_nf4_values(const std::vector<float>& v, std::size_t block) {
  for (std::size_t b0 = 0; b0 < v.size(); b0 += block) {
    const std::size_t end = std::min(v.size(), b0 + block);
    double absmax = 0;
    for (std::size_t i = b0; i < end; ++i) absmax = std::max(absmax, std::fabs(double(v[i])));
    for (std::size_t i = b0; i < end && absmax > 0; ++i) {
      bool level = false;
      for (const double l : kLevels) level = level || std::fabs(v[i] / absmax - l) < 1e-6;
      if (!level) return false;
    }
  }
  return true;
}

bool is_base_linear_weight(const std::string& name) {
  return name.find(".lora_") == std::string::npos &&
         (has(name, ".attn.c_attn.weight") || has(name, ".attn.c_proj.weight") ||
          has(name, ".mlp.c_fc.weight") || has(name, ".mlp.c_proj.weight"));
}

std::vector<double> losses(const std::vector<json>& records) {
  std::vector<double> out;
  for (const auto& r : records)
    if (r.contains("loss")) out.push_back(r["loss"].get<double>());
  return out;
}

class QuantizedBase : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    config_ = write_file("nf4.toml", std::string(kGpt) + kNf4).string();
    write_token_walk(dir_ / "train.bin", 2000, 5);
    write_token_walk(dir_ / "eval.bin", 16 * 6 + 1, 6);
  }
  StFile tensors(const std::string& from, const std::string& out) {
    const auto r = run("export " + from + " --format safetensors --out " + out, dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return read_st(dir_ / out);
  }
  // Losses of `run` resumed from its step-2 checkpoint in a new folder `half`.
  std::vector<double> resumed_losses(const std::string& run_dir, const std::string& half) {
    fs::create_directories(dir_ / half / "checkpoints");
    fs::copy(dir_ / run_dir / "config.toml", dir_ / half / "config.toml");
    fs::copy(dir_ / run_dir / "checkpoints" / "step-00000002.mxt",
             dir_ / half / "checkpoints" / "step-00000002.mxt");
    const auto r = run("train --resume " + half, dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return losses(records(dir_ / half / "metrics.jsonl"));
  }
  std::string config_;
};

TEST_F(QuantizedBase, LoraTrainsOnAnNf4BaseThatLeavesAsItEnteredAndResumesBitForBit) {
  auto r = run("export " + config_ + " --initial --out initial.safetensors", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run(
      "export " + write_file("plain.toml", kGpt).string() + " --initial --out plain.safetensors",
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  StFile initial = read_st(dir_ / "initial.safetensors");
  StFile plain = read_st(dir_ / "plain.safetensors");
  std::size_t nf4 = 0;
  for (const auto& t : initial.tensors) {
    const StTensor* unquantized = plain.find(t.name);
    ASSERT_NE(unquantized, nullptr) << t.name;
    if (!is_base_linear_weight(t.name)) {
      EXPECT_EQ(t.bytes, unquantized->bytes) << t.name << " is not a linear weight: kept as it is";
      continue;
    }
    ++nf4;
    EXPECT_NE(t.bytes, unquantized->bytes) << t.name << " should be NF4";
    EXPECT_TRUE(holds_nf4_values(st_floats(t), 64)) << t.name;
  }
  EXPECT_EQ(nf4, 8u);  // c_attn, attn.c_proj, c_fc, mlp.c_proj in each of 2 layers

  r = run("train " + config_ + " --run-dir run", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto full = losses(records(dir_ / "run" / "metrics.jsonl"));
  ASSERT_EQ(full.size(), 6u);
  EXPECT_LT((full[3] + full[4] + full[5]) / 3, full[0]) << "the adapters learn on the NF4 base";
  StFile trained = tensors("run/checkpoints/step-00000006.mxt", "trained.safetensors");
  for (const auto& t : initial.tensors) {
    const StTensor* after = trained.find(t.name);
    ASSERT_NE(after, nullptr) << t.name;
    const bool adapter = has(t.name, ".lora_A.") || has(t.name, ".lora_B.");
    if (adapter)
      EXPECT_NE(after->bytes, t.bytes) << t.name << " trains, yet it did not change";
    else
      EXPECT_EQ(after->bytes, t.bytes) << t.name << " is frozen, yet it changed";
  }
  const json s = summary(dir_ / "run");
  ASSERT_TRUE(s.contains("parameter_memory")) << s.dump();
  EXPECT_EQ(s["parameter_memory"]["bytes_per_parameter"]["nf4"].get<double>(), 0.5625);
  EXPECT_GT(s["parameter_memory"]["nf4_parameters"].get<std::int64_t>(), 0);

  // Resumed from step 2 with the run's own config.toml: the same losses and tensors.
  fs::create_directories(dir_ / "half" / "checkpoints");
  fs::copy(dir_ / "run" / "config.toml", dir_ / "half" / "config.toml");
  fs::copy(dir_ / "run" / "checkpoints" / "step-00000002.mxt",
           dir_ / "half" / "checkpoints" / "step-00000002.mxt");
  r = run("train --resume half", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto resumed = losses(records(dir_ / "half" / "metrics.jsonl"));
  ASSERT_EQ(resumed.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed[i], full[i + 2]) << "step " << i + 3;
  StFile again = tensors("half/checkpoints/step-00000006.mxt", "again.safetensors");
  ASSERT_EQ(again.tensors.size(), trained.tensors.size());
  for (std::size_t i = 0; i < again.tensors.size(); ++i)
    EXPECT_EQ(again.tensors[i].bytes, trained.tensors[i].bytes) << again.tensors[i].name;

  // Another base format, or another block: refused, naming both.
  r = run("train --resume run --set run.steps=8 --set train.frozen_format=\"compute\"", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "trained with train.frozen_format = nf4 (blocks of 64), this one has "
                  "train.frozen_format = compute"))
      << r.err;
  r = run("train --resume run --set run.steps=8 --set train.frozen_block_size=32", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "this one has train.frozen_format = nf4 (blocks of 32)")) << r.err;
}

TEST_F(QuantizedBase, ABlockThatDoesNotDivideAWeightEndsInAPartialBlock) {
  // 100 divides none of the weights (32·96, 32·32, 32·128, 128·32 elements).
  const auto r = run("export " + config_ + " --initial --out odd.safetensors" +
                         " --set train.frozen_block_size=100",
                     dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  StFile odd = read_st(dir_ / "odd.safetensors");
  for (const auto& t : odd.tensors) {
    if (!is_base_linear_weight(t.name)) continue;
    const auto v = st_floats(t);
    ASSERT_NE(v.size() % 100, 0u) << t.name;
    EXPECT_TRUE(holds_nf4_values(v, 100)) << t.name;
    EXPECT_FALSE(holds_nf4_values(v, 64)) << t.name << ": blocks of 100, not 64";
  }
}

TEST_F(QuantizedBase, CheckGivesBytesPerParameter) {
  const auto r = run("check " + config_ + " --skip-rehearsal", dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 8 NF4 weights of 2 · (32·96 + 32·32 + 32·128 + 128·32) = 24576 parameters; 4 bits each and an
  // fp32 absmax per 64.
  EXPECT_TRUE(has(r.out, "24576 of them NF4 at 0.5625 (blocks of 64)")) << r.out;
  EXPECT_TRUE(has(r.out, "masters 4.00, gradients 4.00, working copies 0.00, optimizer state 8.00"))
      << r.out;
  EXPECT_TRUE(has(r.out, "frozen NF4 weights")) << r.out;
  EXPECT_TRUE(has(r.out, "linear weights as NF4 (24576 parameters)")) << r.out;
}

TEST_F(QuantizedBase, BadSettingsExitTwoAtTheirLine) {
  struct Case {
    std::string train, key_line, message;
    bool lora = true;
  };
  const std::vector<Case> cases = {
      {"frozen_format = \"nf5\"\n", "frozen_format", "train.frozen_format"},
      {"frozen_format = \"nf4\"\nfrozen_block_size = 0\n", "frozen_block_size",
       "train.frozen_block_size"},
      {"frozen_format = \"nf4\"\n", "frozen_format",
       "no frozen parameter is a linear node's weight", false},
      {"frozen_format = \"nf4\"\nfrozen = [\"ln_f\"]\n", "frozen_format",
       "no frozen parameter is a linear node's weight", false},
  };
  for (const auto& c : cases) {
    std::string text = kGpt;
    if (!c.lora) text = text.substr(0, text.find("[model.lora]"));
    text += "[train]\n" + c.train;
    const auto config = write_file("bad.toml", text);
    const auto r = run("train " + config.string() + " --run-dir bad", dir_);
    EXPECT_EQ(r.exit_code, 2) << c.train << r.err;
    std::size_t line = 1, start = 0;
    while (text.compare(start, c.key_line.size(), c.key_line) != 0) {
      start = text.find('\n', start) + 1;
      ++line;
    }
    EXPECT_TRUE(has(r.err, config.string() + ":" + std::to_string(line) + ":")) << c.train << r.err;
    EXPECT_TRUE(has(r.err, c.message)) << c.train << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "bad")) << c.train;
  }
}

// The block formats' layouts, as graph/quantized_weight.h gives them (an outside reader's copy).
sdk::BlockScaledLayout layout_of(const std::string& format) {
  if (format == "fp8-block") return sdk::fp8_block_weight_layout(sdk::BlockElement::e4m3, true);
  return sdk::mx_layout(sdk::ReductionAxis::cols, sdk::BlockElement::e4m3,
                        sdk::MxScaleRule::round_up);
}

TEST_F(QuantizedBase, Fp8BlockFormatBasesHoldTheirQuantizationAndResumeBitForBit) {
  auto r = run(
      "export " + write_file("plain.toml", kGpt).string() + " --initial --out plain.safetensors",
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  StFile plain = read_st(dir_ / "plain.safetensors");
  // 8 weights of 2 · (96·32 + 32·32 + 128·32 + 32·128) = 24576 parameters, each under one partial
  // 128x128 block (a 4-byte scale) or in rows of 32-wide blocks (a scale byte per 32).
  const std::vector<std::pair<std::string, std::string>> formats = {
      {"fp8-block", "24576 of them fp8-block at 1.0013 (e4m3 128x128 fp32_pow2 scales)"},
      {"mxfp8", "24576 of them mxfp8 at 1.0312 (e4m3 1x32 e8m0_round_up scales)"}};
  for (const auto& [format, memory_line] : formats) {
    const std::string config =
        write_file(format + ".toml",
                   std::string(kGpt) + "[train]\nfrozen_format = \"" + format + "\"\n")
            .string();
    r = run("export " + config + " --initial --out " + format + ".safetensors", dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    StFile initial = read_st(dir_ / (format + ".safetensors"));
    std::size_t quantized = 0;
    for (const auto& t : initial.tensors) {
      const StTensor* unquantized = plain.find(t.name);
      ASSERT_NE(unquantized, nullptr) << t.name;
      if (!is_base_linear_weight(t.name)) {
        EXPECT_EQ(t.bytes, unquantized->bytes) << format << " " << t.name;
        continue;
      }
      ++quantized;
      ASSERT_EQ(t.shape.size(), 2u) << t.name;
      const auto want = sdk::dequantize_block_scaled(sdk::quantize_block_scaled(
          st_floats(*unquantized), t.shape[0], t.shape[1], layout_of(format)));
      EXPECT_EQ(st_floats(t), want) << format << " " << t.name;
      EXPECT_NE(t.bytes, unquantized->bytes) << format << " " << t.name;
    }
    EXPECT_EQ(quantized, 8u) << format;

    const std::string run_dir = "run-" + format;
    r = run("train " + config + " --run-dir " + run_dir, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto full = losses(records(dir_ / run_dir / "metrics.jsonl"));
    ASSERT_EQ(full.size(), 6u);
    EXPECT_LT((full[3] + full[4] + full[5]) / 3, full[0]) << format;
    const auto resumed = resumed_losses(run_dir, "half-" + format);
    ASSERT_EQ(resumed.size(), 4u) << format;
    for (std::size_t i = 0; i < 4; ++i)
      EXPECT_EQ(resumed[i], full[i + 2]) << format << " step " << i + 3;
    StFile trained = tensors(run_dir + "/checkpoints/step-00000006.mxt", format + "-a.safetensors");
    StFile again =
        tensors("half-" + format + "/checkpoints/step-00000006.mxt", format + "-b.safetensors");
    ASSERT_EQ(again.tensors.size(), trained.tensors.size());
    for (std::size_t i = 0; i < again.tensors.size(); ++i)
      EXPECT_EQ(again.tensors[i].bytes, trained.tensors[i].bytes) << again.tensors[i].name;

    const json s = summary(dir_ / run_dir);
    const std::string key = format == "fp8-block" ? "fp8_block" : "mxfp8";
    EXPECT_EQ(s["parameter_memory"][key + "_parameters"].get<std::int64_t>(), 24576) << s.dump();
    EXPECT_EQ(s["parameter_memory"]["bytes_per_parameter"][key].get<double>(),
              format == "fp8-block" ? (24576.0 + 8 * 4) / 24576 : 1.0 + 1.0 / 32)
        << s.dump();
    r = run("check " + config + " --skip-rehearsal", dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(has(r.out, memory_line)) << r.out;
    EXPECT_TRUE(has(r.out, "frozen " + format + " weights")) << r.out;
  }
  r = run("train --resume run-fp8-block --set run.steps=8 --set train.frozen_format=\"mxfp8\"",
          dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err,
                  "trained with train.frozen_format = fp8-block, this one has "
                  "train.frozen_format = mxfp8"))
      << r.err;
}

TEST_F(QuantizedBase, ABlockSizeBesideAFixedBlockFormatExitsTwoAtItsLine) {
  const std::string text =
      std::string(kGpt) + "[train]\nfrozen_format = \"mxfp8\"\nfrozen_block_size = 32\n";
  const auto config = write_file("fixed.toml", text);
  const auto r = run("train " + config.string() + " --run-dir fixed", dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const auto line =
      std::count(text.begin(), text.begin() + text.find("frozen_block_size"), '\n') + 1;
  EXPECT_TRUE(has(r.err, config.string() + ":" + std::to_string(line) + ":")) << r.err;
  EXPECT_TRUE(has(r.err, "has fixed blocks (e4m3 1x32 e8m0_round_up scales)")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "fixed"));
}

}  // namespace
}  // namespace mixtrain::test
