// The convolution's host-side rules (contract in the header).
#include "cuda_conv_rules.h"

#include <algorithm>
#include <cstdint>
#include <functional>

#include "mixtrain/sdk/support/backend_argument_checks.h"

namespace mixtrain::backend_cuda::conv {

using sdk::DType;

const char* op_text(ConvOp op) {
  switch (op) {
    case ConvOp::forward:
      return "fprop";
    case ConvOp::backward_data:
      return "dgrad";
    case ConvOp::backward_weights:
      return "wgrad";
  }
  return "?";
}

const char* data_type_text(DataType t) {
  switch (t) {
    case DataType::f32:
      return "f32";
    case DataType::f16:
      return "f16";
    case DataType::bf16:
      return "bf16";
  }
  return "?";
}

const char* layout_text(FilterLayout l) {
  return l == FilterLayout::kcrs ? "KCRS" : "KRSC";
}

TensorDims image_dims(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return {{n, c, h, w}, {h * w * c, 1, w * c, c}};
}

TensorDims filter_dims(const sdk::Conv2dGeometry& g, FilterLayout layout) {
  const std::int64_t k = g.out_channels, c = g.in_channels / g.groups;
  const std::int64_t r = g.kernel_h, s = g.kernel_w;
  if (layout == FilterLayout::kcrs) return {{k, c, r, s}, {c * r * s, r * s, s, 1}};
  return {{k, c, r, s}, {r * s * c, 1, s * c, c}};
}

ConvParams conv_params(const sdk::Conv2dGeometry& g) {
  // PyTorch's padding is symmetric; the floor in OH/OW means the post padding may be partly
  // unused, which cuDNN computes the same way (its output dims are given, and must agree).
  return {{g.pad_h, g.pad_w},
          {g.pad_h, g.pad_w},
          {g.stride_h, g.stride_w},
          {g.dilation_h, g.dilation_w}};
}

std::string wgrad_fallback_hint(ConvOp op, const Route& route, bool fallback_heuristics,
                                bool sixteen_bit_dw_on) {
  if (op != ConvOp::backward_weights || !fallback_heuristics || sixteen_bit_dw_on ||
      route.io == DataType::f32 || route.out != DataType::f32)
    return "";
  return "backend.cuda: a convolution's weight gradient from " +
         std::string(route.io == DataType::bf16 ? "bf16" : "fp16") +
         " operands into an FP32 dw runs on an engine of cuDNN's fallback heuristics, which has "
         "no fast engine for it (ResNet-50 on an H200 spent 31 of 67 ms a step there); "
         "backend.cuda.conv_wgrad_in_operand_dtype = true takes dw from cuDNN in the operands' "
         "dtype, rounded once as PyTorch AMP's is, on its fast engines";
}

std::string route_text(const Route& r) {
  std::string s = std::string("io ") + data_type_text(r.io);
  if (r.decode_a || r.decode_b)
    s += std::string(" (decoded:") + (r.decode_a ? " a" : "") + (r.decode_b ? " b" : "") + ")";
  s += std::string(", out ") + data_type_text(r.out) + (r.out_direct ? " direct" : " via scratch");
  if (r.accumulate) s += r.out_direct ? " (beta 1)" : " + add";
  s += r.tensor_cores ? ", tensor cores" : ", no tf32";
  return s;
}

namespace {

bool sixteen(DType t) {
  return t == DType::bf16 || t == DType::fp16;
}
DataType data_type_of16(DType t) {
  return t == DType::bf16 ? DataType::bf16 : DataType::f16;
}

// Where the output goes for a route reading `io`.
void place_output(Route& r, ConvOp op, DType out, bool extra, FilterLayout layout) {
  if (op == ConvOp::backward_weights) {
    r.out = DataType::f32;
    r.out_direct = layout == FilterLayout::kcrs && !extra;
    return;
  }
  const bool bias = op == ConvOp::forward && extra;
  if (op == ConvOp::backward_data && extra) {
    r.accumulate = true;
    if (sdk::is_fp32_storage(out)) {
      // dx fp32 += the gradient: cuDNN adds into dx itself (beta = 1); conv_routes adds the
      // scratch placement after it.
      r.out = DataType::f32;
      r.out_direct = true;
    } else {
      // A 16-bit sum: the gradient into scratch of the operands' dtype, then one add that rounds
      // the sum once into dx.
      r.out = r.io;
      r.out_direct = false;
    }
    return;
  }
  if (sdk::is_fp32_storage(out)) {
    // fp32 y: cuDNN writes it; a bias is then added in place (one fp32 rounding of acc + b, as
    // the CPU's primitive does).
    r.out = DataType::f32;
    r.out_direct = true;
  } else if (r.io == data_type_of16(out) && !bias) {
    r.out = r.io;  // cuDNN rounds its FP32 result once into the 16-bit y
    r.out_direct = true;
  } else {
    r.out = DataType::f32;  // FP32 scratch, then + bias and one rounding into y
    r.out_direct = false;
  }
}

}  // namespace

std::vector<Route> conv_routes(ConvOp op, DType a, DType b, DType out, DType compute, bool extra,
                               FilterLayout layout, bool wgrad_in_operand_dtype) {
  const bool tf32 = compute == DType::tf32 || a == DType::tf32 || b == DType::tf32;
  std::vector<Route> routes;
  auto add = [&](Route r) {
    place_output(r, op, out, extra, layout);
    routes.push_back(r);
    if (r.accumulate && r.out_direct) {
      // Where no engine takes beta = 1: the gradient into scratch, then one add into dx. 16-bit
      // operands write their own dtype there, the plan and the bits of the overwriting dgrad that
      // the host's axpy used to add (never more bytes than that path); fp32 ones write fp32.
      r.out_direct = false;
      if (r.io != DataType::f32) r.out = r.io;
      routes.push_back(r);
    }
  };
  if (sdk::is_fp32_storage(a) && sdk::is_fp32_storage(b)) {
    add({DataType::f32, false, false, DataType::f32, true, tf32});
  } else if (sixteen(a) && a == b) {
    if (op == ConvOp::backward_weights && wgrad_in_operand_dtype) {
      // dw in the operands' dtype (cuDNN's FP32 sum rounded once), decoded and moved into the
      // fp32 dw by the finish.
      routes.push_back({data_type_of16(a), false, false, data_type_of16(a), false, true});
    }
    add({data_type_of16(a), false, false, DataType::f32, true, true});
    // Exact fp32 decode: TF32 holds every bf16/fp16 value, so Tensor Cores stay exact.
    add({DataType::f32, true, true, DataType::f32, true, true});
  } else {
    // Mixed operands: the 16-bit ones decoded; TF32 only when asked or when no operand is real
    // fp32 data.
    add({DataType::f32, sixteen(a), sixteen(b), DataType::f32, true,
         tf32 || (sixteen(a) && sixteen(b))});
  }
  return routes;
}

std::int64_t common_alignment(std::initializer_list<const void*> pointers) {
  std::int64_t a = 16;
  for (const void* p : pointers) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    while (a > 1 && address % static_cast<std::uintptr_t>(a) != 0) a /= 2;
  }
  return a;
}

PlanKey plan_key(ConvOp op, const sdk::Conv2dGeometry& g, const Route& route, FilterLayout layout,
                 std::int64_t alignment) {
  PlanKey k;
  k.op = op;
  k.n = g.batch;
  k.c = g.in_channels;
  k.h = g.height;
  k.w = g.width;
  k.k = g.out_channels;
  k.r = g.kernel_h;
  k.s = g.kernel_w;
  k.stride_h = g.stride_h;
  k.stride_w = g.stride_w;
  k.pad_h = g.pad_h;
  k.pad_w = g.pad_w;
  k.dil_h = g.dilation_h;
  k.dil_w = g.dilation_w;
  k.groups = g.groups;
  k.io = route.io;
  k.out = route.out;
  k.layout = layout;
  k.tensor_cores = route.tensor_cores;
  k.alignment = alignment;
  k.beta_one = route.accumulate && route.out_direct;
  return k;
}

std::size_t PlanKeyHash::operator()(const PlanKey& k) const noexcept {
  std::size_t h = 0;
  auto mix = [&h](std::int64_t v) {
    h ^= std::hash<std::int64_t>{}(v) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  };
  for (std::int64_t v : {static_cast<std::int64_t>(k.op),
                         k.n,
                         k.c,
                         k.h,
                         k.w,
                         k.k,
                         k.r,
                         k.s,
                         k.stride_h,
                         k.stride_w,
                         k.pad_h,
                         k.pad_w,
                         k.dil_h,
                         k.dil_w,
                         k.groups,
                         static_cast<std::int64_t>(k.io),
                         static_cast<std::int64_t>(k.out),
                         static_cast<std::int64_t>(k.layout),
                         static_cast<std::int64_t>(k.tensor_cores),
                         k.alignment,
                         static_cast<std::int64_t>(k.beta_one)})
    mix(v);
  return h;
}

std::string key_text(const PlanKey& k) {
  auto i = [](std::int64_t v) { return std::to_string(v); };
  return std::string(op_text(k.op)) + " n" + i(k.n) + " c" + i(k.c) + " " + i(k.h) + "x" + i(k.w) +
         " k" + i(k.k) + " " + i(k.r) + "x" + i(k.s) + " stride " + i(k.stride_h) + "x" +
         i(k.stride_w) + " pad " + i(k.pad_h) + "x" + i(k.pad_w) + " dilation " + i(k.dil_h) + "x" +
         i(k.dil_w) + " groups " + i(k.groups) + ", io " + data_type_text(k.io) + ", out " +
         data_type_text(k.out) + ", filter " + layout_text(k.layout) +
         (k.tensor_cores ? ", tensor cores" : ", no tf32") + ", align " + i(k.alignment) +
         (k.beta_one ? ", beta 1" : "");
}

bool AutotuneCandidates::wants(const SearchPass& pass, const std::string& engine,
                               bool runtime_compiled) const {
  if (full()) return false;
  if (runtime_compiled && !engines_.empty()) return false;
  if (deterministic_first_ && deterministic_found_ && !pass.deterministic) return false;
  return std::find(engines_.begin(), engines_.end(), engine) == engines_.end();
}

void AutotuneCandidates::take(const SearchPass& pass, const std::string& engine) {
  if (!wants(pass, engine)) return;
  engines_.push_back(engine);
  deterministic_found_ = deterministic_found_ || pass.deterministic;
}

bool pointwise_dgrad_accumulates_as_gemm(const sdk::Conv2dGeometry& g, sdk::DType dy,
                                         sdk::DType w) {
  const bool pointwise = g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 &&
                         g.pad_h == 0 && g.pad_w == 0 && g.dilation_h == 1 && g.dilation_w == 1 &&
                         g.groups == 1;
  return pointwise && dy == w && sixteen(dy);
}

std::vector<SearchPass> search_passes(bool deterministic_first, bool adds_into_output) {
  std::vector<SearchPass> passes =
      deterministic_first ? std::vector<SearchPass>{{false, true, false},
                                                    {true, true, false},
                                                    {false, false, true},
                                                    {true, false, true}}
                          : std::vector<SearchPass>{{false, false, false}, {true, false, false}};
  if (adds_into_output)
    std::erase_if(passes, [](const SearchPass& p) { return p.fallback_heuristics; });
  return passes;
}

std::string engine_refusal(std::span<const int> notes, const NumericsPolicy& policy) {
  for (int n : notes) {
    switch (static_cast<NumericalNote>(n)) {
      case NumericalNote::down_convert_inputs:
        return "DOWN_CONVERT_INPUTS: converts the inputs to a narrower type";
      case NumericalNote::reduced_precision_reduction:
        return "REDUCED_PRECISION_REDUCTION: accumulates below FP32";
      case NumericalNote::tensor_core:
        if (policy.fp32_data && !policy.tensor_cores)
          return "TENSOR_CORE on fp32 data: TF32 is not allowed (compute fp32)";
        break;
      case NumericalNote::nondeterministic:
        if (policy.deterministic) return "NONDETERMINISTIC: deterministic engines are preferred";
        break;
      default:
        break;
    }
  }
  return {};
}

namespace {

std::size_t round256(std::size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

std::size_t data_type_bytes(DataType t) {
  return t == DataType::f32 ? 4 : 2;
}

RouteScratch route_scratch(const Route& route, std::size_t workspace, std::int64_t a_numel,
                           std::int64_t b_numel, std::int64_t out_numel, bool filter_copy,
                           bool out_direct) {
  const auto bytes = [](std::int64_t numel, std::size_t each) {
    return static_cast<std::size_t>(numel) * each;
  };
  RouteScratch need;
  need.workspace = workspace;
  need.a = route.decode_a ? bytes(a_numel, 4) : 0;
  need.b = filter_copy      ? bytes(b_numel, data_type_bytes(route.io))
           : route.decode_b ? bytes(b_numel, 4)
                            : 0;
  need.out = out_direct ? 0 : bytes(out_numel, data_type_bytes(route.out));
  return need;
}

std::size_t RouteScratch::caller_bytes() const {
  const std::size_t parts = round256(workspace) + round256(a) + round256(b) + round256(out);
  return parts == 0 ? 0 : parts + 255;
}

RouteScratch::Places RouteScratch::place_in(void* base) const {
  auto* at = reinterpret_cast<std::byte*>(round256(reinterpret_cast<std::uintptr_t>(base)));
  const auto take = [&](std::size_t bytes) -> void* {
    if (bytes == 0) return nullptr;
    void* p = at;
    at += round256(bytes);
    return p;
  };
  Places p;
  p.workspace = take(workspace);
  p.a = take(a);
  p.b = take(b);
  p.out = take(out);
  return p;
}

}  // namespace mixtrain::backend_cuda::conv
