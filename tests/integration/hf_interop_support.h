// What the tests that meet transformers through tests/integration/hf_interop.py share
// (test_hf_export.cpp, test_from_pretrained.cpp): running it, and comparing logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "cli_test_support.h"
#include "npy_test_support.h"

namespace mixtrain::test {

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
