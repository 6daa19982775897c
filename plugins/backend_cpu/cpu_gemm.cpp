#include "cpu_gemm.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <optional>

#include "cpu_access.h"
#include "cpu_features.h"
#include "cpu_few_row_gemm.h"
#include "cpu_problem_text.h"
#include "cpu_single_thread.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu {

using dnnl::memory;
using sdk::DType;

namespace {

constexpr const char* kSupportedInputs =
    "A/B in fp32, tf32, bf16, fp16, fp8_e4m3 or fp8_e5m2 (any mix), C in fp32, bf16 or fp16";

// GEMMs of at most this many multiply-adds (128^3) run on one thread: splitting 4 MFLOP over
// threads saves ~50 us at best, and on a loaded machine a descheduled worker stalls the whole
// team at the barrier. The shape alone decides, so a cached primitive always runs with the
// thread count it was created under.
constexpr std::int64_t kSingleThreadGemm = std::int64_t{1} << 21;
// The activation epilogue's block: its three passes (pre-activation rounded, the activation, C
// rounded) run a block at a time, while the block's fp32 z is in cache. Measured on an AMX Xeon
// only (bench/RESULTS.md, session 64: GPT-2 small's c_fc GEMMs about 4 % faster than one pass
// over the whole z); the gradient epilogue's block (cpu_activation_kernels.h) has figures for two
// CPUs.
constexpr std::int64_t kActivationBlock = std::int64_t{1} << 18;

bool is_gemm_input(DType t) {
  return is_storage_float(t) || sdk::is_fp8(t);
}

// The oneDNN type of an operand passed through undecoded (fp32 storage or bf16).
memory::data_type native_dt(DType t) {
  return t == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
}

std::optional<memory::data_type> output_dnnl_type(DType t) {
  switch (t) {
    case DType::fp32:
      return memory::data_type::f32;
    case DType::bf16:
      return memory::data_type::bf16;
    case DType::fp16:
      return memory::data_type::f16;
    default:
      return std::nullopt;
  }
}

// Batches [0, batches) of `v`, batch i starting `stride` elements after batch i-1 (batch 0 at
// v.data), each `numel` elements, decoded exactly (x scale_inv, then tf32-rounded when asked) into
// compact `dst` [batches, numel]; parallel over (batch, chunk) pairs.
void decode_batches(const sdk::TensorView& v, std::int64_t batches, std::int64_t stride,
                    std::int64_t numel, float scale_inv, bool tf32, float* dst) {
  const std::int64_t chunks = (numel + kDecodeChunk - 1) / kDecodeChunk;
#pragma omp parallel for schedule(static) if (parallel_worth(batches * numel))
  for (std::int64_t q = 0; q < batches * chunks; ++q) {
    const std::int64_t i = q / chunks, c0 = q % chunks * kDecodeChunk;
    const std::int64_t len = std::min(kDecodeChunk, numel - c0);
    float* out = dst + i * numel + c0;
    decode_into(v, i * stride + c0, len, out, scale_inv);
    if (tf32) sdk::round_to_tf32(std::span(out, static_cast<std::size_t>(len)));
  }
}

// The inverse for an output: compact fp32 `src` [batches, numel] encoded once (RNE) into batch i
// of `v` at i * stride.
void commit_batches(const sdk::TensorView& v, std::int64_t batches, std::int64_t stride,
                    std::int64_t numel, const float* src) {
  const std::int64_t chunks = (numel + kDecodeChunk - 1) / kDecodeChunk;
#pragma omp parallel for schedule(static) if (parallel_worth(batches * numel))
  for (std::int64_t q = 0; q < batches * chunks; ++q) {
    const std::int64_t i = q / chunks, c0 = q % chunks * kDecodeChunk;
    commit_chunk(v, i * stride + c0, std::min(kDecodeChunk, numel - c0), src + i * numel + c0);
  }
}

// alpha times the fp8 operands' scale_inv, rounded to fp32 once: the accumulator of the
// unscaled codes' exact products is scaled once at the end, as a Tensor Core's FP8 GEMM does
// (decoding code x scale_inv would round each element whose scale_inv is no power of two).
float output_scale(const sdk::GemmArgs& args) {
  double factor = args.alpha;
  for (const auto* op : {&args.a, &args.b})
    if (sdk::is_fp8(op->view.dtype)) factor *= static_cast<double>(op->scale_inv);
  return static_cast<float>(factor);
}

// How alpha enters a primitive. The caller's alone (no fp8 operand): a constant output scale,
// keyed by its value as beta is (a model's alphas are few: LoRA's alpha / r), because oneDNN
// 2.6's brgemm matmul takes no run-time scale and falls back to gemm:jit (GPT-2's LoRA B forward,
// bf16 [1024, 8] · [8, 3072]: 4.6 ms against 0.41 on brgemm, bench/RESULTS.md, session 74).
// With fp8 operands their scale_inv joins it, which delayed scaling changes every step: a
// run-time scale, one primitive for every value.
template <class K>
void set_alpha(K& key, const sdk::GemmArgs& args, float alpha) {
  if (alpha == 1.0f) return;
  if (sdk::is_fp8(args.a.view.dtype) || sdk::is_fp8(args.b.view.dtype))
    key.has_alpha = true;
  else
    key.alpha_bits = std::bit_cast<std::uint32_t>(alpha);
}

}  // namespace

GemmEngine::GemmEngine(Bf16GemmPath bf16_path)
    : bf16_request_(bf16_path), engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}
GemmEngine::~GemmEngine() = default;

const float* GemmEngine::operand_fp32(const sdk::GemmOperand& op, std::int64_t numel, bool tf32,
                                      ScratchBuffer& scratch) {
  const bool fp32 = is_fp32_storage(op.view.dtype);
  if (fp32 && !tf32) return op.view.as<const float>();
  // fp8 codes are decoded unscaled (exact); their scale_inv joins alpha (output_scale).
  float* out = scratch.as<float>(static_cast<std::size_t>(numel));
  // bf16 and fp16 values already fit in tf32's 10 mantissa bits; only fp32 storage is rounded.
  decode_tensor(op.view, 1.0f, tf32 && fp32, out, numel);
  return out;
}

void GemmEngine::check_dtypes(const sdk::GemmArgs& args) const {
  const DType a = args.a.view.dtype;
  const DType b = args.b.view.dtype;
  if (!is_gemm_input(a) || !is_gemm_input(b))
    fail("gemm",
         "input dtypes A=" + std::string(sdk::dtype_name(a)) +
             ", B=" + std::string(sdk::dtype_name(b)) + " are not supported; this backend takes " +
             kSupportedInputs,
         "cast A and B to a floating-point storage dtype (backend.cast)");
  if (!output_dnnl_type(args.c.dtype))
    fail("gemm", "C dtype " + std::string(sdk::dtype_name(args.c.dtype)) + " is not supported",
         "use an fp32, bf16 or fp16 output");
}

bool GemmEngine::reads_bf16_natively(sdk::DType a, sdk::DType b, sdk::DType compute) {
  return a == DType::bf16 && b == DType::bf16 && compute != DType::tf32 && bf16_native();
}

bool GemmEngine::writes_c_directly(sdk::DType a, sdk::DType b, sdk::DType c, sdk::DType compute) {
  return c == DType::fp32 || (c == DType::bf16 && reads_bf16_natively(a, b, compute));
}

GemmEngine::Operands GemmEngine::prepare_operands(const sdk::GemmArgs& args, std::int64_t a_numel,
                                                  std::int64_t b_numel) {
  const DType a = args.a.view.dtype;
  const DType b = args.b.view.dtype;
  if (reads_bf16_natively(a, b, args.compute))
    return {args.a.view.data, args.b.view.data, memory::data_type::bf16, memory::data_type::bf16};
  const bool tf32 = args.compute == DType::tf32 || a == DType::tf32 || b == DType::tf32;
  const float* a32 = operand_fp32(args.a, a_numel, tf32, scratch_a_);
  const float* b32 = operand_fp32(args.b, b_numel, tf32, scratch_b_);
  return {a32, b32, memory::data_type::f32, memory::data_type::f32};
}

GemmEngine::Entry GemmEngine::create_entry(const Key& key) const {
  const memory::data_type c_dt = key.c_dt;
  const memory::dim m = key.m, n = key.n, k = key.k;
  Entry e;
  // op(A) is [m,k]: stored [m,k] row-major, or stored [k,m] and read through swapped strides.
  const memory::dims a_strides = key.trans_a ? memory::dims{1, m} : memory::dims{k, 1};
  const memory::dims b_strides = key.trans_b ? memory::dims{1, k} : memory::dims{n, 1};
  if (key.batch == 0) {
    e.a_md = memory::desc({m, k}, key.a_dt, a_strides);
    e.b_md = memory::desc({k, n}, key.b_dt, b_strides);
    e.c_md = memory::desc({m, n}, c_dt, memory::dims{n, 1});
  } else {
    // The batch is the outer dimension; a stride of 0 is a batch dimension of 1, which oneDNN
    // broadcasts over the output's batches (the stride of a size-1 dimension is not read).
    const memory::dim batch = key.batch;
    auto outer = [batch](std::int64_t stride, std::int64_t numel) {
      return stride == 0 ? std::pair<memory::dim, memory::dim>{1, numel}
                         : std::pair<memory::dim, memory::dim>{batch, stride};
    };
    const auto [ba, sa] = outer(key.stride_a, m * k);
    const auto [bb, sb] = outer(key.stride_b, k * n);
    e.a_md = memory::desc({ba, m, k}, key.a_dt, {sa, a_strides[0], a_strides[1]});
    e.b_md = memory::desc({bb, k, n}, key.b_dt, {sb, b_strides[0], b_strides[1]});
    e.c_md = memory::desc({batch, m, n}, c_dt, memory::dims{key.stride_c, n, 1});
  }
  if (key.has_bias) e.bias_md = memory::desc({1, n}, memory::data_type::f32, memory::dims{n, 1});

  dnnl::primitive_attr attr;
  dnnl::post_ops ops;
  const float constant_alpha = std::bit_cast<float>(key.alpha_bits);
  if (key.has_alpha)
    attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
  else if (constant_alpha != 1.0f)
    attr.set_output_scales(0, {constant_alpha});
  const float beta = std::bit_cast<float>(key.beta_bits);
  if (beta != 0.0f) ops.append_sum(beta);
  // oneDNN's matmul bias is inside the output scale (alpha*(AB + bias)); the contract wants
  // alpha*AB + beta*C + bias, so with alpha != 1 the bias is added after the sum instead.
  const bool bias_in_matmul = key.has_bias && !key.has_alpha && constant_alpha == 1.0f;
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
    e = create_entry(key);
  } catch (const dnnl::error& err) {
    fail("gemm",
         "oneDNN cannot create a matmul for m=" + std::to_string(key.m) +
             " n=" + std::to_string(key.n) + " k=" + std::to_string(key.k) + ": " + err.what(),
         "report this shape; fp32 matmul should always be available");
  }
  return cache_.emplace(key, std::move(e)).first->second;
}

std::vector<std::string> GemmEngine::report() const {
  std::vector<std::string> lines;
  lines.reserve(cache_.size());
  for (const auto& [key, e] : cache_) {
    // A plan made and never run (the capabilities' probe of the fp32 kernel) ran no op.
    if (e.runs == 0 && !e.implementation.empty()) continue;
    std::string line = "m=" + std::to_string(key.m) + " n=" + std::to_string(key.n) +
                       " k=" + std::to_string(key.k) + " A " + dnnl_type_text(key.a_dt) +
                       (key.trans_a ? " (T)" : "") + " B " + dnnl_type_text(key.b_dt) +
                       (key.trans_b ? " (T)" : "");
    if (key.c_dt != memory::data_type::f32) line += std::string(" C ") + dnnl_type_text(key.c_dt);
    if (key.batch > 0) line += ", batch " + std::to_string(key.batch);
    const float beta = std::bit_cast<float>(key.beta_bits);
    if (beta != 0.0f) line += ", beta " + std::to_string(beta);
    if (key.has_bias) line += ", bias";
    if (key.has_alpha) line += ", alpha";  // another primitive than the same GEMM without it
    if (const float a = std::bit_cast<float>(key.alpha_bits); a != 1.0f)
      line += ", alpha " + std::to_string(a);
    line += ": " + (e.implementation.empty() ? std::string("not created") : e.implementation);
    if (e.runs > 0) line += ", " + std::to_string(e.runs) + (e.runs == 1 ? " run" : " runs");
    if (!e.usable) line += " (a reference kernel or refused: run as a loop of 2-D GEMMs)";
    lines.push_back(std::move(line));
  }
  std::sort(lines.begin(), lines.end());  // the map's order is not stable across runs
  return lines;
}

GemmEngine::Entry* GemmEngine::batched_entry_for(const Key& key) {
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    Entry e;
    try {
      e = create_entry(key);
      // A reference kernel is far slower than a loop over the 2-D primitive.
      e.usable = e.implementation.find("ref") == std::string::npos;
    } catch (const dnnl::error&) {
      e.usable = false;  // e.g. strides oneDNN rejects: the caller loops instead
    }
    it = cache_.emplace(key, std::move(e)).first;
  }
  return it->second.usable ? &it->second : nullptr;
}

std::size_t GemmEngine::cached_primitives() const {
  return static_cast<std::size_t>(
      std::count_if(cache_.begin(), cache_.end(), [](const auto& kv) { return kv.second.usable; }));
}

void GemmEngine::execute(Entry& e, const Key& key, const void* a, const void* b, void* c,
                         float alpha, const void* bias) {
  memory a_mem(e.a_md, engine_, const_cast<void*>(a));
  memory b_mem(e.b_md, engine_, const_cast<void*>(b));
  memory c_mem(e.c_md, engine_, c);
  std::unordered_map<int, memory> exec_args{
      {DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}};
  if (key.has_alpha)
    exec_args.emplace(DNNL_ARG_ATTR_OUTPUT_SCALES,
                      memory({{1}, memory::data_type::f32, memory::dims{1}}, engine_, &alpha));
  if (key.has_bias)
    exec_args.emplace(e.bias_arg, memory(e.bias_md, engine_, const_cast<void*>(bias)));
  e.primitive.execute(stream_, exec_args);
  stream_.wait();
  ++e.runs;
  last_implementation_ = e.implementation;
}

bool GemmEngine::few_rows_route(const sdk::GemmArgs& args, std::int64_t m, std::int64_t k,
                                bool epilogue) {
  return m <= kFewGemmRows && k > 0 && args.a.view.dtype == DType::bf16 &&
         args.b.view.dtype == DType::bf16 && args.compute != DType::tf32 && !args.a.transpose &&
         args.b.transpose && args.alpha == 1.0f && args.beta == 0.0f && !args.has_activation &&
         !epilogue && (args.c.dtype == DType::fp32 || args.c.dtype == DType::bf16);
}

void GemmEngine::run(const sdk::GemmArgs& args, const ActivateInPlace& activate) {
  run_product(args, activate, {});
}

void GemmEngine::run_into(const sdk::GemmArgs& args, const EpilogueIntoC& into_c) {
  if (args.has_activation)
    fail("gemm", "run_into was given a forward activation as well as its own epilogue",
         "report this: gemm_gradient passes its GEMM without has_activation");
  run_product(args, {}, into_c);
}

void GemmEngine::run_product(const sdk::GemmArgs& args, const ActivateInPlace& activate,
                             const EpilogueIntoC& into_c) {
  const auto& av = args.a.view;
  const auto& bv = args.b.view;
  const auto [m, n, k] = checks().gemm_shape(args);
  check_dtypes(args);
  const bool has_bias = !args.bias.empty();  // checked (fp32 [n]) by gemm_shape
  if (m == 0 || n == 0) return;
  if (args.has_activation && !activate)
    fail("gemm", "an activation epilogue was asked but this engine has no activation function",
         "report this: CpuBackend::gemm passes its activation_forward");
  if (few_rows_route(args, m, k, bool(into_c))) {
    few_row_gemm_bf16(static_cast<const Bf16Bits*>(av.data), static_cast<const Bf16Bits*>(bv.data),
                      has_bias ? args.bias.as<float>() : nullptr, m, n, k, args.c.data,
                      args.c.dtype == DType::bf16,
                      scratch_a_.as<float>(static_cast<std::size_t>(2 * m * k)));
    last_implementation_ = kFewRowsImplementation;
    return;
  }

  const Operands ops = prepare_operands(args, av.numel(), bv.numel());
  // z is computed in fp32: in C itself when C is fp32, else in scratch, encoded into C once at the
  // end with the SDK's RNE (oneDNN's own down-conversion flushes fp32 subnormals, which would make
  // a second definition of bf16). An activation epilogue then runs in place on that fp32 z. The
  // native bf16 route, whose products already flush subnormals, lets oneDNN write a bf16 C
  // without an epilogue itself (the header's exception): one pass over C fewer.
  const bool native_c = args.c.dtype == DType::bf16 && ops.a_dt == memory::data_type::bf16 &&
                        ops.b_dt == memory::data_type::bf16 && !args.has_activation && !into_c &&
                        k > 0;
  const bool c_via_fp32 = !is_fp32_storage(args.c.dtype) && !native_c;
  const std::int64_t total = m * n;
  void* c_ptr = args.c.data;
  if (c_via_fp32) {
    float* c32 = scratch_c_.as<float>(static_cast<std::size_t>(total));
    if (args.beta != 0.0f) decode_tensor(args.c, 1.0f, false, c32, total);
    c_ptr = c32;
  }

  if (k == 0) {
    last_implementation_.clear();
    // Empty inner product: z = beta*C + bias, which oneDNN does not handle for k = 0.
    float* z = static_cast<float*>(c_ptr);
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < n; ++j) {
        const float base = args.beta == 0.0f ? 0.0f : args.beta * z[r * n + j];
        z[r * n + j] = base + (has_bias ? args.bias.as<float>()[j] : 0.0f);
      }
  } else {
    const SingleThreadScope small_gemm(m * n * k <= kSingleThreadGemm);
    const float alpha = output_scale(args);
    Key key{{m, n, k, args.a.transpose, args.b.transpose}, has_bias, false, ops.a_dt, ops.b_dt,
            std::bit_cast<std::uint32_t>(args.beta)};
    set_alpha(key, args, alpha);
    if (native_c) key.c_dt = memory::data_type::bf16;
    execute(entry_for(key), key, ops.a, ops.b, c_ptr, alpha, args.bias.data);
  }
  if (native_c) return;

  // z is in fp32 at c_ptr (C itself, or scratch).
  float* z = static_cast<float*>(c_ptr);
  if (into_c) {
    into_c(sdk::TensorView{z, DType::fp32, sdk::Shape{m, n}}, args.c);
    return;
  }
  if (args.has_activation) {
    for (std::int64_t b0 = 0; b0 < total; b0 += kActivationBlock) {
      const std::int64_t len = std::min(kActivationBlock, total - b0);
      float* zb = z + b0;
      if (!args.pre_activation.empty())
        encode_tensor(element_range(args.pre_activation, b0, len), zb, len);
      activate(args.activation, sdk::TensorView{zb, DType::fp32, sdk::Shape{len}});
      if (c_via_fp32) encode_tensor(element_range(args.c, b0, len), zb, len);
    }
    return;
  }
  if (c_via_fp32) encode_tensor(args.c, z, total);
}

GemmEngine::BatchedOperand GemmEngine::batched_operand(const sdk::GemmOperand& op,
                                                       std::int64_t batch, std::int64_t stride,
                                                       bool tf32, bool native,
                                                       ScratchBuffer& scratch) {
  if (native) return {op.view.data, native_dt(op.view.dtype), stride};
  const std::int64_t numel = op.view.numel();
  const std::int64_t batches = stride == 0 ? 1 : batch;
  float* out = scratch.as<float>(static_cast<std::size_t>(batches * numel));
  decode_batches(op.view, batches, stride, numel, 1.0f, tf32 && is_fp32_storage(op.view.dtype),
                 out);  // fp8 unscaled: scale_inv joins alpha (output_scale)
  return {out, memory::data_type::f32, stride == 0 ? 0 : numel};
}

bool GemmEngine::run_batched(const sdk::GemmBatchedArgs& args) {
  const sdk::GemmArgs& g = args.gemm;
  const auto shape = checks().gemm_batched_shape(args);
  const std::int64_t m = shape.m, n = shape.n, k = shape.k, batch = args.batch;
  check_dtypes(g);
  if (batch == 0 || m == 0 || n == 0) return true;  // nothing to write
  // batch 1 is run()'s 2-D primitive; k = 0 is run()'s beta*C path.
  if (batch == 1 || k == 0) return false;
  const std::int64_t a_numel = g.a.view.numel(), b_numel = g.b.view.numel();
  // oneDNN descriptors take non-negative strides of non-overlapping batches only.
  auto expressible = [](std::int64_t stride, std::int64_t numel) {
    return stride == 0 || stride >= numel;
  };
  if (!expressible(args.stride_a, a_numel) || !expressible(args.stride_b, b_numel) ||
      args.stride_c < 0)
    return false;

  // The operands as run() would feed them: fp32 (and both-bf16 on the native path) as stored,
  // everything else decoded exactly to fp32.
  const DType at = g.a.view.dtype, bt = g.b.view.dtype;
  const bool tf32 = g.compute == DType::tf32 || at == DType::tf32 || bt == DType::tf32;
  const bool bf16_pair = reads_bf16_natively(at, bt, g.compute);
  const bool a_native = bf16_pair || (is_fp32_storage(at) && !tf32);
  const bool b_native = bf16_pair || (is_fp32_storage(bt) && !tf32);
  const bool c_via_fp32 = !is_fp32_storage(g.c.dtype);
  const std::int64_t c_numel = m * n;
  auto compact = [](std::int64_t stride, std::int64_t numel) { return stride == 0 ? 0 : numel; };

  // gemm()'s rule per batch: batches of at most 128^3 multiply-adds (attention's score and
  // context products) run on one thread, decodes included. The loop this replaces ran each of
  // them on one thread; oneDNN's batched kernel on a 2-thread team measured 5-10x slower than
  // that on a loaded 2-core machine (bench/RESULTS.md, issue 14).
  const SingleThreadScope small_gemm(m * n * k <= kSingleThreadGemm);
  const float alpha = output_scale(g);
  Key key{{m, n, k, g.a.transpose, g.b.transpose},
          false,
          false,
          a_native ? native_dt(at) : memory::data_type::f32,
          b_native ? native_dt(bt) : memory::data_type::f32,
          std::bit_cast<std::uint32_t>(g.beta)};
  set_alpha(key, g, alpha);
  key.batch = batch;
  key.stride_a = a_native ? args.stride_a : compact(args.stride_a, a_numel);
  key.stride_b = b_native ? args.stride_b : compact(args.stride_b, b_numel);
  key.stride_c = c_via_fp32 ? c_numel : args.stride_c;
  Entry* e = batched_entry_for(key);
  if (e == nullptr) return false;

  const BatchedOperand a = batched_operand(g.a, batch, args.stride_a, tf32, a_native, scratch_a_);
  const BatchedOperand b = batched_operand(g.b, batch, args.stride_b, tf32, b_native, scratch_b_);
  void* c_ptr = g.c.data;
  if (c_via_fp32) {
    float* c32 = scratch_c_.as<float>(static_cast<std::size_t>(batch * c_numel));
    if (g.beta != 0.0f) decode_batches(g.c, batch, args.stride_c, c_numel, 1.0f, false, c32);
    c_ptr = c32;
  }
  execute(*e, key, a.data, b.data, c_ptr, alpha, nullptr);
  if (c_via_fp32)
    commit_batches(g.c, batch, args.stride_c, c_numel, static_cast<const float*>(c_ptr));
  return true;
}

std::string GemmEngine::fp32_implementation() {
  Key key{};  // no bias, alpha 1, beta 0
  key.m = key.n = key.k = 512;
  key.a_dt = key.b_dt = memory::data_type::f32;
  return entry_for(key).implementation;
}

std::string GemmEngine::bf16_implementation() {
  if (bf16_state_ < 0) bf16_native();
  return bf16_impl_;
}

std::string GemmEngine::bf16_note() {
  if (bf16_state_ < 0) bf16_native();
  return bf16_note_;
}

bool GemmEngine::bf16_native() {
  if (bf16_state_ >= 0) return bf16_state_ == 1;
  // What oneDNN would run for a bf16 matmul here; a creation failure means it has none.
  Key key{};  // no bias, alpha 1, beta 0
  key.m = key.n = key.k = 512;
  key.a_dt = key.b_dt = memory::data_type::bf16;
  try {
    bf16_impl_ = create_entry(key).implementation;
  } catch (const dnnl::error&) {
    bf16_impl_.clear();
  }
  const bool usable = !bf16_impl_.empty() && bf16_impl_.find("ref") == std::string::npos;
  bool native = false;
  switch (bf16_request_) {
    case Bf16GemmPath::emulated:
      bf16_note_ = "bf16_gemm = emulated";
      break;
    case Bf16GemmPath::onednn:
      native = !bf16_impl_.empty();
      bf16_note_ = native ? "bf16_gemm = onednn" : "oneDNN has no bf16 matmul on this CPU";
      break;
    case Bf16GemmPath::automatic: {
      const CpuInfo cpu = detect_cpu();
      const bool amx = cpu.has("amx_bf16");
      native = usable && onednn_bf16_preferred(cpu);
      if (bf16_impl_.empty())
        bf16_note_ = "oneDNN has no bf16 matmul on this CPU";
      else if (!usable)
        bf16_note_ = "oneDNN's bf16 matmul here is a reference kernel (" + bf16_impl_ + ")";
      else if (!native)
        bf16_note_ = "no AMX: oneDNN's " + bf16_impl_ + " measured slower than emulation on " +
                     (cpu.vendor.empty() ? std::string("this CPU") : cpu.vendor) +
                     " CPUs; bf16_gemm = \"onednn\" forces it";
      else
        bf16_note_ = amx ? "AMX-BF16" : "AVX512-BF16 (" + cpu.vendor + ")";
      break;
    }
  }
  bf16_state_ = native ? 1 : 0;
  return native;
}

}  // namespace mixtrain::backend_cpu
