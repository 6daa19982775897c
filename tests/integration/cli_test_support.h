// Shared fixture of the integration tests: runs the real `mixtrain` executable in a fresh
// temporary folder per test (kept when the test fails, for inspection) and reads its outputs.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixtrain::test {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

inline bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / (std::string("mixtrain-it-") + info->test_suite_name() +
                                        "-" + info->name() + "-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Runs `mixtrain ARGS`, in `cwd` when given (else the test's own working folder).
  CliResult run(const std::string& args, const fs::path& cwd = {}) {
    CliResult r;
    auto out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    std::string cmd = (cwd.empty() ? std::string() : "cd '" + cwd.string() + "' && ") +
                      std::string(MIXTRAIN_EXE) + " " + args + " >" + out.string() + " 2>" +
                      err.string() + " </dev/null";
    int status = std::system(cmd.c_str());
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  fs::path write_file(const std::string& name, const std::string& text) {
    auto p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }

  static std::vector<json> records(const fs::path& metrics) {
    std::vector<json> out;
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) out.push_back(json::parse(line));
    return out;
  }

  // The training losses a run in `run_dir` logged per step (its records with a step), in order.
  static std::vector<double> step_losses(const fs::path& run_dir) {
    std::vector<double> out;
    for (const auto& rec : records(run_dir / "metrics.jsonl"))
      if (rec.contains("loss") && rec.contains("step")) out.push_back(rec["loss"].get<double>());
    return out;
  }

  static json summary(const fs::path& run_dir) { return json::parse(slurp(run_dir / "summary.json")); }

  static std::string config(const std::string& name) {
    return std::string(MIXTRAIN_CONFIGS_DIR) + "/" + name;
  }
  static std::string quickstart() { return config("quickstart.toml"); }

  fs::path dir_;
};

}  // namespace mixtrain::test
