// The profiler's kernel trace (profiling_backend.h): over a backend whose kernel_trace facet is a
// fake, each recording span is traced once (started as it opens, stopped as it closes), the spans
// since reset() merge by kernel name, a failed start is reported once and not retried, and the
// table prints the top kernels per step; over a backend without the facet nothing is traced. And
// an error the profiler's per-op wait raises after a facet call is raised later, never dropped.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/profiling/profiling_backend.h"
#include "mixtrain/sdk/backend_call_observer.h"
#include "mixtrain/sdk/backend_kernel_trace.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

// Each span returns `span`; `refuse` makes start throw as a missing library would.
class FakeTrace final : public sdk::KernelTraceFacet {
 public:
  void start_kernel_trace() override {
    ++starts;
    if (refuse) throw sdk::BackendError("kernel_trace: CUPTI not found", "put it on the path");
    if (running) throw std::logic_error("started twice");
    running = true;
  }
  sdk::KernelTrace stop_kernel_trace() override {
    ++stops;
    if (!running) return {};
    running = false;
    return span;
  }
  sdk::KernelTrace span;
  bool refuse = false, running = false;
  int starts = 0, stops = 0;
};

class TracedBackend final : public test_support::ForwardingBackend {
 public:
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::KernelTraceFacet::kName ? &trace : in_->find_facet(name);
  }
  FakeTrace trace;
};

TEST(ProfilerKernelTrace, EachRecordingSpanIsTracedAndTheSpansMergeByName) {
  auto inner = std::make_shared<TracedBackend>();
  inner->trace.span = {{{"wgrad", 2, 0.004}, {"fill", 3, 0.001}}, 1};
  auto p = make_profiling_backend(inner);
  // Recording from construction is not a traced span: the trainer pauses it at once.
  p->set_recording(false);
  EXPECT_EQ(inner->trace.starts, 0);
  EXPECT_EQ(inner->trace.stops, 0);
  p->set_recording(true);
  p->set_recording(true);  // already on: no second start
  EXPECT_EQ(inner->trace.starts, 1);
  EXPECT_TRUE(inner->trace.running);
  p->set_recording(false);
  EXPECT_FALSE(inner->trace.running);
  inner->trace.span = {{{"fill", 1, 0.005}, {"gemm", 4, 0.002}}, 0};
  p->set_recording(true);
  p->set_recording(false);
  const KernelTraceResult k = p->kernel_trace();
  EXPECT_TRUE(k.offered);
  EXPECT_TRUE(k.error.empty());
  ASSERT_EQ(k.trace.kernels.size(), 3u);
  EXPECT_EQ(k.trace.kernels[0].name, "fill");  // 0.006 s over 4 calls
  EXPECT_EQ(k.trace.kernels[0].calls, 4);
  EXPECT_DOUBLE_EQ(k.trace.kernels[0].device_seconds, 0.006);
  EXPECT_EQ(k.trace.kernels[1].name, "wgrad");
  EXPECT_EQ(k.trace.kernels[2].name, "gemm");
  EXPECT_EQ(k.trace.dropped, 1);

  // Two steps: per-step figures, the top 2 of 3, the dropped records said.
  const std::string table = format_kernel_trace(k, 2, 2);
  EXPECT_NE(table.find("the top 2 of 3 by device time"), std::string::npos) << table;
  EXPECT_NE(table.find("6.000 ms/step in all kernels"), std::string::npos) << table;
  EXPECT_NE(table.find("1 records lost"), std::string::npos) << table;
  EXPECT_NE(table.find("3.000   50.0%        2.0  fill"), std::string::npos) << table;
  EXPECT_NE(table.find("wgrad"), std::string::npos) << table;
  EXPECT_EQ(table.find("gemm"), std::string::npos) << table;  // third: cut

  p->reset();
  EXPECT_TRUE(p->kernel_trace().trace.kernels.empty());
}

TEST(ProfilerKernelTrace, AFailedStartIsReportedOnceAndTheOpTableStillRecords) {
  auto inner = std::make_shared<TracedBackend>();
  inner->trace.refuse = true;
  auto p = make_profiling_backend(inner);
  p->set_recording(false);
  p->set_recording(true);
  p->set_recording(false);
  p->set_recording(true);
  p->set_recording(false);
  EXPECT_EQ(inner->trace.starts, 1);  // not retried
  EXPECT_EQ(inner->trace.stops, 0);   // nothing to stop
  const KernelTraceResult k = p->kernel_trace();
  EXPECT_TRUE(k.offered);
  EXPECT_NE(k.error.find("CUPTI not found"), std::string::npos) << k.error;
  EXPECT_NE(k.error.find("put it on the path"), std::string::npos) << k.error;
  EXPECT_EQ(format_kernel_trace(k, 2), "kernels: not traced: " + k.error + "\n");
  EXPECT_GE(p->recorded_seconds(), 0.0);
}

TEST(ProfilerKernelTrace, ABackendWithoutTheFacetIsNotTracedAndPrintsNothing) {
  auto p = make_profiling_backend(test_support::cpu());
  p->set_recording(false);
  p->set_recording(true);
  p->set_recording(false);
  const KernelTraceResult k = p->kernel_trace();
  EXPECT_FALSE(k.offered);
  EXPECT_TRUE(k.trace.kernels.empty());
  EXPECT_EQ(format_kernel_trace(k, 2), "");
}

// A backend whose next synchronize() raises once, as the CUDA backend's does for a bad label that a
// kernel left in a device record (the record is cleared as it is raised).
class FailingOnceBackend final : public test_support::ForwardingBackend {
 public:
  void synchronize() override {
    if (armed) {
      armed = false;
      throw sdk::BackendError("softmax_cross_entropy: label 12 is outside [0, 10)", "fix the data");
    }
    in_->synchronize();
  }
  bool armed = false;
};

TEST(ProfilerKernelTrace, AnErrorTheWaitAfterAFacetCallFindsIsRaisedByTheNextOp) {
  auto inner = std::make_shared<FailingOnceBackend>();
  auto p = make_profiling_backend(inner);
  auto* observer = sdk::facet<sdk::CallObserverFacet>(*p);
  ASSERT_NE(observer, nullptr);
  // A facet call: its observer cannot throw, so the error waits for the next op.
  inner->armed = true;
  observer->begin_facet_call();
  observer->end_facet_call("softmax_cross_entropy");
  EXPECT_FALSE(inner->armed);
  try {
    p->synchronize();
    FAIL() << "the bad label was dropped";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("label 12"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(p->synchronize());  // raised once
  // The same through one of the backend's own ops, and through set_recording().
  inner->armed = true;
  observer->begin_facet_call();
  observer->end_facet_call("gather");
  std::vector<float> host(4, 1.0f);
  void* data = p->allocate(16);
  const sdk::TensorView v{data, sdk::DType::fp32, sdk::Shape{4}};
  EXPECT_THROW(p->copy_from_host(v, host.data()), sdk::BackendError);
  EXPECT_NO_THROW(p->copy_from_host(v, host.data()));
  inner->armed = true;
  observer->begin_facet_call();
  observer->end_facet_call("gather");
  EXPECT_THROW(p->set_recording(false), sdk::BackendError);
  p->deallocate(data);
}

}  // namespace
}  // namespace mixtrain::core
