// bench_gemm: GFLOP/s of the wide-MLP (1024 -> 4096 -> 4096 -> 1024, batch 512) GEMMs through
// CpuBackend::gemm (oneDNN matmul) and OpenBLAS cblas_sgemm, at the same thread count.
//
// Usage: bench_gemm [--threads N] [--lib onednn|openblas|both] [--seconds S] [--steps N]
//                   [--with-relu 0|1] [--mixed 1]
// --mixed 1 prints, instead, the per-dtype table of CpuBackend::gemm: fp32, bf16 through oneDNN's
// bf16 matmul, bf16 emulated (exact decode + fp32 GEMM), fp16 emulated and fp8 E4M3 emulated,
// with operands and C stored as a Linear layer of a mixed policy stores them (forward Y and dX in
// the 16-bit dtype, dW in fp32; fp8 C is bf16).
// --with-relu 1 follows every GEMM with the backend's OpenMP ReLU over C, as a training step
// does; it shows what a second thread pool (OpenBLAS's pthreads) costs next to OpenMP work.
// With --steps N > 0 it also times N full FP32 training steps of that MLP (forward, softmax-CE,
// backward, fused unscale check, AdamW) through CpuBackend alone, as the trainer would run them.
// Each measurement: 3 warm-up calls, then as many calls as fit in S seconds (at least 5);
// GFLOP/s = 2*m*n*k / t, for the median call and for the fastest call (on a shared machine the
// fastest call is the best estimate of what a library does with the cores to itself). Run each library in its own process for the
// cleanest numbers: OpenMP (oneDNN) worker threads keep spinning after a parallel region and
// steal cycles from OpenBLAS's pthread pool when both run in one process.
#include <cblas.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu_backend.h"

namespace {

using mixtrain::backend_cpu::Bf16GemmPath;
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
    cases.push_back({"fwd Y=X*W^T", batch, out, in, false, true});
    cases.push_back({"dX=dY*W", batch, in, out, false, false});
    cases.push_back({"dW=dY^T*X", out, in, batch, true, false});
  }
  return cases;
}

struct Timing {
  double median, best;
};

Timing time_calls(const std::function<void()>& call, double budget) {
  for (int i = 0; i < 3; ++i) call();
  std::vector<double> times;
  const auto start = std::chrono::steady_clock::now();
  while (times.size() < 5 ||
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < budget) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front()};
}

// One FP32 training step of Linear(1024,4096)-ReLU-Linear(4096,4096)-ReLU-Linear(4096,1024)-ReLU-
// Linear(1024,10) at batch 512 with AdamW, using only backend ops. Returns steps/s.
double mlp_steps_per_second(CpuBackend& be, int steps) {
  const std::int64_t batch = 512;
  const std::vector<std::int64_t> widths = {1024, 4096, 4096, 1024, 10};
  const std::size_t layers = widths.size() - 1;
  std::vector<void*> owned;
  auto tensor = [&](std::vector<std::int64_t> shape, DType dt = DType::fp32) {
    TensorView v;
    v.dtype = dt;
    v.shape = mixtrain::sdk::Shape::from_vector(shape);
    v.data = be.allocate(v.bytes());
    owned.push_back(v.data);
    be.fill(v, 0.0f);
    return v;
  };
  std::vector<TensorView> w, b, dw, db, m_w, v_w, m_b, v_b, z, h, dz;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t l = 0; l < layers; ++l) {
    const std::int64_t in = widths[l], out = widths[l + 1];
    w.push_back(tensor({out, in}));
    const float std_dev = 1.0f / std::sqrt(static_cast<float>(in));
    for (std::int64_t i = 0; i < out * in; ++i) w.back().as<float>()[i] = normal(rng) * std_dev;
    b.push_back(tensor({out}));
    dw.push_back(tensor({out, in}));
    db.push_back(tensor({out}));
    m_w.push_back(tensor({out, in}));
    v_w.push_back(tensor({out, in}));
    m_b.push_back(tensor({out}));
    v_b.push_back(tensor({out}));
    z.push_back(tensor({batch, out}));
    h.push_back(tensor({batch, out}));
    dz.push_back(tensor({batch, out}));
  }
  TensorView x = tensor({batch, widths[0]});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = normal(rng);
  TensorView labels = tensor({batch}, DType::int32);
  for (std::int64_t i = 0; i < batch; ++i) labels.as<std::int32_t>()[i] = static_cast<std::int32_t>(i % 10);
  TensorView loss = tensor({1}), correct = tensor({1}, DType::int32);
  std::vector<TensorView> grads;
  std::vector<mixtrain::sdk::ParamTensors> params;
  for (std::size_t l = 0; l < layers; ++l) {
    grads.push_back(dw[l]);
    grads.push_back(db[l]);
    params.push_back({w[l], dw[l], {}, m_w[l], v_w[l]});
    params.push_back({b[l], db[l], {}, m_b[l], v_b[l]});
  }
  mixtrain::sdk::AdamWHyper hyper;
  auto step = [&](std::int64_t t) {
    for (std::size_t l = 0; l < layers; ++l) {
      mixtrain::sdk::GemmArgs g;
      g.a = {l == 0 ? x : h[l - 1], false};
      g.b = {w[l], true};
      g.c = z[l];
      g.bias = b[l];
      mixtrain::sdk::facet<mixtrain::sdk::GemmFacet>(be)->gemm(g);
      if (l + 1 < layers)
        mixtrain::sdk::facet<mixtrain::sdk::ActivationFacet>(be)->activation_forward(
            mixtrain::sdk::Activation::relu, z[l], h[l]);
    }
    mixtrain::sdk::facet<mixtrain::sdk::LossFacet>(be)->softmax_cross_entropy(
        z[layers - 1], labels, 1.0f, 0.0f, loss, correct, dz[layers - 1]);
    for (std::size_t l = layers; l-- > 0;) {
      mixtrain::sdk::GemmArgs g;  // dW = dZ^T * H_prev
      g.a = {dz[l], true};
      g.b = {l == 0 ? x : h[l - 1], false};
      g.c = dw[l];
      mixtrain::sdk::facet<mixtrain::sdk::GemmFacet>(be)->gemm(g);
      mixtrain::sdk::facet<mixtrain::sdk::ActivationFacet>(be)->bias_grad(dz[l], db[l], false);
      if (l > 0) {
        mixtrain::sdk::GemmArgs gx;  // dH_prev = dZ * W, then through the ReLU in place
        gx.a = {dz[l], false};
        gx.b = {w[l], false};
        gx.c = dz[l - 1];
        mixtrain::sdk::facet<mixtrain::sdk::GemmFacet>(be)->gemm(gx);
        mixtrain::sdk::facet<mixtrain::sdk::ActivationFacet>(be)->activation_backward(
            mixtrain::sdk::Activation::relu, z[l - 1], dz[l - 1], dz[l - 1]);
      }
    }
    if (mixtrain::sdk::facet<mixtrain::sdk::GradientCheckFacet>(be)->unscale_and_check_finite(grads,
                                                                                              1.0f))
      std::printf("non-finite gradient!\n");
    hyper.step = t;
    mixtrain::sdk::facet<mixtrain::sdk::OptimizerFacet>(be)->adamw_update(hyper, params);
  };
  step(1);  // warm-up: creates every primitive
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step(i + 2);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("final loss %.4f\n", static_cast<double>(loss.as<float>()[0]));
  for (void* p : owned) be.deallocate(p);
  return steps / elapsed;
}

struct MixedColumn {
  const char* name;
  DType input;
  Bf16GemmPath path;
};

// One table row per wide-MLP GEMM, one column per input dtype / bf16 implementation.
void run_mixed(int threads, double seconds) {
  const std::vector<MixedColumn> columns = {{"fp32", DType::fp32, Bf16GemmPath::automatic},
                                            {"bf16 oneDNN", DType::bf16, Bf16GemmPath::onednn},
                                            {"bf16 emulated", DType::bf16, Bf16GemmPath::emulated},
                                            {"fp16 emulated", DType::fp16, Bf16GemmPath::automatic},
                                            {"e4m3 emulated", DType::fp8_e4m3, Bf16GemmPath::automatic}};
  std::vector<std::unique_ptr<CpuBackend>> backends;
  for (const auto& col : columns) backends.push_back(std::make_unique<CpuBackend>(threads, col.path));
  std::printf("threads=%d; GFLOP/s as median / best call; A, B in the column's dtype\n", threads);
  std::printf("| %-14s | %5s | %5s | %5s |", "GEMM", "m", "n", "k");
  for (const auto& col : columns) std::printf(" %-15s |", col.name);
  std::printf("\n|----------------|-------|-------|-------|");
  for (std::size_t i = 0; i < columns.size(); ++i) std::printf("-----------------|");
  std::printf("\n");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<Timing> totals(columns.size(), Timing{0, 0});
  double total_flop = 0.0;
  for (const Case& c : wide_mlp_cases()) {
    const double flop = 2.0 * c.m * c.n * c.k;
    total_flop += flop;
    std::printf("| %-14s | %5d | %5d | %5d |", c.name, c.m, c.n, c.k);
    for (std::size_t ci = 0; ci < columns.size(); ++ci) {
      CpuBackend& be = *backends[ci];
      using mixtrain::sdk::Shape;
      const DType in = columns[ci].input;
      const bool weight_grad = c.trans_a;  // dW is fp32 in every policy
      const DType out = in == DType::fp32 || weight_grad ? DType::fp32
                        : mixtrain::sdk::is_fp8(in)      ? DType::bf16
                                                         : in;
      auto make = [&](DType dt, Shape shape, bool random) {
        TensorView v{nullptr, dt, shape};
        v.data = be.allocate(v.bytes());
        TensorView f32{be.allocate(static_cast<std::size_t>(v.numel()) * 4), DType::fp32, shape};
        for (std::int64_t i = 0; i < v.numel(); ++i) f32.as<float>()[i] = random ? dist(rng) : 0.0f;
        be.cast(f32, v);
        be.deallocate(f32.data);
        return v;
      };
      mixtrain::sdk::GemmArgs args;
      args.a = {make(in, c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k}, true), c.trans_a};
      args.b = {make(in, c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, true), c.trans_b};
      args.c = make(out, Shape{c.m, c.n}, false);
      args.compute = in;
      const Timing t = time_calls(
          [&] { mixtrain::sdk::facet<mixtrain::sdk::GemmFacet>(be)->gemm(args); }, seconds);
      totals[ci].median += t.median;
      totals[ci].best += t.best;
      std::printf(" %6.1f / %6.1f |", flop / t.median * 1e-9, flop / t.best * 1e-9);
      std::fflush(stdout);
      be.deallocate(args.a.view.data);
      be.deallocate(args.b.view.data);
      be.deallocate(args.c.data);
    }
    std::printf("\n");
  }
  std::printf("| %-14s | %5s | %5s | %5s |", "all 9 (total)", "", "", "");
  for (const auto& t : totals)
    std::printf(" %6.1f / %6.1f |", total_flop / t.median * 1e-9, total_flop / t.best * 1e-9);
  std::printf("\n");
  for (std::size_t ci = 0; ci < columns.size(); ++ci) {
    const auto caps = backends[ci]->capabilities();
    const auto* s = caps.find(columns[ci].input);
    std::printf("%s: %s, %s\n", columns[ci].name, s->native ? "native" : "emulated", s->how.c_str());
  }
  const auto auto_caps = CpuBackend(threads).capabilities();
  std::printf("bf16 path chosen automatically on this CPU: %s\n",
              auto_caps.native(DType::bf16) ? "oneDNN bf16 matmul" : "emulated");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fp32 GEMMs of the wide MLP: the CPU backend's oneDNN against OpenBLAS"};
  int threads = 2;
  std::string lib = "both";
  double seconds = 1.0;
  int steps = 0;
  int with_relu = 0;
  int mixed = 0;
  app.add_option("--threads", threads, "threads of both libraries")->check(CLI::Range(1, 1024));
  app.add_option("--lib", lib, "which library runs")
      ->check(CLI::IsMember({"onednn", "openblas", "both"}));
  app.add_option("--seconds", seconds, "timed seconds per GEMM")->check(CLI::Range(0.0, 3600.0));
  app.add_option("--steps", steps, "full training steps of the wide MLP after the GEMMs")
      ->check(CLI::Range(0, 100000));
  app.add_option("--with-relu", with_relu, "1: every GEMM followed by the backend's ReLU over C")
      ->check(CLI::IsMember({0, 1}));
  app.add_option("--mixed", mixed, "1: the bf16 / fp16 / fp8 table instead")
      ->check(CLI::IsMember({0, 1}));
  CLI11_PARSE(app, argc, argv);
  if (mixed) {
    run_mixed(threads, seconds);
    return 0;
  }
  const bool run_onednn = lib == "both" || lib == "onednn";
  const bool run_openblas = lib == "both" || lib == "openblas";
  CpuBackend backend(threads);
  openblas_set_num_threads(threads);

  std::printf("threads=%d%s; GFLOP/s as median / best call\n", threads,
              with_relu ? "; every GEMM followed by the backend's OpenMP ReLU over C" : "");
  std::printf("| %-14s | %5s | %5s | %5s | %-17s | %-17s |\n", "GEMM", "m", "n", "k",
              "oneDNN (backend)", "OpenBLAS sgemm");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", "----------------", "-------", "-------", "-------",
              "-------------------", "-------------------");
  double total_flop = 0.0;
  Timing onednn_total{0, 0}, openblas_total{0, 0};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto cell = [](bool ran, double flop, Timing t) {
    char text[64];
    if (!ran) return std::string("-");
    std::snprintf(text, sizeof text, "%6.1f / %6.1f", flop / t.median * 1e-9, flop / t.best * 1e-9);
    return std::string(text);
  };
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

    Timing t_dnnl{0, 0}, t_blas{0, 0};
    const TensorView c_view{out, DType::fp32, {c.m, c.n}};
    if (run_onednn) {
      using mixtrain::sdk::Shape;
      mixtrain::sdk::GemmArgs args;
      args.a = {TensorView{a, DType::fp32, c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k}}, c.trans_a};
      args.b = {TensorView{b, DType::fp32, c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}}, c.trans_b};
      args.c = TensorView{out, DType::fp32, {c.m, c.n}};
      t_dnnl = time_calls(
          [&] {
            mixtrain::sdk::facet<mixtrain::sdk::GemmFacet>(backend)->gemm(args);
            if (with_relu)
              mixtrain::sdk::facet<mixtrain::sdk::ActivationFacet>(backend)->activation_forward(
                  mixtrain::sdk::Activation::relu, args.c, args.c);
          },
          seconds);
      onednn_total.median += t_dnnl.median;
      onednn_total.best += t_dnnl.best;
    }
    if (run_openblas) {
      const int lda = c.trans_a ? c.m : c.k;
      const int ldb = c.trans_b ? c.k : c.n;
      t_blas = time_calls(
          [&] {
            cblas_sgemm(CblasRowMajor, c.trans_a ? CblasTrans : CblasNoTrans,
                        c.trans_b ? CblasTrans : CblasNoTrans, c.m, c.n, c.k, 1.0f, a, lda, b, ldb,
                        0.0f, out, c.n);
            if (with_relu)
              mixtrain::sdk::facet<mixtrain::sdk::ActivationFacet>(backend)->activation_forward(
                  mixtrain::sdk::Activation::relu, c_view, c_view);
          },
          seconds);
      openblas_total.median += t_blas.median;
      openblas_total.best += t_blas.best;
    }
    std::printf("| %-14s | %5d | %5d | %5d | %-17s | %-17s |\n", c.name, c.m, c.n, c.k,
                cell(run_onednn, flop, t_dnnl).c_str(), cell(run_openblas, flop, t_blas).c_str());
    backend.deallocate(a);
    backend.deallocate(b);
    backend.deallocate(out);
  }
  std::printf("| %-14s | %5s | %5s | %5s | %-17s | %-17s |\n", "all 9 (total)", "", "", "",
              cell(run_onednn, total_flop, onednn_total).c_str(),
              cell(run_openblas, total_flop, openblas_total).c_str());
  if (run_openblas)
    std::printf("OpenBLAS: %s (core %s, parallel mode %d)\n", openblas_get_config(),
                openblas_get_corename(), openblas_get_parallel());
  if (run_onednn) std::printf("fp32 implementation: %s\n", backend.capabilities().gemm_inputs[0].how.c_str());
  if (steps > 0) {
    const double sps = mlp_steps_per_second(backend, steps);
    std::printf("wide MLP fp32 AdamW training step (batch 512): %.2f steps/s (%.1f ms/step)\n", sps,
                1e3 / sps);
  }
  return 0;
}
