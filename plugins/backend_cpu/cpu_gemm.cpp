#include "cpu_gemm.h"

#include <bit>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <algorithm>
#include <new>
#include <optional>

#include "cpu_access.h"
#include "cpu_numerics.h"

namespace mixtrain::backend_cpu {

using dnnl::memory;
using sdk::DType;

void ScratchBuffer::Free::operator()(void* p) const noexcept { std::free(p); }

void* ScratchBuffer::get(std::size_t bytes) {
  if (bytes > capacity_) {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr)
      fail("gemm", "cannot allocate " + std::to_string(rounded) + " bytes of scratch",
           "reduce the GEMM size or free memory");
    data_.reset(p);
    capacity_ = rounded;
  }
  return data_.get();
}

namespace {

constexpr const char* kSupportedInputs =
    "fp32 (native, oneDNN matmul) and tf32 (emulated: RNE to 10 mantissa bits + fp32 GEMM)";

// Rows of a [.., cols] view with leading dims folded; unlike Shape::rows() it stays right when
// cols is 0 (an empty inner dimension).
std::int64_t folded_rows(const sdk::Shape& s) {
  std::int64_t r = 1;
  for (int i = 0; i + 1 < s.rank; ++i) r *= s[i];
  return r;
}

std::optional<memory::data_type> output_dnnl_type(DType t) {
  switch (t) {
    case DType::fp32: return memory::data_type::f32;
    case DType::bf16: return memory::data_type::bf16;
    case DType::fp16: return memory::data_type::f16;
    default: return std::nullopt;
  }
}

void round_to_tf32_into(const float* src, float* dst, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) dst[i] = round_to_tf32(src[i]);
}

}  // namespace

std::size_t GemmEngine::KeyHash::operator()(const Key& key) const noexcept {
  std::size_t h = std::hash<std::int64_t>{}(key.m);
  auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(std::hash<std::int64_t>{}(key.n));
  mix(std::hash<std::int64_t>{}(key.k));
  mix((key.trans_a ? 1u : 0u) | (key.trans_b ? 2u : 0u) | (key.has_bias ? 4u : 0u) |
      (key.has_alpha ? 8u : 0u));
  mix(static_cast<std::size_t>(key.a_dt) * 131 + static_cast<std::size_t>(key.b_dt) * 17 +
      static_cast<std::size_t>(key.c_dt));
  mix(key.beta_bits);
  return h;
}

GemmEngine::GemmEngine() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}
GemmEngine::~GemmEngine() = default;

GemmEngine::Operands GemmEngine::prepare_operands(const sdk::GemmArgs& args,
                                                  std::int64_t a_numel, std::int64_t b_numel) {
  const DType a = args.a.view.dtype;
  const DType b = args.b.view.dtype;
  const bool fp32_inputs = is_fp32_storage(a) && is_fp32_storage(b);
  if (!fp32_inputs) {
    fail("gemm",
         "input dtypes A=" + std::string(sdk::dtype_name(a)) +
             ", B=" + std::string(sdk::dtype_name(b)) + " are not supported; this backend runs " +
             kSupportedInputs,
         "cast A and B to fp32 (backend.cast) or pick a precision policy whose GEMM inputs are "
         "fp32/tf32; bf16, fp16 and fp8 GEMM inputs arrive in a later backend_cpu version");
  }
  const bool tf32 = args.compute == DType::tf32 || a == DType::tf32 || b == DType::tf32;
  if (!tf32)
    return {args.a.view.data, args.b.view.data, memory::data_type::f32, memory::data_type::f32};
  float* a_rounded = scratch_a_.as<float>(static_cast<std::size_t>(a_numel));
  float* b_rounded = scratch_b_.as<float>(static_cast<std::size_t>(b_numel));
  round_to_tf32_into(static_cast<const float*>(args.a.view.data), a_rounded, a_numel);
  round_to_tf32_into(static_cast<const float*>(args.b.view.data), b_rounded, b_numel);
  return {a_rounded, b_rounded, memory::data_type::f32, memory::data_type::f32};
}

GemmEngine::Entry GemmEngine::create_entry(const Key& key, memory::data_type c_dt) const {
  const memory::dim m = key.m, n = key.n, k = key.k;
  Entry e;
  // op(A) is [m,k]: stored [m,k] row-major, or stored [k,m] and read through swapped strides.
  e.a_md = memory::desc({m, k}, key.a_dt, key.trans_a ? memory::dims{1, m} : memory::dims{k, 1});
  e.b_md = memory::desc({k, n}, key.b_dt, key.trans_b ? memory::dims{1, k} : memory::dims{n, 1});
  e.c_md = memory::desc({m, n}, c_dt, memory::dims{n, 1});
  if (key.has_bias) e.bias_md = memory::desc({1, n}, memory::data_type::f32, memory::dims{n, 1});

  dnnl::primitive_attr attr;
  dnnl::post_ops ops;
  if (key.has_alpha) attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
  const float beta = std::bit_cast<float>(key.beta_bits);
  if (beta != 0.0f) ops.append_sum(beta);
  // oneDNN's matmul bias is inside the output scale (alpha*(AB + bias)); the contract wants
  // alpha*AB + beta*C + bias, so with alpha != 1 the bias is added after the sum instead.
  const bool bias_in_matmul = key.has_bias && !key.has_alpha;
  if (key.has_bias && !bias_in_matmul) {
    e.bias_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(ops.len()) | DNNL_ARG_SRC_1;
    ops.append_binary(dnnl::algorithm::binary_add, e.bias_md);
  }
  attr.set_post_ops(ops);
  const auto desc = bias_in_matmul ? dnnl::matmul::desc(e.a_md, e.b_md, e.bias_md, e.c_md)
                                   : dnnl::matmul::desc(e.a_md, e.b_md, e.c_md);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
  e.implementation = pd.impl_info_str();
  e.primitive = dnnl::matmul(pd);
  return e;
}

GemmEngine::Entry& GemmEngine::entry_for(const Key& key) {
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  Entry e;
  try {
    e = create_entry(key, key.c_dt);
  } catch (const dnnl::error& err) {
    if (key.c_dt == memory::data_type::f32)
      fail("gemm",
           "oneDNN cannot create a matmul for m=" + std::to_string(key.m) + " n=" +
               std::to_string(key.n) + " k=" + std::to_string(key.k) + ": " + err.what(),
           "report this shape; fp32 matmul should always be available");
    // This oneDNN build cannot write C in a 16-bit type from these inputs: go through fp32.
    e = create_entry(key, memory::data_type::f32);
    e.c_via_fp32 = true;
  }
  return cache_.emplace(key, std::move(e)).first->second;
}

void GemmEngine::run(const sdk::GemmArgs& args) {
  const auto& av = args.a.view;
  const auto& bv = args.b.view;
  require_present("gemm", "A", av);
  require_present("gemm", "B", bv);
  require_present("gemm", "C", args.c);
  const std::int64_t m = args.a.transpose ? av.shape.cols() : folded_rows(av.shape);
  const std::int64_t k = args.a.transpose ? folded_rows(av.shape) : av.shape.cols();
  const std::int64_t kb = args.b.transpose ? bv.shape.cols() : folded_rows(bv.shape);
  const std::int64_t n = args.b.transpose ? folded_rows(bv.shape) : bv.shape.cols();
  if (k != kb)
    fail("gemm",
         "inner dimensions differ: op(A) is [" + std::to_string(m) + ", " + std::to_string(k) +
             "] (A " + describe(av) + (args.a.transpose ? ", transposed" : "") + ") but op(B) is [" +
             std::to_string(kb) + ", " + std::to_string(n) + "] (B " + describe(bv) +
             (args.b.transpose ? ", transposed" : "") + ")",
         "check the transpose flags and the operand order");
  if (args.c.shape.cols() != n || args.c.numel() != m * n)
    fail("gemm",
         "C is " + describe(args.c) + " but op(A)*op(B) is [" + std::to_string(m) + ", " +
             std::to_string(n) + "]",
         "allocate C with shape [m, n]");
  const auto c_dt = output_dnnl_type(args.c.dtype);
  if (!c_dt)
    fail("gemm", "C dtype " + std::string(sdk::dtype_name(args.c.dtype)) + " is not supported",
         "use an fp32, bf16 or fp16 output");
  const bool has_bias = !args.bias.empty();
  if (has_bias) {
    require_fp32("gemm", "bias", args.bias);
    require_numel("gemm", "bias", args.bias, n);
  }
  if (m == 0 || n == 0) return;

  const Operands ops = prepare_operands(args, av.numel(), bv.numel());
  if (k == 0) {
    // Empty inner product: C = beta*C + bias, which oneDNN does not handle for k = 0.
    float row_buf[kChunk];
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const std::int64_t len = std::min(kChunk, n - c0);
        const float* old = read_chunk(args.c, r * n + c0, len, row_buf);
        float* out = write_target(args.c, r * n + c0, row_buf);
        for (std::int64_t j = 0; j < len; ++j) {
          const float base = args.beta == 0.0f ? 0.0f : args.beta * old[j];
          out[j] = base + (has_bias ? args.bias.as<float>()[c0 + j] : 0.0f);
        }
        commit_chunk(args.c, r * n + c0, len, out);
      }
    return;
  }

  const Key key{m,
                n,
                k,
                args.a.transpose,
                args.b.transpose,
                has_bias,
                args.alpha != 1.0f,
                ops.a_dt,
                ops.b_dt,
                *c_dt,
                std::bit_cast<std::uint32_t>(args.beta)};
  Entry& e = entry_for(key);

  void* c_ptr = args.c.data;
  if (e.c_via_fp32) {
    float* c32 = scratch_c_.as<float>(static_cast<std::size_t>(m * n));
    if (args.beta != 0.0f) {
      const std::int64_t total = m * n;
#pragma omp parallel for schedule(static)
      for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
        const std::int64_t len = std::min(kChunk, total - c0);
        const float* src = read_chunk(args.c, c0, len, c32 + c0);
        (void)src;  // read_chunk wrote into c32 + c0 (non-fp32 C)
      }
    }
    c_ptr = c32;
  }

  memory a_mem(e.a_md, engine_, const_cast<void*>(ops.a));
  memory b_mem(e.b_md, engine_, const_cast<void*>(ops.b));
  memory c_mem(e.c_md, engine_, c_ptr);
  std::unordered_map<int, memory> exec_args{
      {DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
  float alpha = args.alpha;
  if (key.has_alpha)
    exec_args.emplace(DNNL_ARG_ATTR_OUTPUT_SCALES,
                      memory({{1}, memory::data_type::f32, memory::dims{1}}, engine_, &alpha));
  if (has_bias) exec_args.emplace(e.bias_arg, memory(e.bias_md, engine_, args.bias.data));
  e.primitive.execute(stream_, exec_args);
  stream_.wait();

  if (e.c_via_fp32) {
    const float* c32 = static_cast<const float*>(c_ptr);
    const std::int64_t total = m * n;
#pragma omp parallel for schedule(static)
    for (std::int64_t c0 = 0; c0 < total; c0 += kChunk)
      commit_chunk(args.c, c0, std::min(kChunk, total - c0), c32 + c0);
  }
}

std::string GemmEngine::fp32_implementation() {
  const Key key{512, 512, 512, false, false, false, false, memory::data_type::f32,
                memory::data_type::f32, memory::data_type::f32, 0u};
  return entry_for(key).implementation;
}

}  // namespace mixtrain::backend_cpu
