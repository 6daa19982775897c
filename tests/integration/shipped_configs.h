// The shipped configs (configs/*.toml) as the integration tests run them many times over: their
// names, and the --set lines that make each a smaller copy of itself — the same layers, blocks,
// strides and data source on fewer synthetic rows and narrower widths — so that a test crossing
// them with policies or paths spends its time on what it tests, not on drawing weights and rows.
// own-images.toml reads the user's files (../data/*.npy): small ones of that layout are written
// into the test's folder. gpt2-tiny-lora.toml reads what the README's fine-tuning walk makes
// (../data/tiny-gpt2, its token files): a GPT-2 folder of its sizes (`export --initial --layout
// hf` of the gpt preset) and token files are written there too (needs MIXTRAIN_EXE).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "npy_test_support.h"

namespace mixtrain::test {

inline std::vector<std::string> shipped_configs() {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(MIXTRAIN_CONFIGS_DIR))
    if (entry.path().extension() == ".toml") out.push_back(entry.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// An llm.c token file of `n` ids below `vocab`, a fixed walk through them.
inline void write_vocab_tokens(const std::filesystem::path& path, std::int32_t n,
                               std::uint16_t vocab) {
  std::vector<std::int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = n;
  std::vector<std::uint16_t> tokens(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::uint16_t>((i * 37 + i / 5) % vocab);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(2 * tokens.size()));
}

// What gpt2-tiny-lora.toml reads, in `dir`: token files and a GPT-2 folder of its sizes (2 layers,
// 2 heads, 64 wide, 64 positions, 512 tokens). The --set lines that point the config at them.
inline std::string write_walk_inputs(const std::filesystem::path& dir) {
  write_vocab_tokens(dir / "walk-train.bin", 4000, 512);
  write_vocab_tokens(dir / "walk-val.bin", 400, 512);
  std::ofstream(dir / "walk-base.toml") << R"(
[run]
name = "walk-base"
[backend]
type = "cpu"
[optimizer]
type = "adamw"
[model]
preset = "gpt"
[model.gpt]
n_layer = 2
n_head = 2
n_embd = 64
[data]
source = "tokens"
train = "walk-train.bin"
vocab_size = 512
block_size = 64
)";
  const auto folder = dir / "walk-gpt2";
  const std::string export_folder =
      std::string(MIXTRAIN_EXE) + " export " + (dir / "walk-base.toml").string() +
      " --initial --layout hf --out " + folder.string() + " >/dev/null 2>&1";
  if (std::system(export_folder.c_str()) != 0) return " --set model.from_pretrained=export-failed";
  return " --set model.from_pretrained=" + folder.string() +
         " --set data.train=" + (dir / "walk-train.bin").string() +
         " --set data.eval=" + (dir / "walk-val.bin").string();
}

// The --set lines (each with a leading space) of a smaller copy of shipped config `name`: the wide
// MLPs' two 4096-wide hidden layers at 512 (on 1024 rows), the ResNets at 1/8 of their widths on
// 512 images (ResNet-50's at 64×64). own-images.toml gets its data files, written into `dir`.
inline std::string smaller_copy(const std::string& name, const std::filesystem::path& dir) {
  std::string smaller = " --set data.synthetic.rows=4096";
  if (name.rfind("mlp-", 0) == 0)
    smaller +=
        " --set model.layers.0.out=512 --set model.layers.2.out=512"
        " --set data.synthetic.rows=1024";
  if (name.rfind("resnet20-", 0) == 0)
    smaller += " --set 'model.resnet.widths=[2, 4, 8]' --set data.synthetic.rows=512";
  if (name == "resnet18-bf16.toml")
    smaller += " --set 'model.resnet.widths=[8, 16, 32, 64]' --set data.synthetic.rows=512";
  if (name == "resnet50-bf16.toml")
    smaller +=
        " --set 'model.resnet.widths=[8, 16, 32, 64]' --set data.synthetic.rows=512"
        " --set data.synthetic.height=64 --set data.synthetic.width=64"
        " --set data.synthetic.max_shift=8";
  if (name == "own-images.toml") {
    write_cifar_layout_images(dir / "images.npy", dir / "labels.npy", 160);
    smaller = " --set data.npy.features=" + (dir / "images.npy").string() +
              " --set data.npy.labels=" + (dir / "labels.npy").string();
  }
  if (name == "gpt2-tiny-lora.toml") smaller = write_walk_inputs(dir);
  return smaller;
}

}  // namespace mixtrain::test
