// PyTorch parity of the dropout op (dropout_reference.py under /usr/bin/python3 with torch):
// evaluation mode and p = 0 equal torch.nn.Dropout's output exactly, and in training mode our
// output equals torch's formula x * m / (1 - p) with m our own mask (the generators differ, so
// only the convention can match: which scale, applied how).
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "cpu_backend.h"
#include "mixtrain/core/graph/model.h"
#include "torch_test_support.h"

namespace mixtrain::test {
namespace {

using core::Model;

// A model that is one dropout node over [N, F] features: its output is the logits.
std::vector<float> run_dropout(double p, bool training, const std::vector<float>& x,
                               std::int64_t rows, std::int64_t features) {
  static auto cpu = std::make_shared<backend_cpu::CpuBackend>(2);
  core::ModelSpec spec;
  core::LayerSpec l;
  l.type = "dropout";
  l.name = "drop";
  l.options.push_back({"p", p, {}});
  spec.layers = {l};
  Model m(cpu, spec, features, static_cast<std::int32_t>(features));
  for (auto& op : m.layers()) op->set_precision({});
  m.allocate(rows);
  m.init_parameters(1234);
  m.set_mode(training ? Model::Mode::train : Model::Mode::eval);
  m.begin_micro_batch(0, 1, 3);
  cpu->copy_from_host(m.input(rows), x.data());
  m.forward(rows);
  std::vector<float> y(x.size());
  cpu->copy_to_host(y.data(), m.logits(rows));
  return y;
}

class DropoutParity : public CliTest {};

TEST_F(DropoutParity, EvalAndPZeroAreTorchsAndTrainingIsTorchsFormulaOnOurMask) {
  if (!torch_available()) GTEST_SKIP() << torch_missing_message("dropout parity");
  const std::int64_t rows = 64, features = 96;
  const double p = 0.3;
  std::mt19937 rng(17);
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> x(static_cast<std::size_t>(rows * features));
  for (auto& v : x) v = d(rng);
  json in;
  in["p"] = p;
  in["shape"] = {rows, features};
  in["x"] = x;
  in["y_train"] = run_dropout(p, true, x, rows, features);
  in["y_eval"] = run_dropout(p, false, x, rows, features);
  in["y_p0"] = run_dropout(0.0, true, x, rows, features);
  std::ofstream(dir_ / "tensors.json") << in.dump();
  const json r = run_torch_script(dir_, "dropout_reference.py", (dir_ / "tensors.json").string());
  ASSERT_TRUE(r.is_object()) << "the reference printed no JSON";
  EXPECT_EQ(r["eval_max_abs"].get<double>(), 0.0);
  EXPECT_EQ(r["p0_max_abs"].get<double>(), 0.0);
  // torch divides by (1 - p) computed in double and rounded to float; we use 1 / (1 - p) in
  // float: equal up to one rounding of the scale.
  EXPECT_LE(r["train_max_rel"].get<double>(), 2e-7);
  EXPECT_NEAR(r["kept_fraction"].get<double>(), 1.0 - p, 0.05);
}

}  // namespace
}  // namespace mixtrain::test
