// Tiny hand-written run folders for the compare tests, in a per-test temp folder.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

namespace mixtrain::testing_compare {

namespace fs = std::filesystem;

class RunFolders : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ =
        fs::temp_directory_path() / (std::string("mixtrain-compare-") + info->test_suite_name() +
                                     "-" + info->name() + "-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(root_);
  }

  fs::path write(const fs::path& rel, const std::string& text) {
    auto p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  static std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // Baseline: fp32, summary present. Losses 2.0 @10, 1.0 @20, 0.5 @30.
  fs::path baseline(const std::string& name = "base") {
    write(
        name + "/metrics.jsonl",
        R"({"step":10,"loss":2.0,"loss_scale":1.0,"next_loss_scale":1.0,"skipped":false,"lr":0.1,"grad_norm":1.0,"samples_per_s":900,"epoch":0}
{"step":20,"loss":1.0,"loss_scale":1.0,"next_loss_scale":1.0,"skipped":false,"lr":0.1,"grad_norm":1.0,"samples_per_s":1000,"epoch":0}
{"step":20,"eval_loss":0.9,"eval_accuracy":0.8}
{"step":30,"loss":0.5,"loss_scale":1.0,"next_loss_scale":1.0,"skipped":false,"lr":0.1,"grad_norm":1.0,"samples_per_s":1100,"epoch":0}
{"step":30,"eval_loss":0.6,"eval_accuracy":0.8}
)");
    write(name + "/summary.json",
          R"({"steps":30,"skipped_steps":0,"final_loss":0.5,"eval_loss":0.6,"eval_accuracy":0.8,
"final_loss_scale":1.0,"peak_memory_bytes":2097152,"peak_rss_bytes":1,"samples_per_s":1000.0,
"wall_seconds":1.0,"policy":"fp32","scaler":"none","optimizer":"adamw","backend":"cpu"})");
    return root_ / name;
  }

  // fp16 with a dynamic scaler: one skipped step (15, non-finite loss), one step the baseline
  // never logged (40). Gaps: 0.1 @10, 0.3 @20, 0.1 @30.
  fs::path fp16_run(const std::string& name = "fp16") {
    write(
        name + "/metrics.jsonl",
        R"({"step":10,"loss":2.2,"loss_scale":65536.0,"next_loss_scale":65536.0,"skipped":false,"samples_per_s":1400}
{"step":15,"loss":null,"loss_scale":65536.0,"next_loss_scale":32768.0,"skipped":true,"samples_per_s":1500}
{"step":20,"loss":0.7,"loss_scale":32768.0,"next_loss_scale":32768.0,"skipped":false,"samples_per_s":1500}
{"step":30,"loss":0.55,"loss_scale":32768.0,"next_loss_scale":32768.0,"skipped":false,"samples_per_s":1500}
{"step":40,"loss":0.4,"loss_scale":32768.0,"next_loss_scale":32768.0,"skipped":false,"samples_per_s":1500}
{"step":40,"eval_loss":0.5,"eval_accuracy":0.85}
)");
    write(name + "/summary.json",
          R"({"steps":40,"skipped_steps":1,"final_loss":0.4,"eval_loss":0.5,"eval_accuracy":0.85,
"peak_memory_bytes":1048576,"samples_per_s":1500.0,"policy":"fp16-mixed","scaler":"dynamic",
"optimizer":"adamw","backend":"cpu"})");
    return root_ / name;
  }

  // Interrupted: no summary.json; labels from config.toml. Same losses as the baseline at 10, 20.
  fs::path interrupted_run(const std::string& name = "cut") {
    write(name + "/config.toml",
          "[precision]\npolicy = \"bf16-mixed\"\n[scaler]\ntype = \"static\"\n");
    write(
        name + "/metrics.jsonl",
        R"({"step":10,"loss":2.0,"loss_scale":128.0,"next_loss_scale":128.0,"skipped":false,"samples_per_s":200}
{"step":20,"loss":1.0,"loss_scale":128.0,"next_loss_scale":128.0,"skipped":false,"samples_per_s":400}
{"step":20,"eval_loss":1.1,"eval_accuracy":0.7}
{"step":25,"loss":1.25,"loss_scale":128.0,"next_loss_scale":128.0,"skipped":true,"samples_per_s":0}
)");
    return root_ / name;
  }

  // A run that logged losses[i] at step first + i * interval, metrics only.
  fs::path curve_run(const std::string& name, std::int64_t first, std::int64_t interval,
                     const std::vector<double>& losses) {
    std::ostringstream m;
    m << std::setprecision(17);
    for (std::size_t i = 0; i < losses.size(); ++i)
      m << "{\"step\":" << first + static_cast<std::int64_t>(i) * interval
        << ",\"loss\":" << losses[i] << "}\n";
    write(name + "/metrics.jsonl", m.str());
    return root_ / name;
  }

  fs::path root_;
};

}  // namespace mixtrain::testing_compare
