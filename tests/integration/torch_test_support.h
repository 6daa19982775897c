// What the integration tests that run PyTorch share: whether Debian's /usr/bin/python3 imports
// torch and numpy, the message of a test skipped without them, and a reference script of this
// folder (gpt_reference.py, resnet_reference.py) run as a command that prints one JSON object.
#pragma once

#include <cstdlib>
#include <string>

#include "cli_test_support.h"

namespace mixtrain::test {

// Debian's python3-torch imports only under /usr/bin/python3 (not the python3 first on PATH).
inline constexpr const char* kTorchPython = "/usr/bin/python3";

inline bool torch_available() {
  static const bool ok =
      std::system(
          (std::string(kTorchPython) + " -c 'import torch, numpy' >/dev/null 2>&1").c_str()) == 0;
  return ok;
}

inline std::string torch_missing_message(const std::string& what) {
  return std::string(kTorchPython) +
         " cannot import torch/numpy (Debian: apt install python3-torch python3-numpy, or bash "
         "cmake/setup-debian.sh --tests); " +
         what + " not tested";
}

// `tests/integration/SCRIPT ARGS` under kTorchPython with stdout and stderr in `dir`; the test
// fails (naming the command and its stderr) when it exits non-zero. Returns its JSON (discarded
// when it printed none).
inline json run_torch_script(const fs::path& dir, const std::string& script,
                             const std::string& args) {
  const auto out = dir / "py.out", err = dir / "py.err";
  const std::string cmd = std::string(kTorchPython) + " " + MIXTRAIN_CONFIGS_DIR +
                          "/../tests/integration/" + script + " " + args + " >" + out.string() +
                          " 2>" + err.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << slurp(err);
  return json::parse(slurp(out), nullptr, false);
}

}  // namespace mixtrain::test
