// bench_gemm_cuda_sweep: why a 16-bit GEMM of the CUDA backend trails PyTorch, answered in one
// GPU run. For bf16 and fp16 at the bench's square shape and the wide MLP's three GEMMs of one
// hidden layer, it times the backend's own GemmEngine (the code CudaBackend::gemm runs, same
// descriptors, routes and epilogues) as it is and with one knob changed at a time, plus
// cublasGemmEx, which is what PyTorch's `a @ b.t()` calls by default:
//   backend          GemmEngine as CudaBackend builds it (32 MiB workspace, heuristic result 0)
//   ws 4 / 64 MiB    the workspace limit the heuristic sees and the matmul gets
//   heuristic #i     the i-th of the heuristic's first N results (#0 is the backend's)
//   autotune N       GemmTuning::autotune_candidates: the fastest of N, timed at the first call
//   no epilogue      (forward only) the same GEMM without bias and ReLU: the epilogue's cost
//   cublasGemmEx     cuBLAS's legacy API, CUBLAS_COMPUTE_32F, 32 MiB workspace, no epilogue
// Cases (row-major, as the backend's callers pass them; S = --size, B = --batch, H = --hidden):
//   square   C[S,S] = A[S,S]·B[S,S]ᵀ, C in the input dtype (bench_gemm_cuda's problem)
//   fwd      y[B,H] = relu(x[B,H]·W[H,H]ᵀ + b), y in the input dtype, b fp32 (LinearLayer forward
//            fused with the ReLU after it)
//   dgrad    dx[B,H] = dy[B,H]·W[H,H], dx in the input dtype
//   wgrad    dW[H,H] = dy[B,H]ᵀ·x[B,H], dW fp32, beta 0 (the weight gradient's first write)
// Timing: CUDA events around a batch of back-to-back calls (each batch ~--batch-ms), rotating
// between operand sets that together exceed twice the L2 cache, so no call finds its inputs
// there; uniform(-1, 1) operands (zeros would flatter the power-limited clocks). The variants of
// one case are interleaved: each round times one batch of every variant, so a clock that drifts
// over the run (heat, power) touches all of them alike; the median over --rounds rounds is
// reported, and the fastest. Every variant's C is compared at 256 entries with the backend's
// (max |diff| / rms): another algorithm may round differently, never by more than ~1e-2.
// Without a usable GPU it prints one line "no CUDA device: <CUDA's reason>" and exits 2.
//
// Usage: bench_gemm_cuda_sweep [--only bf16,fp16] [--cases square,fwd,dgrad,wgrad] [--size S]
//          [--batch B] [--hidden H] [--candidates N] [--rounds R] [--batch-ms T] [--device D]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_access.h"
#include "cuda_cast_fill.h"
#include "cuda_gemm.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace {

namespace be = mixtrain::backend_cuda;
using mixtrain::sdk::DType;
using mixtrain::sdk::Shape;
using mixtrain::sdk::TensorView;

struct Failure : std::exception {
  std::string text;
  explicit Failure(std::string t) : text(std::move(t)) {}
  const char* what() const noexcept override { return text.c_str(); }
};

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Failure(std::string(what) + ": " + be::cuda_error_text(status));
}
void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Failure(std::string(what) + ": " + cublasGetStatusName(status) + ": " +
                  cublasGetStatusString(status));
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { check(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct Case {
  std::string name;
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  bool c_fp32;  // else C in the input dtype
  bool bias_relu;
};

// Uniform(-1, 1) values on the device, long enough that tiling them over an operand does not
// repeat rows: the period (a prime) is no multiple of any row length used here.
class RandomPool {
 public:
  explicit RandomPool(cudaStream_t stream) : stream_(stream), buf_(2 * kPeriod * sizeof(float)) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> host(2 * kPeriod);
    for (float& x : host) x = dist(rng);
    check(cudaMemcpy(buf_.p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
          "upload of the random pool");
  }
  // Fills n elements of dtype t at dst, starting at a seed-dependent place in the pool.
  void fill(void* dst, DType t, std::int64_t n, std::uint32_t seed) const {
    const auto* src = static_cast<const float*>(buf_.p);
    const std::size_t elem = mixtrain::sdk::dtype_size(t);
    for (std::int64_t done = 0, chunk = 0; done < n; ++chunk) {
      const std::int64_t count = std::min<std::int64_t>(kPeriod, n - done);
      const std::int64_t offset = (seed * 104729LL + chunk * 7919LL) % kPeriod;
      check(be::kernels::cast(src + offset, be::kernels::Elem::f32,
                              static_cast<char*>(dst) + static_cast<std::size_t>(done) * elem,
                              be::elem_of(t), false, count, 1.0f, false, nullptr, stream_),
            "random fill (cast kernel)");
      done += count;
    }
  }

 private:
  static constexpr std::int64_t kPeriod = 4194301;  // prime, ~4 M
  cudaStream_t stream_;
  DeviceBuffer buf_;
};

struct OperandSet {
  std::unique_ptr<DeviceBuffer> a, b, c;
};

struct Variant {
  std::string name;
  bool plain = false;  // no bias/ReLU: compared with the plain backend, not the fused one
  std::unique_ptr<be::GemmEngine> engine;  // null for cublasGemmEx
  std::function<void(int set)> launch;
  std::string algo, note;
  bool skip = false;
  std::vector<double> ms;  // per call, one entry per round
  double err = -1.0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::string ran_plan(const be::GemmEngine& engine, std::string* problem) {
  for (const auto& info : engine.plan_infos())
    if (info.runs > 0) {
      if (problem != nullptr) *problem = info.problem;
      return "#" + std::to_string(info.candidate) + "/" + std::to_string(info.candidates) + " " +
             info.algo + " ws=" + std::to_string(info.workspace >> 10) + "K";
    }
  return "no plan ran";
}

struct Options {
  std::vector<DType> dtypes{DType::bf16, DType::fp16};
  std::vector<std::string> cases{"square", "fwd", "dgrad", "wgrad"};
  std::int64_t size = 8192, batch = 16384, hidden = 8192;
  int candidates = 8, rounds = 5, device = 0;
  double batch_ms = 25.0;
};

class Sweep {
 public:
  Sweep(const Options& opt, int sm, std::size_t l2_bytes, cudaStream_t stream)
      : opt_(opt), sm_(sm), l2_(l2_bytes), stream_(stream), pool_(stream) {
    check(cublasCreate(&cublas_), "cublasCreate");
    cublas_ws_ = std::make_unique<DeviceBuffer>(kPyTorchWorkspace);
    check(cublasSetStream(cublas_, stream_), "cublasSetStream");
    check(cublasSetWorkspace(cublas_, cublas_ws_->p, kPyTorchWorkspace), "cublasSetWorkspace");
  }
  ~Sweep() { cublasDestroy(cublas_); }
  Sweep(const Sweep&) = delete;
  Sweep& operator=(const Sweep&) = delete;

  // Returns the number of wrong results.
  int run_case(const Case& cs, DType dt) {
    const std::size_t in = mixtrain::sdk::dtype_size(dt);
    const DType c_dt = cs.c_fp32 ? DType::fp32 : dt;
    const Shape a_shape = cs.trans_a ? Shape{cs.k, cs.m} : Shape{cs.m, cs.k};
    const Shape b_shape = cs.trans_b ? Shape{cs.n, cs.k} : Shape{cs.k, cs.n};
    const std::size_t a_bytes = static_cast<std::size_t>(cs.m * cs.k) * in;
    const std::size_t b_bytes = static_cast<std::size_t>(cs.k * cs.n) * in;
    const std::size_t c_bytes =
        static_cast<std::size_t>(cs.m * cs.n) * mixtrain::sdk::dtype_size(c_dt);
    const std::size_t set_bytes = a_bytes + b_bytes + c_bytes;
    const int sets =
        static_cast<int>(std::clamp<std::size_t>((2 * l2_ + set_bytes - 1) / set_bytes, 2, 8));
    std::vector<OperandSet> ops(static_cast<std::size_t>(sets));
    for (int s = 0; s < sets; ++s) {
      auto& o = ops[static_cast<std::size_t>(s)];
      o.a = std::make_unique<DeviceBuffer>(a_bytes);
      o.b = std::make_unique<DeviceBuffer>(b_bytes);
      o.c = std::make_unique<DeviceBuffer>(c_bytes);
      pool_.fill(o.a->p, dt, cs.m * cs.k, 2u * static_cast<std::uint32_t>(s) + 1u);
      pool_.fill(o.b->p, dt, cs.k * cs.n, 2u * static_cast<std::uint32_t>(s) + 2u);
    }
    DeviceBuffer bias(static_cast<std::size_t>(cs.n) * sizeof(float));
    pool_.fill(bias.p, DType::fp32, cs.n, 99u);
    check(cudaStreamSynchronize(stream_), "operand fill");

    auto args_for = [&](int s, bool epilogue) {
      const auto& o = ops[static_cast<std::size_t>(s)];
      mixtrain::sdk::GemmArgs g;
      g.a = {TensorView{o.a->p, dt, a_shape}, cs.trans_a};
      g.b = {TensorView{o.b->p, dt, b_shape}, cs.trans_b};
      g.c = TensorView{o.c->p, c_dt, Shape{cs.m, cs.n}};
      g.compute = dt;
      if (epilogue && cs.bias_relu) {
        g.bias = TensorView{bias.p, DType::fp32, Shape{cs.n}};
        g.has_activation = true;
        g.activation = mixtrain::sdk::Activation::relu;
      }
      return g;
    };

    std::vector<Variant> vs;
    auto add_engine = [&](std::string name, be::GemmTuning tuning, bool epilogue) {
      Variant v;
      v.name = std::move(name);
      v.plain = !(epilogue && cs.bias_relu);
      v.engine = std::make_unique<be::GemmEngine>(sm_, stream_, false, tuning);
      be::GemmEngine* e = v.engine.get();
      v.launch = [e, args_for, epilogue](int s) { e->run(args_for(s, epilogue)); };
      vs.push_back(std::move(v));
    };
    add_engine("backend", {}, true);
    add_engine("ws 4 MiB", {std::size_t{4} << 20, 0, 0}, true);
    add_engine("ws 64 MiB", {std::size_t{64} << 20, 0, 0}, true);
    for (int i = 1; i < opt_.candidates; ++i)
      add_engine("heuristic #" + std::to_string(i), {std::size_t{32} << 20, i, 0}, true);
    add_engine("autotune " + std::to_string(opt_.candidates),
               {std::size_t{32} << 20, 0, opt_.candidates}, true);
    if (cs.bias_relu) add_engine("backend, no epilogue", {}, false);
    {
      // cuBLAS is column-major: C^T = op(B)^T op(A)^T, exactly as GemmEngine maps it.
      Variant v;
      v.name = cs.bias_relu ? "cublasGemmEx, no epilogue" : "cublasGemmEx (PyTorch's path)";
      v.plain = true;
      v.algo = "CUBLAS_GEMM_DEFAULT_TENSOR_OP, ws 32M";
      const cudaDataType_t t = dt == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
      const cudaDataType_t ct = cs.c_fp32 ? CUDA_R_32F : t;
      const cublasOperation_t op_a = cs.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t op_b = cs.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      const std::int64_t lda = b_shape.cols(), ldb = a_shape.cols(), m = cs.m, n = cs.n, k = cs.k;
      cublasHandle_t h = cublas_;
      const OperandSet* o = ops.data();
      v.launch = [=](int s) {
        const float alpha = 1.0f, beta = 0.0f;
        const OperandSet& x = o[s];
        check(cublasGemmEx(h, op_a, op_b, static_cast<int>(n), static_cast<int>(m),
                           static_cast<int>(k), &alpha, x.b->p, t, static_cast<int>(lda), x.a->p, t,
                           static_cast<int>(ldb), &beta, x.c->p, ct, static_cast<int>(n),
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP),
              "cublasGemmEx");
      };
      vs.push_back(std::move(v));
    }

    // Warm-up (plans, autotuning, kernel loading), then each variant's result at the probes.
    std::mt19937 rng(7);
    std::vector<std::int64_t> probes(256);
    for (auto& p : probes)
      p = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(cs.m * cs.n));
    std::vector<double> ref_fused, ref_plain;
    std::string backend_problem, plain_problem;
    int wrong = 0;
    for (Variant& v : vs) {
      try {
        v.launch(0);
        v.launch(1);
        check(cudaStreamSynchronize(stream_), "warm-up");
      } catch (const std::exception& e) {
        v.skip = true;
        v.note = std::string("FAILED: ") + e.what();
        continue;
      }
      if (v.engine) {
        std::string problem;
        v.algo = ran_plan(*v.engine, &problem);
        std::string& want = v.plain ? plain_problem : backend_problem;
        if (want.empty()) want = problem;
        if (problem !=
            want) {  // a heuristic offering fewer results sends the GEMM down another route
          v.skip = true;
          v.note = "n/a: ran another route (" + problem + ")";
          continue;
        }
      }
      const std::vector<double> got = read_probes(ops[0].c->p, c_dt, probes);
      std::vector<double>& ref = v.plain ? ref_plain : ref_fused;
      if (ref.empty()) ref = got;
      v.err = relative_error(got, ref);
      if (!(v.err <= 0.02)) {
        v.note = "WRONG RESULT";
        ++wrong;
      }
    }

    // Calls per batch from the backend's speed.
    int per_batch = 2;
    {
      cudaEvent_t e0, e1;
      check(cudaEventCreate(&e0), "cudaEventCreate");
      check(cudaEventCreate(&e1), "cudaEventCreate");
      check(cudaEventRecord(e0, stream_), "cudaEventRecord");
      for (int i = 0; i < 3; ++i) vs[0].launch(i % sets);
      check(cudaEventRecord(e1, stream_), "cudaEventRecord");
      check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      per_batch = std::clamp(static_cast<int>(opt_.batch_ms / std::max(ms / 3.0f, 1e-3f)), 2, 500);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    int next = 0;
    for (int r = 0; r < opt_.rounds; ++r)
      for (Variant& v : vs) {
        if (v.skip) continue;
        check(cudaEventRecord(start, stream_), "cudaEventRecord");
        for (int i = 0; i < per_batch; ++i) v.launch(next++ % sets);
        check(cudaEventRecord(stop, stream_), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0.0f;
        check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        v.ms.push_back(static_cast<double>(ms) / per_batch);
      }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);

    const double flop =
        2.0 * static_cast<double>(cs.m) * static_cast<double>(cs.n) * static_cast<double>(cs.k);
    const double base = vs[0].skip ? 0.0 : median(vs[0].ms);
    const std::string dname(mixtrain::sdk::dtype_name(dt));
    std::printf(
        "\n### %s %s: m=%lld n=%lld k=%lld, A%s B%s, C %s%s; %d calls per batch, %d operand "
        "sets\n\n",
        cs.name.c_str(), dname.c_str(), static_cast<long long>(cs.m), static_cast<long long>(cs.n),
        static_cast<long long>(cs.k), cs.trans_a ? "ᵀ" : "", cs.trans_b ? "ᵀ" : "",
        std::string(mixtrain::sdk::dtype_name(c_dt)).c_str(),
        cs.bias_relu ? ", + fp32 bias, ReLU" : "", per_batch, sets);
    std::printf(
        "| case | dtype | variant | algorithm (heuristic #/offered, cublasLt.h ids) | ms median | "
        "TFLOP/s median | TFLOP/s best | vs backend | err vs backend |\n");
    std::printf("|---|---|---|---|---:|---:|---:|---:|---:|\n");
    const Variant* fastest = nullptr;
    for (const Variant& v : vs) {
      if (v.skip) {
        std::printf("| %s | %s | %s | %s | | | | | %s |\n", cs.name.c_str(), dname.c_str(),
                    v.name.c_str(), v.algo.c_str(), v.note.c_str());
        continue;
      }
      const double med = median(v.ms), best = *std::min_element(v.ms.begin(), v.ms.end());
      std::printf("| %s | %s | %s | %s | %.3f | %.1f | %.1f | %.3fx | %.1e%s%s |\n",
                  cs.name.c_str(), dname.c_str(), v.name.c_str(), v.algo.c_str(), med,
                  flop / (med * 1e-3) * 1e-12, flop / (best * 1e-3) * 1e-12,
                  base > 0 ? base / med : 0.0, v.err, v.note.empty() ? "" : " ", v.note.c_str());
      if (!v.plain || !cs.bias_relu)
        if (fastest == nullptr || med < median(fastest->ms)) fastest = &v;
    }
    if (fastest != nullptr && base > 0)
      std::printf("\nfastest like-for-like: %s %s: %s, %.3fx the backend\n", cs.name.c_str(),
                  dname.c_str(), fastest->name.c_str(), base / median(fastest->ms));
    std::fflush(stdout);
    return wrong;
  }

 private:
  static constexpr std::size_t kPyTorchWorkspace = std::size_t{32} << 20;

  std::vector<double> read_probes(const void* c, DType t, const std::vector<std::int64_t>& probes) {
    const std::size_t elem = mixtrain::sdk::dtype_size(t);
    std::vector<double> out;
    for (std::int64_t p : probes) {
      std::uint32_t bits = 0;
      check(cudaMemcpy(&bits, static_cast<const char*>(c) + static_cast<std::size_t>(p) * elem,
                       elem, cudaMemcpyDeviceToHost),
            "probe read-back");
      float v = 0.0f;
      if (t == DType::fp32)
        std::memcpy(&v, &bits, sizeof v);
      else if (t == DType::bf16)
        v = mixtrain::sdk::decode_bf16(static_cast<std::uint16_t>(bits));
      else
        v = mixtrain::sdk::decode_fp16(static_cast<std::uint16_t>(bits));
      out.push_back(v);
    }
    return out;
  }
  static double relative_error(const std::vector<double>& got, const std::vector<double>& ref) {
    double sq = 0.0, worst = 0.0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      sq += ref[i] * ref[i];
      worst = std::max(worst, std::isfinite(got[i]) ? std::fabs(got[i] - ref[i]) : INFINITY);
    }
    const double rms = std::sqrt(sq / static_cast<double>(ref.size()));
    return rms > 0 ? worst / rms : worst;
  }

  const Options& opt_;
  int sm_;
  std::size_t l2_;
  cudaStream_t stream_;
  RandomPool pool_;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<DeviceBuffer> cublas_ws_;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"the CUDA backend's GemmEngine with one knob changed at a time"};
  std::vector<std::string> only{"bf16", "fp16"};
  app.add_option("--only", only, "input dtypes")
      ->delimiter(',')
      ->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--cases", opt.cases, "a subset of square,fwd,dgrad,wgrad")
      ->delimiter(',')
      ->check(CLI::IsMember({"square", "fwd", "dgrad", "wgrad"}));
  const auto extent = CLI::Range(std::int64_t{1}, std::int64_t{1} << 20);
  app.add_option("--size", opt.size, "the square case's m = n = k")->check(extent);
  app.add_option("--batch", opt.batch, "the layer cases' rows")->check(extent);
  app.add_option("--hidden", opt.hidden, "the layer cases' width")->check(extent);
  app.add_option("--candidates", opt.candidates, "cuBLASLt heuristic algorithms timed")
      ->check(CLI::Range(1, 64));
  app.add_option("--rounds", opt.rounds, "interleaved rounds")->check(CLI::Range(1, 10000));
  app.add_option("--batch-ms", opt.batch_ms, "milliseconds a timed batch of calls")
      ->check(CLI::Range(0.001, 60000.0));
  app.add_option("--device", opt.device, "CUDA device")->check(CLI::Range(0, 64));
  CLI11_PARSE(app, argc, argv);
  opt.dtypes.clear();
  for (const std::string& d : only) opt.dtypes.push_back(d == "bf16" ? DType::bf16 : DType::fp16);

  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count <= opt.device) {
    std::printf(
        "no CUDA device: %s\n",
        status != cudaSuccess
            ? be::cuda_error_text(status).c_str()
            : ("device " + std::to_string(opt.device) + " of " + std::to_string(count)).c_str());
    return 2;
  }
  int wrong = 0;
  try {
    check(cudaSetDevice(opt.device), "cudaSetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, opt.device), "cudaGetDeviceProperties");
    const int sm = prop.major * 10 + prop.minor;
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    std::printf("device: %s, sm_%d, %d SMs, L2 %d MiB; cuBLASLt %zu, cuBLAS via the same library\n",
                prop.name, sm, prop.multiProcessorCount, prop.l2CacheSize >> 20,
                cublasLtGetVersion());
    std::printf(
        "each row: CUDA events around batches of back-to-back calls, rotating operand sets; median "
        "(and fastest) of %d interleaved rounds; TFLOP/s = 2mnk / time per call\n",
        opt.rounds);
    const std::int64_t S = opt.size, B = opt.batch, H = opt.hidden;
    std::vector<Case> cases;
    for (const std::string& c : opt.cases) {
      if (c == "square") cases.push_back({"square", S, S, S, false, true, false, false});
      if (c == "fwd") cases.push_back({"fwd", B, H, H, false, true, false, true});
      if (c == "dgrad") cases.push_back({"dgrad", B, H, H, false, false, false, false});
      if (c == "wgrad") cases.push_back({"wgrad", H, H, B, true, false, true, false});
    }
    {
      Sweep sweep(opt, sm, static_cast<std::size_t>(prop.l2CacheSize), stream);
      for (DType dt : opt.dtypes)
        for (const Case& cs : cases) wrong += sweep.run_case(cs, dt);
    }
    cudaStreamDestroy(stream);
  } catch (const std::exception& e) {
    std::printf("bench_gemm_cuda_sweep: %s\n", e.what());
    return 1;
  }
  if (wrong > 0)
    std::printf("\n%d variant(s) computed a wrong result (see WRONG RESULT above)\n", wrong);
  return wrong == 0 ? 0 : 1;
}
