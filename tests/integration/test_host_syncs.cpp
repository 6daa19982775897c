// The training step's host waits, counted: a backend wrapper forwards every op to the CPU backend
// and counts the calls that make the host wait for the device (copy_to_host, the fused
// unscale/check, first_nonfinite, synchronize). On a GPU each is a pipeline stall, so a step may
// read its check once and read more only where it reports. With the gated update the check's
// read is no stall: the optimizer's update is queued before it, which the wrapper's call log
// shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "forwarding_backend.h"
#include "logging_optimizer_facet.h"
#include "mixtrain/core/train/trainer.h"
#include "quickstart_components.h"

namespace mixtrain {
namespace {

using sdk::TensorView;

// Waits are bucketed by step: bucket i holds what happened after the i-th read of the gradient
// check and before the next one (bucket 0: setup and the first step's forward/backward). The
// gradient-check facet, which holds the waiting calls, is wrapped too, and the optimizer facet
// to log its updates; every other facet is the inner backend's (none of their ops waits).
class WaitCountingBackend final : public test::ForwardingBackend, public sdk::GradientCheckFacet {
 public:
  WaitCountingBackend(std::shared_ptr<sdk::DeviceBackend> inner, bool gated)
      : ForwardingBackend(std::move(inner)),
        checks_(sdk::facet<sdk::GradientCheckFacet>(*in_)),
        optimizer_(sdk::facet<sdk::OptimizerFacet>(*in_), calls, gated) {
    waits.push_back(0);
  }
  std::vector<int> waits;
  // The step's check and update calls in order: "check" (waits), "queue check", "read check",
  // "update", "gated update".
  std::vector<std::string> calls;

  void copy_to_host(void* dst, TensorView src) override {
    wait();
    in_->copy_to_host(dst, src);
  }
  void synchronize() override {
    wait();
    in_->synchronize();
  }

  sdk::Facet* find_facet(std::string_view name) override {
    if (name == sdk::GradientCheckFacet::kName) return static_cast<sdk::GradientCheckFacet*>(this);
    if (name == sdk::OptimizerFacet::kName) return &optimizer_;
    return in_->find_facet(name);
  }

  bool supports(sdk::GradientCheckOp op, std::span<const sdk::DType> d) const override {
    return checks_->supports(op, d);
  }
  bool unscale_and_check_finite(std::span<const TensorView> g, float inv) override {
    const bool found = checks_->unscale_and_check_finite(g, inv);
    calls.push_back("check");
    waits.push_back(0);  // the step's one allowed wait opens the next bucket
    return found;
  }
  GradientCheck unscale_check_and_sum_squares(std::span<const TensorView> g, float inv) override {
    const auto r = checks_->unscale_check_and_sum_squares(g, inv);
    calls.push_back("check");
    waits.push_back(0);  // one wait for both results, like unscale_and_check_finite
    return r;
  }
  void queue_unscale_check(std::span<const TensorView> g, float inv, bool sum_squares,
                           TensorView status) override {
    calls.push_back("queue check");  // no wait: the status stays on the device
    checks_->queue_unscale_check(g, inv, sum_squares, status);
  }
  GradientCheck queued_check_result() override {
    calls.push_back("read check");
    waits.push_back(0);  // the step's read of its check opens the next bucket
    return checks_->queued_check_result();
  }
  int first_nonfinite(std::span<const TensorView> t) override {
    wait();
    return checks_->first_nonfinite(t);
  }
  sdk::UnderflowTally count_underflow(TensorView values, float threshold) override {
    wait();  // its counts come back to the host
    return checks_->count_underflow(values, threshold);
  }

 private:
  void wait() { ++waits.back(); }
  sdk::GradientCheckFacet* checks_;
  test::LoggingOptimizerFacet optimizer_;
};

// Trains the quickstart for `steps` with log_every = 10 and returns the per-step buckets.
std::shared_ptr<WaitCountingBackend> train(std::vector<std::string> sets, int steps,
                                           bool gated = true) {
  std::vector<std::string> all = {"run.steps=" + std::to_string(steps), "run.log_every=10",
                                  "run.eval_every=0", "checkpoint.every=0"};
  all.insert(all.end(), sets.begin(), sets.end());
  auto [e, c] = test::quickstart_components(all);
  auto counting = std::make_shared<WaitCountingBackend>(c.backend, gated);
  c.backend = counting;
  core::TrainOptions opt;
  opt.run_dir = std::filesystem::temp_directory_path() /
                ("mixtrain-host-syncs-" + std::to_string(::getpid()));
  std::filesystem::remove_all(opt.run_dir);
  core::Trainer(e, std::move(c), opt).run();
  std::filesystem::remove_all(opt.run_dir);
  return counting;
}

TEST(HostSyncs, AnUnloggedStepWaitsOnlyForFoundInf) {
  constexpr int kSteps = 30;
  auto b = train({}, kSteps);
  ASSERT_GE(b->waits.size(), static_cast<std::size_t>(kSteps + 1));
  // Bucket s (1-based step s) spans step s's post-found_inf work and step s+1's forward and
  // backward. Unlogged steps: no wait besides found_inf itself.
  for (int s = 1; s < kSteps; ++s) {
    if (s % 10 == 0) {
      // A logged step reads the loss and the correct count; its gradient norm came with found_inf.
      EXPECT_EQ(b->waits[static_cast<std::size_t>(s)], 2) << "logged step " << s;
    } else {
      EXPECT_EQ(b->waits[static_cast<std::size_t>(s)], 0) << "step " << s;
    }
  }
}

// The log with each run of one call kept once: an optimizer updates its parameter groups (with
// and without weight decay) in a call each.
std::vector<std::string> phases(std::vector<std::string> calls) {
  calls.erase(std::unique(calls.begin(), calls.end()), calls.end());
  return calls;
}

// The calls of the check and the update, step by step: "queue check", "gated update", "read
// check" for every step with the gate, "check", "update" without.
std::vector<std::string> step_calls(bool gated, int steps) {
  const std::vector<std::string> one =
      gated ? std::vector<std::string>{"queue check", "gated update", "read check"}
            : std::vector<std::string>{"check", "update"};
  std::vector<std::string> want;
  for (int s = 0; s < steps; ++s) want.insert(want.end(), one.begin(), one.end());
  return want;
}

TEST(HostSyncs, TheUpdateIsQueuedBeforeTheHostReadsTheCheck) {
  constexpr int kSteps = 12;
  auto b = train({}, kSteps);
  EXPECT_EQ(phases(b->calls), step_calls(true, kSteps));
}

TEST(HostSyncs, WithoutTheGatedKernelTheHostWaitsForTheCheckThenUpdates) {
  constexpr int kSteps = 12;
  auto b = train({}, kSteps, /*gated=*/false);
  EXPECT_EQ(phases(b->calls), step_calls(false, kSteps));
  for (int s = 1; s < kSteps; ++s) {
    if (s % 10 == 0) continue;
    EXPECT_EQ(b->waits[static_cast<std::size_t>(s)], 0) << "step " << s;
  }
}

TEST(HostSyncs, ClippingIsGatedToo) {
  constexpr int kSteps = 12;
  auto b = train({"optimizer.clip_grad_norm=0.5"}, kSteps);
  EXPECT_EQ(phases(b->calls), step_calls(true, kSteps));
}

TEST(HostSyncs, Fp8ScalesKeepTheWaitBeforeTheUpdate) {
  constexpr int kSteps = 4;
  auto b = train({"precision.policy=fp8-delayed"}, kSteps);
  EXPECT_EQ(phases(b->calls), step_calls(false, kSteps));
}

TEST(HostSyncs, GradientClippingAddsNoWait) {
  constexpr int kSteps = 20;
  auto b = train({"optimizer.clip_grad_norm=0.5"}, kSteps);
  ASSERT_GE(b->waits.size(), static_cast<std::size_t>(kSteps + 1));
  for (int s = 1; s < kSteps; ++s) {
    if (s % 10 != 0) {
      EXPECT_EQ(b->waits[static_cast<std::size_t>(s)], 0) << "step " << s;
    }
  }
}

TEST(HostSyncs, DelayedFp8ReadsEveryLayersAmaxesInOneWaitPerStep) {
  constexpr int kSteps = 20;
  auto b = train({"precision.policy=fp8-delayed"}, kSteps);
  ASSERT_GE(b->waits.size(), static_cast<std::size_t>(kSteps + 1));
  // The quickstart has three linear layers, each casting three operands. The casts leave their
  // amaxes in the model's one table on the device, and the trainer reads it once after found_inf.
  for (int s = 1; s < kSteps; ++s) {
    if (s % 10 == 0) continue;
    EXPECT_EQ(b->waits[static_cast<std::size_t>(s)], 1) << "step " << s;
  }
}

}  // namespace
}  // namespace mixtrain
