// A convolution's workspace in the step's arena (convolution facet 1.2, conv2d.h, memory_plan.h):
// the memory plan gives each convolution pass the bytes its backend asked for, live at that
// pass's step only, and the executor binds them around that one call. The CPU backend wants no
// workspace of its caller's, so here a facet asks for some and, before running the CPU's
// convolution, fills what it is handed with ones (a NaN in every float dtype): a workspace that
// shared a byte with anything live at that step would change the step. With dead buffers
// poisoned too, the step must be the plain CPU step bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cnn_test_support.h"
#include "config/model_presets.h"
#include "cpu_test_backend.h"
#include "forwarding_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/memory_plan.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"

namespace mixtrain::core {
namespace {

using namespace cnn_testing;
using sdk::DType;
using test_support::cpu;

// What the stand-in asks for a call: a size that differs per op and grows with the batch, so a
// workspace sized for another call or another batch shows.
std::size_t asked_bytes(sdk::ConvolutionOp op, const sdk::Conv2dGeometry& g) {
  return static_cast<std::size_t>(1000 + 24 * static_cast<int>(op) + 40 * g.batch * g.out_channels);
}

// The CPU's convolutions behind a facet that asks for a workspace and scribbles over it.
class ScribblingConvolution final : public ForwardingConvolution {
 public:
  using ForwardingConvolution::ForwardingConvolution;
  std::size_t conv2d_workspace_bytes(const sdk::Conv2dWorkspaceQuery& q) const override {
    ++queries;
    ++queried[q.op];
    if (refuse_queries) throw sdk::BackendError("refused", "a test's stand-in");
    return asked_bytes(q.op, q.geometry);
  }
  void conv2d_forward_with_workspace(const sdk::Conv2dForwardArgs& a, sdk::TensorView ws) override {
    scribble(sdk::ConvolutionOp::conv2d_forward, a.geometry, ws);
    in_.conv2d_forward(a);
  }
  void conv2d_backward_data_with_workspace(const sdk::Conv2dBackwardDataArgs& a,
                                           sdk::TensorView ws) override {
    scribble(sdk::ConvolutionOp::conv2d_backward_data, a.geometry, ws);
    in_.conv2d_backward_data(a);
  }
  void conv2d_backward_data_accumulate_with_workspace(const sdk::Conv2dBackwardDataArgs& a,
                                                      sdk::TensorView ws) override {
    scribble(sdk::ConvolutionOp::conv2d_backward_data_accumulate, a.geometry, ws);
    in_.conv2d_backward_data_accumulate(a);
  }
  void conv2d_backward_weights_with_workspace(const sdk::Conv2dBackwardWeightsArgs& a,
                                              sdk::TensorView ws) override {
    scribble(sdk::ConvolutionOp::conv2d_backward_weights, a.geometry, ws);
    in_.conv2d_backward_weights(a);
  }
  // With offer_accumulate, the CPU's accumulating data gradient (implemented everywhere, offered
  // there only where its conv_gemm rule runs a 1x1 one as a GEMM) into an FP32 sum; without, what
  // the CPU offers, so that the plain CPU step takes the same route.
  bool supports(sdk::ConvolutionOp op, std::span<const DType> d) const override {
    if (op == sdk::ConvolutionOp::conv2d_backward_data_accumulate && offer_accumulate)
      return d.size() == 3 && d[2] == DType::fp32 &&
             in_.supports(sdk::ConvolutionOp::conv2d_backward_data, d);
    return in_.supports(op, d);
  }
  void conv2d_forward(const sdk::Conv2dForwardArgs& a) override {
    ++plain_calls;
    in_.conv2d_forward(a);
  }
  void conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& a) override {
    ++plain_calls;
    in_.conv2d_backward_data(a);
  }
  void conv2d_backward_weights(const sdk::Conv2dBackwardWeightsArgs& a) override {
    ++plain_calls;
    in_.conv2d_backward_weights(a);
  }

  mutable int queries = 0;
  mutable std::map<sdk::ConvolutionOp, int> queried;
  bool refuse_queries = false;
  bool offer_accumulate = false;
  int workspace_calls = 0, plain_calls = 0;
  std::set<const void*> workspaces;  // every address handed over

 private:
  void scribble(sdk::ConvolutionOp op, const sdk::Conv2dGeometry& g, sdk::TensorView ws) {
    ++workspace_calls;
    workspaces.insert(ws.data);
    // The executor's workspace is sized for the step's rows: at least this call's.
    EXPECT_GE(ws.bytes(), asked_bytes(op, g)) << sdk::op_name(op);
    std::memset(ws.data, 0xFF, ws.bytes());  // the CPU backend's memory is the host's
  }
};

class WorkspaceBackend final : public test_support::ForwardingBackend {
 public:
  explicit WorkspaceBackend(bool offer_accumulate = false)
      : conv(*sdk::facet<sdk::ConvolutionFacet>(*in_)) {
    conv.offer_accumulate = offer_accumulate;
  }
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::ConvolutionFacet::kName ? &conv : in_->find_facet(name);
  }
  ScribblingConvolution conv;
};

// The CPU's convolutions as they run without a workspace of the caller's (the SDK's default
// answer, none asked for): the baseline every step here is compared with.
class PlainBackend final : public test_support::ForwardingBackend {
 public:
  PlainBackend() : conv(*sdk::facet<sdk::ConvolutionFacet>(*in_)) {}
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::ConvolutionFacet::kName ? &conv : in_->find_facet(name);
  }
  ForwardingConvolution conv;
};

std::shared_ptr<sdk::DeviceBackend> plain_cpu() {
  return std::make_shared<PlainBackend>();
}

constexpr std::int64_t kRows = 4;

std::unique_ptr<Model> bottleneck(std::shared_ptr<sdk::DeviceBackend> backend, DType dtype,
                                  bool reserve_fp32 = false) {
  ResNetPreset p;
  p.blocks = {1, 2};
  p.widths = {4, 8};
  p.block = ResNetBlock::bottleneck;
  p.classes = 3;
  auto m = std::make_unique<Model>(std::move(backend), graph(resnet_preset(p)), 3 * 8 * 8, 3,
                                   image(3, 8, 8));
  for (auto& l : m->layers()) l->set_precision(test_support::uniform_precision(dtype));
  m->allocate(kRows, reserve_fp32);
  m->init_parameters(5);
  feed(*m, kRows, 2);
  return m;
}

// `loss`, then every parameter's gradient as the model holds it, flattened.
std::vector<float> with_gradients(Model& m, float loss) {
  std::vector<float> out{loss};
  for (auto* t : m.parameters()) {
    const auto g = test_support::read(t->grad.view());
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

std::vector<std::size_t> conv_nodes(Model& m) {
  std::vector<std::size_t> nodes;
  for (std::size_t i = 0; i < m.layers().size(); ++i)
    if (m.layers()[i]->type() == "conv2d") nodes.push_back(i);
  return nodes;
}

TEST(ConvStepWorkspace, EachPassGetsItsBytesAtItsStepOnlyAndTheStepIsTheCpusBitForBit) {
  for (const DType dtype : {DType::fp32, DType::bf16}) {
    SCOPED_TRACE(std::string(sdk::dtype_name(dtype)));
    auto backend = std::make_shared<WorkspaceBackend>();
    auto m = bottleneck(backend, dtype);
    m->executor().set_poison_dead_buffers(true);
    auto plain = bottleneck(plain_cpu(), dtype);
    const std::vector<std::size_t> convs = conv_nodes(*m);
    ASSERT_GE(convs.size(), 8u);

    // Asked only for the calls a step makes, for the planned backward and the all-FP32 pass's:
    // the weight gradient written and added to (a later micro-batch's), the data gradient of
    // every convolution but the stem (its input is the batch), and an accumulating one only where
    // the CPU offers it (its conv_gemm rule: bf16 or fp32 operands into an FP32
    // sum with AMX-BF16).
    const int count = static_cast<int>(convs.size());
    EXPECT_EQ(backend->conv.queried[sdk::ConvolutionOp::conv2d_forward], count);
    EXPECT_EQ(backend->conv.queried[sdk::ConvolutionOp::conv2d_backward_weights], 2 * 2 * count);
    EXPECT_EQ(backend->conv.queried[sdk::ConvolutionOp::conv2d_backward_data], 2 * (count - 1));
    const bool offered = backend->conv.supports(sdk::ConvolutionOp::conv2d_backward_data_accumulate,
                                                std::vector<DType>{dtype, dtype, DType::fp32});
    EXPECT_EQ(backend->conv.queried[sdk::ConvolutionOp::conv2d_backward_data_accumulate] > 0,
              offered);

    // The plan: one workspace per convolution and pass, of the bytes asked, at that pass's step.
    const StepMemoryPlan& plan = m->executor().step_plan();
    const int n = static_cast<int>(m->layers().size());
    for (std::size_t i = 0; i < m->layers().size(); ++i) {
      const bool conv = std::find(convs.begin(), convs.end(), i) != convs.end();
      ASSERT_EQ(plan.forward_workspace[i] != kNoBuffer, conv) << m->layers()[i]->name();
      ASSERT_EQ(plan.backward_workspace[i] != kNoBuffer, conv) << m->layers()[i]->name();
      if (!conv) continue;
      const BufferLife& f = plan.lives[plan.forward_workspace[i]];
      const BufferLife& b = plan.lives[plan.backward_workspace[i]];
      EXPECT_EQ(f.first_step, static_cast<int>(i));
      EXPECT_EQ(f.last_step, static_cast<int>(i));
      EXPECT_EQ(b.first_step, 2 * n - static_cast<int>(i));
      EXPECT_EQ(b.last_step, 2 * n - static_cast<int>(i));
      EXPECT_NE(f.name.find("workspace (forward)"), std::string::npos) << f.name;
      EXPECT_GE(f.bytes, std::size_t{1000});
      // The backward's is the largest of its calls': the weight gradient's and the data
      // gradient's (and the accumulating one's, where the backend offers it).
      EXPECT_GE(b.bytes, f.bytes);
    }

    const std::vector<float> with = loss_and_gradients(*m, kRows);
    const std::vector<float> without = loss_and_gradients(*plain, kRows);
    ASSERT_EQ(with.size(), without.size());
    EXPECT_EQ(with, without);
    // Every convolution call of the step ran in a workspace: a forward each, and a weight
    // gradient each (the stem's input needs no gradient; the others' data gradients too).
    EXPECT_EQ(backend->conv.plain_calls, 0);
    EXPECT_GE(backend->conv.workspace_calls, 2 * static_cast<int>(convs.size()));
    EXPECT_GT(backend->conv.workspaces.size(), 1u);
  }
}

// Where the backend adds a convolution's data gradient into a sum itself, the plan asks for that
// call's workspace too, for the convolutions whose input is summed: each block's first
// convolution and each projection shortcut (5 in this net: 2 projection blocks, 1 identity).
TEST(ConvStepWorkspace, TheAccumulatingDataGradientIsAskedForWhereTheInputIsSummed) {
  auto backend = std::make_shared<WorkspaceBackend>(/*offer_accumulate=*/true);
  auto m = bottleneck(backend, DType::fp32);
  int summed = 0;
  for (const std::size_t i : conv_nodes(*m)) {
    const TensorId root = m->plan().root(m->plan().node(i).inputs[0]);
    summed +=
        root.is_node() && m->executor().step_plan().gradients.slots[root.position()].reads > 1;
  }
  EXPECT_EQ(summed, 5);
  EXPECT_EQ(backend->conv.queried[sdk::ConvolutionOp::conv2d_backward_data_accumulate], summed);
  m->executor().set_poison_dead_buffers(true);
  const std::vector<float> with = loss_and_gradients(*m, kRows);
  EXPECT_EQ(backend->conv.plain_calls, 0);
  // In fp32 the op adds what the axpy would: the CPU's step as it is, bit for bit.
  EXPECT_EQ(with, loss_and_gradients(*bottleneck(plain_cpu(), DType::fp32), kRows));
}

// The all-FP32 pass (the underflow measurement) comes between the forward and the loss, while
// the step arena holds the activations the step's own backward reads: its workspaces are planned
// in its own arena, each at its backward step there. Its counts and the step after it are the
// baseline's.
TEST(ConvStepWorkspace, TheAllFp32PassRunsInWorkspacesOfItsOwnArena) {
  for (const bool reserved : {true, false}) {
    SCOPED_TRACE(reserved ? "its arena reserved in the step's" : "its arena allocated per pass");
    auto backend = std::make_shared<WorkspaceBackend>();
    auto m = bottleneck(backend, DType::bf16, reserved);
    auto plain = bottleneck(plain_cpu(), DType::bf16, reserved);
    const auto& fp32 = m->executor().step_plan().gradients.fp32_workspace;
    const std::vector<std::size_t> convs = conv_nodes(*m);
    for (const std::size_t i : convs) EXPECT_NE(fp32[i].offset, kNoBuffer);
    m->forward(kRows);
    const int before = backend->conv.workspace_calls;
    const auto counts = measure_gradient_underflow(*m, kRows, 1.0f);
    EXPECT_GE(backend->conv.workspace_calls - before, static_cast<int>(convs.size()));
    EXPECT_EQ(backend->conv.plain_calls, 0);
    const float loss = m->loss(kRows, 1.0f, true).loss;
    m->backward(kRows);
    plain->forward(kRows);
    const auto plain_counts = measure_gradient_underflow(*plain, kRows, 1.0f);
    const float plain_loss = plain->loss(kRows, 1.0f, true).loss;
    plain->backward(kRows);
    ASSERT_EQ(counts.size(), plain_counts.size());
    for (std::size_t k = 0; k < counts.size(); ++k) {
      EXPECT_EQ(counts[k].nonzero, plain_counts[k].nonzero) << counts[k].tensor;
      EXPECT_EQ(counts[k].flushed, plain_counts[k].flushed) << counts[k].tensor;
    }
    EXPECT_EQ(with_gradients(*m, loss), with_gradients(*plain, plain_loss));
  }
}

TEST(ConvStepWorkspace, TheNonFiniteReplayKeepsTheScheduleAndItsWorkspaces) {
  auto backend = std::make_shared<WorkspaceBackend>();
  auto m = bottleneck(backend, DType::fp32);
  const std::vector<float> step = loss_and_gradients(*m, kRows);
  const int before = backend->conv.workspace_calls;
  EXPECT_EQ(locate_first_nonfinite(*m, kRows, 1.0f).where, "");
  EXPECT_GT(backend->conv.workspace_calls, before);
  EXPECT_EQ(with_gradients(*m, step[0]), step);
}

TEST(ConvStepWorkspace, AnEvaluationOfMoreRowsPlansItsOwnForwardWorkspaces) {
  auto backend = std::make_shared<WorkspaceBackend>();
  ResNetPreset p;
  p.blocks = {1};
  p.widths = {4};
  p.block = ResNetBlock::bottleneck;
  p.classes = 3;
  Model m(backend, graph(resnet_preset(p)), 3 * 8 * 8, 3, image(3, 8, 8));
  m.allocate(Executor::PassRows{2, 6});
  m.init_parameters(5);
  const ForwardMemoryPlan& eval = m.executor().evaluation_plan();
  const std::vector<std::size_t> convs = conv_nodes(m);
  for (std::size_t i : convs) {
    ASSERT_NE(eval.forward_workspace[i], kNoBuffer);
    EXPECT_GT(eval.lives[eval.forward_workspace[i]].bytes,
              m.executor().step_plan().lives[m.executor().step_plan().forward_workspace[i]].bytes)
        << "sized for the evaluation's 6 rows, not the step's 2";
  }
  m.set_mode(Model::Mode::eval);
  feed(m, 6, 3);
  const int before = backend->conv.workspace_calls;
  m.forward(6);
  EXPECT_EQ(backend->conv.workspace_calls - before, static_cast<int>(convs.size()));
  EXPECT_EQ(backend->conv.plain_calls, 0);
}

TEST(ConvStepWorkspace, AQueryTheBackendRefusesPlansNoneAndTheCallsRunWithout) {
  auto backend = std::make_shared<WorkspaceBackend>();
  backend->conv.refuse_queries = true;
  auto m = bottleneck(backend, DType::fp32);
  const StepMemoryPlan& plan = m->executor().step_plan();
  for (std::size_t i = 0; i < m->layers().size(); ++i) {
    EXPECT_EQ(plan.forward_workspace[i], kNoBuffer);
    EXPECT_EQ(plan.backward_workspace[i], kNoBuffer);
  }
  EXPECT_GT(backend->conv.queries, 0);
  const std::vector<float> with = loss_and_gradients(*m, kRows);
  EXPECT_EQ(backend->conv.workspace_calls, 0);
  EXPECT_EQ(with, loss_and_gradients(*bottleneck(plain_cpu(), DType::fp32), kRows));
}

// A backend that does not override the 1.2 methods keeps the SDK's default: no workspace asked
// for (ForwardingConvolution's stand-ins rely on it).
TEST(ConvStepWorkspace, TheSdksDefaultAsksForNone) {
  sdk::ConvolutionFacet& conv = *sdk::facet<sdk::ConvolutionFacet>(*cpu());
  sdk::Conv2dWorkspaceQuery q;
  q.geometry.batch = 2;
  EXPECT_EQ(conv.sdk::ConvolutionFacet::conv2d_workspace_bytes(q), 0u);
}

// The SDK's checks of the 1.2 calls: a workspace overlapping an operand or an output, and a query
// for an op that takes none, are refused with the tensor named.
TEST(ConvStepWorkspace, AnOverlappingWorkspaceOrABadQueryIsRefused) {
  const sdk::BackendArgumentChecks checks("cpu");
  std::vector<float> y(64), x(64), w(16), ws(32);
  sdk::Conv2dForwardArgs a;
  a.x.view = {x.data(), DType::fp32, sdk::Shape{64}};
  a.w.view = {w.data(), DType::fp32, sdk::Shape{16}};
  a.y = {y.data(), DType::fp32, sdk::Shape{64}};
  EXPECT_NO_THROW(
      checks.conv2d_workspace("conv2d_forward", {ws.data(), DType::fp32, sdk::Shape{32}}, a));
  EXPECT_NO_THROW(checks.conv2d_workspace("conv2d_forward", {}, a));
  try {
    checks.conv2d_workspace("conv2d_forward", {y.data() + 8, DType::fp32, sdk::Shape{16}}, a);
    ADD_FAILURE() << "a workspace inside y was accepted";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("workspace overlaps y"), std::string::npos) << e.what();
  }
  sdk::Conv2dBackwardWeightsArgs bw;
  bw.dw = {w.data(), DType::fp32, sdk::Shape{16}};
  EXPECT_THROW(checks.conv2d_workspace("conv2d_backward_weights",
                                       {w.data(), DType::fp32, sdk::Shape{4}}, bw),
               sdk::BackendError);

  sdk::Conv2dWorkspaceQuery q;
  EXPECT_NO_THROW(checks.conv2d_workspace_query(q));
  q.op = sdk::ConvolutionOp::pool2d_forward;
  try {
    checks.conv2d_workspace_query(q);
    ADD_FAILURE() << "a pooling query was accepted";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("takes no workspace"), std::string::npos) << e.what();
  }
  q.op = sdk::ConvolutionOp::conv2d_forward;
  q.compute = DType::bf16;
  EXPECT_THROW(checks.conv2d_workspace_query(q), sdk::BackendError);
  q.compute = DType::fp32;
  q.geometry.kernel_h = 9;  // larger than the 1-pixel image
  EXPECT_THROW(checks.conv2d_workspace_query(q), sdk::BackendError);
}

}  // namespace
}  // namespace mixtrain::core
