// The shipped configs (configs/*.toml) as the integration tests run them many times over: their
// names, and the --set lines that make each a smaller copy of itself — the same layers, blocks,
// strides and data source on fewer synthetic rows and narrower widths — so that a test crossing
// them with policies or paths spends its time on what it tests, not on drawing weights and rows.
// own-images.toml reads the user's files (../data/*.npy): small ones of that layout are written
// into the test's folder.
#pragma once

#include <algorithm>
#include <filesystem>
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
  return smaller;
}

}  // namespace mixtrain::test
