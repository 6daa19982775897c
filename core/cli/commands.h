// The subcommands of the `mixtrain` executable. Each returns the process exit code and lets
// sdk::UserError (exit 2) and other exceptions (exit 1) reach main(), which prints them once.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mixtrain::cli {

struct ConfigArgs {
  std::string config;  // empty: the embedded quickstart
  std::vector<std::string> sets;
};

int run_train(const ConfigArgs& cfg, const std::string& run_dir,
              const std::optional<std::string>& resume);
int run_check(const ConfigArgs& cfg);
int run_plugins();
int run_eval(const ConfigArgs& cfg, const std::string& checkpoint);
// Parity table of runs against the first; writes compare.{json,md,svg} into out_dir (empty: the
// first run's folder).
int run_compare(const std::vector<std::string>& run_dirs, const std::string& out_dir);

}  // namespace mixtrain::cli
