// What the CNN tests that run PyTorch share: the reference ResNet
// (tests/integration/resnet_reference.py) run as a command that prints one JSON object, and the
// files it makes for them (synthetic images, initial weights); torch_test_support.h has the rest.
#pragma once

#include <string>

#include "torch_test_support.h"

namespace mixtrain::test {

// `resnet_reference.py ARGS` (see run_torch_script). Its --threads is 1 unless ARGS say more.
inline json run_resnet_reference(const fs::path& dir, const std::string& args) {
  return run_torch_script(dir, "resnet_reference.py", args);
}

// `rows` synthetic images [rows, 3, size, size] float32 in `dir`/NAME_x.npy and int64 labels in
// NAME_y.npy: 10 classes of oriented coloured gratings (one task: another seed draws other
// images of the same classes), Gaussian noise of standard deviation `noise`.
inline json make_resnet_images(const fs::path& dir, const std::string& name, int rows, int seed,
                               double noise, int size = 32) {
  return run_resnet_reference(dir, "make-data --rows " + std::to_string(rows) + " --seed " +
                                       std::to_string(seed) + " --noise " + std::to_string(noise) +
                                       " --size " + std::to_string(size) +
                                       " --features " + (dir / (name + "_x.npy")).string() +
                                       " --labels " + (dir / (name + "_y.npy")).string());
}

// torchvision-initialised ResNet weights and zeroed/unit running statistics at `out`.
inline json init_resnet_weights(const fs::path& dir, const fs::path& out, const std::string& blocks,
                                const std::string& widths, int classes, int seed) {
  return run_resnet_reference(dir, "init --blocks " + blocks + " --widths " + widths +
                                       " --classes " + std::to_string(classes) + " --seed " +
                                       std::to_string(seed) + " --out " + out.string());
}

}  // namespace mixtrain::test
