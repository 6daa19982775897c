// PyTorch parity of label smoothing (label_smoothing_reference.py under /usr/bin/python3 with
// torch): the CPU backend's softmax_cross_entropy with label_smoothing ε gives
// torch.nn.CrossEntropyLoss(label_smoothing=ε)'s loss and gradient on the same logits, ε = 0
// (plain cross-entropy) included, for fp32 and bf16 logits.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <vector>

#include "cpu_backend.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "torch_test_support.h"

namespace mixtrain::test {
namespace {

using sdk::DType;

struct Result {
  float loss = 0.0f;
  std::vector<float> grad;
};

// The loss facet on `logits` stored as `dtype` (values representable in it), gradient in fp32.
Result cpu_loss(const std::vector<float>& logits, const std::vector<std::int32_t>& labels,
                std::int64_t rows, std::int64_t classes, float eps, float grad_scale, DType dtype) {
  static backend_cpu::CpuBackend cpu(2);
  auto alloc = [&](DType t, sdk::Shape shape) {
    sdk::TensorView v{nullptr, t, shape};
    v.data = cpu.allocate(v.bytes());
    return v;
  };
  const auto z32 = alloc(DType::fp32, sdk::Shape{rows, classes});
  const auto z = dtype == DType::fp32 ? z32 : alloc(dtype, sdk::Shape{rows, classes});
  const auto y = alloc(DType::int32, sdk::Shape{rows});
  const auto loss = alloc(DType::fp32, sdk::Shape{1});
  const auto dz = alloc(DType::fp32, sdk::Shape{rows, classes});
  cpu.copy_from_host(z32, logits.data());
  if (dtype != DType::fp32) cpu.cast(z32, z);
  cpu.copy_from_host(y, labels.data());
  sdk::facet<sdk::LossFacet>(cpu)->softmax_cross_entropy(z, y, grad_scale, eps, loss, {}, dz);
  Result r;
  cpu.copy_to_host(&r.loss, loss);
  r.grad.resize(static_cast<std::size_t>(rows * classes));
  cpu.copy_to_host(r.grad.data(), dz);
  for (auto v : {z32, y, loss, dz}) cpu.deallocate(v.data);
  if (dtype != DType::fp32) cpu.deallocate(z.data);
  return r;
}

class LabelSmoothingParity : public CliTest {};

TEST_F(LabelSmoothingParity, LossAndGradientAreTorchsCrossEntropyLoss) {
  if (!torch_available()) GTEST_SKIP() << torch_missing_message("label smoothing parity");
  const std::int64_t rows = 24, classes = 10;
  std::mt19937 rng(29);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> logits(static_cast<std::size_t>(rows * classes));
  // bf16-representable values, so the bf16 run reads the very logits torch gets.
  for (auto& v : logits) v = sdk::decode_bf16(sdk::encode_bf16(d(rng)));
  logits[5] = 40.0f;  // a confident row, where smoothing matters most
  std::vector<std::int32_t> labels;
  for (std::int64_t r = 0; r < rows; ++r) labels.push_back(static_cast<std::int32_t>(r * 3 % 10));
  const std::vector<std::pair<float, float>> cases = {
      {0.0f, 1.0f}, {0.1f, 1.0f}, {0.25f, 1024.0f}, {1.0f, 1.0f}};
  json in = {{"rows", rows}, {"classes", classes}, {"logits", logits}, {"labels", labels}};
  for (const auto& [eps, scale] : cases)
    in["cases"].push_back({{"eps", eps}, {"grad_scale", scale}});
  std::ofstream(dir_ / "logits.json") << in.dump();
  const json r =
      run_torch_script(dir_, "label_smoothing_reference.py", (dir_ / "logits.json").string());
  ASSERT_TRUE(r.is_object() && r.contains("results")) << "the reference printed no JSON";
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const auto [eps, scale] = cases[c];
    const auto& theirs = r["results"][c];
    const double want = theirs["loss"].get<double>();
    const auto grad = theirs["grad"].get<std::vector<double>>();
    for (DType dtype : {DType::fp32, DType::bf16}) {
      SCOPED_TRACE("eps " + std::to_string(eps) + " " + std::string(sdk::dtype_name(dtype)));
      const Result ours = cpu_loss(logits, labels, rows, classes, eps, scale, dtype);
      EXPECT_NEAR(ours.loss, want, 1e-6 * std::fabs(want));
      double worst = 0.0;
      for (std::size_t i = 0; i < grad.size(); ++i) {
        const double err = std::fabs(ours.grad[i] - grad[i]);
        worst = std::max(worst, err / (std::fabs(grad[i]) + 1e-6 * scale));
        EXPECT_NEAR(ours.grad[i], grad[i], 1e-6 * std::fabs(grad[i]) + 1e-7 * scale)
            << "logit " << i;
      }
      RecordProperty("worst_grad_rel_" + std::to_string(c) + std::string(sdk::dtype_name(dtype)),
                     std::to_string(worst));
    }
  }
}

}  // namespace
}  // namespace mixtrain::test
