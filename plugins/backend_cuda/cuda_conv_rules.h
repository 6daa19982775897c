// The convolution's host-side rules, plain C++ without a CUDA or cuDNN header so the host tests
// check them without a GPU: the cuDNN tensor dims and strides of a geometry, the routes a call
// may take (which dtypes cuDNN reads and writes, what runs before and after it), the plan-cache
// key, and which engines the numerics policy accepts from their numerical notes.
//
// Contract
// - Tensors are described to cuDNN as it wants them: dims in NCHW order ([N, C, H, W] for images,
//   [K, C/g, R, S] for filters), the memory layout in the strides. Our channels-last activations
//   are NHWC strides; PyTorch's [O, C/g, KH, KW] weights are KCRS strides as stored, or KRSC
//   strides for the channels-last copy the backend makes of them (cuda_conv_kernels.h). Groups
//   are implied by the filter's C/g against the image's C, as cuDNN infers them.
// - Numerics policy (engine_allowed): FP32 accumulation always (no engine that down-converts
//   inputs or reduces in reduced precision); an engine that uses Tensor Cores on fp32 data
//   (TF32) only where TF32 is allowed: compute = tf32 or a tf32 view, or fp32 data that are
//   decoded 16-bit values, which TF32 holds exactly; never silently for fp32 compute on fp32 data.
//   Deterministic engines are preferred: a plan is built from non-deterministic ones only when
//   no deterministic engine configuration finalizes (the plan report says so).
// - Routes (conv_routes): in preference order. Operands of one 16-bit dtype go to cuDNN as they
//   are (Tensor Cores, FP32 accumulation), falling back to their exact fp32 decode; fp32 operands
//   as stored; mixed operands decoded to fp32. cuDNN writes the output itself where it can (same
//   dtype, no bias to add before a rounding, not accumulating), else FP32 scratch that one kernel
//   finishes (bias added, rounded once into the output's dtype, accumulated, or moved back from
//   the channels-last filter layout). The accumulating data gradient into an fp32 dx (dx +=
//   ...) offers two placements per operand route: cuDNN adding into dx itself (beta = 1, the
//   gradient unrounded), then its output into scratch and one add: in the operands' 16-bit dtype
//   for 16-bit operands (the overwriting dgrad's plan, its one rounding, and no more bytes than the
//   host's axpy path), fp32 for fp32 ones. Into a 16-bit sum (dx of dy's dtype) only the second:
//   scratch of the operands' dtype and one add that rounds the sum once. A pointwise one on 16-bit
//   operands is a GEMM instead (pointwise_dgrad_accumulates_as_gemm). The weight gradient is
//   written in FP32 unless the backend was told to take it in the 16-bit operands' dtype
//   (conv_routes' wgrad_in_operand_dtype).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cuda::conv {

enum class ConvOp : int { forward = 0, backward_data = 1, backward_weights = 2 };
const char* op_text(ConvOp op);

// Data types cuDNN reads or writes here; the values are cudnnDataType_t's (checked where
// cudnn_graph.h is included).
enum class DataType : int { f32 = 0, f16 = 2, bf16 = 9 };
const char* data_type_text(DataType t);

// The filter's memory layout as cuDNN reads or writes it.
enum class FilterLayout : int {
  kcrs = 0,  // PyTorch's [O, C/g, KH, KW] as stored
  krsc = 1,  // channels-last copy [O, KH, KW, C/g]
};
const char* layout_text(FilterLayout l);

struct TensorDims {
  std::array<std::int64_t, 4> dims{}, strides{};
  bool operator==(const TensorDims&) const = default;
};
// Image [n, c, h, w] dims with NHWC strides.
TensorDims image_dims(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w);
TensorDims filter_dims(const sdk::Conv2dGeometry& g, FilterLayout layout);

// The convolution descriptor's arrays (spatial dims 2: h, w).
struct ConvParams {
  std::array<std::int64_t, 2> pre_padding{}, post_padding{}, stride{}, dilation{};
};
ConvParams conv_params(const sdk::Conv2dGeometry& g);

// How one call runs.
struct Route {
  DataType io = DataType::f32;   // the operands as cuDNN reads them
  bool decode_a = false;         // first operand (x; dy for backward data) decoded to fp32 first
  bool decode_b = false;         // second operand (w; dy for backward weights) likewise
  DataType out = DataType::f32;  // the output tensor cuDNN writes
  bool out_direct = true;  // cuDNN writes the caller's output; else scratch of `out` + a kernel
  bool tensor_cores = false;     // engines with the TENSOR_CORE note allowed
  // The output's old value is added (the accumulating dgrad): by cuDNN (beta = 1) when
  // out_direct, else by the finish.
  bool accumulate = false;
  bool operator==(const Route&) const = default;
};
std::string route_text(const Route& r);
// What the backend says once (info) when a weight gradient from 16-bit operands into an FP32 dw
// ran on an engine of cuDNN's fallback heuristics, the 16-bit dw route being off: cuDNN 9 has no
// heuristics-mode-A engine for it, and its fallback took 31 of ResNet-50's 67 ms a step on an
// H200 (session 57). "" when nothing is due: another op or route, a mode-A engine, or the option
// already on.
std::string wgrad_fallback_hint(ConvOp op, const Route& route, bool fallback_heuristics,
                                bool sixteen_bit_dw_on);
// Candidate routes for `op` on operands a, b (forward: x, w; backward data: dy, w; backward
// weights: x, dy) with output dtype `out` (fp32 for backward weights). `extra`: a bias to add
// (forward) or accumulate (backward data, into dx: an fp32 sum or a 16-bit one of dy's dtype;
// backward weights). The filter layout
// decides for backward weights whether cuDNN can write dw itself (only in KCRS).
// `wgrad_in_operand_dtype` (the backend option conv_wgrad_in_operand_dtype): for backward weights
// on operands of one 16-bit dtype, a route first on which cuDNN writes dw in that dtype (into
// scratch: its FP32 sum rounded once, as PyTorch AMP's 16-bit dw is) and the finish decodes it
// into the fp32 dw, for the engines cuDNN has for a 16-bit output; the FP32-output routes follow.
std::vector<Route> conv_routes(ConvOp op, sdk::DType a, sdk::DType b, sdk::DType out,
                               sdk::DType compute, bool extra, FilterLayout layout,
                               bool wgrad_in_operand_dtype = false);

// The accumulating data gradient of a pointwise convolution (1x1 kernel, stride 1, no padding or
// dilation, one group) on operands of one 16-bit dtype is one GEMM: dx [N·H·W, C] += dy [N·H·W,
// K] · w [K, C], which cuBLASLt runs with beta = 1 into the sum (FP32 accumulation, the gradient
// unrounded, as cuDNN's beta = 1 would add it; a 16-bit sum is rounded once, after the add).
// cuDNN 9.19 has no mode A engine for that op (its fallback engine overwrote dx, and the route
// after it costs a 16-bit scratch and an add: 2.1 ms of ResNet-50's step on an H200,
// bench/RESULTS.md, session 57). True when that GEMM applies.
bool pointwise_dgrad_accumulates_as_gemm(const sdk::Conv2dGeometry& g, sdk::DType dy, sdk::DType w);

// The scratch one route of a call takes (cuda_convolution_facet.cpp): cuDNN's workspace (every
// autotuning candidate's until the key's first run has timed them), the first operand decoded,
// the second decoded or the channels-last weights, the output cuDNN writes before its finish (in
// route.out's dtype: FP32, or the 16-bit io of a 16-bit dw or sum). In a caller's workspace
// (convolution facet 1.2) each part starts at a 256-byte boundary, the first rounded up from the
// workspace's start (hence 255 bytes of slack), in that order, apart.
struct RouteScratch {
  std::size_t workspace = 0, a = 0, b = 0, out = 0;
  // The bytes a caller's workspace must hold for all of it; 0 when the route takes none.
  std::size_t caller_bytes() const;
  struct Places {
    void *workspace = nullptr, *a = nullptr, *b = nullptr, *out = nullptr;
  };
  // Where each part lies in a caller's workspace at `base` of at least caller_bytes().
  Places place_in(void* base) const;
};
// Bytes an element of `t` takes.
std::size_t data_type_bytes(DataType t);
// What `route` takes, given cuDNN's workspace bytes, the operands' and the output's element
// counts, whether the weights go through a channels-last copy (in the io dtype) and whether cuDNN
// writes the caller's output itself (out_direct: the route's, or a 1×1 or depthwise dw in KRSC):
// a decoded operand is FP32, the output's scratch is route.out's dtype. The query and the call
// both size from it, so a caller's workspace holds what the call places there.
RouteScratch route_scratch(const Route& route, std::size_t workspace, std::int64_t a_numel,
                           std::int64_t b_numel, std::int64_t out_numel, bool filter_copy,
                           bool out_direct);

// The plan cache's key: everything a cuDNN execution plan depends on.
struct PlanKey {
  ConvOp op = ConvOp::forward;
  std::int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0;
  std::int64_t stride_h = 0, stride_w = 0, pad_h = 0, pad_w = 0, dil_h = 0, dil_w = 0, groups = 0;
  DataType io = DataType::f32, out = DataType::f32;
  FilterLayout layout = FilterLayout::kcrs;
  bool tensor_cores = false;
  std::int64_t alignment = 16;  // bytes every data pointer is aligned to (a power of two <= 16)
  bool beta_one = false;        // the operation adds into its output (a direct accumulating route)
  bool operator==(const PlanKey&) const = default;
};
PlanKey plan_key(ConvOp op, const sdk::Conv2dGeometry& g, const Route& route, FilterLayout layout,
                 std::int64_t alignment);
// The largest power of two <= 16 dividing every address (what a plan may assume).
std::int64_t common_alignment(std::initializer_list<const void*> pointers);
struct PlanKeyHash {
  std::size_t operator()(const PlanKey& k) const noexcept;
};
std::string key_text(const PlanKey& k);

// cuDNN's numerical notes (cudnnBackendNumericalNote_t values).
enum class NumericalNote : int {
  tensor_core = 0,
  down_convert_inputs = 1,
  reduced_precision_reduction = 2,
  fft = 3,
  nondeterministic = 4,
  winograd = 5,
};
struct NumericsPolicy {
  bool tensor_cores = false;  // TF32 on fp32 data (16-bit data always use Tensor Cores)
  bool fp32_data = true;      // the data cuDNN reads are fp32
  bool deterministic = true;  // refuse NONDETERMINISTIC engines
};
// The plan search's passes, in order. deterministic_first (the backend option
// deterministic_convolutions, the default): every deterministic pass (heuristics mode A, then the
// fallback heuristics) before any that accepts a NONDETERMINISTIC engine, so a deterministic
// engine of the fallback list wins over a non-deterministic one of mode A; those later passes
// retry only the engines the deterministic ones refused for their determinism. Otherwise mode A's
// list in its own order, whatever the determinism (cuDNN's fastest guess, as PyTorch's default
// takes), then the fallback list likewise. adds_into_output (a plan key's beta_one: the
// accumulating data gradient's direct route): mode A's passes alone. On an H200 with cuDNN 9.19
// the fallback list's engine for a 1x1 dgrad of bf16/fp16 operands into an fp32 dx (engine 78)
// overwrote dx instead of adding into it (bench/RESULTS.md, session 57); without a plan, the
// route after it writes the gradient into scratch and adds it.
struct SearchPass {
  bool fallback_heuristics = false;  // CUDNN_HEUR_MODE_FALLBACK (else CUDNN_HEUR_MODE_A)
  bool deterministic = true;         // NumericsPolicy::deterministic of the pass
  bool retry_only = false;  // only engines a deterministic pass refused as non-deterministic
};
std::vector<SearchPass> search_passes(bool deterministic_first = true,
                                      bool adds_into_output = false);
// Autotuning's candidates (the backend option conv_autotune = N >= 2): the engine
// configurations a plan search accepts, in its order, up to N, each engine once. With
// deterministic_first, once a deterministic pass has given a candidate, the non-deterministic
// passes give none: autotuning never trades determinism for speed (deterministic_convolutions =
// false lets them all compete). An engine cuDNN compiles at run time (its behavior note
// RUNTIME_COMPILATION) joins only as the first candidate, which the search would take anyway:
// compiling more of them could cost seconds per shape, more than a choice at one shape's first
// run can win back. wants() is asked for each configuration a pass accepts (its engine's text,
// "engine 12 (TENSOR_CORE)") before it is finalized, take() once it finalized; full() ends the
// search.
class AutotuneCandidates {
 public:
  AutotuneCandidates(int wanted, bool deterministic_first)
      : wanted_(wanted < 1 ? 1 : wanted), deterministic_first_(deterministic_first) {}
  bool wants(const SearchPass& pass, const std::string& engine,
             bool runtime_compiled = false) const;
  void take(const SearchPass& pass, const std::string& engine);
  bool full() const { return static_cast<int>(engines_.size()) >= wanted_; }
  std::size_t size() const { return engines_.size(); }

 private:
  int wanted_;
  bool deterministic_first_;
  bool deterministic_found_ = false;
  std::vector<std::string> engines_;
};

// Empty when an engine with these notes (cudnnBackendNumericalNote_t values) is allowed, else
// why not ("TENSOR_CORE on fp32 data: TF32 not allowed").
std::string engine_refusal(std::span<const int> notes, const NumericsPolicy& policy);
inline bool engine_allowed(std::span<const int> notes, const NumericsPolicy& policy) {
  return engine_refusal(notes, policy).empty();
}

}  // namespace mixtrain::backend_cuda::conv
