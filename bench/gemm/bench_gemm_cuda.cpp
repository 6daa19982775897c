// bench_gemm_cuda: TFLOP/s of the CUDA backend's GEMM facet (CudaGemm::gemm, cuBLASLt) per input
// dtype at one large shape (default m = n = k = 8192), against the dense Tensor Core / CUDA core
// peaks of an H100/H200 SXM.
//
// Usage: bench_gemm_cuda [--m M] [--n N] [--k K] [--size S (sets m, n, k)] [--seconds T]
//                        [--device D] [--trans-b 0|1] [--only fp32,tf32,bf16,fp16,fp8]
//                        [--fp8-fast-accum 0|1] [--gemm-autotune N]
// --gemm-autotune N builds the backend with the `gemm_autotune` option (time cuBLASLt's first N
// heuristic algorithms per plan at its first call, keep the fastest; the warm-up calls pay it), so
// the default and the tuned numbers come from two runs of this bench; the plan report names each
// plan's pick. --fp8-fast-accum 1 builds the backend with fp8_fast_accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM,
// Transformer Engine's forward-GEMM setting) to show what the exact accumulation costs.
// Rows (A and B in the row's dtype, C as a mixed-precision Linear layer stores its output):
//   fp32        A, B fp32, C fp32, compute fp32 (CUBLAS_COMPUTE_32F: CUDA cores)
//   tf32        A, B fp32, C fp32, GemmArgs.compute = tf32 (CUBLAS_COMPUTE_32F_FAST_TF32)
//   bf16        A, B bf16, C bf16 (FP32 accumulation)
//   fp16        A, B fp16, C fp16 (FP32 accumulation)
//   fp8 e4m3    A, B fp8_e4m3 (scale_inv 1), C bf16 (FP32 accumulation)
// Layout: C[m,n] = A[m,k] · B[n,k]ᵀ (B transposed: a Linear layer's forward Y = X·Wᵀ), the "TN"
// layout cuBLASLt's FP8 kernels take without a transpose copy; --trans-b 0 times A·B instead
// (FP8 then pays a transpose into scratch per call, which the figure includes).
// Operands: uniform(-1, 1) random values (zeros would flatter the Tensor Cores' power-limited
// clocks), generated once in fp32 and cast on the device into each dtype.
// Timing: 3 warm-up calls, then batches of back-to-back calls bracketed by
// CudaBackend::synchronize() and a host steady clock (each batch >= ~50 ms, so the bracketing is
// < 0.1 % of it), for T seconds per dtype (at least 5 batches); TFLOP/s = 2·m·n·k / time per call,
// for the median and the fastest batch.
// Check: 64 entries of each C (read back as fp32) against a double-precision dot product, as
// max |c - ref| / rms(ref): of the fp32 operands for fp32 and tf32 rows (~1e-6, ~1e-3), of the
// operands as stored for 16-bit and FP8 rows (~1e-3: C's rounding). It guards against a fast path
// that computes something else.
// Without a usable GPU it prints one line "no CUDA device: <CUDA's reason>" and exits 2.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_backend.h"
#include "mixtrain/sdk/error.h"

namespace {

using mixtrain::backend_cuda::CudaBackend;
using mixtrain::sdk::DType;
using mixtrain::sdk::Shape;
using mixtrain::sdk::TensorView;

// Dense (no sparsity) peaks of the H100 SXM5 / H200 SXM in TFLOP/s, NVIDIA's datasheets (the H200
// has the H100's SMs and clocks, only more and faster memory): FP32 66.9 (CUDA cores), TF32 494.7,
// BF16 / FP16 989.4, FP8 1978.9 (Tensor Cores). Boost clock; sustained clocks under a long GEMM
// can be lower (power limit). PCIe / NVL parts have lower peaks: the "%" column is then off.
struct Row {
  const char* name;
  DType input;
  DType compute;
  DType output;
  double peak_tflops;
};
constexpr Row kRows[] = {
    {"fp32", DType::fp32, DType::fp32, DType::fp32, 66.9},
    {"tf32", DType::fp32, DType::tf32, DType::fp32, 494.7},
    {"bf16", DType::bf16, DType::bf16, DType::bf16, 989.4},
    {"fp16", DType::fp16, DType::fp16, DType::fp16, 989.4},
    {"fp8", DType::fp8_e4m3, DType::fp8_e4m3, DType::bf16, 1978.9},
};

struct Timing {
  double median = 0.0, best = 0.0;  // seconds per call
  int calls = 0;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Timing time_gemm(CudaBackend& be, const mixtrain::sdk::GemmArgs& args, double budget) {
  mixtrain::sdk::GemmFacet& gemm = *mixtrain::sdk::facet<mixtrain::sdk::GemmFacet>(be);
  for (int i = 0; i < 3; ++i) gemm.gemm(args);
  be.synchronize();
  // Size a batch from one more synchronised call: >= 50 ms per batch, at least 2 calls.
  double t0 = now_s();
  gemm.gemm(args);
  be.synchronize();
  const double one = std::max(now_s() - t0, 1e-6);
  const int per_batch = std::max(2, static_cast<int>(0.05 / one));
  std::vector<double> per_call;
  int calls = 0;
  const double start = now_s();
  while (per_call.size() < 5 || now_s() - start < budget) {
    t0 = now_s();
    for (int i = 0; i < per_batch; ++i) gemm.gemm(args);
    be.synchronize();
    per_call.push_back((now_s() - t0) / per_batch);
    calls += per_batch;
  }
  std::sort(per_call.begin(), per_call.end());
  return {per_call[per_call.size() / 2], per_call.front(), calls};
}

bool parse_dtypes(const std::string& list, std::vector<Row>& rows) {
  rows.clear();
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t end = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, end - pos);
    bool found = false;
    for (const Row& r : kRows)
      if (name == r.name) {
        rows.push_back(r);
        found = true;
      }
    if (!found) return false;
    pos = end + 1;
  }
  return !rows.empty();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"TFLOP/s of the CUDA backend's GEMM facet per input dtype at one shape"};
  std::int64_t m = 8192, n = 8192, k = 8192, size = 0;
  double seconds = 1.0;
  int device = 0, trans_b_flag = 1, fast_accum_flag = 0, gemm_autotune = 0;
  std::string only;
  const auto extent = CLI::Range(std::int64_t{1}, std::int64_t{1} << 20);
  app.add_option("--m", m, "rows of A and C")->check(extent);
  app.add_option("--n", n, "columns of C")->check(extent);
  app.add_option("--k", k, "the inner dimension")->check(extent);
  app.add_option("--size", size, "m, n and k at once (those not given apart)")->check(extent);
  app.add_option("--seconds", seconds, "timed seconds per dtype")->check(CLI::Range(0.0, 3600.0));
  app.add_option("--device", device, "CUDA device")->check(CLI::Range(0, 64));
  app.add_option("--trans-b", trans_b_flag, "1: C = A·Bᵀ (a Linear's forward), 0: A·B")
      ->check(CLI::IsMember({0, 1}));
  app.add_option("--only", only, "a comma-separated subset of fp32,tf32,bf16,fp16,fp8");
  app.add_option("--fp8-fast-accum", fast_accum_flag, "1: the backend's fp8_fast_accumulation")
      ->check(CLI::IsMember({0, 1}));
  app.add_option("--gemm-autotune", gemm_autotune, "the backend's gemm_autotune (0: off)")
      ->check(CLI::Range(0, 64));
  CLI11_PARSE(app, argc, argv);
  const bool trans_b = trans_b_flag != 0, fp8_fast_accum = fast_accum_flag != 0;
  if (size > 0) {
    if (app.count("--m") == 0) m = size;
    if (app.count("--n") == 0) n = size;
    if (app.count("--k") == 0) k = size;
  }
  std::vector<Row> rows(std::begin(kRows), std::end(kRows));
  if (!only.empty() && !parse_dtypes(only, rows)) {
    std::fprintf(stderr,
                 "--only %s: expected a comma-separated subset of fp32,tf32,bf16,fp16,fp8\n",
                 only.c_str());
    return 2;
  }

  std::unique_ptr<CudaBackend> owned;
  try {
    CudaBackend::device_count();  // throws with CUDA's own text when there is no usable device
    owned = std::make_unique<CudaBackend>(mixtrain::backend_cuda::CudaOptions{
        .device = device, .fp8_fast_accumulation = fp8_fast_accum, .gemm_autotune = gemm_autotune});
  } catch (const std::exception& e) {
    std::string reason = e.what();
    for (char& c : reason)
      if (c == '\n') c = ' ';
    std::printf("no CUDA device: %s\n", reason.c_str());
    return 2;
  }
  CudaBackend& be = *owned;
  const auto caps = be.capabilities();
  std::printf("device: %s, sm_%d%s, gemm_autotune %d%s\n", caps.device_name.c_str(),
              be.sm_version(), fp8_fast_accum ? ", fp8_fast_accumulation on" : "", gemm_autotune,
              gemm_autotune > 1 ? " (tuned)" : " (default: heuristic result 0)");
  std::printf("C[m,n] = A[m,k] * %s, m=%lld n=%lld k=%lld; %.1f s per dtype; TFLOP/s = 2mnk / time "
              "per call, median / fastest batch\n",
              trans_b ? "B[n,k]^T" : "B[k,n]", static_cast<long long>(m), static_cast<long long>(n),
              static_cast<long long>(k), seconds);
  std::printf("peaks: dense H100/H200 SXM datasheet figures (FP32 66.9, TF32 494.7, BF16/FP16 989.4, "
              "FP8 1978.9 TFLOP/s)%s\n",
              be.sm_version() == 90 ? "" : "; THIS IS NOT AN sm_90 GPU: the % column does not apply");

  // fp32 operands on the host, once; every dtype's operands are cast from them on the device.
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const Shape a_shape{m, k};
  const Shape b_shape = trans_b ? Shape{n, k} : Shape{k, n};
  std::vector<float> a_host(static_cast<std::size_t>(m * k)), b_host(static_cast<std::size_t>(k * n));
  for (float& x : a_host) x = dist(rng);
  for (float& x : b_host) x = dist(rng);

  // Reference entries: (i, j) spread over C, dot products in double of the operands given.
  std::vector<std::pair<std::int64_t, std::int64_t>> probes;
  for (int p = 0; p < 64; ++p) probes.emplace_back((p * 7919) % m, (p * 104729 + 13) % n);
  struct Reference {
    std::vector<double> value;
    double rms = 0.0;
  };
  auto reference = [&](const std::vector<float>& av, const std::vector<float>& bv) {
    Reference r;
    double sq = 0.0;
    for (const auto& [i, j] : probes) {
      double acc = 0.0;
      for (std::int64_t t = 0; t < k; ++t) {
        const double y = trans_b ? bv[static_cast<std::size_t>(j * k + t)] : bv[static_cast<std::size_t>(t * n + j)];
        acc += static_cast<double>(av[static_cast<std::size_t>(i * k + t)]) * y;
      }
      r.value.push_back(acc);
      sq += acc * acc;
    }
    r.rms = std::sqrt(sq / static_cast<double>(r.value.size()));
    return r;
  };
  // A narrow operand read back as fp32: the values the GEMM really multiplies.
  auto as_stored = [&](TensorView narrow, std::size_t count) {
    TensorView wide{be.allocate(count * 4), DType::fp32, narrow.shape};
    be.cast(narrow, wide);
    std::vector<float> host(count);
    be.copy_to_host(host.data(), wide);
    be.deallocate(wide.data);
    return host;
  };
  const Reference fp32_ref = reference(a_host, b_host);

  int failures = 0;
  std::vector<std::pair<std::string, double>> median_tflops;
  std::printf("\n| dtype (A x B -> C)      | TFLOP/s median | TFLOP/s best | ms/call | %% of peak (median) | calls | max err / rms |\n");
  std::printf("|-------------------------|---------------:|-------------:|--------:|-------------------:|------:|--------------:|\n");
  try {
    TensorView a32{be.allocate(a_host.size() * 4), DType::fp32, a_shape};
    TensorView b32{be.allocate(b_host.size() * 4), DType::fp32, b_shape};
    be.copy_from_host(a32, a_host.data());
    be.copy_from_host(b32, b_host.data());
    for (const Row& r : rows) {
      if (!caps.supports(r.input)) {
        std::printf("| %-23s | not supported by this backend/device |\n", r.name);
        continue;
      }
      const bool own_inputs = r.input != DType::fp32;
      TensorView a = a32, b = b32;
      if (own_inputs) {
        a = TensorView{be.allocate(a_host.size() * mixtrain::sdk::dtype_size(r.input)), r.input, a_shape};
        b = TensorView{be.allocate(b_host.size() * mixtrain::sdk::dtype_size(r.input)), r.input, b_shape};
        be.cast(a32, a);
        be.cast(b32, b);
      }
      // 16-bit and FP8 rows are checked against their operands as stored, so the check sees the
      // GEMM's own error (accumulation, C's rounding) and not the inputs' quantization, which for
      // e4m3 alone is ~5% of rms at k = 8192. fp32 and tf32 rows use the fp32 operands.
      const Reference ref = own_inputs ? reference(as_stored(a, a_host.size()), as_stored(b, b_host.size()))
                                       : fp32_ref;
      TensorView c{be.allocate(static_cast<std::size_t>(m * n) * mixtrain::sdk::dtype_size(r.output)),
                   r.output, Shape{m, n}};
      mixtrain::sdk::GemmArgs args;
      args.a = {a, false};
      args.b = {b, trans_b};
      args.c = c;
      args.compute = r.compute;
      double err = -1.0;
      Timing t;
      try {
        t = time_gemm(be, args, seconds);
        // Read C back as fp32 and compare the probes.
        TensorView c32 = c;
        if (r.output != DType::fp32) {
          c32 = TensorView{be.allocate(static_cast<std::size_t>(m * n) * 4), DType::fp32, Shape{m, n}};
          be.cast(c, c32);
        }
        std::vector<float> c_host(static_cast<std::size_t>(m * n));
        be.copy_to_host(c_host.data(), c32);
        if (c32.data != c.data) be.deallocate(c32.data);
        err = 0.0;
        for (std::size_t p = 0; p < probes.size(); ++p) {
          const double got = c_host[static_cast<std::size_t>(probes[p].first * n + probes[p].second)];
          err = std::max(err, std::isfinite(got) ? std::fabs(got - ref.value[p]) : INFINITY);
        }
        err /= ref.rms;
      } catch (const std::exception& e) {
        std::string what = e.what();
        for (char& ch : what)
          if (ch == '\n') ch = ' ';
        std::printf("| %-23s | FAILED: %s |\n", r.name, what.c_str());
        ++failures;
      }
      if (err >= 0.0) {
        const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
        const double med = flop / t.median * 1e-12, best = flop / t.best * 1e-12;
        const std::string label = std::string(r.name) + " (" + std::string(mixtrain::sdk::dtype_name(r.input)) +
                                  " -> " + std::string(mixtrain::sdk::dtype_name(r.output)) + ")";
        std::printf("| %-23s | %14.1f | %12.1f | %7.3f | %17.1f%% | %5d | %13.2e |\n", label.c_str(), med,
                    best, t.median * 1e3, 100.0 * med / r.peak_tflops, t.calls, err);
        std::fflush(stdout);
        median_tflops.emplace_back(r.name, med);
        // Loose sanity bounds, far above each format's rounding: anything beyond is a wrong result.
        const double bound = r.input == DType::fp32 && r.compute == DType::fp32 ? 1e-4 : 0.02;
        if (!(err <= bound)) {
          std::printf("  ^ %s: max error %.3g x rms exceeds the sanity bound %.3g: the result is wrong\n",
                      r.name, err, bound);
          ++failures;
        }
      }
      be.deallocate(c.data);
      if (own_inputs) {
        be.deallocate(a.data);
        be.deallocate(b.data);
      }
    }
    be.deallocate(a32.data);
    be.deallocate(b32.data);
  } catch (const std::exception& e) {
    std::printf("bench_gemm_cuda: %s\n", e.what());
    return 1;
  }

  auto tflops = [&](const char* name) {
    for (const auto& [n_, v] : median_tflops)
      if (n_ == name) return v;
    return 0.0;
  };
  std::printf("\n");
  if (tflops("fp8") > 0 && tflops("bf16") > 0)
    std::printf("FP8 / BF16 = %.2fx (ideal on Hopper: 2x)\n", tflops("fp8") / tflops("bf16"));
  if (tflops("bf16") > 0 && tflops("tf32") > 0)
    std::printf("BF16 / TF32 = %.2fx (ideal: 2x)\n", tflops("bf16") / tflops("tf32"));
  if (tflops("tf32") > 0 && tflops("fp32") > 0)
    std::printf("TF32 / FP32 = %.2fx\n", tflops("tf32") / tflops("fp32"));
  std::vector<DType> listed;
  for (const Row& r : rows)
    if (const auto* s = caps.find(r.input); s && std::find(listed.begin(), listed.end(), r.input) == listed.end()) {
      listed.push_back(r.input);
      std::printf("%s: %s, %s\n", std::string(mixtrain::sdk::dtype_name(r.input)).c_str(),
                  s->native ? "native" : "emulated", s->how.c_str());
    }
  std::printf("cuBLASLt plans cached: %zu; peak device memory %.0f MiB\n", be.cached_gemm_plans(),
              static_cast<double>(be.memory_stats().peak_bytes) / (1024.0 * 1024.0));
  // Which cuBLASLt problem each row really ran (m/n/k and A/B as cuBLASLt sees them: our B is
  // its A), and any plan cuBLASLt declined: a declined native plan means a slower fallback ran.
  for (const std::string& line : be.gemm_plan_report()) std::printf("  plan %s\n", line.c_str());
  return failures == 0 ? 0 : 1;
}
