// bench_gemm: GFLOP/s of the wide-MLP (1024 -> 4096 -> 4096 -> 1024, batch 512) GEMMs through
// CpuBackend::gemm (oneDNN matmul) and OpenBLAS cblas_sgemm, at the same thread count.
//
// Usage: bench_gemm [--threads N] [--lib onednn|openblas|both] [--seconds S]
// Each measurement: 3 warm-up calls, then as many calls as fit in S seconds (at least 5); the
// median call time gives GFLOP/s = 2*m*n*k / t. Run each library in its own process for the
// cleanest numbers: OpenMP (oneDNN) worker threads keep spinning after a parallel region and
// steal cycles from OpenBLAS's pthread pool when both run in one process.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cpu_backend.h"

namespace {

using mixtrain::backend_cpu::CpuBackend;
using mixtrain::sdk::DType;
using mixtrain::sdk::TensorView;

struct Case {
  const char* name;  // which GEMM of a Linear layer
  int m, n, k;
  bool trans_a, trans_b;
};

// For a Linear in->out at batch B, with X [B,in], W [out,in], dY [B,out]:
//   forward  Y  = X · Wᵀ   (m=B,   n=out, k=in,  B transposed)
//   dX       dX = dY · W   (m=B,   n=in,  k=out)
//   dW       dW = dYᵀ · X  (m=out, n=in,  k=B,   A transposed)
std::vector<Case> wide_mlp_cases() {
  std::vector<Case> cases;
  const int batch = 512;
  for (auto [in, out] : {std::pair{1024, 4096}, std::pair{4096, 4096}, std::pair{4096, 1024}}) {
    cases.push_back({"fwd  Y=X*W^T", batch, out, in, false, true});
    cases.push_back({"dX   =dY*W  ", batch, in, out, false, false});
    cases.push_back({"dW   =dY^T*X", out, in, batch, true, false});
  }
  return cases;
}

double median_seconds(const std::function<void()>& call, double budget) {
  for (int i = 0; i < 3; ++i) call();
  std::vector<double> times;
  const auto start = std::chrono::steady_clock::now();
  while (times.size() < 5 ||
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < budget) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2),
                   times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::string lib = "both";
  double seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--lib") lib = argv[i + 1];
    else if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\nusage: bench_gemm [--threads N] [--lib onednn|openblas|both] [--seconds S]\n", argv[i]);
      return 2;
    }
  }
  const bool run_onednn = lib == "both" || lib == "onednn";
  const bool run_openblas = lib == "both" || lib == "openblas";
  CpuBackend backend(threads);
  openblas_set_num_threads(threads);

  std::printf("threads=%d\n%-14s %5s %5s %5s %14s %16s\n", threads, "gemm", "m", "n", "k",
              run_onednn ? "oneDNN GFLOP/s" : "", run_openblas ? "OpenBLAS GFLOP/s" : "");
  double total_flop = 0.0, onednn_time = 0.0, openblas_time = 0.0;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Case& c : wide_mlp_cases()) {
    const std::size_t a_elems = static_cast<std::size_t>(c.m) * c.k;
    const std::size_t b_elems = static_cast<std::size_t>(c.k) * c.n;
    const std::size_t c_elems = static_cast<std::size_t>(c.m) * c.n;
    auto* a = static_cast<float*>(backend.allocate(a_elems * 4));
    auto* b = static_cast<float*>(backend.allocate(b_elems * 4));
    auto* out = static_cast<float*>(backend.allocate(c_elems * 4));
    for (std::size_t i = 0; i < a_elems; ++i) a[i] = dist(rng);
    for (std::size_t i = 0; i < b_elems; ++i) b[i] = dist(rng);
    std::memset(out, 0, c_elems * 4);
    const double flop = 2.0 * c.m * c.n * c.k;
    total_flop += flop;

    double t_dnnl = 0.0, t_blas = 0.0;
    if (run_onednn) {
      mixtrain::sdk::GemmArgs args;
      args.a = {TensorView{a, DType::fp32, c.trans_a ? mixtrain::sdk::Shape{c.k, c.m} : mixtrain::sdk::Shape{c.m, c.k}}, c.trans_a};
      args.b = {TensorView{b, DType::fp32, c.trans_b ? mixtrain::sdk::Shape{c.n, c.k} : mixtrain::sdk::Shape{c.k, c.n}}, c.trans_b};
      args.c = TensorView{out, DType::fp32, {c.m, c.n}};
      t_dnnl = median_seconds([&] { backend.gemm(args); }, seconds);
      onednn_time += t_dnnl;
    }
    if (run_openblas) {
      const int lda = c.trans_a ? c.m : c.k;
      const int ldb = c.trans_b ? c.k : c.n;
      t_blas = median_seconds(
          [&] {
            cblas_sgemm(CblasRowMajor, c.trans_a ? CblasTrans : CblasNoTrans,
                        c.trans_b ? CblasTrans : CblasNoTrans, c.m, c.n, c.k, 1.0f, a, lda, b, ldb,
                        0.0f, out, c.n);
          },
          seconds);
      openblas_time += t_blas;
    }
    std::printf("%-14s %5d %5d %5d %14.1f %16.1f\n", c.name, c.m, c.n, c.k,
                run_onednn ? flop / t_dnnl * 1e-9 : 0.0, run_openblas ? flop / t_blas * 1e-9 : 0.0);
    backend.deallocate(a);
    backend.deallocate(b);
    backend.deallocate(out);
  }
  std::printf("%-14s %17s %14.1f %16.1f\n", "all 9 (time-weighted)", "",
              run_onednn ? total_flop / onednn_time * 1e-9 : 0.0,
              run_openblas ? total_flop / openblas_time * 1e-9 : 0.0);
  if (run_onednn) std::printf("fp32 implementation: %s\n", backend.capabilities().gemm_inputs[0].how.c_str());
  return 0;
}
