#include "cpu_tile_matmul.h"

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "cpu_gemm.h"  // ScratchBuffer
#include "cpu_single_thread.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu {

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

struct Plan {
  dnnl::memory::desc a, b, c, scratchpad;
  dnnl::matmul primitive;
  std::string implementation;
};

// (m, n, k, transposes) in one word: each size below 2^20 (checked by the caller).
std::uint64_t plan_key(std::int64_t m, std::int64_t n, std::int64_t k, bool at, bool bt) {
  return (static_cast<std::uint64_t>(m) << 42) | (static_cast<std::uint64_t>(n) << 22) |
         (static_cast<std::uint64_t>(k) << 2) | (at ? 2u : 0u) | (bt ? 1u : 0u);
}

Plan make_plan(std::int64_t m, std::int64_t n, std::int64_t k, bool at, bool bt) {
  Plan p;
  p.a = dnnl::memory::desc({m, k}, dt::bf16, at ? tag::ba : tag::ab);
  p.b = dnnl::memory::desc({k, n}, dt::bf16, bt ? tag::ba : tag::ab);
  p.c = dnnl::memory::desc({m, n}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // Planned for one thread, wherever it is first asked for (the callers' teams, or available()'s
  // probe on the host thread), so it never starts a team of its own and sums in one order.
  const SingleThreadScope one_thread;
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.a, p.b, p.c), attr, cpu_engine());
  p.scratchpad = pd.scratchpad_desc();
  p.implementation = pd.impl_info_str();
  p.primitive = dnnl::matmul(pd);
  return p;
}

// Sizes plan_key can hold: 1 to 2^20 - 1 each.
void check_sizes(std::int64_t m, std::int64_t n, std::int64_t k) {
  constexpr std::int64_t kLimit = std::int64_t{1} << 20;
  if (m < 1 || n < 1 || k < 1 || m >= kLimit || n >= kLimit || k >= kLimit)
    throw sdk::BackendError("backend_cpu: a bf16 tile product of " + std::to_string(m) + " x " +
                                std::to_string(k) + " by " + std::to_string(k) + " x " +
                                std::to_string(n),
                            "tiles are 1 to 2^20 - 1 in each dimension");
}

const Plan& plan_for(std::int64_t m, std::int64_t n, std::int64_t k, bool at, bool bt) {
  check_sizes(m, n, k);
  static std::mutex mutex;
  static std::unordered_map<std::uint64_t, std::unique_ptr<Plan>> plans;
  const std::uint64_t key = plan_key(m, n, k, at, bt);
  std::lock_guard lock(mutex);
  auto it = plans.find(key);
  if (it == plans.end()) {
    try {
      it = plans.emplace(key, std::make_unique<Plan>(make_plan(m, n, k, at, bt))).first;
    } catch (const dnnl::error& e) {
      throw sdk::BackendError(
          std::string("backend_cpu: oneDNN refused a bf16 tile product: ") + e.what(),
          "report this: the tile shapes are valid by construction");
    }
  }
  return *it->second;  // plans are never erased: the reference stays valid after the lock
}

}  // namespace

// A plan's memory objects on one thread, made once: creating four dnnl::memory objects per call
// cost 1.5 µs, more than a 64 x 64 x 64 product (1.0 µs); a call sets their data handles.
// The thread finds them by the plan's key without taking the cache's lock.
struct Bound {
  const Plan* plan;
  dnnl::memory a, b, c, scratchpad;
  std::array<dnnl_exec_arg_t, 4> args{};
};

struct Bf16TileScratch::State {
  dnnl::stream stream{cpu_engine()};
  ScratchBuffer scratchpad;
  std::unordered_map<std::uint64_t, Bound> bound;
};

Bf16TileScratch::Bf16TileScratch() : state_(std::make_unique<State>()) {}
Bf16TileScratch::~Bf16TileScratch() = default;

void Bf16TileMatmul::run(std::int64_t m, std::int64_t n, std::int64_t k, const Bf16Bits* a,
                         bool a_transposed, const Bf16Bits* b, bool b_transposed, float* c,
                         Bf16TileScratch& scratch) {
  check_sizes(m, n, k);
  Bf16TileScratch::State& s = *scratch.state_;
  const std::uint64_t key = plan_key(m, n, k, a_transposed, b_transposed);
  auto it = s.bound.find(key);
  dnnl_status_t status = dnnl_success;
  try {
    if (it == s.bound.end()) {
      const Plan& p = plan_for(m, n, k, a_transposed, b_transposed);
      Bound fresh{&p, dnnl::memory(p.a, cpu_engine(), DNNL_MEMORY_NONE),
                  dnnl::memory(p.b, cpu_engine(), DNNL_MEMORY_NONE),
                  dnnl::memory(p.c, cpu_engine(), DNNL_MEMORY_NONE),
                  dnnl::memory(p.scratchpad, cpu_engine(), DNNL_MEMORY_NONE)};
      fresh.args = {dnnl_exec_arg_t{DNNL_ARG_SRC, fresh.a.get()},
                    dnnl_exec_arg_t{DNNL_ARG_WEIGHTS, fresh.b.get()},
                    dnnl_exec_arg_t{DNNL_ARG_DST, fresh.c.get()},
                    dnnl_exec_arg_t{DNNL_ARG_SCRATCHPAD, fresh.scratchpad.get()}};
      it = s.bound.emplace(key, std::move(fresh)).first;
    }
    Bound& bound = it->second;
    const Plan& p = *bound.plan;
    // oneDNN reads A and B only; its handles are non-const.
    bound.a.set_data_handle(const_cast<Bf16Bits*>(a));
    bound.b.set_data_handle(const_cast<Bf16Bits*>(b));
    bound.c.set_data_handle(c);
    bound.scratchpad.set_data_handle(s.scratchpad.get(p.scratchpad.get_size()));
    status = dnnl_primitive_execute(p.primitive.get(), s.stream.get(),
                                    static_cast<int>(bound.args.size()), bound.args.data());
  } catch (const dnnl::error& e) {
    throw sdk::BackendError(std::string("backend_cpu: a bf16 tile product failed: ") + e.what(),
                            "report this: the tile shapes are valid by construction");
  }
  if (status != dnnl_success)
    throw sdk::BackendError("backend_cpu: oneDNN's bf16 tile product returned status " +
                                std::to_string(static_cast<int>(status)),
                            "report this: the tile shapes are valid by construction");
}

bool Bf16TileMatmul::available() {
  static const bool offered = [] {
    try {
      plan_for(64, 64, 64, false, true);
      return true;
    } catch (const sdk::BackendError&) {
      return false;
    }
  }();
  return offered;
}

std::string Bf16TileMatmul::implementation(std::int64_t m, std::int64_t n, std::int64_t k,
                                           bool a_transposed, bool b_transposed) {
  return plan_for(m, n, k, a_transposed, b_transposed).implementation;
}

}  // namespace mixtrain::backend_cpu
