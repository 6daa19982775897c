// bench_wide_mlp_gemm_bound: the GEMMs of one FP32 training step of the wide MLP
// (1024 -> 4096 -> 4096 -> 1024 -> 10, batch 512) and nothing else, through oneDNN matmul
// primitives created once: the lower bound of a step's time for a trainer built on oneDNN.
//
// Per Linear in->out with X [B,in], W [out,in] (row-major, as mixtrain stores them), dY [B,out]:
//   forward  Y  = X · Wᵀ + b   m=B,   n=out, k=in   (W read transposed through strides; the bias
//                                                   is fused into the matmul, as mixtrain does)
//   dW       dW = dYᵀ · X      m=out, n=in,  k=B    (dY read transposed through strides)
//   dX       dX = dY · W       m=B,   n=in,  k=out  (every layer but the first)
// Same layouts, same order (forward fc1..head, then backward head..fc1: dW, then dX) and one
// buffer per tensor, as in mixtrain's LinearLayer, so caches see what a real step sees.
//
// Usage: bench_wide_mlp_gemm_bound [--threads N] [--batch B] [--warmup S] [--windows W]
//                                  [--steps-per-window K]
// Prints one JSON object: steps/s (median of the windows), GFLOP/s, and the median time of every
// GEMM on its own (same primitives, timed one at a time after the step timing).
#include <omp.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

namespace {

using dnnl::memory;
using Clock = std::chrono::steady_clock;

struct Buffer {
  std::vector<float> v;
  explicit Buffer(std::size_t n, std::mt19937& rng) : v(n) {
    std::uniform_real_distribution<float> d(-0.05f, 0.05f);
    for (auto& x : v) x = d(rng);
  }
  float* data() { return v.data(); }
};

struct Gemm {
  std::string name;
  memory::dim m, n, k;
  dnnl::matmul prim;
  std::unordered_map<int, memory> args;
  std::string impl;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// C[m,n] = op(A)[m,k] · op(B)[k,n] (+ bias[n]); A, B, C row-major as stored.
Gemm make_gemm(const dnnl::engine& eng, std::string name, memory::dim m, memory::dim n,
               memory::dim k, bool trans_a, bool trans_b, float* a, float* b, float* c,
               float* bias) {
  using dt = memory::data_type;
  memory::desc a_md({m, k}, dt::f32, trans_a ? memory::dims{1, m} : memory::dims{k, 1});
  memory::desc b_md({k, n}, dt::f32, trans_b ? memory::dims{1, k} : memory::dims{n, 1});
  memory::desc c_md({m, n}, dt::f32, memory::dims{n, 1});
  memory::desc bias_md({1, n}, dt::f32, memory::dims{n, 1});
  const auto desc = bias != nullptr ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md)
                                    : dnnl::matmul::desc(a_md, b_md, c_md);
  dnnl::matmul::primitive_desc pd(desc, eng);
  Gemm g{std::move(name), m, n, k, dnnl::matmul(pd), {}, pd.impl_info_str()};
  g.args = {{DNNL_ARG_SRC, memory(a_md, eng, a)},
            {DNNL_ARG_WEIGHTS, memory(b_md, eng, b)},
            {DNNL_ARG_DST, memory(c_md, eng, c)}};
  if (bias != nullptr) g.args.emplace(DNNL_ARG_BIAS, memory(bias_md, eng, bias));
  return g;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the wide MLP step's GEMMs alone: the lower bound of its step time"};
  int threads = 2, batch = 512, warmup = 3, windows = 5, per_window = 5;
  app.add_option("--threads", threads, "OpenMP threads")->check(CLI::Range(1, 1024));
  app.add_option("--batch", batch, "rows a step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::Range(0, 100000));
  app.add_option("--windows", windows, "timed windows")->check(CLI::Range(1, 100000));
  app.add_option("--steps-per-window", per_window, "steps a window")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(threads);

  const std::vector<memory::dim> widths{1024, 4096, 4096, 1024, 10};
  const std::size_t L = widths.size() - 1;
  std::mt19937 rng(0);
  const memory::dim B = batch;

  // acts[0] = input X; acts[l+1] = output of layer l (ReLU in place is not a GEMM: not timed).
  std::vector<Buffer> acts, grads_act, weights, wgrads, biases;
  for (std::size_t l = 0; l <= L; ++l) {
    acts.emplace_back(static_cast<std::size_t>(B * widths[l]), rng);
    grads_act.emplace_back(static_cast<std::size_t>(B * widths[l]), rng);
  }
  for (std::size_t l = 0; l < L; ++l) {
    weights.emplace_back(static_cast<std::size_t>(widths[l + 1] * widths[l]), rng);
    wgrads.emplace_back(static_cast<std::size_t>(widths[l + 1] * widths[l]), rng);
    biases.emplace_back(static_cast<std::size_t>(widths[l + 1]), rng);
  }

  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  std::vector<Gemm> step;  // in execution order
  const char* names[] = {"fc1", "fc2", "fc3", "head"};
  for (std::size_t l = 0; l < L; ++l)
    step.push_back(make_gemm(eng, std::string(names[l]) + ".fwd", B, widths[l + 1], widths[l],
                             false, true, acts[l].data(), weights[l].data(), acts[l + 1].data(),
                             biases[l].data()));
  for (std::size_t li = L; li-- > 0;) {
    // dW[out,in] = dY[B,out]ᵀ · X[B,in]
    step.push_back(make_gemm(eng, std::string(names[li]) + ".dW", widths[li + 1], widths[li], B,
                             true, false, grads_act[li + 1].data(), acts[li].data(),
                             wgrads[li].data(), nullptr));
    if (li > 0)  // dX[B,in] = dY[B,out] · W[out,in]
      step.push_back(make_gemm(eng, std::string(names[li]) + ".dX", B, widths[li], widths[li + 1],
                               false, false, grads_act[li + 1].data(), weights[li].data(),
                               grads_act[li].data(), nullptr));
  }
  double step_flops = 0;
  for (const auto& g : step) step_flops += g.flops();

  auto run_step = [&] {
    for (auto& g : step) g.prim.execute(strm, g.args);
    strm.wait();
  };
  for (int i = 0; i < warmup; ++i) run_step();
  std::vector<double> window_sps;
  for (int w = 0; w < windows; ++w) {
    const auto t0 = Clock::now();
    for (int s = 0; s < per_window; ++s) run_step();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    window_sps.push_back(per_window / dt);
  }
  const double sps = median(window_sps);

  // Each GEMM on its own: median of 5 calls after one warm-up call.
  std::vector<double> each;
  for (auto& g : step) {
    g.prim.execute(strm, g.args);
    strm.wait();
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      g.prim.execute(strm, g.args);
      strm.wait();
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    each.push_back(median(t));
  }

  std::printf("{\"framework\": \"onednn-gemm-only\", \"threads\": %d, \"batch\": %d, "
              "\"omp_max_threads\": %d, \"warmup_steps\": %d, \"steps_per_window\": %d, "
              "\"gemms_per_step\": %zu, \"gflop_per_step\": %.4f, \"window_steps_per_s\": [",
              threads, batch, omp_get_max_threads(), warmup, per_window, step.size(),
              step_flops * 1e-9);
  for (std::size_t i = 0; i < window_sps.size(); ++i)
    std::printf("%s%.4f", i ? ", " : "", window_sps[i]);
  std::printf("], \"steps_per_s\": %.4f, \"step_ms\": %.3f, \"samples_per_s\": %.2f, "
              "\"gflop_per_s\": %.2f, \"gemms\": [",
              sps, 1e3 / sps, sps * batch, sps * step_flops * 1e-9);
  for (std::size_t i = 0; i < step.size(); ++i)
    std::printf("%s{\"name\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"ms\": %.3f, "
                "\"gflop_per_s\": %.2f, \"impl\": \"%s\"}",
                i ? ", " : "", step[i].name.c_str(), static_cast<long long>(step[i].m),
                static_cast<long long>(step[i].n), static_cast<long long>(step[i].k), each[i] * 1e3,
                step[i].flops() / each[i] * 1e-9, step[i].impl.c_str());
  std::printf("]}\n");
  return 0;
}
