// The CNN ops through the model (conv2d, batchnorm2d, pooling, the channels-last layout, the
// resnet preset) on the core tests' CPU backend: finite-difference gradients of whole small
// networks (through the fused pairs), evaluation with running statistics, synchronized batch norm,
// PyTorch's flatten order, plan-time errors. The fusions themselves: test_cnn_fusion.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cnn_test_support.h"
#include "config/model_presets.h"
#include "cpu_test_backend.h"
#include "distributed/data_parallel.h"
#include "graph/ops/batchnorm2d.h"
#include "layer_gradient_check.h"
#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {
namespace {

using namespace cnn_testing;
using sdk::DType;
using test_support::cpu;
using test_support::op;
using test_support::random_vector;
using test_support::read;
using test_support::write;

// Allocates, perturbs the parameters, runs one step and checks every parameter's gradient
// against central differences of the loss.
void check_model_gradients(Model& m, std::int64_t batch, float eps) {
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(batch);
  m.init_parameters(3);
  for (auto* p : m.parameters()) {
    auto v = read(p->master.view());
    auto noise = random_vector(v.size(), 17, -0.3f, 0.3f);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += noise[i];
    write(p->master.view(), v);
  }
  feed(m, batch, 1);
  m.forward(batch);
  ASSERT_TRUE(std::isfinite(m.loss(batch, 1.0f, true).loss));
  m.backward(batch);
  for (auto* p : m.parameters()) {
    const auto analytic = read(p->grad.view());
    const auto fd = test_support::finite_difference(m, *p, batch, analytic, eps);
    // Loose enough for FP32 forwards and the kinks of relu and max pooling that a step of `eps`
    // can cross; a wrong gradient is off by far more.
    EXPECT_LT(fd.max_err, 1e-2 * std::max(1.0, fd.max_ref))
        << p->name << " (largest |gradient| " << fd.max_ref << ")";
    EXPECT_GT(fd.max_ref, 1e-4) << p->name << ": a gradient check of nothing";
  }
}

TEST(CnnOps, ConvBatchNormPoolNetworkGradientsMatchFiniteDifferences) {
  // The batch [3, 6, 6] is plain (the first conv permutes it); a strided, dilated and grouped
  // conv, BN fused with its relu, BN without affine, max and average pooling, a residual add of
  // two channels-last tensors, and the global pool into a linear.
  Model m(
      cpu(),
      graph(
          {op("conv2d", "c1", {{"out", 4}, {"kernel", 3}, {"padding", 1}, {"bias", false}},
              {"input"}),
           op("batchnorm2d", "b1", {}, {"c1"}), op("relu", "r1", {}, {"b1"}),
           op("conv2d", "c2",
              {{"out", 4},
               {"kernel", 3},
               {"padding", 2},
               {"dilation", 2},
               {"groups", 2},
               {"bias", false}},  // a bias right before batch norm has no gradient
              {"r1"}),
           op("batchnorm2d", "b2", {{"affine", false}}, {"c2"}), op("add", "res", {}, {"b2", "r1"}),
           op("maxpool2d", "mp", {{"kernel", 2}}, {"res"}),
           op("conv2d", "c3", {{"out", 6}, {"kernel", 2}, {"stride", 1}, {"bias", true}}, {"mp"}),
           op("avgpool2d", "ap",
              {{"kernel", 2}, {"stride", 1}, {"padding", 1}, {"count_include_pad", false}}, {"c3"}),
           op("global_avgpool", "gap", {}, {"ap"}), op("linear", "fc", {{"out", 3}}, {"gap"})}),
      3 * 6 * 6, 3, image(3, 6, 6));
  EXPECT_TRUE(m.layers()[2]->is_view()) << "the relu after b1 is fused into it";
  check_model_gradients(m, 3, 2e-3f);
}

// The network of the test above, BN fused with its relu and BN without affine.
Model small_cnn() {
  return Model(
      cpu(),
      graph(
          {op("conv2d", "c1", {{"out", 4}, {"kernel", 3}, {"padding", 1}, {"bias", false}},
              {"input"}),
           op("batchnorm2d", "b1", {}, {"c1"}), op("relu", "r1", {}, {"b1"}),
           op("conv2d", "c2", {{"out", 4}, {"kernel", 3}, {"padding", 1}, {"bias", false}}, {"r1"}),
           op("batchnorm2d", "b2", {{"affine", false}}, {"c2"}), op("add", "res", {}, {"b2", "r1"}),
           op("global_avgpool", "gap", {}, {"res"}), op("linear", "fc", {{"out", 3}}, {"gap"})}),
      3 * 6 * 6, 3, image(3, 6, 6));
}

TEST(CnnOps, SynchronizedBatchNormOnOneRankIsPlainBatchNorm) {
  // Synchronized batch norm with a one-rank reducer (the sums stay as they are) runs the split
  // ops (statistics, normalise with given statistics, reduce, elementwise): the same loss,
  // gradients and running statistics as the fused ops, and gradients that match finite
  // differences of the loss.
  Model plain = small_cnn(), synced = small_cnn();
  int reductions = 0;
  std::size_t last_length = 0;
  for (auto& l : synced.layers())
    if (auto* bn = dynamic_cast<BatchNorm2dLayer*>(l.get())) {
      bn->set_statistics_reducer([&](std::span<double> v) {
        ++reductions;
        last_length = v.size();
      });
      EXPECT_TRUE(bn->synchronized());
      EXPECT_TRUE(bn->traits().varies_per_step) << "a step graph cannot capture the reductions";
    }
  const std::int64_t batch = 3;
  double loss[2];
  std::vector<std::vector<float>> grads[2], running[2];
  Model* models[2] = {&plain, &synced};
  for (int k = 0; k < 2; ++k) {
    Model& m = *models[k];
    for (auto& l : m.layers()) l->set_precision({});
    m.allocate(batch);
    m.init_parameters(3);
    feed(m, batch, 5);
    m.forward(batch);
    loss[k] = m.loss(batch, 1.0f, true).loss;
    m.backward(batch);
    for (auto* p : m.parameters()) grads[k].push_back(read(p->grad.view()));
    for (auto* b : m.buffers()) running[k].push_back(read(b->value.view()));
  }
  EXPECT_EQ(reductions, 4) << "per batch-norm layer: the statistics and the backward's sums";
  EXPECT_EQ(last_length, 2u * 4u) << "Σg and Σg·x̂ of 4 channels";
  EXPECT_NEAR(loss[1], loss[0], 1e-6 * std::abs(loss[0]));
  ASSERT_EQ(grads[1].size(), grads[0].size());
  for (std::size_t i = 0; i < grads[0].size(); ++i)
    for (std::size_t j = 0; j < grads[0][i].size(); ++j)
      EXPECT_NEAR(grads[1][i][j], grads[0][i][j], 1e-5 * std::max(1.0f, std::abs(grads[0][i][j])))
          << plain.parameters()[i]->name << "[" << j << "]";
  for (std::size_t i = 0; i < running[0].size(); ++i)
    for (std::size_t j = 0; j < running[0][i].size(); ++j)
      EXPECT_NEAR(running[1][i][j], running[0][i][j], 1e-6) << plain.buffers()[i]->name;

  Model checked = small_cnn();
  for (auto& l : checked.layers())
    if (auto* bn = dynamic_cast<BatchNorm2dLayer*>(l.get()))
      bn->set_statistics_reducer([](std::span<double>) {});
  check_model_gradients(checked, batch, 2e-3f);
}

TEST(CnnOps, SynchronizedBatchNormOnABackendWithoutTheSplitOpsStopsAtPlanTime) {
  auto backend = no_split_batch_norm();
  auto make = [&] {
    return Model(
        backend,
        graph({op("conv2d", "c1", {{"out", 2}, {"kernel", 1}, {"bias", false}}, {"input"}),
               op("batchnorm2d", "bn7", {}, {"c1"}), op("global_avgpool", "gap", {}, {"bn7"}),
               op("linear", "fc", {{"out", 3}}, {"gap"})}),
        3 * 4 * 4, 3, image(3, 4, 4));
  };
  // Local batch norm needs only version 1's ops.
  Model local = make();
  for (auto& l : local.layers()) l->set_precision({});
  EXPECT_NO_THROW(local.allocate(2));
  Model synced = make();
  for (auto& l : synced.layers()) {
    l->set_precision({});
    if (auto* bn = dynamic_cast<BatchNorm2dLayer*>(l.get()))
      bn->set_statistics_reducer([](std::span<double>) {});
  }
  try {
    synced.allocate(2);
    FAIL() << "the plan accepted synchronized batch norm without the split ops";
  } catch (const sdk::UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'bn7'"), std::string::npos) << what;
    EXPECT_NE(what.find("batchnorm_statistics"), std::string::npos) << what;
  }
}

// Two ranks where the other one holds this rank's very batch: a sum over the ranks doubles each
// value. Tensor collectives complete at once without touching the data (this test reads no
// gradient bucket after them).
class MirrorCommunicator final : public sdk::Communicator {
 public:
  int host_reductions = 0;
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string description() const override { return "mirror, 2 ranks"; }
  void bind(sdk::DeviceBackend&) override {}
  sdk::CommunicationHandlePtr start_all_reduce(sdk::TensorView, sdk::ReduceOp) override {
    return std::make_unique<Done>();
  }
  sdk::CommunicationHandlePtr start_reduce_scatter(sdk::TensorView, sdk::TensorView,
                                                   sdk::ReduceOp) override {
    return std::make_unique<Done>();
  }
  sdk::CommunicationHandlePtr start_all_gather(sdk::TensorView, sdk::TensorView) override {
    return std::make_unique<Done>();
  }
  void broadcast(sdk::TensorView, int) override {}
  void barrier() override {}
  void all_reduce_host(std::span<double> values, sdk::ReduceOp op) override {
    ++host_reductions;
    if (op == sdk::ReduceOp::sum)
      for (double& v : values) v *= 2.0;
  }
  void broadcast_host(std::vector<std::byte>&, int) override {}

 private:
  struct Done final : sdk::CommunicationHandle {
    bool test() override { return true; }
    void wait() override {}
  };
};

// What the trainer binds the optimizer to, before data parallel moves the gradients.
void bind_lists(Model& m, std::vector<sdk::Parameter>& params,
                std::vector<sdk::TensorView>& grads) {
  for (auto* p : m.parameters()) {
    sdk::Parameter sp;
    sp.name = p->name;
    sp.tensors.master = p->master.view();
    sp.tensors.grad = p->grad.view();
    params.push_back(sp);
    grads.push_back(p->grad.view());
  }
}

TEST(CnnOps, DataParallelInstallsSynchronizedBatchNormOnEveryBatchNormLayer) {
  // 2 ranks with the same batch: the global batch's mean and variance are this batch's, and so
  // are the backward's means, so loss and gradients are plain batch norm's; the running variance
  // is unbiased over the 2·rows of the global batch. Two host all-reduces per layer and step, none
  // while the hook is off (the non-finite replay).
  const std::int64_t batch = 3, rows = batch * 6 * 6;
  Model plain = small_cnn(), synced = small_cnn();
  auto comm = std::make_shared<MirrorCommunicator>();
  DataParallelSettings settings;
  settings.sync_batch_norm = true;
  DataParallel dp(comm, cpu(), settings);
  double loss[2];
  std::vector<std::vector<float>> grads[2], running[2];
  Model* models[2] = {&plain, &synced};
  for (int k = 0; k < 2; ++k) {
    Model& m = *models[k];
    for (auto& l : m.layers()) l->set_precision({});
    m.allocate(batch);
    m.init_parameters(3);
    if (k == 1) {
      std::vector<sdk::Parameter> params;
      std::vector<sdk::TensorView> views;
      bind_lists(m, params, views);
      dp.attach(m, params, views);
      int layers = 0;
      for (auto& l : m.layers())
        if (auto* bn = dynamic_cast<BatchNorm2dLayer*>(l.get())) {
          EXPECT_TRUE(bn->synchronized()) << bn->name();
          ++layers;
        }
      EXPECT_EQ(layers, 2);
      dp.begin_step();
    }
    feed(m, batch, 5);
    m.forward(batch);
    loss[k] = m.loss(batch, 1.0f, true).loss;
    m.backward(batch);
    for (auto* p : m.parameters()) grads[k].push_back(read(p->grad.view()));
    for (auto* b : m.buffers()) running[k].push_back(read(b->value.view()));
  }
  EXPECT_EQ(comm->host_reductions, 4);
  EXPECT_NEAR(loss[1], loss[0], 1e-6 * std::abs(loss[0]));
  for (std::size_t i = 0; i < grads[0].size(); ++i)
    for (std::size_t j = 0; j < grads[0][i].size(); ++j)
      EXPECT_NEAR(grads[1][i][j], grads[0][i][j], 1e-5 * std::max(1.0f, std::abs(grads[0][i][j])))
          << plain.parameters()[i]->name << "[" << j << "]";
  // Buffers: b1.running_mean, b1.running_var, b2.running_mean, b2.running_var; momentum 0.1 from
  // 0 and 1. The plain run's variance: (rv - 0.9) / 0.1 · (rows - 1) / rows.
  const double n = static_cast<double>(rows);
  for (std::size_t i = 0; i < running[0].size(); ++i)
    for (std::size_t j = 0; j < running[0][i].size(); ++j) {
      if (i % 2 == 0) {
        EXPECT_NEAR(running[1][i][j], running[0][i][j], 1e-6) << plain.buffers()[i]->name;
        continue;
      }
      const double var = (running[0][i][j] - 0.9) / 0.1 * (n - 1.0) / n;
      EXPECT_NEAR(running[1][i][j], 0.9 + 0.1 * var * 2.0 * n / (2.0 * n - 1.0), 1e-6)
          << plain.buffers()[i]->name;
    }
  const auto alone = dp.local_only();
  synced.forward(batch);
  EXPECT_EQ(comm->host_reductions, 4) << "the replay communicates nothing";
}

TEST(CnnOps, DataParallelSyncBatchNormOnABackendWithoutTheSplitOpsNamesTheNode) {
  auto backend = no_split_batch_norm();
  Model m(backend,
          graph({op("conv2d", "c1", {{"out", 2}, {"kernel", 1}, {"bias", false}}, {"input"}),
                 op("batchnorm2d", "bn7", {}, {"c1"}), op("global_avgpool", "gap", {}, {"bn7"}),
                 op("linear", "fc", {{"out", 3}}, {"gap"})}),
          3 * 4 * 4, 3, image(3, 4, 4));
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(2);
  DataParallelSettings settings;
  settings.sync_batch_norm = true;
  DataParallel dp(std::make_shared<MirrorCommunicator>(), backend, settings);
  std::vector<sdk::Parameter> params;
  std::vector<sdk::TensorView> grads;
  bind_lists(m, params, grads);
  try {
    dp.attach(m, params, grads);
    FAIL() << "attach accepted synchronized batch norm without the split ops";
  } catch (const sdk::BackendError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'bn7'"), std::string::npos) << what;
    EXPECT_NE(what.find("batchnorm_statistics"), std::string::npos) << what;
    EXPECT_NE(what.find("batch_norm = \"sync\""), std::string::npos) << what;
  }
}

TEST(CnnOps, FlattenOfAChannelsLastImageIsInPyTorchOrder) {
  Model m(cpu(),
          graph({op("conv2d", "c", {{"out", 3}, {"kernel", 1}, {"bias", false}}, {"input"}),
                 op("flatten", "f", {}, {"c"}), op("linear", "fc", {{"out", 2}}, {"f"})}),
          2 * 2 * 3, 2, image(2, 2, 3));
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(2);
  m.init_parameters(1);
  feed(m, 2, 4);
  m.forward(2);
  const auto x = read(m.input(2));                        // [N, 2, 2, 3] channels first
  const auto w = read(m.parameters()[0]->master.view());  // [3, 2, 1, 1]
  const auto flat = read(m.layers()[1]->output(2));       // [N, 3·2·3]
  for (int n = 0; n < 2; ++n)
    for (int o = 0; o < 3; ++o)
      for (int p = 0; p < 6; ++p) {
        const float want = w[o * 2 + 0] * x[n * 12 + 0 * 6 + p] + w[o * 2 + 1] * x[n * 12 + 6 + p];
        EXPECT_NEAR(flat[n * 18 + o * 6 + p], want, 1e-5) << n << "," << o << "," << p;
      }
  // And its gradient flows back through the permute.
  check_model_gradients(m, 2, 1e-2f);
}

TEST(CnnOps, BatchNormUsesBatchStatisticsInTrainingAndRunningStatisticsInEval) {
  // The layer alone (a model's activation plan may reuse its output's memory after its readers),
  // reading a plain [2, 3, 3] batch of 4.
  BatchNorm2dLayer bn("bn", 2, 3, 3, 1e-5f, 0.25f, true, /*plain_input=*/true);
  bn.set_precision({});
  const std::int64_t rows = 4 * 2 * 3;  // output rows: N·C·H
  bn.allocate(cpu(), rows);
  bn.init_parameters(0);
  write(bn.parameters()[0].master.view(), {1.5f, 0.5f});
  write(bn.parameters()[1].master.view(), {0.1f, -0.2f});
  Tensor xt(cpu(), DType::fp32, sdk::Shape{4, 18});
  const auto x = random_vector(72, 9, -2.0f, 3.0f);  // [4, 2, 3, 3] channels first
  write(xt.view(), x);
  bn.forward(xt.view(), rows);
  // Per channel: mean and biased / unbiased variance over N·H·W = 36 values.
  std::vector<double> mean(2), var(2);
  for (int c = 0; c < 2; ++c) {
    double s = 0, s2 = 0;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 9; ++i) s += x[n * 18 + c * 9 + i];
    mean[c] = s / 36;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 9; ++i) s2 += std::pow(x[n * 18 + c * 9 + i] - mean[c], 2);
    var[c] = s2 / 36;
  }
  const auto rm = read(bn.buffers()[0].value.view());
  const auto rv = read(bn.buffers()[1].value.view());
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(rm[c], 0.25 * mean[c], 1e-5);
    EXPECT_NEAR(rv[c], 0.75 + 0.25 * var[c] * 36.0 / 35.0, 1e-5);  // unbiased, as PyTorch
  }
  // Training output: normalised with the batch's statistics (the output is channels-last).
  const float g[2] = {1.5f, 0.5f}, b[2] = {0.1f, -0.2f};
  auto expect_normalised = [&](const std::vector<double>& m, const std::vector<double>& v,
                               const char* what) {
    const auto y = read(bn.output(rows));  // [4, 3, 3, 2]
    for (int n = 0; n < 4; ++n)
      for (int c = 0; c < 2; ++c)
        for (int i = 0; i < 9; ++i) {
          const double want = (x[n * 18 + c * 9 + i] - m[c]) / std::sqrt(v[c] + 1e-5) * g[c] + b[c];
          EXPECT_NEAR(y[(n * 9 + i) * 2 + c], want, 1e-4)
              << what << " " << n << "," << c << "," << i;
        }
  };
  expect_normalised(mean, var, "training");
  // Eval: the running statistics, nothing updated.
  bn.set_training(false);
  bn.forward(xt.view(), rows);
  expect_normalised({rm[0], rm[1]}, {rv[0], rv[1]}, "eval");
  EXPECT_EQ(read(bn.buffers()[0].value.view()), rm);
  EXPECT_EQ(read(bn.buffers()[1].value.view()), rv);
}

TEST(CnnOps, ResNetPresetNamesItsTensorsAsTorchvision) {
  ResNetPreset p;
  p.blocks = {1, 1};
  p.widths = {4, 8};
  p.classes = 5;
  Model m(cpu(), graph(resnet_preset(p)), 3 * 8 * 8, 5, image(3, 8, 8));
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(2);
  std::vector<std::string> names;
  for (auto* t : m.parameters()) names.push_back(t->name);
  for (auto* b : m.buffers()) names.push_back(b->name);
  for (const char* want :
       {"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight", "layer1.0.bn2.bias",
        "layer2.0.conv1.weight", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight",
        "fc.weight", "fc.bias", "bn1.running_mean", "bn1.running_var",
        "layer2.0.downsample.1.running_var"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  EXPECT_EQ(std::count_if(names.begin(), names.end(),
                          [](const std::string& s) { return s.find("downsample") != s.npos; }),
            5)
      << "stage 1 keeps its width and stride: no shortcut conv there";
  // conv1 3·4·9, bn1 8, layer1: 2·(4·4·9) + 2·8, layer2: 4·8·9 + 8·8·9 + 2·16 + 4·8 + 16, fc 8·5+5
  EXPECT_EQ(m.parameter_count(), 108 + 8 + 288 + 16 + 288 + 576 + 32 + 32 + 16 + 45);
}

TEST(CnnOps, ResNetGradientsMatchFiniteDifferences) {
  ResNetPreset p;
  p.blocks = {1, 1};
  p.widths = {2, 4};
  p.classes = 3;
  Model m(cpu(), graph(resnet_preset(p)), 3 * 4 * 4, 3, image(3, 4, 4));
  check_model_gradients(m, 2, 2e-3f);
}

// torchvision's resnet50(): parameter and buffer names in state_dict order, less
// num_batches_tracked (not kept), written out from torchvision's definition, not from the preset.
std::vector<std::string> torchvision_resnet50_names() {
  std::vector<std::string> names = {"conv1.weight"};
  auto bn = [&](const std::string& m) {
    for (const char* t : {"weight", "bias", "running_mean", "running_var"})
      names.push_back(m + "." + t);
  };
  bn("bn1");
  const int blocks[] = {3, 4, 6, 3};
  for (int s = 1; s <= 4; ++s)
    for (int b = 0; b < blocks[s - 1]; ++b) {
      const std::string h = "layer" + std::to_string(s) + "." + std::to_string(b) + ".";
      for (const char* i : {"1", "2", "3"}) {
        names.push_back(h + "conv" + i + ".weight");
        bn(h + "bn" + i);
      }
      if (b == 0) {
        names.push_back(h + "downsample.0.weight");
        bn(h + "downsample.1");
      }
    }
  names.push_back("fc.weight");
  names.push_back("fc.bias");
  return names;
}

ResNetPreset resnet50() {
  ResNetPreset p;
  p.blocks = {3, 4, 6, 3};
  p.widths = {64, 128, 256, 512};
  p.block = ResNetBlock::bottleneck;
  p.stem = ResNetStem::imagenet;
  p.classes = 1000;
  return p;
}

std::int64_t int_option(const LayerSpec& l, const std::string& key) {
  for (const auto& o : l.options)
    if (o.key == key) return std::get<std::int64_t>(o.value);
  ADD_FAILURE() << l.name << " has no option " << key;
  return -1;
}

TEST(CnnOps, ResNet50PresetIsTorchvisionsResNet50NameForName) {
  const std::vector<LayerSpec> nodes = resnet_preset(resnet50());
  // stem conv1, bn1, relu, maxpool; 16 bottlenecks of 10 nodes (conv/bn/relu ×3 less a relu,
  // add, relu3); 4 shortcuts of 2; avgpool, fc.
  EXPECT_EQ(nodes.size(), 4u + 16 * 10 + 4 * 2 + 2);
  auto node = [&](const std::string& name) -> const LayerSpec& {
    for (const auto& l : nodes)
      if (l.name == name) return l;
    ADD_FAILURE() << "no node " << name;
    return nodes.front();
  };
  std::vector<std::string> block_nodes;
  for (const auto& l : nodes)
    if (l.name.starts_with("layer2.0.")) block_nodes.push_back(l.name.substr(9));
  EXPECT_EQ(block_nodes,
            (std::vector<std::string>{"conv1", "bn1", "relu1", "conv2", "bn2", "relu2", "conv3",
                                      "bn3", "downsample.0", "downsample.1", "add", "relu3"}));
  EXPECT_EQ(node("layer2.0.add").inputs,
            (std::vector<std::string>{"layer2.0.bn3", "layer2.0.downsample.1"}));
  EXPECT_EQ(node("layer2.1.add").inputs,
            (std::vector<std::string>{"layer2.1.bn3", "layer2.0.relu3"}));
  // v1.5: the first block of stages 2-4 strides on its 3×3 conv2 and its shortcut, never on the
  // 1×1 conv1; layer1.0 has a stride-1 shortcut (64 stem channels into 256).
  for (const char* stage : {"layer1.0.", "layer2.0.", "layer3.0.", "layer4.0."}) {
    const std::int64_t stride = std::string(stage) == "layer1.0." ? 1 : 2;
    EXPECT_EQ(int_option(node(stage + std::string("conv1")), "stride"), 1) << stage;
    EXPECT_EQ(int_option(node(stage + std::string("conv2")), "stride"), stride) << stage;
    EXPECT_EQ(int_option(node(stage + std::string("conv3")), "stride"), 1) << stage;
    EXPECT_EQ(int_option(node(stage + std::string("downsample.0")), "stride"), stride) << stage;
  }
  for (const auto& l : nodes) {
    if (!l.name.starts_with("layer")) continue;
    const bool first = l.name.find(".0.") != std::string::npos;
    EXPECT_FALSE(l.name.find("downsample") != std::string::npos && !first) << l.name;
    if (l.type == "conv2d" && !first) {
      EXPECT_EQ(int_option(l, "stride"), 1) << l.name;
    }
  }

  // The tensors, from the shapes the model gives them (3×32×32 keeps the activations small; the
  // parameters do not depend on the image size).
  Model m(cpu(), graph(nodes), 3 * 32 * 32, 1000, image(3, 32, 32));
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(1);
  EXPECT_EQ(m.parameter_count(), 25'557'032) << "torchvision.models.resnet50()'s";
  std::vector<std::string> names;
  for (auto* t : m.parameters()) names.push_back(t->name);
  EXPECT_EQ(names.size(), 161u);
  for (auto* b : m.buffers()) names.push_back(b->name);
  auto want = torchvision_resnet50_names();
  std::sort(names.begin(), names.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names, want);
  auto shape_of = [&](const std::string& name) {
    std::vector<std::int64_t> dims;
    for (auto* t : m.parameters())
      if (t->name == name)
        for (int i = 0; i < t->master.shape().rank; ++i) dims.push_back(t->master.shape()[i]);
    return dims;
  };
  using S = std::vector<std::int64_t>;
  EXPECT_EQ(shape_of("conv1.weight"), (S{64, 3, 7, 7}));
  EXPECT_EQ(shape_of("layer1.0.conv1.weight"), (S{64, 64, 1, 1}));
  EXPECT_EQ(shape_of("layer1.0.downsample.0.weight"), (S{256, 64, 1, 1}));
  EXPECT_EQ(shape_of("layer2.0.conv1.weight"), (S{128, 256, 1, 1}));
  EXPECT_EQ(shape_of("layer2.0.conv2.weight"), (S{128, 128, 3, 3}));
  EXPECT_EQ(shape_of("layer2.0.conv3.weight"), (S{512, 128, 1, 1}));
  EXPECT_EQ(shape_of("layer4.2.conv3.weight"), (S{2048, 512, 1, 1}));
  EXPECT_EQ(shape_of("fc.weight"), (S{1000, 2048}));
}

TEST(CnnOps, BottleneckResNetGradientsMatchFiniteDifferences) {
  // check_model_gradients' bound, element by element, less the kinks: a Bottleneck network has
  // more ReLUs behind batch norms over few values than a BasicBlock one, so a central difference
  // may step over a ReLU kink at an isolated weight (off by up to the gradient's size; measured:
  // none here, one or two elements in other sizes and steps). A wrong gradient is wrong at most
  // elements, so each parameter must match at all but max(1, 5%) of its elements.
  ResNetPreset p;
  p.blocks = {1, 1};
  p.widths = {2, 2};
  p.block = ResNetBlock::bottleneck;
  p.classes = 3;
  const std::int64_t hw = 4, batch = 4;
  const float eps = 1e-3f;
  Model m(cpu(), graph(resnet_preset(p)), 3 * hw * hw, 3, image(3, hw, hw));
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(batch);
  ASSERT_EQ(m.fused_pairs(), 2);  // each bn3 runs in its add: the fused backward is checked
  m.init_parameters(3);
  feed(m, batch, 1);
  m.forward(batch);
  ASSERT_TRUE(std::isfinite(m.loss(batch, 1.0f, true).loss));
  m.backward(batch);
  for (auto* param : m.parameters()) {
    const auto analytic = read(param->grad.view());
    auto values = read(param->master.view());
    std::size_t off = 0;
    double ref2 = 0, worst = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float saved = values[i];
      double l[2];
      for (int side = 0; side < 2; ++side) {
        values[i] = saved + (side == 0 ? eps : -eps);
        write(param->master.view(), values);
        m.forward(batch);
        l[side] = m.loss(batch, 1.0f, false).loss;
      }
      values[i] = saved;
      write(param->master.view(), values);
      const double fd = (l[0] - l[1]) / (2.0 * eps), e = std::abs(fd - analytic[i]);
      off += e > 1e-2 * std::max(1.0, std::abs(fd));
      ref2 += fd * fd;
      worst = std::max(worst, e);
    }
    EXPECT_LE(off, std::max<std::size_t>(1, values.size() / 20))
        << param->name << ": " << off << " of " << values.size() << " elements off, worst by "
        << worst;
    EXPECT_GT(ref2, 1e-8) << param->name << ": a gradient check of nothing";
  }
}

std::string plan_error(std::vector<LayerSpec> nodes, InputSpec in = image(3, 8, 8)) {
  try {
    Model m(cpu(), graph(std::move(nodes)), 3 * 8 * 8, 4, in);
  } catch (const sdk::ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(CnnOps, BadGeometriesArePlanTimeErrorsNamingTheNode) {
  auto head = [](const std::string& from) {
    return std::vector<LayerSpec>{op("global_avgpool", "gap", {}, {from}),
                                  op("linear", "fc", {{"out", 4}}, {"gap"})};
  };
  auto with_head = [&](std::vector<LayerSpec> body, const std::string& last) {
    for (auto& l : head(last)) body.push_back(l);
    return body;
  };
  std::string e =
      plan_error(with_head({op("conv2d", "big", {{"out", 4}, {"kernel", 11}}, {"input"})}, "big"));
  EXPECT_NE(e.find("'big'"), e.npos) << e;
  EXPECT_NE(e.find("larger than its padded input"), e.npos) << e;
  e = plan_error(
      with_head({op("conv2d", "g", {{"out", 4}, {"kernel", 3}, {"groups", 2}}, {"input"})}, "g"));
  EXPECT_NE(e.find("'g'"), e.npos) << e;
  EXPECT_NE(e.find("does not divide"), e.npos) << e;
  e = plan_error(
      with_head({op("conv2d", "c", {{"out", 4}, {"kernel", 3}, {"in", 1}}, {"input"})}, "c"));
  EXPECT_NE(e.find("'c'"), e.npos) << e;
  EXPECT_NE(e.find("3 channels"), e.npos) << e;
  e = plan_error(
      with_head({op("maxpool2d", "mp", {{"kernel", 2}, {"padding", 2}}, {"input"})}, "mp"));
  EXPECT_NE(e.find("'mp'"), e.npos) << e;
  // A linear reading a channels-last image, and an add mixing layouts.
  e = plan_error({op("conv2d", "c", {{"out", 4}, {"kernel", 1}}, {"input"}),
                  op("linear", "fc", {{"out", 4}}, {"c"})});
  EXPECT_NE(e.find("'fc'"), e.npos) << e;
  EXPECT_NE(e.find("channels-last"), e.npos) << e;
  e = plan_error(with_head({op("conv2d", "c", {{"out", 3}, {"kernel", 1}}, {"input"}),
                            op("add", "a", {}, {"c", "input"})},
                           "a"));
  EXPECT_NE(e.find("'a'"), e.npos) << e;
  // An image op fed a flat tensor.
  e = plan_error({op("linear", "l", {{"out", 8}}, {"input"}),
                  op("conv2d", "c", {{"out", 4}, {"kernel", 1}}, {"l"}),
                  op("global_avgpool", "gap", {}, {"c"}),
                  op("linear", "fc", {{"out", 4}}, {"gap"})});
  EXPECT_NE(e.find("'c'"), e.npos) << e;
  EXPECT_NE(e.find("reads images [C, H, W]"), e.npos) << e;
}

}  // namespace
}  // namespace mixtrain::core
