// What the GPT tests that run PyTorch share: whether /usr/bin/python3 imports torch, llm.c token
// files with a learnable token walk, and the reference GPT (tests/integration/gpt_reference.py)
// run as a command that prints one JSON object.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cli_test_support.h"

namespace mixtrain::test {

// Debian's python3-torch imports only under /usr/bin/python3 (not the python3 first on PATH).
inline constexpr const char* kTorchPython = "/usr/bin/python3";

inline bool torch_available() {
  static const bool ok = std::system((std::string(kTorchPython) +
                                      " -c 'import torch, numpy' >/dev/null 2>&1")
                                         .c_str()) == 0;
  return ok;
}

inline std::string torch_missing_message(const std::string& what) {
  return std::string(kTorchPython) +
         " cannot import torch/numpy (Debian: apt install python3-torch python3-numpy, or bash "
         "cmake/setup-debian.sh --tests); " +
         what + " not tested";
}

// An llm.c token file: 256 int32 header (magic 20240520, version 1, count), then n uint16 tokens
// of a walk over [0, 64) with some regularity, so that a model's loss can fall.
inline void write_token_walk(const fs::path& path, std::size_t n, std::uint32_t seed) {
  std::vector<std::int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = static_cast<std::int32_t>(n);
  std::mt19937 rng(seed);
  std::vector<std::uint16_t> tokens(n);
  std::uint16_t t = 1;
  for (auto& x : tokens) {
    t = static_cast<std::uint16_t>((t * 5 + rng() % 3) % 64);
    x = t;
  }
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(2 * n));
}

// `gpt_reference.py ARGS` with stdout and stderr in `dir`; the test fails (naming the command and
// its stderr) when it exits non-zero. Returns its JSON (discarded when it printed none).
inline json run_gpt_reference(const fs::path& dir, const std::string& args) {
  const auto out = dir / "py.out", err = dir / "py.err";
  const std::string cmd = std::string(kTorchPython) + " " + MIXTRAIN_CONFIGS_DIR +
                          "/../tests/integration/gpt_reference.py " + args + " >" + out.string() +
                          " 2>" + err.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << slurp(err);
  return json::parse(slurp(out), nullptr, false);
}

}  // namespace mixtrain::test
