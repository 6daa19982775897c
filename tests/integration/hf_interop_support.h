// What the tests that meet transformers through tests/integration/hf_interop.py share
// (test_hf_export.cpp, test_from_pretrained.cpp, the LoRA and PEFT tests): running it, comparing
// logits, and the tiny GPT whose `export --initial --layout hf` is their base folder.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cli_test_support.h"
#include "npy_test_support.h"

namespace mixtrain::test {

// A 2-layer GPT (2 heads, 32 wide, 16 positions, 64 tokens) sized by hand, without adapters:
// `export CONFIG --initial --layout hf --out hf` writes the folder LoRA runs start from.
inline constexpr const char* kTinyGptBase = R"(
[run]
name = "base"
seed = 3
steps = 1
[backend]
type = "cpu"
[precision]
policy = "fp32"
[optimizer]
type = "adamw"
[model]
preset = "gpt"
[model.gpt]
n_layer = 2
n_head = 2
n_embd = 32
[data]
source = "tokens"
train = "train.bin"
block_size = 16
vocab_size = 64
batch_size = 4
)";

// max |ours - theirs| over max |theirs|, after checking the shapes agree.
inline double relative_gap(const NpyFloats& ours, const NpyFloats& theirs) {
  EXPECT_EQ(ours.shape, theirs.shape);
  if (ours.values.size() != theirs.values.size() || theirs.values.empty()) return 1.0;
  double gap = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < ours.values.size(); ++i) {
    gap = std::max(gap, std::abs(static_cast<double>(ours.values[i]) - theirs.values[i]));
    scale = std::max(scale, std::abs(static_cast<double>(theirs.values[i])));
  }
  return gap / scale;
}

// `tests/integration/hf_interop.py ARGS` under `python`; its JSON, or null (the test fails,
// naming the command and its stderr) when it exits non-zero.
inline json run_hf_interop(const fs::path& dir, const std::string& python,
                           const std::string& args) {
  const auto out = dir / "py.out", err = dir / "py.err";
  const std::string cmd = python + " " + MIXTRAIN_CONFIGS_DIR +
                          "/../tests/integration/hf_interop.py " + args + " >" + out.string() +
                          " 2>" + err.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << slurp(err);
  return json::parse(slurp(out), nullptr, false);
}

}  // namespace mixtrain::test
