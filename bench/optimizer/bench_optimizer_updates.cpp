// bench_optimizer_updates: the CPU backend's fused optimizer updates over the two worked examples'
// parameter lists (optimizer facet):
// - GPT-2 small (124.4 M parameters, AdamW): every matrix with a bf16 working copy, wte and the
//   vectors without one, as the GPT preset's bf16-mixed policy keeps them;
// - ResNet-50 (25.6 M, SGD with momentum 0.9 and weight decay): the convolutions' and the
//   classifier's weights with bf16 working copies, batch norm's vectors without.
// Each update reads g, m (and v), p and writes m (v), p and the working copy: a pass over the
// memory that no cache holds at these sizes. GB/s counts those bytes once.
//
// Usage: bench_optimizer_updates [--threads N] [--reps R] [--models gpt2,resnet50]
// Per model: 2 warm-up calls, then R (5) calls; the fastest in ms (best_call_time.h).
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../support/best_call_time.h"
#include "../support/cpu_arena.h"
#include "cpu_backend.h"
#include "mixtrain/sdk/backend_optimizer_updates.h"

namespace {

using mixtrain::backend_cpu::CpuBackend;
using mixtrain::bench::Arena;
using mixtrain::bench::best_ms;
using mixtrain::sdk::DType;
using mixtrain::sdk::Shape;
namespace sdk = mixtrain::sdk;

struct Param {
  Shape shape;
  bool working;  // a bf16 working copy beside the fp32 master
};

// GPT-2 small: 12 layers, 768 wide, 1024 positions, vocabulary 50,257, tied LM head.
std::vector<Param> gpt2_small() {
  const std::int64_t c = 768, layers = 12;
  std::vector<Param> ps{{{50257, c}, false}, {{1024, c}, false}};
  for (std::int64_t l = 0; l < layers; ++l) {
    for (std::int64_t n : {c, c}) ps.push_back({{n}, false});  // ln_1
    ps.push_back({{3 * c, c}, true});
    ps.push_back({{3 * c}, false});
    ps.push_back({{c, c}, true});
    ps.push_back({{c}, false});
    for (std::int64_t n : {c, c}) ps.push_back({{n}, false});  // ln_2
    ps.push_back({{4 * c, c}, true});
    ps.push_back({{4 * c}, false});
    ps.push_back({{c, 4 * c}, true});
    ps.push_back({{c}, false});
  }
  for (std::int64_t n : {c, c}) ps.push_back({{n}, false});  // ln_f
  return ps;
}

// ResNet-50 (torchvision's v1.5): the stem, 3 + 4 + 6 + 3 Bottlenecks, the classifier.
std::vector<Param> resnet50() {
  std::vector<Param> ps;
  auto conv_bn = [&](std::int64_t out, std::int64_t in, std::int64_t k) {
    ps.push_back({{out, in, k, k}, true});
    ps.push_back({{out}, false});
    ps.push_back({{out}, false});
  };
  conv_bn(64, 3, 7);
  std::int64_t in = 64;
  const std::int64_t blocks[] = {3, 4, 6, 3};
  for (int s = 0; s < 4; ++s) {
    const std::int64_t width = 64 << s, out = width * 4;
    for (std::int64_t b = 0; b < blocks[s]; ++b) {
      conv_bn(width, in, 1);
      conv_bn(width, width, 3);
      conv_bn(out, width, 1);
      if (b == 0) conv_bn(out, in, 1);  // the projection shortcut
      in = out;
    }
  }
  ps.push_back({{1000, 2048}, true});
  ps.push_back({{1000}, false});
  return ps;
}

void run(CpuBackend& be, const std::string& model, int reps) {
  const bool adamw = model == "gpt2";
  const std::vector<Param> list = adamw ? gpt2_small() : resnet50();
  Arena a(be);
  std::vector<sdk::ParamTensors> params;
  std::int64_t numel = 0, working = 0;
  unsigned seed = 1;
  for (const Param& p : list) {
    sdk::ParamTensors t;
    t.master = a.make(DType::fp32, p.shape, seed++, -0.1f, 0.1f);
    t.grad = a.make(DType::fp32, p.shape, seed++, -1e-3f, 1e-3f);
    t.state1 = a.make(DType::fp32, p.shape, seed++, -1e-4f, 1e-4f);
    if (adamw) t.state2 = a.make(DType::fp32, p.shape, seed++, 0.0f, 1e-6f);
    if (p.working) t.working = a.make(DType::bf16, p.shape, seed++);
    numel += p.shape.numel();
    working += p.working ? p.shape.numel() : 0;
    params.push_back(t);
  }
  auto* opt = sdk::facet<sdk::OptimizerFacet>(be);
  double ms = 0.0;
  if (adamw) {
    sdk::AdamWHyper h;
    h.lr = 6e-4f;
    h.weight_decay = 0.1f;
    h.beta2 = 0.95f;
    ms = best_ms(
        [&] {
          opt->adamw_update(h, params);
          ++h.step;
        },
        reps);
  } else {
    sdk::SgdHyper h;
    h.lr = 0.1f;
    h.momentum = 0.9f;
    h.weight_decay = 1e-4f;
    ms = best_ms(
        [&] {
          opt->sgd_update(h, params);
          h.first_step = false;
        },
        reps);
  }
  // g, p, m (, v) read; p, m (, v) written; the working copy written.
  const double bytes = static_cast<double>(numel) * (adamw ? 7 : 5) * 4 + 2.0 * working;
  std::printf("%-9s %-6s %10.2f M %9.2f M %9.2f ms %8.1f GB/s\n", model.c_str(),
              adamw ? "AdamW" : "SGD", numel / 1e6, working / 1e6, ms, bytes / ms / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "the CPU backend's fused optimizer updates on GPT-2 small's and ResNet-50's parameters"};
  int threads = 2, reps = 5;
  std::vector<std::string> models{"gpt2", "resnet50"};
  app.add_option("--threads", threads, "CPU backend threads")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls per model")->check(CLI::Range(1, 100000));
  app.add_option("--models", models, "parameter lists, each run in turn")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpt2", "resnet50"}));
  CLI11_PARSE(app, argc, argv);
  CpuBackend be(threads);
  std::printf("threads %d, best of %d calls\n", threads, reps);
  std::printf("%-9s %-6s %12s %11s %12s %13s\n", "model", "update", "parameters", "bf16 copies",
              "time", "rate");
  for (const std::string& m : models) run(be, m, reps);
  return 0;
}
