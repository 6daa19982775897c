// bench_batched_gemm: the attention GEMMs of one layer, batch = N*H = 64 heads, through
// CpuBackend::gemm_strided_batched (one cached 3-D oneDNN matmul) and through the loop of 64
// gemm() calls it replaced, in fp32 and bf16 (bf16 both ways the backend can run it: emulated,
// the default without AMX, and oneDNN's bf16 matmul).
//
//   scores  S = Q·Kᵀ  m = n = 128 (tokens), k = 32 (head_dim), C fp32 (the softmax is fp32)
//   context O = P·V   m = 128, n = 32, k = 128, C in the operand dtype
//
// Usage: bench_batched_gemm [--threads N] [Google Benchmark flags, e.g.
// --benchmark_repetitions=5 --benchmark_min_time=0.5]. FLOP/s counts 2*batch*m*n*k per call,
// per second of wall time (UseRealTime).
#include <benchmark/benchmark.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu_backend.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace {

using mixtrain::backend_cpu::Bf16GemmPath;
using mixtrain::backend_cpu::CpuBackend;
using mixtrain::sdk::DType;
using mixtrain::sdk::Shape;
using mixtrain::sdk::TensorView;

int g_threads = 0;

struct Problem {
  const char* name;
  std::int64_t batch, m, n, k;
  bool trans_b;
  bool c_like_inputs;  // C in the operand dtype (else fp32)
};

struct Route {
  const char* name;
  DType dtype;
  Bf16GemmPath bf16;
};

// Backend-owned tensors of one problem, filled with random values of the operand dtype.
class Operands {
 public:
  Operands(CpuBackend& be, const Problem& p, DType dt) : be_(be) {
    a_ = make(dt, p.batch * p.m * p.k, 1);
    b_ = make(dt, p.batch * p.k * p.n, 2);
    c_ = make(p.c_like_inputs ? dt : DType::fp32, p.batch * p.m * p.n, 3);
    args_.gemm.a = {{a_.data, dt, Shape{p.m, p.k}}, false};
    args_.gemm.b = {{b_.data, dt, p.trans_b ? Shape{p.n, p.k} : Shape{p.k, p.n}}, p.trans_b};
    args_.gemm.c = {c_.data, c_.dtype, Shape{p.m, p.n}};
    args_.gemm.alpha = 0.125f;  // 1/sqrt(head_dim) for the scores; any non-1 scale
    args_.batch = p.batch;
    args_.stride_a = p.m * p.k;
    args_.stride_b = p.k * p.n;
    args_.stride_c = p.m * p.n;
  }
  ~Operands() {
    for (void* ptr : {a_.data, b_.data, c_.data}) be_.deallocate(ptr);
  }
  Operands(const Operands&) = delete;
  Operands& operator=(const Operands&) = delete;

  void batched() {
    mixtrain::sdk::facet<mixtrain::sdk::GemmFacet>(be_)->gemm_strided_batched(args_);
  }
  void loop() {
    mixtrain::sdk::GemmArgs g = args_.gemm;
    for (std::int64_t i = 0; i < args_.batch; ++i) {
      g.a.view = moved(args_.gemm.a.view, i * args_.stride_a);
      g.b.view = moved(args_.gemm.b.view, i * args_.stride_b);
      g.c = moved(args_.gemm.c, i * args_.stride_c);
      mixtrain::sdk::facet<mixtrain::sdk::GemmFacet>(be_)->gemm(g);
    }
  }

 private:
  static TensorView moved(TensorView v, std::int64_t elements) {
    v.data = static_cast<char*>(v.data) +
             elements * static_cast<std::int64_t>(mixtrain::sdk::dtype_size(v.dtype));
    return v;
  }
  TensorView make(DType dt, std::int64_t numel, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> values(static_cast<std::size_t>(numel));
    for (auto& v : values) v = dist(rng);
    TensorView t{nullptr, dt, Shape{numel}};
    t.data = be_.allocate(t.bytes());
    if (dt == DType::fp32) {
      std::memcpy(t.data, values.data(), t.bytes());
    } else {
      mixtrain::sdk::convert(values, std::span(t.as<std::uint16_t>(), values.size()), dt);
    }
    return t;
  }

  CpuBackend& be_;
  TensorView a_, b_, c_;
  mixtrain::sdk::GemmBatchedArgs args_;
};

void run(benchmark::State& state, const Problem& p, const Route& r, bool batched) {
  CpuBackend be(g_threads, r.bf16);
  Operands ops(be, p, r.dtype);
  if (batched)
    ops.batched();  // creates and caches the primitive outside the timing
  else
    ops.loop();
  for (auto _ : state) {
    if (batched)
      ops.batched();
    else
      ops.loop();
  }
  state.counters["FLOP/s"] = benchmark::Counter(static_cast<double>(2 * p.batch * p.m * p.n * p.k),
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(be.last_gemm_implementation() + ", " + std::to_string(be.threads()) + " threads");
}

}  // namespace

int main(int argc, char** argv) {
  // Google Benchmark takes its flags out of argv; what is left is this program's.
  benchmark::Initialize(&argc, argv);
  CLI::App app{"CpuBackend::gemm_strided_batched against a loop of gemm() on attention shapes"};
  app.add_option("--threads", g_threads, "CPU backend threads")->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  static const Problem problems[] = {
      {"scores QK^T b64 m128 n128 k32", 64, 128, 128, 32, true, false},
      {"context PV b64 m128 n32 k128", 64, 128, 32, 128, false, true}};
  static const Route routes[] = {{"fp32", DType::fp32, Bf16GemmPath::automatic},
                                 {"bf16 emulated", DType::bf16, Bf16GemmPath::emulated},
                                 {"bf16 onednn", DType::bf16, Bf16GemmPath::onednn}};
  for (const Problem& p : problems)
    for (const Route& r : routes)
      for (bool batched : {false, true}) {
        const std::string name = std::string(p.name) + " / " + r.name +
                                 (batched ? " / batched primitive" : " / loop of gemm()");
        // UseRealTime: the GEMMs run on the backend's OpenMP threads, so the main thread's CPU
        // time (Google Benchmark's default clock, and the one the iteration-invariant FLOP/s
        // rate divides by) is not the call's duration: wall time is.
        benchmark::RegisterBenchmark(name.c_str(), [&p, &r, batched](benchmark::State& s) {
          run(s, p, r, batched);
        })->Unit(benchmark::kMicrosecond)->UseRealTime();
      }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
