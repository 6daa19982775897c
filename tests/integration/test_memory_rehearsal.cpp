// Trainer::memory_report in process, on the quickstart: its items add up to the allocator's
// count — held + step buffers + scratch + freed = the peak, to the byte — whether or not the
// backend reports its scratch apart (a wrapper hides the CPU backend's scratch facet), it
// rehearses the underflow measurement exactly when the plan stores gradients narrower than fp32,
// and that measurement keeps none of its casts. Also what `check` says of a peak near the host's or
// the device's memory (memory_headroom_warnings), and the progress a long rehearsal reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/backend_scratch.h"
#include "quickstart_components.h"

namespace mixtrain {
namespace {

using sdk::TensorView;

// Forwards everything to the inner backend but the scratch facet, which it does not offer.
class NoScratchFacet final : public sdk::DeviceBackend {
 public:
  explicit NoScratchFacet(std::shared_ptr<sdk::DeviceBackend> inner) : in_(std::move(inner)) {}
  sdk::BackendCapabilities capabilities() const override { return in_->capabilities(); }
  void* allocate(std::size_t bytes) override { return in_->allocate(bytes); }
  void deallocate(void* p) noexcept override { in_->deallocate(p); }
  sdk::MemoryStats memory_stats() const override { return in_->memory_stats(); }
  void copy_from_host(TensorView dst, const void* src) override { in_->copy_from_host(dst, src); }
  void copy_to_host(void* dst, TensorView src) override { in_->copy_to_host(dst, src); }
  void copy(TensorView dst, TensorView src) override { in_->copy(dst, src); }
  void synchronize() override { in_->synchronize(); }
  void cast(TensorView s, TensorView d, const sdk::CastArgs& a) override { in_->cast(s, d, a); }
  void fill(TensorView x, float v) override { in_->fill(x, v); }
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::ScratchFacet::kName ? nullptr : in_->find_facet(name);
  }

 private:
  std::shared_ptr<sdk::DeviceBackend> in_;
};

core::MemoryReport rehearse(const std::string& policy, bool hide_scratch,
                            std::vector<std::string> sets = {}) {
  sets.push_back("precision.policy=" + policy);
  sets.push_back("backend.threads=1");
  auto [e, c] = test::quickstart_components(sets);
  if (hide_scratch) c.backend = std::make_shared<NoScratchFacet>(c.backend);
  core::TrainOptions opt;
  opt.write_outputs = false;
  return core::Trainer(e, std::move(c), opt).memory_report(/*rehearse=*/true);
}

std::size_t sum(const std::vector<core::MemoryItem>& items) {
  std::size_t total = 0;
  for (const auto& i : items) total += i.bytes;
  return total;
}

bool rehearsed(const core::MemoryReport& r, const std::string& path) {
  return std::find(r.rehearsed.begin(), r.rehearsed.end(), path) != r.rehearsed.end();
}

TEST(MemoryRehearsal, TheItemsAddUpToThePeakToTheByte) {
  for (const std::string policy : {"fp32", "fp16-mixed"}) {
    const auto r = rehearse(policy, /*hide_scratch=*/false);
    EXPECT_EQ(sum(r.held), r.held_bytes) << policy;
    ASSERT_TRUE(r.scratch_bytes) << policy;
    EXPECT_EQ(r.held_bytes + r.step_bytes + *r.scratch_bytes + r.transient_bytes, r.peak_bytes)
        << policy;
    std::size_t grew = 0;
    for (const auto& g : r.scratch_growth) grew += g.bytes;
    EXPECT_EQ(grew, *r.scratch_bytes) << policy;  // a fresh backend: all of it grew here
  }
}

TEST(MemoryRehearsal, FrozenWeightsAreOneItemStoredOnceAndTheSumsStillHold) {
  const auto all = rehearse("bf16-mixed", false);
  const auto frozen = rehearse("bf16-mixed", false, {"train.frozen=[\"fc1\"]"});
  auto item = [](const core::MemoryReport& r, const std::string& what) -> std::size_t {
    for (const auto& i : r.held)
      if (i.what == what) return i.bytes;
    return 0;
  };
  // fc1 is 32 -> 128 (weight and bias): its fp32 master and gradient go, its bf16 copy stays,
  // counted as the frozen weights'.
  const std::size_t fc1 = (32 * 128 + 128) * 4;
  EXPECT_EQ(item(frozen, "fp32 master weights"), item(all, "fp32 master weights") - fc1);
  EXPECT_EQ(item(frozen, "fp32 weight gradients"), item(all, "fp32 weight gradients") - fc1);
  EXPECT_GT(item(frozen, "frozen weights"), 0u);
  EXPECT_EQ(item(all, "frozen weights"), 0u);
  EXPECT_EQ(sum(frozen.held), frozen.held_bytes);
  ASSERT_TRUE(frozen.scratch_bytes);
  EXPECT_EQ(frozen.held_bytes + frozen.step_bytes + *frozen.scratch_bytes + frozen.transient_bytes,
            frozen.peak_bytes);
}

// The chunked loss (the quickstart's head in blocks of 16 rows): the items still add up to the
// byte, and the peak is no higher than with the whole logits, give or take the two blocks'
// rounding to the plan's 64-byte alignment (ten classes: the logits are too small to save more).
TEST(MemoryRehearsal, TheChunkedLossKeepsTheSumsAndNeedsNoMore) {
  for (const std::string policy : {"fp32", "bf16-mixed"}) {
    const auto whole = rehearse(policy, false, {"model.loss_chunk_rows=0"});
    const auto blocks = rehearse(policy, false, {"model.loss_chunk_rows=16"});
    EXPECT_EQ(sum(blocks.held), blocks.held_bytes) << policy;
    ASSERT_TRUE(blocks.scratch_bytes) << policy;
    EXPECT_EQ(
        blocks.held_bytes + blocks.step_bytes + *blocks.scratch_bytes + blocks.transient_bytes,
        blocks.peak_bytes)
        << policy;
    EXPECT_LE(blocks.peak_bytes, whole.peak_bytes + 2 * core::kDefaultBufferAlignment) << policy;
  }
}

TEST(MemoryRehearsal, Fp16EmulationKeepsFp32CopiesOfTheGemmOperands) {
  // A run that evaluates only at its end: the step's paths are rehearsed first, and grow it.
  const auto fp32 = rehearse("fp32", false, {"run.eval_every=0"});
  const auto fp16 = rehearse("fp16-mixed", false, {"run.eval_every=0"});
  ASSERT_TRUE(fp32.scratch_bytes && fp16.scratch_bytes);
  // The quickstart is linear layers: in fp32 the CPU backend's GEMM reads them as they are.
  EXPECT_EQ(*fp32.scratch_bytes, 0u);
  EXPECT_GT(*fp16.scratch_bytes, 0u);
  for (const auto& g : fp16.scratch_growth) {
    ASSERT_TRUE(g.format) << g.where;  // each growth is at a node's GEMM
    EXPECT_EQ(*g.format, sdk::DType::fp16) << g.where;
  }
  EXPECT_TRUE(std::any_of(fp16.emulated.begin(), fp16.emulated.end(),
                          [](const auto& d) { return d.dtype == sdk::DType::fp16; }));
}

TEST(MemoryRehearsal, WithoutTheScratchFacetTheStepBuffersHoldTheScratch) {
  const auto with = rehearse("fp16-mixed", false);
  const auto without = rehearse("fp16-mixed", true);
  ASSERT_TRUE(with.scratch_bytes);
  EXPECT_FALSE(without.scratch_bytes);
  EXPECT_TRUE(without.scratch_growth.empty());
  EXPECT_EQ(without.peak_bytes, with.peak_bytes);
  EXPECT_EQ(without.held_bytes, with.held_bytes);
  EXPECT_EQ(without.step_bytes, with.step_bytes + *with.scratch_bytes);
  EXPECT_EQ(without.held_bytes + without.step_bytes + without.transient_bytes, without.peak_bytes);
}

// Where gradients are stored in a narrower range than fp32's (fp16), not where bf16 keeps fp32's
// range: a bf16 plan takes no pass, and its peak holds no fp32 copy of the step's gradients.
TEST(MemoryRehearsal, RehearsesTheUnderflowMeasurementWhereGradientsAreNarrow) {
  const auto fp32 = rehearse("fp32", false);
  const auto bf16 = rehearse("bf16-mixed", false);
  const auto fp16 = rehearse("fp16-mixed", false);
  for (const auto* r : {&fp32, &bf16, &fp16})
    for (const char* path : {"forward and backward", "gradient check", "skipped-step replay",
                             "update", "evaluation batch"})
      EXPECT_TRUE(rehearsed(*r, path)) << path;
  EXPECT_FALSE(rehearsed(fp32, "underflow measurement"));
  EXPECT_FALSE(rehearsed(bf16, "underflow measurement"));
  EXPECT_TRUE(rehearsed(fp16, "underflow measurement"));
  const auto fp16_unmeasured = rehearse("fp16-mixed", false, {"run.underflow_every=0"});
  EXPECT_LT(fp16_unmeasured.peak_bytes, fp16.peak_bytes);
}

TEST(MemoryRehearsal, TheUnderflowMeasurementKeepsNoneOfItsCasts) {
  // fp16-mixed: the pass hands each linear its gradient in fp32, which it casts to fp16; the
  // casts live while that op's backward runs, and none is held after.
  const auto r = rehearse("fp16-mixed", false);
  ASSERT_TRUE(rehearsed(r, "underflow measurement"));
  for (const auto& g : r.step_growth) EXPECT_NE(g.where, "underflow measurement") << g.bytes;
  EXPECT_GT(r.transient_bytes, 0u);
}

// A step at a large input runs for minutes: the rehearsal reports each path as it ends, in the
// order of MemoryReport::rehearsed, and reads the host's figures `check` compares the peak with.
TEST(MemoryRehearsal, ReportsEachPathAsItEndsAndReadsTheHostsMemory) {
  auto [e, c] = test::quickstart_components({"precision.policy=bf16-mixed", "backend.threads=1"});
  const sdk::BackendCapabilities caps = c.backend->capabilities();
  core::TrainOptions opt;
  opt.write_outputs = false;
  std::vector<std::string> reported;
  const auto r = core::Trainer(e, std::move(c), opt)
                     .memory_report(/*rehearse=*/true, [&](std::string_view path, double seconds) {
                       reported.emplace_back(path);
                       EXPECT_GE(seconds, 0.0) << path;
                     });
  EXPECT_EQ(reported, r.rehearsed);
  EXPECT_EQ(r.rehearsed_seconds.size(), r.rehearsed.size());
  EXPECT_EQ(r.device_memory, caps.memory_bytes);
  EXPECT_EQ(r.device_name, caps.device_name);
  // Linux says both: the process's peak is at least what it held when the rehearsal began.
  EXPECT_GT(r.host_memory_at_start, 0u);
  EXPECT_GT(r.host_peak_rss, 0u);
  EXPECT_NE(core::render_memory_report(r).find("the process's resident peak"), std::string::npos);
}

core::MemoryReport headroom(std::size_t peak, std::size_t device, std::size_t rss,
                            std::size_t host) {
  core::MemoryReport r;
  r.backend = "cuda";
  r.device_name = "a test device";
  r.rehearsed = {"forward and backward"};
  r.peak_bytes = peak;
  r.device_memory = device;
  r.host_peak_rss = rss;
  r.host_memory_at_start = host;
  return r;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(MemoryHeadroom, WarnsOfTheHostFirstThenOfTheDeviceAndOnlyAboveTheirShares) {
  constexpr std::size_t GiB = std::size_t{1} << 30;
  // Under both shares (host 79 %, device 89 %): nothing.
  EXPECT_TRUE(
      core::memory_headroom_warnings(headroom(89 * GiB, 100 * GiB, 79 * GiB, 100 * GiB)).empty());
  // The process near the host's memory: one warning with the figures and the fix.
  const auto host =
      core::memory_headroom_warnings(headroom(1 * GiB, 100 * GiB, 85 * GiB, 100 * GiB));
  ASSERT_EQ(host.size(), 1u);
  EXPECT_TRUE(contains(host[0], "host memory")) << host[0];
  EXPECT_TRUE(contains(host[0], "85%")) << host[0];
  EXPECT_TRUE(contains(host[0], "data.batch_size")) << host[0];
  // The backend's peak near its device's memory.
  const auto device =
      core::memory_headroom_warnings(headroom(95 * GiB, 100 * GiB, 1 * GiB, 100 * GiB));
  ASSERT_EQ(device.size(), 1u);
  EXPECT_TRUE(contains(device[0], "95%")) << device[0];
  EXPECT_TRUE(contains(device[0], "cuda backend")) << device[0];
  EXPECT_TRUE(contains(device[0], "a test device")) << device[0];
  // Both: the host's alone (on a CPU backend they are one memory, said once).
  const auto both =
      core::memory_headroom_warnings(headroom(95 * GiB, 100 * GiB, 90 * GiB, 100 * GiB));
  ASSERT_EQ(both.size(), 1u);
  EXPECT_TRUE(contains(both[0], "host memory")) << both[0];
}

// The time line adds up a plain step's paths only (not the evaluation, the underflow pass or the
// replay) and says nothing under a second, where one-time setup would be most of it.
TEST(MemoryHeadroom, TheStepTimeIsThePlainStepsPathsAndSaysNothingUnderASecond) {
  core::MemoryReport r;
  r.rehearsed = {"evaluation batch", "forward and backward", "underflow measurement",
                 "gradient check",   "skipped-step replay",  "update"};
  r.rehearsed_seconds = {30.0, 32.0, 60.0, 0.5, 30.0, 0.5};
  const std::string line = core::step_time_line(r, 1000);
  EXPECT_TRUE(contains(line, "took 33.0 s; 1000 steps at that rate: about 9.2 h")) << line;
  EXPECT_TRUE(contains(core::step_time_line(r, 3), "about 99 s")) << core::step_time_line(r, 3);
  // run.accumulate = 4: four micro-batches' forward and backward, one check and update.
  EXPECT_TRUE(contains(core::step_time_line(r, 10, 4), "took 129.0 s; 10 steps"))
      << core::step_time_line(r, 10, 4);
  r.rehearsed_seconds = {30.0, 0.6, 60.0, 0.1, 30.0, 0.2};
  EXPECT_EQ(core::step_time_line(r, 1000), "");
}

// `train` says the same of its first step, with the place it measured.
TEST(MemoryHeadroom, TheHostWarningNamesWhereItMeasured) {
  constexpr std::size_t GiB = std::size_t{1} << 30;
  EXPECT_FALSE(core::host_memory_warning(8 * GiB, 10 * GiB, "by the end of its first step"));
  EXPECT_FALSE(core::host_memory_warning(9 * GiB, 0, "by the end of its first step"));
  const auto w = core::host_memory_warning(9 * GiB, 10 * GiB, "by the end of its first step");
  ASSERT_TRUE(w);
  EXPECT_TRUE(contains(*w, "9.00 GiB resident by the end of its first step, 90% of the 10.00 GiB"))
      << *w;
}

TEST(MemoryHeadroom, SaysNothingWithoutARehearsalOrWhereTheFiguresAreUnknown) {
  constexpr std::size_t GiB = std::size_t{1} << 30;
  auto unrehearsed = headroom(99 * GiB, 100 * GiB, 99 * GiB, 100 * GiB);
  unrehearsed.rehearsed.clear();
  EXPECT_TRUE(core::memory_headroom_warnings(unrehearsed).empty());
  // The kernel did not say (0): no share of nothing, and no line about it.
  const auto unknown = headroom(1 * GiB, 0, 99 * GiB, 0);
  EXPECT_TRUE(core::memory_headroom_warnings(unknown).empty());
  EXPECT_FALSE(contains(core::render_memory_report(unknown), "resident peak"));
  EXPECT_FALSE(contains(core::render_memory_report(unknown), "of the backend's"));
  // A small model on a large host: a share below half a percent is "<1%", not "0%".
  const auto small = core::render_memory_report(headroom(GiB / 1000, 100 * GiB, GiB, 100 * GiB));
  EXPECT_TRUE(contains(small, "<1% of the backend's")) << small;
  EXPECT_TRUE(contains(small, "1% of the 100.00 GiB")) << small;
}

}  // namespace
}  // namespace mixtrain
