// StepGraph (core/src/train/step_graph.h) against a fake step-graph facet that follows the SDK
// contract: while recording, ops are stored, not run; replay runs the stored ops. The body's
// "ops" add to a counter, so a step that ran exactly once adds its value exactly once.
#include "train/step_graph.h"

#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

class FakeGraphs final : public sdk::StepGraphFacet {
 public:
  long long total = 0;  // what the ops did
  bool recording = false;
  bool refuse_begin = false;
  int begins = 0, ends = 0, released = 0;
  std::vector<std::vector<int>> graphs;
  std::vector<int> current;

  // One op of the body: stored while recording, run otherwise; `recordable` false models a host
  // upload, which raises while recording.
  void op(int value, bool recordable = true) {
    if (!recording) {
      total += value;
      return;
    }
    if (!recordable) throw sdk::BackendError("a host upload cannot be recorded", "");
    current.push_back(value);
  }

  bool begin_capture() override {
    if (refuse_begin) return false;
    ++begins;
    recording = true;
    current.clear();
    return true;
  }
  int end_capture() override {
    ++ends;
    const bool ok = recording;
    recording = false;
    if (!ok) return -1;
    graphs.push_back(current);
    return static_cast<int>(graphs.size()) - 1;
  }
  void replay(int graph) override {
    for (int v : graphs.at(static_cast<std::size_t>(graph))) total += v;
  }
  void release(int) noexcept override { ++released; }
};

// A step body of three ops whose values sum to `sum`.
std::function<void()> body(FakeGraphs& g, int sum, bool recordable = true) {
  return [&g, sum, recordable] {
    g.op(1);
    g.op(sum - 3, recordable);
    g.op(2);
  };
}

TEST(StepGraph, WarmsUpRecordsOnceThenReplaysAndEveryStepRunsExactlyOnce) {
  FakeGraphs g;
  StepGraph sg(&g, StepGraphRequest::on, "", {});
  ASSERT_TRUE(sg.active());
  const StepGraphKey key{32, 1.0f};
  for (int step = 0; step < 5; ++step) sg.run(key, false, body(g, 10));
  EXPECT_EQ(g.total, 50);  // five steps, each exactly once
  EXPECT_EQ(g.begins, 1);  // step 1 eager (warm-up), step 2 recorded, 3–5 replayed
  EXPECT_EQ(sg.captures(), 1);
  EXPECT_EQ(sg.replays(), 4);
}

// run.step_graphs unset: on where the backend offers the facet and the step is static, off (with
// the reason kept) where it does not or the step is not; false: off whatever the backend offers.
TEST(StepGraph, AutomaticIsOnWhereTheBackendRecordsAndTheStepIsStatic) {
  FakeGraphs g;
  StepGraph automatic(&g, StepGraphRequest::automatic, "", {});
  EXPECT_TRUE(automatic.active());
  for (int step = 0; step < 3; ++step) automatic.run({8, 1.0f}, false, body(g, 4));
  EXPECT_EQ(automatic.captures(), 1);  // step 1 eager, step 2 recorded and replayed, 3 replayed
  EXPECT_EQ(automatic.replays(), 2);
  StepGraph no_facet(nullptr, StepGraphRequest::automatic, "", {});
  EXPECT_FALSE(no_facet.active());
  EXPECT_EQ(no_facet.disabled_reason(), "the backend records no step graphs");
  StepGraph not_static(&g, StepGraphRequest::automatic, "run.accumulate > 1", {});
  EXPECT_FALSE(not_static.active());
  EXPECT_EQ(not_static.disabled_reason(), "run.accumulate > 1");
  StepGraph off(&g, StepGraphRequest::off, "", {});
  EXPECT_FALSE(off.active());
  EXPECT_TRUE(off.disabled_reason().empty());
}

TEST(StepGraph, ANewKeyRunsEagerlyOnceAndRecordsAgain) {
  FakeGraphs g;
  StepGraph sg(&g, StepGraphRequest::on, "", {});
  sg.run({32, 1.0f}, false, body(g, 10));
  sg.run({32, 1.0f}, false, body(g, 10));  // recorded
  sg.run({32, 2.0f}, false, body(g, 20));  // the loss scale moved: eager, old graph released
  EXPECT_EQ(g.released, 1);
  EXPECT_EQ(g.total, 40);
  sg.run({32, 2.0f}, false, body(g, 20));  // recorded with the new seed
  sg.run({32, 2.0f}, false, body(g, 20));  // replayed
  EXPECT_EQ(g.total, 80);
  EXPECT_EQ(sg.captures(), 2);
}

TEST(StepGraph, EagerStepsAreNeverRecordedNorReplayed) {
  FakeGraphs g;
  StepGraph sg(&g, StepGraphRequest::on, "", {});
  for (int i = 0; i < 3; ++i) sg.run({8, 1.0f}, /*eager=*/true, body(g, 5));
  EXPECT_EQ(g.begins, 0);
  EXPECT_EQ(g.total, 15);
}

TEST(StepGraph, AnOpThatCannotBeRecordedTurnsGraphsOffAndTheStepStillRunsOnce) {
  FakeGraphs g;
  StepGraph sg(&g, StepGraphRequest::on, "", {});
  sg.run({8, 1.0f}, false, body(g, 7, /*recordable=*/false));  // warm-up: eager, fine
  sg.run({8, 1.0f}, false, body(g, 7, false));  // recording raises: voided, rerun eagerly
  EXPECT_EQ(g.ends, 1);                          // the recording was ended
  EXPECT_FALSE(sg.active());
  EXPECT_NE(sg.disabled_reason().find("host upload"), std::string::npos);
  sg.run({8, 1.0f}, false, body(g, 7, false));  // op by op from now on
  EXPECT_EQ(g.total, 21);
  EXPECT_EQ(g.begins, 1);
}

// The body consumes host state as it runs (a gradient's first write, which overwrites, then
// adds): a voided recording consumed it with nothing run, so `restart` opens the micro-batch again
// before the eager rerun, and only then.
TEST(StepGraph, TheEagerRerunAfterAVoidedRecordingStartsFromRestartedHostState) {
  FakeGraphs g;
  StepGraph sg(&g, StepGraphRequest::on, "", {});
  bool first_write = true;  // what begin_micro_batch sets and the body's first write takes
  std::vector<bool> seen;   // first_write as each body run found it
  int restarts = 0;
  const auto step_body = [&](bool recordable) {
    return [&, recordable] {
      seen.push_back(first_write);
      first_write = false;
      body(g, 7, recordable)();
    };
  };
  const auto restart = [&] {
    ++restarts;
    first_write = true;
  };
  first_write = true;
  sg.run({8, 1.0f}, false, step_body(true), restart);  // warm-up
  first_write = true;
  sg.run({8, 1.0f}, false, step_body(true), restart);  // recorded and replayed
  first_write = true;
  sg.run({8, 1.0f}, false, step_body(true), restart);  // replayed: the body does not run
  EXPECT_EQ(restarts, 0);
  EXPECT_EQ(seen, (std::vector<bool>{true, true}));
  // A new key, warmed up, then a recording that an op voids: the rerun sees a fresh micro-batch.
  first_write = true;
  sg.run({8, 2.0f}, false, step_body(false), restart);
  first_write = true;
  sg.run({8, 2.0f}, false, step_body(false), restart);
  EXPECT_EQ(restarts, 1);
  EXPECT_EQ(seen, (std::vector<bool>{true, true, true, true, true}));
  EXPECT_FALSE(sg.active());
  EXPECT_EQ(g.total, 5 * 7);
}

TEST(StepGraph, OtherErrorsEndTheRecordingAndPropagate) {
  FakeGraphs g;
  StepGraph sg(&g, StepGraphRequest::on, "", {});
  sg.run({8, 1.0f}, false, body(g, 4));
  EXPECT_THROW(sg.run({8, 1.0f}, false, [] { throw std::runtime_error("data error"); }),
               std::runtime_error);
  EXPECT_FALSE(g.recording);
  EXPECT_EQ(g.ends, 1);
}

TEST(StepGraph, OffWhenNotRequestedNotOfferedNotStaticOrRefused) {
  FakeGraphs g;
  StepGraph not_asked(&g, StepGraphRequest::off, "", {});
  EXPECT_FALSE(not_asked.active());
  StepGraph none(nullptr, StepGraphRequest::on, "", {});
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.disabled_reason(), "the backend records no step graphs");
  // A step that is not static says why on any backend (--profile's reason comes this way).
  StepGraph profiled(nullptr, StepGraphRequest::on, "--profile times each op", {});
  EXPECT_EQ(profiled.disabled_reason(), "--profile times each op");
  StepGraph dropout(&g, StepGraphRequest::on,
                    "node 'drop' changes its arguments every step (dropout)", {});
  EXPECT_FALSE(dropout.active());
  EXPECT_NE(dropout.disabled_reason().find("dropout"), std::string::npos);

  g.refuse_begin = true;
  StepGraph refused(&g, StepGraphRequest::on, "", {});
  refused.run({8, 1.0f}, false, body(g, 3));
  refused.run({8, 1.0f}, false, body(g, 3));  // begin_capture says no: eager, and off
  EXPECT_FALSE(refused.active());
  EXPECT_EQ(g.total, 6);
}

}  // namespace
}  // namespace mixtrain::core
