// CudaBackend layer kernels, element-wise ops, mixed-precision machinery and fused optimizers
// against the CPU reference on random inputs. Both compute in FP32 from the same stored inputs;
// the remaining differences are summation order and libm (tanhf/expf) ulps, so fp32 outputs
// agree to ~1e-5 relative and 16-bit outputs to one unit of their format. The ungated optimizer
// updates are the exception: the same element steps as the CPU's, so the same bits, on aligned and
// unaligned views.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "cuda_column_sums.h"
#include "cuda_gradient_check_facet.h"
#include "cuda_test_util.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/gradient_clipping.h"

namespace mixtrain::backend_cuda::testing {
namespace {

const DType kStorage[] = {DType::fp32, DType::bf16, DType::fp16};

double tol_rel(DType t) { return t == DType::fp32 ? 2e-5 : ulp_rel(t); }

TEST_F(backend_cuda_vs_cpu, BiasGrad) {
  for (auto [rows, n] : {std::pair<std::int64_t, std::int64_t>{7, 13}, {3000, 100}, {1, 1}}) {
    const auto y0 = random_values(static_cast<std::size_t>(rows * n), 1);
    const auto bias = random_values(static_cast<std::size_t>(n), 2);
    for (DType dt : kStorage) {
      const std::string what = "rows " + std::to_string(rows) + " " + std::string(sdk::dtype_name(dt));
      Tensor gy(gpu(), dt, {rows, n}, y0), gb(gpu(), DType::fp32, {n}, bias);
      Tensor cy(cpu(), dt, {rows, n}, y0), cb(cpu(), DType::fp32, {n}, bias);

      for (bool accumulate : {true, false}) {
        Tensor gd(gpu(), DType::fp32, {n}, bias), cd(cpu(), DType::fp32, {n}, bias);
        gpu<sdk::ActivationFacet>().bias_grad(gy, gd, accumulate);
        sdk::facet<sdk::ActivationFacet>(cpu())->bias_grad(cy, cd, accumulate);
        expect_close(gd.get(), cd.get(), 1e-5, 1e-5 * std::sqrt(static_cast<double>(rows)),
                     "bias_grad " + what);
        // Fixed partition and order: bit-reproducible.
        const auto first = gd.get();
        gd.set(bias);
        gpu<sdk::ActivationFacet>().bias_grad(gy, gd, accumulate);
        EXPECT_EQ(gd.get(), first) << "bias_grad not reproducible, " << what;
      }
    }
  }
}

// bias_grad's two column-sum paths give the same bits: a 16-byte-aligned dy whose rows are whole
// 16-byte packs (every storage dtype at 768 columns) runs a thread per pack, and the same values
// one element into a larger buffer (unaligned to 16 bytes) run the element path; the partition
// and each column's order of terms are the same (cuda_column_sums.cu). Rows across several
// splits and a partial last one.
TEST_F(backend_cuda_vs_cpu, BiasGradPacksAreTheElementPathBitForBit) {
  const std::int64_t rows = 3000, n = 768;
  const auto y0 = random_values(static_cast<std::size_t>(rows * n), 3);
  std::vector<float> padded(1, 0.0f);
  padded.insert(padded.end(), y0.begin(), y0.end());
  const auto bias = random_values(static_cast<std::size_t>(n), 4);
  for (DType dt : kStorage) {
    Tensor aligned(gpu(), dt, {rows, n}, y0);
    Tensor spare(gpu(), dt, {rows * n + 1}, padded);
    TensorView unaligned = spare.view();
    unaligned.data = static_cast<std::byte*>(unaligned.data) + sdk::dtype_size(dt);
    unaligned.shape = Shape{rows, n};
    for (bool accumulate : {false, true}) {
      Tensor packs(gpu(), DType::fp32, {n}, bias), elements(gpu(), DType::fp32, {n}, bias);
      gpu<sdk::ActivationFacet>().bias_grad(aligned, packs, accumulate);
      gpu<sdk::ActivationFacet>().bias_grad(unaligned, elements, accumulate);
      const auto a = packs.get(), b = elements.get();
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t j = 0; j < a.size(); ++j)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(a[j]), std::bit_cast<std::uint32_t>(b[j]))
            << sdk::dtype_name(dt) << (accumulate ? " accumulate" : "") << ", column " << j;
    }
  }
}

// The finish of the split column sums (kernels::launch_column_finish over split_sums,
// cuda_device.cuh) against the serial loop it stands for, bit for bit: per column
// `double t = 0.0; for (s ...) t += p[s, j];`, then the accumulate and one rounding. Partials of
// magnitudes 2^-20..2^20 (another order of additions would change the bits), splits on both
// sides of a staged chunk (256 fp32 splits of one sum, 128 of two), widths that leave a partial
// tile of 32 columns; one sum, both, and the second alone.
TEST_F(backend_cuda_vs_cpu, ColumnFinishAddsTheSplitsInOrder) {
  const auto bits = [](const std::vector<float>& v) {
    std::vector<std::uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
    return b;
  };
  const std::pair<std::int64_t, std::int64_t> splits_by_width[] = {
      {0, 5}, {1, 33}, {128, 768}, {255, 40}, {256, 31}, {257, 70}, {512, 768}, {600, 65}};
  for (const auto& [splits, n] : splits_by_width) {
    // One spare split row, so that zero splits still allocate; the kernel must not read it.
    std::vector<std::vector<float>> partials;
    for (std::uint32_t seed : {11u, 12u}) {
      auto p = random_values(static_cast<std::size_t>((splits + 1) * n), seed);
      std::mt19937 rng(seed);
      std::uniform_int_distribution<int> exponent(-20, 20);
      for (float& v : p) v = std::ldexp(v, exponent(rng));
      partials.push_back(std::move(p));
    }
    const auto init = random_values(static_cast<std::size_t>(n), 13);
    Tensor gp1(gpu(), DType::fp32, {splits + 1, n}, partials[0]);
    Tensor gp2(gpu(), DType::fp32, {splits + 1, n}, partials[1]);
    for (bool accumulate : {false, true}) {
      for (int which : {1, 2, 3}) {  // bit 0: the first sum, bit 1: the second
        const std::string what = "splits " + std::to_string(splits) + " n " + std::to_string(n) +
                                 (accumulate ? " accumulate" : "") + " sums " +
                                 std::to_string(which);
        Tensor out1(gpu(), DType::fp32, {n}, init), out2(gpu(), DType::fp32, {n}, init);
        float* o1 = (which & 1) != 0 ? static_cast<float*>(out1.view().data) : nullptr;
        float* o2 = (which & 2) != 0 ? static_cast<float*>(out2.view().data) : nullptr;
        gpu().synchronize();
        kernels::launch_column_finish(static_cast<const float*>(gp1.view().data),
                                      static_cast<const float*>(gp2.view().data), splits, n, o1, o2,
                                      accumulate, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        for (int k = 0; k < 2; ++k) {
          const bool wanted = (which & (1 << k)) != 0;
          std::vector<float> want = init;
          for (std::int64_t j = 0; wanted && j < n; ++j) {
            double t = 0.0;
            for (std::int64_t s = 0; s < splits; ++s)
              t += static_cast<double>(partials[k][static_cast<std::size_t>(s * n + j)]);
            want[j] = static_cast<float>((accumulate ? static_cast<double>(init[j]) : 0.0) + t);
          }
          EXPECT_EQ(bits((k == 0 ? out1 : out2).get()), bits(want))
              << what << ": sum " << k + 1 << (wanted ? "" : " written without being asked for");
        }
      }
    }
  }
}

TEST_F(backend_cuda_vs_cpu, ActivationsForwardAndBackwardIncludingInPlace) {
  const std::int64_t rows = 33, n = 129;  // odd sizes: the float4 path and its scalar tail
  auto xv = random_values(static_cast<std::size_t>(rows * n), 3, -5.0f, 5.0f);
  const auto dyv = random_values(xv.size(), 4);
  for (auto act : {sdk::Activation::relu, sdk::Activation::gelu})
    for (DType dt : kStorage) {
      const std::string what = std::string(act == sdk::Activation::relu ? "relu " : "gelu ") +
                               std::string(sdk::dtype_name(dt));
      const double rel = act == sdk::Activation::relu ? 0.0 : tol_rel(dt);
      Tensor gx(gpu(), dt, {rows, n}, xv), gy(gpu(), dt, {rows, n});
      Tensor cx(cpu(), dt, {rows, n}, xv), cy(cpu(), dt, {rows, n});
      gpu<sdk::ActivationFacet>().activation_forward(act, gx, gy);
      sdk::facet<sdk::ActivationFacet>(cpu())->activation_forward(act, cx, cy);
      expect_close(gy.get(), cy.get(), rel, 1e-6, "forward " + what);

      Tensor gdy(gpu(), dt, {rows, n}, dyv), gdx(gpu(), dt, {rows, n});
      Tensor cdy(cpu(), dt, {rows, n}, dyv), cdx(cpu(), dt, {rows, n});
      gpu<sdk::ActivationFacet>().activation_backward(act, gx, gdy, gdx);
      sdk::facet<sdk::ActivationFacet>(cpu())->activation_backward(act, cx, cdy, cdx);
      expect_close(gdx.get(), cdx.get(), rel, 1e-6, "backward " + what);
      gpu<sdk::ActivationFacet>().activation_backward(act, gx, gdy, gdy);  // dx aliases dy
      expect_close(gdy.get(), cdx.get(), rel, 1e-6, "backward in place " + what);
      gpu<sdk::ActivationFacet>().activation_forward(act, gx, gx);  // y aliases x
      expect_close(gx.get(), cy.get(), rel, 1e-6, "forward in place " + what);
    }
  // Mixed dtypes: bf16 in, fp32 out.
  Tensor gx(gpu(), DType::bf16, {rows, n}, xv), gy(gpu(), DType::fp32, {rows, n});
  Tensor cx(cpu(), DType::bf16, {rows, n}, xv), cy(cpu(), DType::fp32, {rows, n});
  gpu<sdk::ActivationFacet>().activation_forward(sdk::Activation::gelu, gx, gy);
  sdk::facet<sdk::ActivationFacet>(cpu())->activation_forward(sdk::Activation::gelu, cx, cy);
  expect_close(gy.get(), cy.get(), 2e-5, 1e-6, "gelu bf16 -> fp32");
}

TEST_F(backend_cuda_vs_cpu, LayerNormForwardAndBackward) {
  for (auto [rows, n] : {std::pair<std::int64_t, std::int64_t>{16, 64}, {37, 1000}, {700, 33}}) {
    const auto xv = random_values(static_cast<std::size_t>(rows * n), 5, -3.0f, 5.0f);
    const auto gv = random_values(static_cast<std::size_t>(n), 6, 0.5f, 1.5f);
    const auto bv = random_values(static_cast<std::size_t>(n), 7);
    const auto dyv = random_values(xv.size(), 8);
    for (DType dt : kStorage)
      for (bool affine : {true, false}) {
        const std::string what = "[" + std::to_string(rows) + ", " + std::to_string(n) + "] " +
                                 std::string(sdk::dtype_name(dt)) + (affine ? " affine" : "");
        auto run = [&](sdk::DeviceBackend& be) {
          Tensor x(be, dt, {rows, n}, xv), g(be, DType::fp32, {n}, gv), b(be, dt, {n}, bv);
          Tensor y(be, dt, {rows, n}), mean(be, DType::fp32, {rows}), rstd(be, DType::fp32, {rows});
          const TensorView gamma = affine ? g.view() : TensorView{};
          const TensorView beta = affine ? b.view() : TensorView{};
          sdk::facet<sdk::LayerNormFacet>(be)->layernorm_forward(x, gamma, beta, 1e-5f, y, mean,
                                                                 rstd);
          Tensor dy(be, dt, {rows, n}, dyv), dx(be, dt, {rows, n});
          Tensor dg(be, DType::fp32, {n}, gv), db(be, DType::fp32, {n}, bv);
          sdk::facet<sdk::LayerNormFacet>(be)->layernorm_backward(dy, x, gamma, mean, rstd, dx, dg,
                                                                  db, /*accumulate=*/true);
          auto first = std::vector<std::vector<float>>{y.get(), mean.get(), rstd.get(), dx.get(),
                                                       dg.get(), db.get()};
          // dx aliasing dy, dgamma/dbeta overwritten.
          sdk::facet<sdk::LayerNormFacet>(be)->layernorm_backward(dy, x, gamma, mean, rstd, dy, dg,
                                                                  db, /*accumulate=*/false);
          first.push_back(dy.get());
          first.push_back(dg.get());
          first.push_back(db.get());
          return first;
        };
        const auto g = run(gpu());
        const auto c = run(cpu());
        const double sum_tol = 1e-5 * std::sqrt(static_cast<double>(rows));
        expect_close(g[0], c[0], tol_rel(dt), 1e-5, "y " + what);
        expect_close(g[1], c[1], 1e-5, 1e-6, "mean " + what);
        expect_close(g[2], c[2], 1e-5, 1e-6, "rstd " + what);
        expect_close(g[3], c[3], tol_rel(dt), 1e-5, "dx " + what);
        expect_close(g[4], c[4], 1e-5, sum_tol, "dgamma accumulate " + what);
        expect_close(g[5], c[5], 1e-5, sum_tol, "dbeta accumulate " + what);
        expect_close(g[6], c[6], tol_rel(dt), 1e-5, "dx in place " + what);
        expect_close(g[7], c[7], 1e-5, sum_tol, "dgamma " + what);
        expect_close(g[8], c[8], 1e-5, sum_tol, "dbeta " + what);
      }
  }
}

// The one-pass backward (cuda_layer_norm_plan.h) against the column sums beside the row kernel
// (layernorm_backward_one_pass = false): dx the same bits (the same row math), dgamma and dbeta
// within FP32 reordering, and the same bits on a second run (a fixed partition). GPT-2 small's
// width, one beyond the default 48 KiB of shared memory (the opt-in), rows that leave a block
// part-filled, dx added into an fp32 sum, and the residual sum and layer norm forward on the way.
TEST_F(backend_cuda_vs_cpu, LayerNormOnePassBackwardMatchesTheColumnSums) {
  CudaBackend two_pass(CudaOptions{.device = 0, .layernorm_backward_one_pass = false});
  for (auto [rows, n] : {std::pair<std::int64_t, std::int64_t>{8 * 128 + 5, 768}, {70, 2000}})
    for (DType dt : {DType::fp32, DType::bf16})
      for (bool add_into_dx : {false, true}) {
        const std::string what = "[" + std::to_string(rows) + ", " + std::to_string(n) + "] " +
                                 std::string(sdk::dtype_name(dt)) +
                                 (add_into_dx ? " added into dx" : "");
        const auto av = random_values(static_cast<std::size_t>(rows * n), 30, -3.0f, 5.0f);
        const auto bv = random_values(av.size(), 31);
        const auto dyv = random_values(av.size(), 32);
        const auto gv = random_values(static_cast<std::size_t>(n), 33, 0.5f, 1.5f);
        auto run = [&](sdk::DeviceBackend& be) {
          Tensor a(be, dt, {rows, n}, av), b(be, dt, {rows, n}, bv), x(be, dt, {rows, n});
          Tensor g(be, DType::fp32, {n}, gv), beta(be, DType::fp32, {n}, gv);
          Tensor y(be, DType::fp32, {rows, n}), mean(be, DType::fp32, {rows}),
              rstd(be, DType::fp32, {rows});
          sdk::LayerNormAddArgs fwd;
          fwd.a = a;
          fwd.b = b;
          fwd.sum = x;
          fwd.gamma = g;
          fwd.beta = beta;
          fwd.y = y;
          fwd.mean = mean;
          fwd.rstd = rstd;
          sdk::facet<sdk::LayerNormFacet>(be)->layernorm_add_forward(fwd);
          Tensor dy(be, dt, {rows, n}, dyv), dg(be, DType::fp32, {n}), db(be, DType::fp32, {n});
          Tensor dx(be, add_into_dx ? DType::fp32 : dt, {rows, n}, av);
          auto* norm = sdk::facet<sdk::LayerNormFacet>(be);
          if (add_into_dx)
            norm->layernorm_backward_accumulate(dy, x, g, mean, rstd, dx, dg, db, false);
          else
            norm->layernorm_backward(dy, x, g, mean, rstd, dx, dg, db, false);
          return std::vector<std::vector<float>>{x.get(), y.get(), dx.get(), dg.get(), db.get()};
        };
        const auto one = run(gpu());
        const auto again = run(gpu());
        const auto two = run(two_pass);
        const auto cpu_ref = run(cpu());
        for (std::size_t k = 0; k < one.size(); ++k)
          expect_same_values(one[k], again[k],
                             "run to run, output " + std::to_string(k) + ", " + what);
        expect_same_values(one[0], two[0], "the sum " + what);
        expect_same_values(one[2], two[2], "dx " + what);
        const double sum_tol = 1e-5 * std::sqrt(static_cast<double>(rows));
        expect_close(one[3], two[3], 1e-6, sum_tol, "dgamma against the column sums " + what);
        expect_close(one[4], two[4], 1e-6, sum_tol, "dbeta against the column sums " + what);
        expect_close(one[1], cpu_ref[1], 1e-5, 1e-5, "y against the cpu " + what);
        expect_close(one[2], cpu_ref[2], tol_rel(dt), 1e-5, "dx against the cpu " + what);
        expect_close(one[3], cpu_ref[3], 1e-5, sum_tol, "dgamma against the cpu " + what);
        expect_close(one[4], cpu_ref[4], 1e-5, sum_tol, "dbeta against the cpu " + what);
      }
}

// A warp per row below 512 classes, a block per row from 512 (cuda_loss.cu): both widths, a row
// of GPT-2's vocabulary (odd: rows at every 2-byte offset), and rows of whole 16-byte packs, which
// a block reads a pack at a time (512; 520, whose last round of packs is short; GPT-2's padded
// 50304), with and without label smoothing.
TEST_F(backend_cuda_vs_cpu, SoftmaxCrossEntropy) {
  for (auto [rows, classes] : {std::pair<std::int64_t, std::int64_t>{64, 10},
                               {5, 1000},
                               {1, 1},
                               {9, 511},
                               {7, 512},
                               {4, 520},
                               {3, 50257},
                               {3, 50304}}) {
    const auto zv = random_values(static_cast<std::size_t>(rows * classes), 9, -6.0f, 6.0f);
    std::vector<float> labels(static_cast<std::size_t>(rows));
    for (std::size_t r = 0; r < labels.size(); ++r)
      labels[r] = static_cast<float>((r * 7) % static_cast<std::size_t>(classes));
    for (DType lt : kStorage)
      for (DType dt : kStorage)
        for (float eps : {0.0f, 0.1f}) {
          const std::string what = "[" + std::to_string(rows) + ", " + std::to_string(classes) +
                                   "] " + std::string(sdk::dtype_name(lt)) + " -> " +
                                   std::string(sdk::dtype_name(dt)) + ", smoothing " +
                                   std::to_string(eps);
          auto run = [&](sdk::DeviceBackend& be) {
            Tensor z(be, lt, {rows, classes}, zv), y(be, DType::int32, {rows}, labels);
            Tensor loss(be, DType::fp32, {1}), correct(be, DType::int32, {1}),
                dz(be, dt, {rows, classes});
            sdk::facet<sdk::LossFacet>(be)->softmax_cross_entropy(z, y, 1024.0f, eps, loss, correct,
                                                                  dz);
            return std::vector<std::vector<float>>{loss.get(), correct.get(), dz.get()};
          };
          const auto g = run(gpu());
          const auto c = run(cpu());
          expect_close(g[0], c[0], 1e-5, 1e-6, "loss " + what);
          EXPECT_EQ(g[1], c[1]) << "correct " << what;
          expect_close(g[2], c[2], tol_rel(dt) * 4, 1e-5, "dlogits " + what);
          // The row's sums run in a fixed order: a second run gives the same bits.
          EXPECT_EQ(run(gpu()), g) << "a second run, " << what;
        }
  }
  // Rows in place (dlogits over the logits), a block's, a block's in packs and a warp's (which
  // reads z[y] before its __syncwarp): the out-of-place bits.
  for (const std::int64_t classes : {std::int64_t{50257}, std::int64_t{50304}, std::int64_t{511}}) {
    const std::int64_t rows = 4;
    const auto zv = random_values(static_cast<std::size_t>(rows * classes), 13, -6.0f, 6.0f);
    Tensor y(gpu(), DType::int32, {rows},
             {5, static_cast<float>(classes - 1), 0, static_cast<float>(classes / 2)});
    Tensor z(gpu(), DType::bf16, {rows, classes}, zv), dz(gpu(), DType::bf16, {rows, classes});
    Tensor loss(gpu(), DType::fp32, {1}), loss_in_place(gpu(), DType::fp32, {1});
    Tensor correct(gpu(), DType::int32, {1}), correct_in_place(gpu(), DType::int32, {1});
    gpu<sdk::LossFacet>().softmax_cross_entropy(z, y, 1024.0f, 0.0f, loss, correct, dz);
    gpu<sdk::LossFacet>().softmax_cross_entropy(z, y, 1024.0f, 0.0f, loss_in_place,
                                                correct_in_place, z);
    EXPECT_EQ(z.get(), dz.get()) << "dlogits written over the logits, " << classes << " classes";
    EXPECT_EQ(loss_in_place.get(), loss.get()) << classes << " classes";
    EXPECT_EQ(correct_in_place.get(), correct.get()) << classes << " classes";
  }
  // Optional outputs may be empty.
  Tensor z(gpu(), DType::fp32, {4, 3}, random_values(12, 10)), y(gpu(), DType::int32, {4}, {0, 1, 2, 0});
  Tensor loss(gpu(), DType::fp32, {1});
  gpu<sdk::LossFacet>().softmax_cross_entropy(z, y, 1.0f, 0.0f, loss, {}, {});
  EXPECT_GT(loss.get()[0], 0.0f);
}

TEST_F(backend_cuda_vs_cpu, SoftmaxCrossEntropyBadLabelRaisesAtTheNextSync) {
  Tensor z(gpu(), DType::fp32, {4, 3}, random_values(12, 11)), y(gpu(), DType::int32, {4}, {0, 3, 1, -1});
  Tensor loss(gpu(), DType::fp32, {1}, {42.0f});
  try {
    gpu<sdk::LossFacet>().softmax_cross_entropy(z, y, 1.0f, 0.0f, loss, {}, {});
    gpu().synchronize();
    FAIL() << "no error for label 3 of 3 classes";
  } catch (const sdk::BackendError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("label 3 at row 1"), std::string::npos) << what;
    EXPECT_NE(what.find("[0, 3)"), std::string::npos) << what;
  }
  EXPECT_EQ(loss.get()[0], 42.0f);  // untouched
  // The record was reset: good labels work again.
  y.set({0, 1, 2, 0});
  gpu<sdk::LossFacet>().softmax_cross_entropy(z, y, 1.0f, 0.0f, loss, {}, {});
  EXPECT_NO_THROW(gpu().synchronize());
  EXPECT_NE(loss.get()[0], 42.0f);
}

TEST_F(backend_cuda_vs_cpu, FillMulScalarAxpy) {
  const auto v = random_values(1001, 12);
  for (DType dt : kStorage) {
    Tensor gx(gpu(), dt, {1001}, v), cx(cpu(), dt, {1001}, v);
    if (dt == DType::fp32) {  // the foreach ops are fp32
      const TensorView gxs[] = {gx}, cxs[] = {cx};
      gpu<sdk::ForeachFacet>().foreach_mul_scalar(gxs, 0.3f);
      sdk::facet<sdk::ForeachFacet>(cpu())->foreach_mul_scalar(cxs, 0.3f);
      expect_same_values(gx.get(), cx.get(), "foreach_mul_scalar");
    }
    Tensor gy(gpu(), DType::fp32, {1001}, v), cy(cpu(), DType::fp32, {1001}, v);
    gpu<sdk::ActivationFacet>().axpy(-1.7f, gx, gy);
    sdk::facet<sdk::ActivationFacet>(cpu())->axpy(-1.7f, cx, cy);
    expect_close(gy.get(), cy.get(), 1e-6, 1e-7, "axpy");  // FMA contraction may differ
    gpu().fill(gx, 2.5f);
    EXPECT_EQ(gx.get(), std::vector<float>(1001, 2.5f));
  }
  Tensor labels(gpu(), DType::int32, {5});
  gpu().fill(labels, 3.0f);
  EXPECT_EQ(labels.get(), std::vector<float>(5, 3.0f));
  // int32 fills out of range and NaN: the CPU's values (toward zero, saturating, NaN 0).
  for (float value : {-7.9f, 3.0e9f, -INFINITY, NAN}) {
    Tensor c(cpu(), DType::int32, {5});
    gpu().fill(labels, value);
    cpu().fill(c, value);
    EXPECT_EQ(labels.raw(), c.raw()) << value;
  }
  Tensor f8(gpu(), DType::fp8_e4m3, {5});
  EXPECT_THROW(gpu().fill(f8, 1.0f), sdk::BackendError);
}

TEST_F(backend_cuda_vs_cpu, UnscaleSumOfSquaresFirstNonfinite) {
  // Many small tensors and one spanning several chunks.
  std::vector<std::vector<float>> values;
  for (int t = 0; t < 7; ++t) values.push_back(random_values(static_cast<std::size_t>(1 + t * 31), 20 + t));
  values.push_back(random_values(100'000, 30, -100.0f, 100.0f));
  auto make = [&](sdk::DeviceBackend& be) {
    std::vector<std::unique_ptr<Tensor>> ts;
    for (const auto& v : values)
      ts.push_back(std::make_unique<Tensor>(be, DType::fp32, Shape{static_cast<std::int64_t>(v.size())}, v));
    return ts;
  };
  auto g = make(gpu());
  auto c = make(cpu());
  std::vector<TensorView> gv, cv;
  for (auto& t : g) gv.push_back(*t);
  for (auto& t : c) cv.push_back(*t);
  EXPECT_FALSE(gpu<sdk::GradientCheckFacet>().unscale_and_check_finite(gv, 0.125f));
  EXPECT_FALSE(sdk::facet<sdk::GradientCheckFacet>(cpu())->unscale_and_check_finite(cv, 0.125f));
  for (std::size_t t = 0; t < g.size(); ++t) expect_same_values(g[t]->get(), c[t]->get(), "unscaled");
  const double gs = gpu<CudaGradientCheck>().sum_of_squares(gv), cs = cpu().sum_of_squares(cv);
  EXPECT_NEAR(gs, cs, 1e-12 * cs);
  EXPECT_EQ(gpu<CudaGradientCheck>().sum_of_squares(gv), gs) << "sum_of_squares not reproducible";
  EXPECT_EQ(gpu<sdk::GradientCheckFacet>().first_nonfinite(gv), -1);
  EXPECT_EQ(gpu<CudaGradientCheck>().sum_of_squares({}), 0.0);
  EXPECT_FALSE(gpu<sdk::GradientCheckFacet>().unscale_and_check_finite({}, 1.0f));

  // An inf deep inside the big tensor and a NaN in tensor 3.
  auto big = values.back();
  big[77'777] = std::numeric_limits<float>::infinity();
  g.back()->set(big);
  EXPECT_TRUE(gpu<sdk::GradientCheckFacet>().unscale_and_check_finite(gv, 1.0f));
  EXPECT_EQ(gpu<sdk::GradientCheckFacet>().first_nonfinite(gv), 7);
  EXPECT_TRUE(std::isinf(gpu<CudaGradientCheck>().sum_of_squares(gv)));
  auto small = values[3];
  small[0] = std::numeric_limits<float>::quiet_NaN();
  g[3]->set(small);
  EXPECT_EQ(gpu<sdk::GradientCheckFacet>().first_nonfinite(gv), 3);
  // A finite gradient that overflows when scaled up is found too.
  Tensor huge(gpu(), DType::fp32, {2}, {3e38f, 1.0f});
  const TensorView hv[] = {huge};
  EXPECT_TRUE(gpu<sdk::GradientCheckFacet>().unscale_and_check_finite(hv, 4.0f));
  // bf16 / fp16 tensors for the norm.
  Tensor h16(gpu(), DType::bf16, {3}, {1.0f, 2.0f, 3.0f});
  const TensorView hv16[] = {h16};
  EXPECT_EQ(gpu<CudaGradientCheck>().sum_of_squares(hv16), 14.0);
  Tensor g16(gpu(), DType::bf16, {3});
  const TensorView bad[] = {g16};
  EXPECT_THROW(gpu<sdk::GradientCheckFacet>().unscale_and_check_finite(bad, 1.0f),
               sdk::BackendError);
}

// One parameter's tensors; the views the update gets start `offset` elements into them, so an
// offset of 1 leaves every view unaligned to 16 bytes (the kernels' scalar path).
struct ParamSet {
  std::unique_ptr<Tensor> master, grad, working, s1, s2;
  std::int64_t offset = 0;
};

ParamSet make_param(sdk::DeviceBackend& be, std::int64_t n, DType working, std::uint32_t seed,
                    std::int64_t offset = 0) {
  ParamSet p;
  const std::int64_t all = n + offset;
  const auto count = static_cast<std::size_t>(all);
  p.master = std::make_unique<Tensor>(be, DType::fp32, Shape{all}, random_values(count, seed));
  p.grad = std::make_unique<Tensor>(be, DType::fp32, Shape{all}, random_values(count, seed + 1));
  p.working = std::make_unique<Tensor>(be, working, Shape{all});
  p.s1 = std::make_unique<Tensor>(be, DType::fp32, Shape{all}, random_values(count, seed + 2));
  p.s2 = std::make_unique<Tensor>(be, DType::fp32, Shape{all},
                                  random_values(count, seed + 3, 0.0f, 1.0f));
  p.offset = offset;
  return p;
}

TensorView shifted(const Tensor& t, std::int64_t offset) {
  TensorView v = t.view();
  v.data = static_cast<std::byte*>(v.data) +
           offset * static_cast<std::int64_t>(sdk::dtype_size(v.dtype));
  v.shape = Shape{v.shape[0] - offset};
  return v;
}

sdk::ParamTensors tensors_of(const ParamSet& p, bool working) {
  return {shifted(*p.master, p.offset), shifted(*p.grad, p.offset),
          working ? shifted(*p.working, p.offset) : TensorView{}, shifted(*p.s1, p.offset),
          shifted(*p.s2, p.offset)};
}

// A gated update clips by a coefficient from each backend's own Σ g², summed in its own order,
// so close rather than identical.
void expect_params_close(const ParamSet& g, const ParamSet& c, DType working,
                         const std::string& what) {
  expect_close(g.master->get(), c.master->get(), 1e-6, 1e-7, what + " master");
  expect_close(g.s1->get(), c.s1->get(), 1e-6, 1e-7, what + " state1");
  expect_close(g.s2->get(), c.s2->get(), 1e-6, 1e-7, what + " state2");
  expect_close(g.working->get(), c.working->get(), ulp_rel(working), 1e-7, what + " working");
}

// The kernels run cuda_element_math.h's steps, which test_cuda_element_math.cpp proves are the
// CPU's bit for bit (--fmad=false, host arithmetic for the bias corrections): so the bits, whole
// buffers (an offset's leading element untouched on both).
void expect_params_identical(const ParamSet& g, const ParamSet& c, const std::string& what) {
  EXPECT_EQ(g.master->raw(), c.master->raw()) << what << " master";
  EXPECT_EQ(g.s1->raw(), c.s1->raw()) << what << " state1";
  EXPECT_EQ(g.s2->raw(), c.s2->raw()) << what << " state2";
  EXPECT_EQ(g.working->raw(), c.working->raw()) << what << " working";
}

TEST_F(backend_cuda_vs_cpu, SgdUpdateMatchesTheCpu) {
  const std::int64_t sizes[] = {1, 100, 40'000, 40'001}, offsets[] = {0, 0, 0, 1};
  for (DType working : kStorage)
    for (int variant = 0; variant < 4; ++variant) {
      sdk::SgdHyper h;
      h.lr = 0.05f;
      h.momentum = variant == 0 ? 0.0f : 0.9f;
      h.dampening = variant == 2 ? 0.1f : 0.0f;
      h.nesterov = variant == 3;
      h.weight_decay = 0.01f;
      h.grad_scale = 0.5f;
      const std::string what = "sgd variant " + std::to_string(variant) + " " +
                               std::string(sdk::dtype_name(working));
      std::vector<ParamSet> g, c;
      for (std::size_t i = 0; i < std::size(sizes); ++i) {
        const auto seed = 50 + static_cast<std::uint32_t>(i) * 10;
        g.push_back(make_param(gpu(), sizes[i], working, seed, offsets[i]));
        c.push_back(make_param(cpu(), sizes[i], working, seed, offsets[i]));
      }
      for (int step = 0; step < 3; ++step) {
        h.first_step = step == 0;
        std::vector<sdk::ParamTensors> gp, cp;
        for (std::size_t i = 0; i < g.size(); ++i) {
          gp.push_back(tensors_of(g[i], i != 1));
          cp.push_back(tensors_of(c[i], i != 1));
        }
        gpu<sdk::OptimizerFacet>().sgd_update(h, gp);
        sdk::facet<sdk::OptimizerFacet>(cpu())->sgd_update(h, cp);
      }
      for (std::size_t i = 0; i < g.size(); ++i)
        expect_params_identical(g[i], c[i], what + " tensor " + std::to_string(i));
    }
  sdk::SgdHyper bad;
  bad.nesterov = true;
  EXPECT_THROW(gpu<sdk::OptimizerFacet>().sgd_update(bad, {}), sdk::BackendError);
}

TEST_F(backend_cuda_vs_cpu, AdamWUpdateMatchesTheCpu) {
  const std::int64_t sizes[] = {3, 20'000, 70'001, 5'003}, offsets[] = {0, 0, 0, 1};
  for (DType working : kStorage) {
    std::vector<ParamSet> g, c;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      const auto seed = 80 + static_cast<std::uint32_t>(i) * 10;
      g.push_back(make_param(gpu(), sizes[i], working, seed, offsets[i]));
      c.push_back(make_param(cpu(), sizes[i], working, seed, offsets[i]));
    }
    sdk::AdamWHyper h;
    h.lr = 1e-3f;
    h.weight_decay = 0.1f;
    h.grad_scale = 0.75f;
    for (std::int64_t step = 1; step <= 4; ++step) {
      h.step = step;
      std::vector<sdk::ParamTensors> gp, cp;
      for (std::size_t i = 0; i < g.size(); ++i) {
        gp.push_back(tensors_of(g[i], true));
        cp.push_back(tensors_of(c[i], true));
      }
      gpu<sdk::OptimizerFacet>().adamw_update(h, gp);
      sdk::facet<sdk::OptimizerFacet>(cpu())->adamw_update(h, cp);
    }
    for (std::size_t i = 0; i < g.size(); ++i)
      expect_params_identical(
          g[i], c[i],
          "adamw " + std::string(sdk::dtype_name(working)) + " tensor " + std::to_string(i));
  }
  sdk::AdamWHyper bad;
  bad.step = 0;
  EXPECT_THROW(gpu<sdk::OptimizerFacet>().adamw_update(bad, {}), sdk::BackendError);
  // Missing state is an error, as on the CPU.
  auto p = make_param(gpu(), 4, DType::bf16, 1);
  sdk::ParamTensors t = tensors_of(p, true);
  t.state2 = {};
  EXPECT_THROW(gpu<sdk::OptimizerFacet>().adamw_update(sdk::AdamWHyper{}, std::span(&t, 1)),
               sdk::BackendError);
}

sdk::GradientStatus status_of(const Tensor& status) {
  sdk::GradientStatus out;
  const auto bytes = status.raw();
  std::memcpy(&out, bytes.data(), sizeof out);
  return out;
}

// The gated update (gradient_check 1.1, optimizer 1.1) against the CPU's: the queued check's
// status and host read, the clipped update it opens, and the skip it makes on an inf, which
// writes nothing at all.
TEST_F(backend_cuda_vs_cpu, QueuedCheckAndGatedUpdatesMatchTheCpu) {
  const std::int64_t sizes[] = {3, 20'000, 70'001};
  for (const bool adamw : {false, true}) {
    const std::string what = adamw ? "adamw gated" : "sgd gated";
    std::vector<ParamSet> g, c;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      g.push_back(make_param(gpu(), sizes[i], DType::bf16, 120 + static_cast<std::uint32_t>(i)));
      c.push_back(make_param(cpu(), sizes[i], DType::bf16, 120 + static_cast<std::uint32_t>(i)));
    }
    Tensor gs(gpu(), DType::int32, {4}), cs(cpu(), DType::int32, {4});
    std::vector<sdk::ParamTensors> gp, cp;
    std::vector<TensorView> gg, cg;
    for (std::size_t i = 0; i < g.size(); ++i) {
      gp.push_back(tensors_of(g[i], true));
      cp.push_back(tensors_of(c[i], true));
      gg.push_back(*g[i].grad);
      cg.push_back(*c[i].grad);
    }
    const auto step = [&](bool expect_inf) {
      gpu<sdk::GradientCheckFacet>().queue_unscale_check(gg, 0.5f, true, gs);
      sdk::facet<sdk::GradientCheckFacet>(cpu())->queue_unscale_check(cg, 0.5f, true, cs);
      // Clipping at a norm below the gradients': the coefficient comes from the status.
      const sdk::UpdateGate ggate{gs, 3.0}, cgate{cs, 3.0};
      if (adamw) {
        sdk::AdamWHyper h;
        h.lr = 1e-3f;
        h.weight_decay = 0.1f;
        gpu<sdk::OptimizerFacet>().adamw_update_gated(h, gp, ggate);
        sdk::facet<sdk::OptimizerFacet>(cpu())->adamw_update_gated(h, cp, cgate);
      } else {
        sdk::SgdHyper h;
        h.lr = 0.05f;
        h.momentum = 0.9f;
        gpu<sdk::OptimizerFacet>().sgd_update_gated(h, gp, ggate);
        sdk::facet<sdk::OptimizerFacet>(cpu())->sgd_update_gated(h, cp, cgate);
      }
      const auto gr = gpu<sdk::GradientCheckFacet>().queued_check_result();
      const auto cr = sdk::facet<sdk::GradientCheckFacet>(cpu())->queued_check_result();
      EXPECT_EQ(gr.found_inf, expect_inf) << what;
      EXPECT_EQ(cr.found_inf, expect_inf) << what;
      EXPECT_EQ(status_of(gs).found_inf != 0, expect_inf) << what;
      if (!expect_inf) {
        EXPECT_NEAR(gr.sum_of_squares, cr.sum_of_squares, 1e-12 * cr.sum_of_squares) << what;
        EXPECT_EQ(status_of(gs).sum_of_squares, gr.sum_of_squares) << what;
        EXPECT_LT(sdk::clip_coefficient(gr.sum_of_squares, 3.0), 1.0f) << "clipping is off";
      }
    };
    step(false);
    for (std::size_t i = 0; i < g.size(); ++i) expect_params_close(g[i], c[i], DType::bf16, what);
    // An inf in the last tensor: the gated update writes nothing, on either backend.
    auto grad = g[2].grad->get();
    grad.back() = std::numeric_limits<float>::infinity();
    g[2].grad->set(grad);
    c[2].grad->set(grad);
    const auto before_master = g[0].master->raw(), before_working = g[0].working->raw();
    const auto before_s1 = g[0].s1->raw();
    step(true);
    EXPECT_EQ(g[0].master->raw(), before_master) << what;
    EXPECT_EQ(g[0].working->raw(), before_working) << what;
    EXPECT_EQ(g[0].s1->raw(), before_s1) << what;
    for (std::size_t i = 0; i < g.size(); ++i) expect_params_close(g[i], c[i], DType::bf16, what);
  }
  // Each queued check is read once; a status of another shape is refused.
  EXPECT_THROW(gpu<sdk::GradientCheckFacet>().queued_check_result(), std::logic_error);
  Tensor wrong(gpu(), DType::fp32, {4});
  EXPECT_THROW(gpu<sdk::GradientCheckFacet>().queue_unscale_check({}, 1.0f, false, wrong),
               sdk::BackendError);
  EXPECT_THROW(gpu<sdk::OptimizerFacet>().sgd_update_gated({}, {}, sdk::UpdateGate{wrong, 0.0}),
               sdk::BackendError);
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
