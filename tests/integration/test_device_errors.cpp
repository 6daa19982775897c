// What a run does when the device cannot serve it, through the Trainer in process with a wrapping
// backend that plays the device (the CLI maps every sdk::UserError to exit code 2):
// - a GPU too old for the policy's dtype (no FP8 Tensor Cores) stops before training, naming the
//   node, the dtype and a fix, whether the policy or the plan-time backend check finds it;
// - running out of device memory while the model allocates names the buffer, its bytes, the
//   plan's predicted total and the fixes;
// - running out of device memory in the middle of training stops the run with one error and
//   leaves every checkpoint already written exactly as it was.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "embedded_quickstart.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain {
namespace {

namespace fs = std::filesystem;
using sdk::DType;
using sdk::TensorView;

// The CPU backend seen as a GPU without FP8 (an sm_80 A100) and, once armed, out of memory: its
// allocate() refuses a request past `allocation_limit`, its GEMM facet refuses FP8 operands and,
// once `fail_gemms` is set, every GEMM with the out-of-memory error CUDA's scratch growth raises.
class DeviceLikeBackend final : public sdk::DeviceBackend, public sdk::GemmFacet {
 public:
  explicit DeviceLikeBackend(std::shared_ptr<sdk::DeviceBackend> inner)
      : in_(std::move(inner)), gemm_(sdk::facet<sdk::GemmFacet>(*in_)) {}

  std::size_t allocation_limit = ~std::size_t{0};
  bool fail_gemms = false;
  // Once set, a copy to the host of more bytes than this fails as a device fault would (a loss or
  // a flag, a few bytes, still comes over).
  std::size_t fail_copies_over = ~std::size_t{0};

  sdk::BackendCapabilities capabilities() const override {
    auto caps = in_->capabilities();
    caps.kind = "testgpu";
    caps.device_name = "Test A100 (sm_80, device 0, 108 SMs)";
    caps.memory_bytes = std::size_t{40} << 30;
    std::erase_if(caps.gemm_inputs,
                  [](const sdk::DTypeSupport& s) { return sdk::is_fp8(s.dtype); });
    return caps;
  }
  void* allocate(std::size_t bytes) override {
    if (bytes > allocation_limit) throw out_of_memory("allocate", bytes);
    return in_->allocate(bytes);
  }
  void deallocate(void* p) noexcept override { in_->deallocate(p); }
  sdk::MemoryStats memory_stats() const override { return in_->memory_stats(); }
  void copy_from_host(TensorView d, const void* s) override { in_->copy_from_host(d, s); }
  void copy_to_host(void* d, TensorView s) override {
    if (s.bytes() > fail_copies_over)
      throw sdk::BackendError(
          "backend_testgpu.copy_to_host: an uncorrectable ECC error was "
          "encountered",
          "the device needs a reset; resume from the newest checkpoint");
    in_->copy_to_host(d, s);
  }
  void copy(TensorView d, TensorView s) override { in_->copy(d, s); }
  void synchronize() override { in_->synchronize(); }
  void cast(TensorView s, TensorView d, const sdk::CastArgs& a) override { in_->cast(s, d, a); }
  void fill(TensorView x, float v) override { in_->fill(x, v); }
  sdk::Facet* find_facet(std::string_view name) override {
    if (name == sdk::GemmFacet::kName) return static_cast<sdk::GemmFacet*>(this);
    return in_->find_facet(name);
  }

  bool supports(sdk::GemmOp op, std::span<const DType> dtypes) const override {
    for (std::size_t i = 0; i < dtypes.size() && i < 2; ++i)
      if (sdk::is_fp8(dtypes[i])) return false;
    return gemm_->supports(op, dtypes);
  }
  void gemm(const sdk::GemmArgs& a) override {
    if (fail_gemms) throw out_of_memory("gemm", std::size_t{96} << 20);
    gemm_->gemm(a);
  }
  void gemm_strided_batched(const sdk::GemmBatchedArgs& a) override {
    if (fail_gemms) throw out_of_memory("gemm", std::size_t{96} << 20);
    gemm_->gemm_strided_batched(a);
  }
  // supports() forwards gemm_gradient's answer, so the call is forwarded too (backend_gemm.h).
  void gemm_gradient(const sdk::GemmGradientArgs& a) override {
    if (fail_gemms) throw out_of_memory("gemm_gradient", std::size_t{96} << 20);
    gemm_->gemm_gradient(a);
  }

 private:
  // The shape of the CUDA backend's error (cuda_allocator.cpp, cuda_scratch.h).
  static sdk::BackendError out_of_memory(const char* op, std::size_t bytes) {
    return sdk::BackendError("backend_testgpu." + std::string(op) +
                                 ": out of device memory: asked for " + std::to_string(bytes) +
                                 " bytes; the device reports 1048576 bytes free of 42949672960",
                             "reduce the batch size or the model, or free device memory");
  }
  std::shared_ptr<sdk::DeviceBackend> in_;
  sdk::GemmFacet* gemm_;
};

struct Rig {
  core::Experiment experiment;
  core::Components components;
  std::shared_ptr<DeviceLikeBackend> device;
};

Rig rig(const std::vector<std::string>& sets, const std::string& extra_toml = {}) {
  auto config = core::Config::from_string(std::string(kEmbeddedQuickstartToml) + extra_toml,
                                          "quickstart.toml", sets);
  static core::PluginRegistry registry(&core::host_log_sink());
  static bool scanned = false;
  if (!scanned) {
    registry.scan({MIXTRAIN_PLUGIN_DIR});
    scanned = true;
  }
  Rig s{core::parse_experiment(config, registry), {}, nullptr};
  s.components = core::create_components(s.experiment, registry);
  s.device = std::make_shared<DeviceLikeBackend>(s.components.backend);
  s.components.backend = s.device;
  return s;
}

class cli_device_errors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("mixtrain-device-errors-" + std::string(info->name()) +
                                        "-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  core::TrainOptions options() const {
    core::TrainOptions opt;
    opt.run_dir = dir_;
    return opt;
  }
  // The error a Trainer built from `s` raises, as the CLI prints it.
  std::string construction_error(Rig& s) {
    try {
      core::Trainer trainer(s.experiment, std::move(s.components), options());
    } catch (const sdk::UserError& e) {
      return e.full_message();
    }
    return "(no error)";
  }
  // Every file of the run's checkpoints/ folder, by path, with its bytes.
  std::map<fs::path, std::string> checkpoint_files() const;
  fs::path dir_;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::map<fs::path, std::string> cli_device_errors::checkpoint_files() const {
  std::map<fs::path, std::string> files;
  for (const auto& f : fs::directory_iterator(dir_ / "checkpoints")) files[f.path()] = slurp(f);
  return files;
}

// --- a GPU too old for the dtype -----------------------------------------------------------------

TEST_F(cli_device_errors, AnFp8PolicyOnAGpuWithoutFp8StopsBeforeTrainingNamingTheNodeAndDtype) {
  auto s = rig({"precision.policy=fp8-delayed", "scaler.type=dynamic"});
  const std::string msg = construction_error(s);
  EXPECT_NE(msg.find("quickstart.toml:33:3: 'model.layers[0]'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 'fc1' (linear) would compute its GEMMs on fp8_e4m3"), std::string::npos)
      << msg;
  // The policy's own explanation, with the device.
  EXPECT_NE(msg.find("policy 'fp8-delayed' needs fp8_e4m3 GEMM operands"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("Test A100 (sm_80"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--set precision.policy=bf16-mixed"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir_ / "metrics.jsonl")) << "nothing may run before the check";
}

TEST_F(cli_device_errors, AnFp8PolicyNamesTheFirstNodeItsOverridesLeaveInFp8) {
  // fc1 kept in bf16 by an override, as configs/mlp-fp8.toml does: fc2 is the first FP8 GEMM.
  auto s = rig({"precision.policy=fp8-delayed", "scaler.type=dynamic"},
               "\n[[precision.override]]\nlayers = \"fc1\"\ncompute = \"bf16\"\n");
  const std::string msg = construction_error(s);
  EXPECT_NE(msg.find("node 'fc2' (linear) would compute its GEMMs on fp8_e4m3"), std::string::npos)
      << msg;
}

TEST_F(cli_device_errors, AnFp8OverrideOnAGpuWithoutFp8StopsAtThePlanTimeBackendCheck) {
  // The policy (bf16) is served; one node asks for FP8 GEMM inputs the backend refuses.
  auto s = rig({"precision.policy=bf16-mixed"},
               "\n[[precision.override]]\nlayers = \"fc2\"\ngemm_input = \"fp8_e4m3\"\n");
  const std::string msg = construction_error(s);
  EXPECT_NE(msg.find("node 'fc2' (linear) needs gemm.gemm on fp8_e4m3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("backend 'testgpu'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT:"), std::string::npos) << msg;
}

TEST_F(cli_device_errors, TheSamePoliciesRunWhereTheBackendHasFp8) {
  // The CPU backend (FP8 emulated) builds the same FP8 model: only the device was missing.
  auto config = core::Config::from_string(
      kEmbeddedQuickstartToml, "quickstart.toml",
      {"precision.policy=fp8-delayed", "scaler.type=dynamic", "run.steps=1"});
  core::PluginRegistry registry(&core::host_log_sink());
  registry.scan({MIXTRAIN_PLUGIN_DIR});
  auto e = core::parse_experiment(config, registry);
  core::TrainOptions opt = options();
  opt.write_outputs = false;
  EXPECT_NO_THROW(core::Trainer(e, core::create_components(e, registry), opt));
}

// --- out of device memory ------------------------------------------------------------------------

TEST_F(cli_device_errors, OutOfMemoryWhileAllocatingNamesTheBufferAndThePlannedPeak) {
  // 1024 rows: the batch is 128 KiB, fc1's and fc2's outputs 512 KiB each.
  auto s = rig({"data.batch_size=1024"});
  s.device->allocation_limit = 256 << 10;
  const std::string msg = construction_error(s);
  EXPECT_NE(msg.find("cannot allocate the arena of the activations and their gradients ("),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("for batches of 1024 rows"), std::string::npos) << msg;
  // The backend's own text, then the plan.
  EXPECT_NE(msg.find("backend_testgpu.allocate: out of device memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the model's memory plan for these batches predicts"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("(the arena of the activations and their gradients 2.0 MiB, parameters"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("backend 'testgpu' on Test A100 (sm_80, device 0, 108 SMs) (40.00 GiB)"),
            std::string::npos)
      << msg;
  // The fixes: the backend's, then the model's.
  EXPECT_NE(msg.find("HINT: reduce the batch size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("data.batch_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("run.accumulate"), std::string::npos) << msg;
  EXPECT_NE(msg.find("precision.policy = \"bf16-mixed\""), std::string::npos) << msg;
  // Its relus run in the linears' GEMMs, and no backward reads a relu's input: recomputing
  // would drop nothing, so the hint does not offer it.
  EXPECT_EQ(msg.find("model.recompute"), std::string::npos) << msg;
  std::printf("%s\n", msg.c_str());  // for the log: what a user reads
}

TEST_F(cli_device_errors, OutOfMemoryOffersTheRecomputationThatWouldDropOutputs) {
  // A gelu between the linears, on a device that refuses the step's arena: the error's text.
  const auto refused = [this](const std::string& recompute) {
    auto s = rig({"data.batch_size=1024", "model.recompute=" + recompute,
                  "model.layers=[{ type = \"linear\", name = \"fc1\", out = 128 }, "
                  "{ type = \"gelu\" }, { type = \"linear\", name = \"fc2\", out = 10 }]"});
    s.device->allocation_limit = 256 << 10;
    return construction_error(s);
  };
  // fc2's weight gradient reads the gelu's output, which model.recompute would compute again
  // instead of keeping.
  const std::string msg = refused("[]");
  EXPECT_NE(msg.find("cannot allocate"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.recompute = [\"gelu\"]"), std::string::npos) << msg;
  // With the gelu listed (and so apart from fc1's GEMM), what is left to offer is fc1's output,
  // which the gelu's backward reads.
  const std::string again = refused("[\"gelu\"]");
  EXPECT_NE(again.find("cannot allocate"), std::string::npos) << again;
  EXPECT_NE(again.find("model.recompute = [\"linear\"]"), std::string::npos) << again;
}

// A session that never trains (eval, predict, sample) allocates no gradients, and its forecast
// says so: the parameters' share is half a training model's (fp32 masters alone).
TEST_F(cli_device_errors, AnEvaluationOnlyForecastCountsNoGradients) {
  const auto message = [&](bool trains) {
    auto s = rig({"data.batch_size=1024"});
    s.device->allocation_limit = 256 << 10;
    core::TrainOptions opt = options();
    opt.trains = trains;
    opt.write_outputs = false;
    try {
      core::Trainer trainer(s.experiment, std::move(s.components), opt);
    } catch (const sdk::UserError& e) {
      return e.full_message();
    }
    return std::string("(no error)");
  };
  // The parameters' figure after `phrase`, in bytes ("79.5 KiB").
  const auto figure = [](const std::string& msg, const std::string& phrase) {
    const auto at = msg.find(phrase);
    if (at == std::string::npos) return -1.0;
    std::istringstream in(msg.substr(at + phrase.size()));
    double value = 0.0;
    std::string unit;
    in >> value >> unit;
    while (!unit.empty() && (unit.back() == ',' || unit.back() == ';')) unit.pop_back();
    const std::map<std::string, double> scale = {
        {"bytes", 1.0}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
    return scale.count(unit) ? value * scale.at(unit) : -1.0;
  };
  const std::string training = message(true), evaluating = message(false);
  const double with = figure(training, "parameters with their gradients and working copies ");
  const double without =
      figure(evaluating, "parameters with their working copies (nothing trains, so no gradients) ");
  ASSERT_GT(with, 0.0) << training;
  ASSERT_GT(without, 0.0) << evaluating;
  EXPECT_NEAR(with / without, 2.0, 0.02) << training << "\n" << evaluating;
}

// Parameters of 2^31 × 2^31 elements: the forecast saturates at "over 16 EiB" instead of
// wrapping around to a plausible size.
TEST_F(cli_device_errors, AnAbsurdModelIsForecastAsAbsurdNotWrappedAround) {
  auto s = rig({"model.layers.0.out=2147483647", "model.layers.2.out=2147483647"});
  s.device->allocation_limit = 256 << 10;
  const std::string msg = construction_error(s);
  EXPECT_NE(msg.find("predicts over 16 EiB in all"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parameters with their gradients and working copies over 16 EiB"),
            std::string::npos)
      << msg;
}

TEST_F(cli_device_errors, OutOfMemoryUnderA16BitPolicyDoesNotSuggestOne) {
  auto s = rig({"data.batch_size=1024", "precision.policy=bf16-mixed", "scaler.type=dynamic"});
  s.device->allocation_limit = 192 << 10;
  const std::string msg = construction_error(s);
  EXPECT_NE(msg.find("cannot allocate the "), std::string::npos) << msg;
  EXPECT_EQ(msg.find("precision.policy = \"bf16-mixed\""), std::string::npos) << msg;
}

TEST_F(cli_device_errors, OutOfMemoryMidTrainingStopsTheRunAndKeepsEveryCheckpoint) {
  auto s = rig({"run.steps=20", "run.log_every=1", "run.eval_every=0", "checkpoint.every=2",
                "checkpoint.keep=10"});
  auto device = s.device;
  core::TrainOptions opt = options();
  // After step 5: checkpoints of steps 2 and 4 exist; their bytes are taken, then the device runs
  // out of memory in step 6's first GEMM (as cuBLASLt's scratch growth would).
  std::map<fs::path, std::string> before;
  opt.after_step = [&](std::int64_t step) {
    if (step != 5) return;
    before = checkpoint_files();
    device->fail_gemms = true;
  };
  core::Trainer trainer(s.experiment, std::move(s.components), opt);
  std::string msg;
  try {
    trainer.run();
  } catch (const sdk::UserError& e) {  // the CLI prints it and exits with 2
    msg = e.full_message();
  }
  EXPECT_NE(msg.find("backend_testgpu.gemm: out of device memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("HINT:"), std::string::npos) << msg;
  ASSERT_EQ(before.size(), 2u);
  std::map<fs::path, std::string> after = checkpoint_files();
  EXPECT_EQ(after.size(), before.size())
      << "no checkpoint may be added, removed or left half-written";
  for (const auto& [path, bytes] : before) {
    ASSERT_TRUE(after.count(path)) << path;
    EXPECT_TRUE(after[path] == bytes) << path << " changed";
  }
  EXPECT_FALSE(fs::exists(dir_ / "summary.json")) << "a failed run writes no summary";
}

// A device fault while a checkpoint reads the weights (a save reads each tensor as its format
// writes it): the run stops with the device's error, not as the format's fault, and the files of
// the earlier saves stay as they were, with nothing half-written beside them.
TEST_F(cli_device_errors, ADeviceFaultDuringACheckpointIsTheDevicesAndKeepsTheEarlierFiles) {
  auto s = rig({"run.steps=20", "run.log_every=1", "run.eval_every=0", "checkpoint.every=2",
                "checkpoint.keep=10"});
  auto device = s.device;
  core::TrainOptions opt = options();
  std::map<fs::path, std::string> before;
  opt.after_step = [&](std::int64_t step) {  // before step 4's checkpoint
    if (step != 4) return;
    before = checkpoint_files();
    device->fail_copies_over = 64;
  };
  core::Trainer trainer(s.experiment, std::move(s.components), opt);
  std::string msg;
  try {
    trainer.run();
  } catch (const sdk::UserError& e) {
    msg = e.full_message();
  }
  EXPECT_NE(msg.find("backend_testgpu.copy_to_host: an uncorrectable ECC error"), std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("report it to its authors"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("failed writing"), std::string::npos) << msg;
  ASSERT_EQ(before.size(), 1u);
  std::map<fs::path, std::string> after = checkpoint_files();
  EXPECT_EQ(after, before) << "a checkpoint was added, removed, changed or left half-written";
}

}  // namespace
}  // namespace mixtrain
