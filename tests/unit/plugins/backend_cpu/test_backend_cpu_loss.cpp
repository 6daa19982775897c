// The CPU backend's softmax cross-entropy (facets/cpu_loss.cpp, cpu_softmax_row.h): loss, gradient
// and correct count against double references and finite differences, label smoothing, each ISA
// variant of the row kernel, the same bits on any number of threads, and bad labels.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "cpu_softmax_row.h"
#include "isa_variants.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu::testing {
namespace {

TEST(backend_cpu_loss, SoftmaxCrossEntropyLossGradAndCorrect) {
  CpuBackend be(2);
  const std::int64_t rows = 7, classes = 13;
  auto zv = random_values(static_cast<std::size_t>(rows * classes), 9, -5.0f, 5.0f);
  zv[3] = 1000.0f;  // row 0: huge logit, needs the max-subtracted log-sum-exp
  std::vector<float> labels = {3, 0, 12, 5, 5, 1, 7};
  DeviceTensor z(be, DType::fp32, {rows, classes}, zv);
  DeviceTensor lab(be, DType::int32, {rows}, labels);
  DeviceTensor loss(be, DType::fp32, {1});
  DeviceTensor correct(be, DType::int32, {1});
  DeviceTensor dz(be, DType::fp32, {rows, classes});
  const float grad_scale = 8.0f;
  sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, lab, grad_scale, 0.0f, loss, correct,
                                                        dz);

  double loss_ref = 0.0;
  int correct_ref = 0;
  std::vector<double> dz_ref;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto* row = zv.data() + r * classes;
    double mx = row[0];
    std::int64_t arg = 0;
    for (std::int64_t j = 1; j < classes; ++j)
      if (row[j] > mx) mx = row[j], arg = j;
    double s = 0.0;
    for (std::int64_t j = 0; j < classes; ++j) s += std::exp(row[j] - mx);
    const double lse = mx + std::log(s);
    const auto y = static_cast<std::int64_t>(labels[static_cast<std::size_t>(r)]);
    loss_ref += lse - row[y];
    correct_ref += arg == y;
    for (std::int64_t j = 0; j < classes; ++j)
      dz_ref.push_back((std::exp(row[j] - lse) - (j == y ? 1.0 : 0.0)) * grad_scale / rows);
  }
  loss_ref /= rows;
  EXPECT_TRUE(std::isfinite(loss.get()[0]));
  EXPECT_NEAR(loss.get()[0], loss_ref, 1e-5 * std::fabs(loss_ref));
  EXPECT_EQ(correct.view().as<std::int32_t>()[0], correct_ref);
  EXPECT_GE(correct_ref, 1);  // row 0 is right by construction
  expect_close(dz.get(), dz_ref, 1e-5, 1e-6, "dlogits");

  // Optional outputs may be omitted.
  sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, lab, 1.0f, 0.0f, loss, {}, {});
  EXPECT_NEAR(loss.get()[0], loss_ref, 1e-5 * std::fabs(loss_ref));

  DeviceTensor bad(be, DType::int32, {rows}, {3, 0, 13, 5, 5, 1, 7});
  try {
    sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, bad, 1.0f, 0.0f, loss, correct, dz);
    FAIL() << "label 13 of 13 classes must be rejected";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("row 2"), std::string::npos) << e.what();
  }
  DeviceTensor negative(be, DType::int32, {rows}, {-1, 0, 1, 5, 5, 1, 7});
  EXPECT_THROW(sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, negative, 1.0f, 0.0f, loss,
                                                                     correct, dz),
               sdk::BackendError);
}

// Label smoothing ε: loss = mean over rows of (1 - ε)·CE + ε·mean_j(-log p_j), dlogits = (p - t)
// · grad_scale / rows with t = (1 - ε)·onehot + ε / classes, against a double reference; ε = 0
// gives plain cross-entropy's bits; ε outside [0, 1] is refused.
TEST(backend_cpu_loss, SoftmaxCrossEntropyWithLabelSmoothing) {
  CpuBackend be(2);
  const std::int64_t rows = 6, classes = 11;
  const auto zv = random_values(static_cast<std::size_t>(rows * classes), 19, -4.0f, 4.0f);
  const std::vector<float> labels = {0, 10, 3, 3, 7, 5};
  DeviceTensor z(be, DType::fp32, {rows, classes}, zv);
  DeviceTensor lab(be, DType::int32, {rows}, labels);
  DeviceTensor loss(be, DType::fp32, {1}), correct(be, DType::int32, {1});
  DeviceTensor dz(be, DType::fp32, {rows, classes});
  const float grad_scale = 4.0f;
  for (const float eps : {0.1f, 0.35f, 1.0f}) {
    sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, lab, grad_scale, eps, loss, correct,
                                                          dz);
    double loss_ref = 0.0;
    std::vector<double> dz_ref;
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto* row = zv.data() + r * classes;
      double mx = row[0], s = 0.0, uniform = 0.0;
      for (std::int64_t j = 1; j < classes; ++j) mx = std::max(mx, static_cast<double>(row[j]));
      for (std::int64_t j = 0; j < classes; ++j) s += std::exp(row[j] - mx);
      const double lse = mx + std::log(s);
      const auto y = static_cast<std::int64_t>(labels[static_cast<std::size_t>(r)]);
      for (std::int64_t j = 0; j < classes; ++j) uniform += (lse - row[j]) / classes;
      loss_ref += (1.0 - eps) * (lse - row[y]) + eps * uniform;
      for (std::int64_t j = 0; j < classes; ++j) {
        const double t = (j == y ? 1.0 - eps : 0.0) + static_cast<double>(eps) / classes;
        dz_ref.push_back((std::exp(row[j] - lse) - t) * grad_scale / rows);
      }
    }
    loss_ref /= rows;
    EXPECT_NEAR(loss.get()[0], loss_ref, 2e-6 * loss_ref) << "eps " << eps;
    expect_close(dz.get(), dz_ref, 1e-5, 1e-6, "smoothed dlogits");
  }
  // Smoothing takes probability mass from the label: on rows the model gets right with
  // confidence, the smoothed loss is above plain cross-entropy.
  DeviceTensor confident(be, DType::fp32, {1, 3}, {8.0f, 0.0f, 0.0f});
  DeviceTensor first(be, DType::int32, {1}, {0});
  DeviceTensor plain(be, DType::fp32, {1});
  sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(confident, first, 1.0f, 0.0f, plain, {},
                                                        {});
  sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(confident, first, 1.0f, 0.1f, loss, {}, {});
  EXPECT_LT(plain.get()[0], loss.get()[0]);
  for (const float bad : {-0.01f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    try {
      sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, lab, 1.0f, bad, loss, {}, dz);
      ADD_FAILURE() << "label_smoothing " << bad << " must be refused";
    } catch (const sdk::BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("label_smoothing"), std::string::npos) << e.what();
    }
  }
}

// The smoothed loss's gradient is its derivative: central differences of the loss (in double
// from fp32 forwards) against dlogits with grad_scale 1.
TEST(backend_cpu_loss, SmoothedCrossEntropyGradientMatchesFiniteDifferences) {
  CpuBackend be(1);
  const std::int64_t rows = 3, classes = 5;
  auto zv = random_values(static_cast<std::size_t>(rows * classes), 23, -2.0f, 2.0f);
  const std::vector<float> labels = {4, 0, 2};
  DeviceTensor lab(be, DType::int32, {rows}, labels);
  DeviceTensor loss(be, DType::fp32, {1});
  for (const float eps : {0.0f, 0.2f, 0.9f}) {
    DeviceTensor z(be, DType::fp32, {rows, classes}, zv);
    DeviceTensor dz(be, DType::fp32, {rows, classes});
    sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, lab, 1.0f, eps, loss, {}, dz);
    const auto analytic = dz.get();
    auto loss_at = [&](std::vector<float> v) {
      DeviceTensor zz(be, DType::fp32, {rows, classes}, v);
      sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(zz, lab, 1.0f, eps, loss, {}, {});
      return static_cast<double>(loss.get()[0]);
    };
    const float h = 1e-2f;
    for (std::size_t i = 0; i < zv.size(); ++i) {
      auto up = zv, down = zv;
      up[i] += h;
      down[i] -= h;
      const double numeric = (loss_at(up) - loss_at(down)) /
                             (static_cast<double>(up[i]) - static_cast<double>(down[i]));
      EXPECT_NEAR(analytic[i], numeric, 2e-4) << "eps " << eps << " logit " << i;
    }
  }
}

// softmax_row on every ISA variant this CPU runs, against double arithmetic on the same floats.
// The bounds come from the format: z_j - max is rounded to fp32 (relative error in e^(z_j - max)
// up to |z_j - max|·2^-24), the exponential is within 1 ulp, the lanes' double sum, 1 / Σ and the
// product add a few ulp (2^-19 covers them with room); lse inherits the sum's relative error as
// an absolute one. Rows long and short (one class, a partial last block, GPT-2's vocabulary),
// a NaN first logit, ties and an in-place call.
TEST(backend_cpu_loss, SoftmaxRowOnEveryIsaVariantMatchesADoubleReference) {
  for (const Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    for (const std::int64_t classes : {1, 7, 63, 64, 65, 1000, 50257}) {
      auto z = random_values(static_cast<std::size_t>(classes), static_cast<std::uint32_t>(classes),
                             -12.0f, 12.0f);
      double top = z[0];
      for (const float v : z) top = std::max(top, static_cast<double>(v));
      double sum = 0.0, z_sum = 0.0;
      for (const float v : z) sum += std::exp(v - top), z_sum += v;
      const double lse = top + std::log(sum);
      std::vector<float> p(z.size());
      const SoftmaxRow row = softmax_row(z.data(), classes, p.data(), true);
      const std::string where = isa_name(isa) + ", " + std::to_string(classes) + " classes";
      EXPECT_NEAR(row.lse, lse, 0x1p-19 * std::max(1.0, std::fabs(lse))) << where;
      EXPECT_NEAR(row.z_sum, z_sum, 1e-12 * classes) << where;
      EXPECT_EQ(z[static_cast<std::size_t>(row.argmax)], static_cast<float>(top)) << where;
      for (std::size_t j = 0; j < z.size(); ++j) {
        const double ref = std::exp(z[j] - lse);
        const double bound = ref * (std::fabs(z[j] - top) * 0x1p-24 + 0x1p-19);
        ASSERT_NEAR(p[j], ref, bound) << where << ", class " << j;
      }
      // In place (p is z): the same bits.
      std::vector<float> inplace = z;
      const SoftmaxRow again = softmax_row(inplace.data(), classes, inplace.data(), true);
      EXPECT_EQ(again.lse, row.lse) << where;
      EXPECT_EQ(again.z_sum, row.z_sum) << where;
      EXPECT_EQ(inplace, p) << where;
    }
    // The argmax is the scan's: ties to the lower index, NaNs past z[0] never win, a NaN z[0]
    // stays (and the row's lse is NaN either way).
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> tie = {1.0f, 3.0f, -2.0f, 3.0f, nan, 3.0f};
    EXPECT_EQ(softmax_row(tie.data(), 6, nullptr, false).argmax, 1) << isa_name(isa);
    EXPECT_TRUE(std::isnan(softmax_row(tie.data(), 6, nullptr, false).lse)) << isa_name(isa);
    std::vector<float> lead = {nan, 5.0f, 7.0f};
    EXPECT_EQ(softmax_row(lead.data(), 3, nullptr, false).argmax, 0) << isa_name(isa);
    std::vector<float> clean = {1.0f, 3.0f, -2.0f, 3.0f, 0.0f, 3.0f};
    EXPECT_EQ(softmax_row(clean.data(), 6, nullptr, false).argmax, 1) << isa_name(isa);
    // Past the first 64-logit block the first maximum is found block by block: a tie in a later
    // block, in the block after a full one, and in the partial block at the end.
    for (const std::int64_t first : {64, 700, 1000, 1030}) {
      std::vector<float> row = random_values(1037, 3, -5.0f, 5.0f);
      row[static_cast<std::size_t>(first)] = 9.0f;
      if (first + 3 < 1037) row[static_cast<std::size_t>(first + 3)] = 9.0f;
      row[1036] = 9.0f;
      EXPECT_EQ(softmax_row(row.data(), 1037, nullptr, false).argmax, first)
          << isa_name(isa) << ", first maximum at " << first;
    }
  }
}

// The row's sums run in fixed double lanes (cpu_softmax_row.cpp), so the ISA variants that compute
// the exponentials alike (both contract exp_shifted's polynomial into FMAs: x86-64-v4 and v3) give
// the same lse, Σ z and probabilities bit for bit at any vector width.
TEST(backend_cpu_loss, SoftmaxRowIsTheSameBitsOnEveryFmaVariant) {
  const auto isas = runnable_isas();
  if (std::find(isas.begin(), isas.end(), Isa::v4) == isas.end())
    GTEST_SKIP() << "this CPU runs no x86-64-v4 variant to compare with v3";
  for (const std::int64_t classes : {7, 65, 1000, 50257}) {
    const auto z = random_values(static_cast<std::size_t>(classes),
                                 static_cast<std::uint32_t>(classes + 5), -12.0f, 12.0f);
    std::vector<float> p4(z.size()), p3(z.size());
    SoftmaxRow r4, r3;
    {
      IsaScope scope(Isa::v4);
      r4 = softmax_row(z.data(), classes, p4.data(), true);
    }
    {
      IsaScope scope(Isa::v3);
      r3 = softmax_row(z.data(), classes, p3.data(), true);
    }
    EXPECT_EQ(r4.lse, r3.lse) << classes << " classes";
    EXPECT_EQ(r4.z_sum, r3.z_sum) << classes << " classes";
    EXPECT_EQ(p4, p3) << classes << " classes";
  }
}

// The mean loss, the correct count and dlogits have the same bits on 1, 2 and 3 threads: each
// row is one thread's work and the rows' losses are summed in row order. Enough rows and classes
// that the OpenMP team is used (kParallelMin), in fp32 and bf16, with and without smoothing.
TEST(backend_cpu_loss, SameBitsOnAnyNumberOfThreads) {
  const std::int64_t rows = 37, classes = 2053;
  const auto zv = random_values(static_cast<std::size_t>(rows * classes), 41, -6.0f, 6.0f);
  std::vector<float> labels;
  for (std::int64_t r = 0; r < rows; ++r) labels.push_back(static_cast<float>((r * 131) % classes));
  for (const DType dtype : {DType::fp32, DType::bf16}) {
    for (const float eps : {0.0f, 0.1f}) {
      std::vector<float> loss_1, dz_1;
      std::int32_t correct_1 = -1;
      for (const int threads : {1, 2, 3}) {
        CpuBackend be(threads);
        DeviceTensor z(be, dtype, {rows, classes}, zv), lab(be, DType::int32, {rows}, labels);
        DeviceTensor loss(be, DType::fp32, {1}), correct(be, DType::int32, {1});
        DeviceTensor dz(be, dtype, {rows, classes});
        sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, lab, 2.0f, eps, loss, correct, dz);
        const std::int32_t right = correct.view().as<std::int32_t>()[0];
        if (threads == 1) {
          loss_1 = loss.get(), dz_1 = dz.get(), correct_1 = right;
          continue;
        }
        const std::string where = std::string(sdk::dtype_name(dtype)) + ", eps " +
                                  std::to_string(eps) + ", " + std::to_string(threads) + " threads";
        EXPECT_EQ(loss.get(), loss_1) << where;
        EXPECT_EQ(dz.get(), dz_1) << where;
        EXPECT_EQ(right, correct_1) << where;
      }
    }
  }
}

// A bf16 dlogits is the fp32 gradient rounded once (the SDK's encode_bf16), bit for bit: the rows
// written straight into bf16 storage by one pass (softmax_gradient_row) against an fp32 dlogits of
// the same logits encoded afterwards. Labels first, last and inside, with and without smoothing.
TEST(backend_cpu_loss, Bf16GradientIsTheFp32GradientRoundedOnce) {
  CpuBackend be(2);
  const std::int64_t rows = 6, classes = 1031;
  const auto zv = random_values(static_cast<std::size_t>(rows * classes), 83, -9.0f, 9.0f);
  const std::vector<float> labels = {0, 1030, 64, 65, 500, 1};
  DeviceTensor lab(be, DType::int32, {rows}, labels);
  DeviceTensor z(be, DType::fp32, {rows, classes}, zv);
  for (const float eps : {0.0f, 0.1f}) {
    DeviceTensor loss(be, DType::fp32, {1}), loss16(be, DType::fp32, {1});
    DeviceTensor dz(be, DType::fp32, {rows, classes}), dz16(be, DType::bf16, {rows, classes});
    sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, lab, 512.0f, eps, loss, {}, dz);
    sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, lab, 512.0f, eps, loss16, {}, dz16);
    EXPECT_EQ(loss16.get(), loss.get()) << "eps " << eps;
    const float* exact = dz.view().as<const float>();
    const auto* rounded = dz16.view().as<const std::uint16_t>();
    for (std::int64_t i = 0; i < rows * classes; ++i)
      ASSERT_EQ(rounded[i], sdk::encode_bf16(exact[i])) << "eps " << eps << ", element " << i;
  }
}

// bf16 logits are read in place by the row kernel: the loss, the correct count and the gradient
// (fp32 and bf16, and bf16 written over the logits) are the bits of the same values given as fp32.
// bf16's ties for the max (many here: the values are rounded to 8 bits) must pick the first
// index; a row holds a NaN inside, another at 0; labels at both ends; a row's tail past the blocks
// of 64.
TEST(backend_cpu_loss, Bf16LogitsReadInPlaceGiveTheBitsOfTheirFp32Values) {
  CpuBackend be(2);
  const std::int64_t rows = 6, classes = 1031;
  auto zv = random_values(static_cast<std::size_t>(rows * classes), 47, -6.0f, 6.0f);
  for (float& v : zv) v = sdk::decode_bf16(sdk::encode_bf16(v));  // exact in both dtypes
  zv[2 * classes + 700] = std::numeric_limits<float>::quiet_NaN();
  zv[4 * classes] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> labels = {0, 1030, 64, 1000, 3, 512};
  DeviceTensor lab(be, DType::int32, {rows}, labels);
  DeviceTensor z32(be, DType::fp32, {rows, classes}, zv);
  for (const float eps : {0.0f, 0.1f}) {
    for (const DType grad : {DType::fp32, DType::bf16}) {
      DeviceTensor z16(be, DType::bf16, {rows, classes}, zv);
      DeviceTensor loss32(be, DType::fp32, {1}), loss16(be, DType::fp32, {1});
      DeviceTensor right32(be, DType::int32, {1}), right16(be, DType::int32, {1});
      DeviceTensor dz32(be, grad, {rows, classes}), dz16(be, grad, {rows, classes});
      auto* facet = sdk::facet<sdk::LossFacet>(be);
      facet->softmax_cross_entropy(z32, lab, 64.0f, eps, loss32, right32, dz32);
      facet->softmax_cross_entropy(z16, lab, 64.0f, eps, loss16, right16, dz16);
      const std::string what =
          "eps " + std::to_string(eps) + ", dlogits " + std::string(sdk::dtype_name(grad));
      EXPECT_TRUE(std::isnan(loss32.get()[0])) << what;  // the NaN rows
      EXPECT_TRUE(std::isnan(loss16.get()[0])) << what;
      EXPECT_EQ(right16.view().as<std::int32_t>()[0], right32.view().as<std::int32_t>()[0]) << what;
      const std::size_t bytes = static_cast<std::size_t>(rows * classes) * sdk::dtype_size(grad);
      EXPECT_EQ(std::memcmp(dz16.view().data, dz32.view().data, bytes), 0) << what;
      if (grad == DType::bf16) {  // dlogits over the bf16 logits themselves
        DeviceTensor loss_in(be, DType::fp32, {1});
        facet->softmax_cross_entropy(z16, lab, 64.0f, eps, loss_in, {}, z16);
        EXPECT_EQ(std::memcmp(z16.view().data, dz32.view().data, bytes), 0) << what;
      }
    }
  }
  // Without the NaNs the losses themselves compare.
  zv[2 * classes + 700] = 1.0f;
  zv[4 * classes] = -1.0f;
  DeviceTensor a(be, DType::fp32, {rows, classes}, zv), b(be, DType::bf16, {rows, classes}, zv);
  DeviceTensor la(be, DType::fp32, {1}), lb(be, DType::fp32, {1});
  sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(a, lab, 1.0f, 0.1f, la, {}, {});
  sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(b, lab, 1.0f, 0.1f, lb, {}, {});
  EXPECT_TRUE(std::isfinite(la.get()[0]));
  EXPECT_EQ(lb.get(), la.get());
}

// dlogits may be the logits' own buffer: the same loss, correct count and gradient as with two
// buffers, with and without smoothing (the label's logit and Σ z are read before the row is
// overwritten).
TEST(backend_cpu_loss, GradientInPlaceOverTheLogitsMatchesTwoBuffers) {
  CpuBackend be(2);
  const std::int64_t rows = 5, classes = 300;
  const auto zv = random_values(static_cast<std::size_t>(rows * classes), 61, -4.0f, 4.0f);
  const std::vector<float> labels = {0, 299, 17, 17, 150};
  DeviceTensor lab(be, DType::int32, {rows}, labels);
  for (const float eps : {0.0f, 0.2f}) {
    DeviceTensor z(be, DType::fp32, {rows, classes}, zv), dz(be, DType::fp32, {rows, classes});
    DeviceTensor loss(be, DType::fp32, {1}), correct(be, DType::int32, {1});
    sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, lab, 3.0f, eps, loss, correct, dz);
    DeviceTensor both(be, DType::fp32, {rows, classes}, zv);
    DeviceTensor loss2(be, DType::fp32, {1}), correct2(be, DType::int32, {1});
    sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(both, lab, 3.0f, eps, loss2, correct2,
                                                          both);
    EXPECT_EQ(loss2.get(), loss.get()) << "eps " << eps;
    EXPECT_EQ(correct2.view().as<std::int32_t>()[0], correct.view().as<std::int32_t>()[0]);
    EXPECT_EQ(both.get(), dz.get()) << "eps " << eps;
  }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
