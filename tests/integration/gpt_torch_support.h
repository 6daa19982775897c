// What the GPT tests that run PyTorch share: llm.c token files with a learnable token walk and
// the reference GPT (tests/integration/gpt_reference.py) run as a command that prints one JSON
// object; torch_test_support.h has the rest.
#pragma once

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "torch_test_support.h"

namespace mixtrain::test {

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

// `gpt_reference.py ARGS` (see run_torch_script).
inline json run_gpt_reference(const fs::path& dir, const std::string& args) {
  return run_torch_script(dir, "gpt_reference.py", args);
}

}  // namespace mixtrain::test
