// CudaConvolution: conv2d forward / backward-data / backward-weights through
// cuDNN 9's graph API (cuda_conv_plans.h; routes and rules in cuda_conv_rules.h), pooling and the
// channels-first / channels-last permutes as CUDA kernels (cuda_pooling.cu).
//
// One convolution call: the host checks (cuda_layer_checks.h), then the first route
// (conv::conv_routes) and filter layout (KRSC first: the channels-last weights cuDNN's NHWC
// Tensor Core engines read; then PyTorch's KCRS as stored) whose plan cuDNN serves; then, on the
// stream, the operand decodes the route asks for (exact, into scratch), the channels-last copy of
// the weights (a small kernel per call: weights change every step, and the copy is O(weights)
// next to the convolution's O(activations)), cuDNN's execution, and the output's finish (bias,
// one rounding into y / dx; dw moved back into [O, C/g, KH, KW] and accumulated). The bias
// gradient is the backend's bias_grad column reduction over dy.
//
// Why pooling and the permutes are kernels: cuDNN's pooling entry points (cudnnPoolingForward /
// Backward) are the legacy API, and its graph-API resample operation is served by runtime-fusion
// engines whose availability varies; our max pooling must route ties to the first maximum in
// window order (PyTorch's rule, which the conformance suite checks exactly) and the average's
// divisor must follow count_include_pad; a gather kernel does both in one pass at bandwidth,
// deterministically (no atomics).
#include <algorithm>
#include <array>
#include <climits>

#include "cuda_access.h"
#include "cuda_activation.h"
#include "cuda_candidate_timing.h"
#include "cuda_cast_fill.h"
#include "cuda_conv_plans.h"
#include "cuda_conv_rules.h"
#include "cuda_convolution.h"
#include "cuda_convolution_facet.h"
#include "cuda_gemm.h"
#include "cuda_gemm_kernels.h"
#include "cuda_layer_checks.h"
#include "cuda_residual.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

using conv::ConvOp;
using conv::FilterLayout;
using conv::Route;
using kernels::Elem;
using sdk::DType;
using sdk::TensorView;

namespace {

Elem elem_of_io(conv::DataType t) {
  switch (t) {
    case conv::DataType::bf16:
      return Elem::bf16;
    case conv::DataType::f16:
      return Elem::f16;
    default:
      return Elem::f32;
  }
}

// One conv2d call as the runner sees it: a and b as conv_routes() names them, the output, and
// what follows cuDNN.
struct ConvCall {
  ConvOp op;
  const sdk::Conv2dGeometry* g;
  TensorView a, b, out;
  DType compute;
  bool extra;         // bias (forward) or accumulate (backward weights)
  const float* bias;  // forward
};

}  // namespace

bool CudaConvolution::supports(sdk::ConvolutionOp op, std::span<const DType> dtypes) const {
  for (DType t : dtypes)
    if (sdk::is_fp8(t)) return false;  // not offered: the cpu backend emulates fp8 exactly
  if (op == sdk::ConvolutionOp::conv2d_backward_data_accumulate) {
    // conv2d_backward_data's dtypes with dx fp32 (the sum it adds into), or dy's 16-bit dtype (a
    // 16-bit sum, backend_convolution.h); every operand route has a placement without beta = 1,
    // so the answer needs no engine.
    if (!context_.conv_dgrad_accumulate || dtypes.size() != 3) return false;
    const bool sixteen_sum =
        (dtypes[2] == DType::bf16 || dtypes[2] == DType::fp16) && dtypes[2] == dtypes[0];
    if (dtypes[2] != DType::fp32 && !sixteen_sum) return false;
    const DType as_written[3] = {dtypes[0], dtypes[1], sixteen_sum ? dtypes[2] : DType::fp32};
    return sdk::ConvolutionFacet::supports(sdk::ConvolutionOp::conv2d_backward_data, as_written);
  }
  // Pooling's backward also reads an fp32 dy into a 16-bit dx (backend_convolution.h): the sum
  // of several readers' gradients, rounded once into dx instead of cast first.
  if (op == sdk::ConvolutionOp::pool2d_backward && dtypes.size() == 2 && dtypes[0] == DType::fp32 &&
      (dtypes[1] == DType::bf16 || dtypes[1] == DType::fp16))
    return true;
  return sdk::ConvolutionFacet::supports(op, dtypes);
}

namespace {

// Runs `call` on the first route and layout cuDNN has a plan for; false (with the reasons
// appended to `declined`) when none. Its scratch comes from `given` (the caller's workspace) when
// that holds all of it, else from the backend's own. With `measure`, nothing runs: the first
// route with a plan (for operands at 16-byte-aligned addresses: null data counts as aligned) sets
// *measure to what it would take of a caller's workspace.
bool run_conv(CudaContext& context, ConvState& st, cudaStream_t stream, const ConvCall& c,
              TensorView given, std::string& declined, std::size_t* measure = nullptr) {
  const sdk::Conv2dGeometry& g = *c.g;
  const char* op = c.op == ConvOp::forward         ? "conv2d_forward"
                   : c.op == ConvOp::backward_data ? "conv2d_backward_data"
                                                   : "conv2d_backward_weights";
  const std::int64_t k = g.out_channels, cg = g.in_channels / g.groups;
  const std::int64_t r = g.kernel_h, s = g.kernel_w;
  const bool filter_is_b = c.op != ConvOp::backward_weights;
  for (std::size_t index = 0;; ++index) {
    bool any = false;
    for (FilterLayout layout : {FilterLayout::krsc, FilterLayout::kcrs}) {
      const std::vector<Route> routes =
          conv::conv_routes(c.op, c.a.dtype, c.b.dtype, c.out.dtype, c.compute, c.extra, layout,
                            context.conv_wgrad_in_operand_dtype);
      if (index >= routes.size()) continue;
      any = true;
      const Route& route = routes[index];
      // A 1×1 filter's KRSC and KCRS layouts are the same bytes ([K, C] either way), and so are a
      // depthwise one's ([K, R, S] either way): cuDNN reads the weights in place when no dtype
      // changes, and writes an fp32 weight gradient straight into dw, instead of a copy there and
      // a move back (ResNet-50: 36 of its 53 convolutions).
      const bool same_bytes = layout == FilterLayout::krsc && (r * s == 1 || cg == 1);
      const bool filter_copy =
          filter_is_b && layout == FilterLayout::krsc &&
          !(same_bytes && !route.decode_b && elem_of(c.b.dtype) == elem_of_io(route.io));
      const bool out_direct =
          route.out_direct || (c.op == ConvOp::backward_weights && same_bytes &&
                               route.out == conv::DataType::f32 && !route.accumulate && !c.extra);
      // Scratch is 256-byte aligned (nullptr stands for it here).
      const bool b_scratch = route.decode_b || filter_copy;
      const void* pa = route.decode_a ? nullptr : c.a.data;
      const void* pb = b_scratch ? nullptr : c.b.data;
      const void* po = out_direct ? c.out.data : nullptr;
      const conv::PlanKey key =
          conv::plan_key(c.op, g, route, layout, conv::common_alignment({pa, pb, po}));
      cudnnHandle_t handle = st.handle.get(stream, op);
      ConvPlans::Plan* plan = st.plans.get(key, handle, op);
      if (plan == nullptr) {
        declined += "[" + conv::route_text(route) + ", filter " + conv::layout_text(layout) + "] " +
                    st.plans.declined(key) + " ";
        continue;
      }
      context.say_once("wgrad_fallback", [&] {
        return conv::wgrad_fallback_hint(c.op, route, plan->fallback_heuristics,
                                         context.conv_wgrad_in_operand_dtype);
      });
      // cuDNN's workspace: the plan's (autotuning's first candidate's until the key is timed).
      const conv::RouteScratch need =
          conv::route_scratch(route, static_cast<std::size_t>(plan->workspace), c.a.numel(),
                              c.b.numel(), c.out.numel(), filter_copy, out_direct);
      if (measure != nullptr) {
        *measure = need.caller_bytes();
        return true;
      }
      // The caller's workspace when it holds all of it.
      const bool in_given = need.caller_bytes() > 0 && given.bytes() >= need.caller_bytes();
      const conv::RouteScratch::Places given_at =
          in_given ? need.place_in(given.data) : conv::RouteScratch::Places{};
      // Operands.
      void* a = c.a.data;
      if (route.decode_a) {
        a = in_given ? given_at.a : st.a.get(need.a, stream, op);
        check_cuda(kernels::cast(c.a.data, elem_of(c.a.dtype), a, Elem::f32, false, c.a.numel(),
                                 1.0f, false, nullptr, stream),
                   op, "operand decode");
      }
      void* b = c.b.data;
      if (filter_copy) {
        b = in_given ? given_at.b : st.b.get(need.b, stream, op);
        check_cuda(kernels::filter_to_krsc(c.b.data, elem_of(c.b.dtype), b, elem_of_io(route.io), k,
                                           cg, r, s, stream),
                   op, "channels-last weights");
      } else if (route.decode_b) {
        b = in_given ? given_at.b : st.b.get(need.b, stream, op);
        check_cuda(kernels::cast(c.b.data, elem_of(c.b.dtype), b, Elem::f32, false, c.b.numel(),
                                 1.0f, false, nullptr, stream),
                   op, "operand decode");
      }
      void* out = out_direct ? c.out.data
                  : in_given ? given_at.out
                             : st.out.get(need.out, stream, op);
      // uid 1 = x / dx, 2 = w / dw, 3 = y / dy.
      const std::size_t out_uid = c.op == ConvOp::forward         ? 2
                                  : c.op == ConvOp::backward_data ? 0
                                                                  : 1;
      std::array<void*, 3> uids{};
      uids[out_uid] = out;
      uids[c.op == ConvOp::backward_data ? 2 : 0] = a;     // x, or dy for backward data
      uids[c.op == ConvOp::backward_weights ? 2 : 1] = b;  // w, or dy for backward weights
      if (!plan->untimed.empty() && stream_capturing(stream))
        ConvPlans::skip_autotune(*plan, "not autotuned (the stream was being captured)");
      if (!plan->untimed.empty()) {
        // conv_autotune: the key's first run times its candidates (cuda_conv_plans.h). A beta = 1
        // plan adds into its output at every call, so it is timed on a scratch output.
        try {
          // The largest candidate's workspace, in a scratch of its own released below; a
          // candidate the device cannot give it is dropped, not the key's whole timing.
          const auto tuning_workspace = [&] {
            return st.tune_workspace.get(
                static_cast<std::size_t>(std::max<std::int64_t>(1, plan->tuning_workspace())),
                stream, op);
          };
          // In a caller's workspace, the candidates that fit in it are timed there: it was
          // planned for the first one, and a larger one's would grow the backend's own.
          void* tune_ws = given_at.workspace;
          if (in_given && ConvPlans::drop_candidates_over(*plan, plan->workspace) > 0 &&
              plan->untimed.empty())
            plan->tuning = "not autotuned (no other candidate fits the caller's workspace)";
          try {
            if (tune_ws == nullptr) tune_ws = tuning_workspace();
          } catch (const sdk::BackendError&) {
            ConvPlans::drop_candidates_over(*plan, plan->workspace);
            if (plan->untimed.empty())
              plan->tuning = "not autotuned (no device memory for the other candidates' workspace)";
            tune_ws = tuning_workspace();
          }
          std::array<void*, 3> tune = uids;
          // A beta = 1 candidate's timing output (an fp32 dx) is released with the tuning
          // workspace: the output scratch would keep it for the run, and in a caller's
          // workspace the backend is to hold nothing of its own.
          if (key.beta_one && !plan->untimed.empty()) {
            const std::size_t bytes = static_cast<std::size_t>(c.out.numel()) * 4;
            tune[out_uid] = st.tune_out.get(bytes, stream, op);
            check_cuda(cudaMemsetAsync(tune[out_uid], 0, bytes, stream), op,
                       "autotuning's scratch output");
          }
          context.account_buffers();
          st.plans.autotune(*plan, handle, stream, tune[0], tune[1], tune[2], tune_ws, op);
        } catch (const sdk::BackendError&) {
          ConvPlans::skip_autotune(*plan, "not autotuned (no device memory to time in)");
        }
        st.tune_workspace.release(stream);
        st.tune_out.release(stream);
        context.account_buffers();
      }
      void* ws = plan->workspace <= 0 ? nullptr
                 : in_given
                     ? given_at.workspace
                     : st.workspace.get(static_cast<std::size_t>(plan->workspace), stream, op);
      context.account_buffers();
      if (!st.plans.run_or_decline(key, handle, uids[0], uids[1], uids[2], ws, op)) {
        // Nothing was written: the next route or layout computes the whole op.
        declined += "[" + conv::route_text(route) + ", filter " + conv::layout_text(layout) + "] " +
                    st.plans.declined(key) + " ";
        continue;
      }
      // The output's finish.
      if (c.op == ConvOp::backward_weights) {
        if (!out_direct)
          check_cuda(kernels::filter_gradient_from(out, elem_of_io(route.out),
                                                   layout == FilterLayout::krsc, c.out.as<float>(),
                                                   k, cg, r, s, c.extra, stream),
                     op, "weight gradient finish");
        return true;
      }
      if (route.accumulate) {
        // dx fp32 += the gradient: added by cuDNN (beta = 1), or here from its scratch; a 16-bit
        // dx (a 16-bit sum) from the scratch alone, rounded once.
        if (!route.out_direct && c.out.dtype == DType::fp32) {
          check_cuda(kernels::axpy(1.0f, out, elem_of_io(route.out), c.out.as<float>(),
                                   c.out.numel(), stream),
                     op, "data gradient add");
        } else if (!route.out_direct) {
          kernels::ResidualInputs terms{};
          terms.data[0] = c.out.data;
          terms.type[0] = elem_of(c.out.dtype);
          terms.data[1] = out;
          terms.type[1] = elem_of_io(route.out);
          terms.count = 2;
          check_cuda(kernels::residual_add(terms, false, c.out.data, elem_of(c.out.dtype),
                                           c.out.numel(), stream),
                     op, "data gradient add");
        }
        return true;
      }
      const std::int64_t cols = c.op == ConvOp::forward ? g.out_channels : g.in_channels;
      const std::int64_t rows = c.out.numel() / cols;
      if (!route.out_direct)
        check_cuda(kernels::finish_output(static_cast<const float*>(out), c.bias, c.out.data,
                                          elem_of(c.out.dtype), rows, cols, stream),
                   op, "output finish");
      else if (c.bias != nullptr)
        check_cuda(kernels::add_bias(c.out.data, elem_of(c.out.dtype), c.bias, Elem::f32, rows,
                                     cols, stream),
                   op, "bias");
      return true;
    }
    if (!any) return false;
  }
}

[[noreturn]] void no_plan(std::string_view op, const sdk::Conv2dGeometry& g,
                          const std::string& declined) {
  fail(op,
       "cuDNN " + cudnn_version_text() + " has no engine for this convolution (batch " +
           std::to_string(g.batch) + ", " + std::to_string(g.in_channels) + " -> " +
           std::to_string(g.out_channels) + " channels, " + std::to_string(g.height) + "x" +
           std::to_string(g.width) + ", kernel " + std::to_string(g.kernel_h) + "x" +
           std::to_string(g.kernel_w) + ", groups " + std::to_string(g.groups) + "): " + declined,
       "report this geometry with conv_plan_report(); the cpu backend computes it");
}

}  // namespace

void CudaConvolution::conv2d_forward(const sdk::Conv2dForwardArgs& args) {
  conv2d_forward_with_workspace(args, {});
}

void CudaConvolution::conv2d_forward_with_workspace(const sdk::Conv2dForwardArgs& args,
                                                    TensorView workspace) {
  context_.activate();
  constexpr const char* op = "conv2d_forward";
  layer_checks::conv_forward(args);
  checks().conv2d_workspace(op, workspace, args);
  const ConvCall call{ConvOp::forward,
                      &args.geometry,
                      args.x.view,
                      args.w.view,
                      args.y,
                      args.compute,
                      !args.bias.empty(),
                      args.bias.empty() ? nullptr : args.bias.as<const float>()};
  std::string declined;
  if (!run_conv(context_, context_.conv_state(), context_.stream, call, workspace, declined))
    no_plan(op, args.geometry, declined);
}

namespace {

// dx = (or, accumulating, dx +=) the data gradient, its scratch from `workspace` when that holds
// it.
void backward_data(CudaContext& context, const sdk::Conv2dBackwardDataArgs& args, bool accumulate,
                   TensorView workspace) {
  context.activate();
  // Off, supports() answers no, and a call is refused as the SDK's default refuses it.
  if (accumulate && !context.conv_dgrad_accumulate)
    fail("conv2d_backward_data_accumulate",
         "the accumulating data gradient is off (backend.cuda.conv_dgrad_accumulate = false)",
         "ask supports() first; without it, write the gradient apart and add it");
  if (accumulate)
    layer_checks::conv_backward_data_accumulate(args);
  else
    layer_checks::conv_backward_data(args);
  checks().conv2d_workspace(accumulate ? "conv2d_backward_data_accumulate" : "conv2d_backward_data",
                            workspace, args);
  const sdk::Conv2dGeometry& g = args.geometry;
  if (accumulate &&
      conv::pointwise_dgrad_accumulates_as_gemm(g, args.dy.view.dtype, args.w.view.dtype)) {
    // dx [N·H·W, C] += dy [N·H·W, K] · w [K, C] (cuda_conv_rules.h): the views as matrices.
    const std::int64_t rows = g.batch * g.height * g.width;
    sdk::GemmArgs gemm;
    gemm.a = {{args.dy.view.data, args.dy.view.dtype, sdk::Shape{rows, g.out_channels}}};
    gemm.b = {{args.w.view.data, args.w.view.dtype, sdk::Shape{g.out_channels, g.in_channels}}};
    gemm.c = {args.dx.data, args.dx.dtype, sdk::Shape{rows, g.in_channels}};
    gemm.beta = 1.0f;
    gemm.compute = args.compute;
    context.gemm->run(gemm);
    return;
  }
  const ConvCall call{ConvOp::backward_data, &args.geometry, args.dy.view, args.w.view, args.dx,
                      args.compute,          accumulate,     nullptr};
  std::string declined;
  if (!run_conv(context, context.conv_state(), context.stream, call, workspace, declined))
    no_plan(accumulate ? "conv2d_backward_data_accumulate" : "conv2d_backward_data", args.geometry,
            declined);
}

}  // namespace

void CudaConvolution::conv2d_backward_data(const sdk::Conv2dBackwardDataArgs& args) {
  backward_data(context_, args, false, {});
}

void CudaConvolution::conv2d_backward_data_accumulate(const sdk::Conv2dBackwardDataArgs& args) {
  backward_data(context_, args, true, {});
}

void CudaConvolution::conv2d_backward_data_with_workspace(const sdk::Conv2dBackwardDataArgs& args,
                                                          TensorView workspace) {
  backward_data(context_, args, false, workspace);
}

void CudaConvolution::conv2d_backward_data_accumulate_with_workspace(
    const sdk::Conv2dBackwardDataArgs& args, TensorView workspace) {
  backward_data(context_, args, true, workspace);
}

void CudaConvolution::conv2d_backward_weights(const sdk::Conv2dBackwardWeightsArgs& args) {
  conv2d_backward_weights_with_workspace(args, {});
}

void CudaConvolution::conv2d_backward_weights_with_workspace(
    const sdk::Conv2dBackwardWeightsArgs& args, TensorView workspace) {
  context_.activate();
  constexpr const char* op = "conv2d_backward_weights";
  layer_checks::conv_backward_weights(args);
  checks().conv2d_workspace(op, workspace, args);
  const sdk::Conv2dGeometry& g = args.geometry;
  const ConvCall call{
      ConvOp::backward_weights, &g,     args.x.view, args.dy.view, args.dw, args.compute,
      args.accumulate,          nullptr};
  std::string declined;
  if (!run_conv(context_, context_.conv_state(), context_.stream, call, workspace, declined))
    no_plan(op, g, declined);
  if (args.dbias.empty()) return;
  const std::int64_t rows = g.batch * g.out_height() * g.out_width();
  float* partial = context_.partial.as<float>(
      std::max<std::size_t>(1, kernels::column_sum_scratch(rows, g.out_channels)), context_.stream,
      op);
  context_.account_buffers();
  check_cuda(
      kernels::bias_grad(args.dy.view.data, elem_of(args.dy.view.dtype), args.dbias.as<float>(),
                         rows, g.out_channels, args.accumulate, partial, context_.stream),
      op, "bias gradient");
}

std::size_t CudaConvolution::conv2d_workspace_bytes(const sdk::Conv2dWorkspaceQuery& q) const {
  layer_checks::conv_workspace_query(q);
  const bool accumulate = q.op == sdk::ConvolutionOp::conv2d_backward_data_accumulate;
  // An op not offered is refused whatever the workspace option, as its call would be.
  if (accumulate && !context_.conv_dgrad_accumulate)
    fail("conv2d_workspace_bytes",
         "the accumulating data gradient is off (backend.cuda.conv_dgrad_accumulate = false)",
         "ask supports() first; without it, write the gradient apart and add it");
  if (!context_.conv_workspace) return 0;  // the option conv_workspace = false
  context_.activate();
  const sdk::Conv2dGeometry& g = q.geometry;
  // The call's views as run_conv sizes them (null data: 16-byte aligned, as a caller's arena).
  const auto view = [](DType dtype, std::int64_t numel) {
    return TensorView{nullptr, dtype, sdk::Shape{numel}};
  };
  const std::int64_t x = g.batch * g.height * g.width * g.in_channels;
  const std::int64_t w = g.out_channels * (g.in_channels / g.groups) * g.kernel_h * g.kernel_w;
  const std::int64_t y = g.batch * g.out_height() * g.out_width() * g.out_channels;
  // A pointwise accumulate is one cuBLASLt GEMM, in the GEMM engine's own workspace.
  if (accumulate && conv::pointwise_dgrad_accumulates_as_gemm(g, q.a, q.b)) return 0;
  ConvCall call{ConvOp::forward, &g,        view(q.a, x), view(q.b, w),
                view(q.out, y),  q.compute, q.bias,       nullptr};
  if (q.op == sdk::ConvolutionOp::conv2d_backward_data || accumulate)
    call = {ConvOp::backward_data, &g,        view(q.a, y), view(q.b, w),
            view(q.out, x),        q.compute, accumulate,   nullptr};
  else if (q.op == sdk::ConvolutionOp::conv2d_backward_weights)
    call = {ConvOp::backward_weights, &g,        view(q.a, x), view(q.b, y),
            view(DType::fp32, w),     q.compute, q.accumulate, nullptr};
  std::string declined;
  std::size_t bytes = 0;
  if (!run_conv(context_, context_.conv_state(), context_.stream, call, {}, declined, &bytes))
    no_plan(sdk::op_name(q.op), g, declined);
  return bytes;
}

// --- pooling -----------------------------------------------------------------------------------

namespace {

kernels::PoolShape pool_shape(const sdk::Pool2dGeometry& g) {
  return {g.batch,
          g.channels,
          g.height,
          g.width,
          g.out_height(),
          g.out_width(),
          static_cast<int>(g.kernel_h),
          static_cast<int>(g.kernel_w),
          static_cast<int>(g.stride_h),
          static_cast<int>(g.stride_w),
          static_cast<int>(g.pad_h),
          static_cast<int>(g.pad_w),
          g.kind == sdk::PoolKind::max,
          g.count_include_pad};
}

// The max pool's workspace: its argmax, an element per output (kernels::pool_argmax_in_bytes).
std::size_t argmax_bytes(const sdk::Pool2dGeometry& g) {
  return static_cast<std::size_t>(g.batch * g.out_height() * g.out_width() * g.channels) *
         (kernels::pool_argmax_in_bytes(g.kernel_h, g.kernel_w) ? 1 : sizeof(std::int32_t));
}

}  // namespace

std::size_t CudaConvolution::pool2d_workspace_bytes(const sdk::Pool2dGeometry& geometry,
                                                    DType x) const {
  constexpr std::string_view op = "pool2d_workspace_bytes";
  const bool max = checks().pool2d_workspace_args(geometry, x);
  layer_checks::pool_limits(op, geometry);
  return max ? argmax_bytes(geometry) : 0;
}

void CudaConvolution::pool2d_forward(const sdk::Pool2dGeometry& g, TensorView x, TensorView y,
                                     TensorView workspace) {
  context_.activate();
  layer_checks::pool_forward(g, x, y, workspace, argmax_bytes(g));
  void* argmax = g.kind == sdk::PoolKind::max && !workspace.empty() ? workspace.data : nullptr;
  check_cuda(kernels::pool_forward(pool_shape(g), x.data, elem_of(x.dtype), y.data, argmax,
                                   context_.stream),
             "pool2d_forward", "kernel launch");
}

void CudaConvolution::pool2d_backward(const sdk::Pool2dGeometry& g, TensorView dy, TensorView x,
                                      TensorView y, TensorView workspace, TensorView dx) {
  context_.activate();
  (void)y;  // the argmax comes from the workspace or from x
  layer_checks::pool_backward(g, dy, x, workspace, argmax_bytes(g), dx);
  const bool max = g.kind == sdk::PoolKind::max;
  const void* argmax = max && !workspace.empty() ? workspace.data : nullptr;
  check_cuda(
      kernels::pool_backward(pool_shape(g), dy.data, elem_of(dy.dtype), max ? x.data : nullptr,
                             argmax, dx.data, elem_of(dx.dtype), context_.stream),
      "pool2d_backward", "kernel launch");
}

// --- permutes ----------------------------------------------------------------------------------

void CudaConvolution::to_channels_last(TensorView src, std::int64_t channels, std::int64_t height,
                                       std::int64_t width, TensorView dst) {
  context_.activate();
  constexpr const char* op = "to_channels_last";
  const std::int64_t images = checks().channel_permute(op, src, channels, height, width, dst);
  check_cuda(kernels::permute_images(src.data, elem_of(src.dtype), dst.data, elem_of(dst.dtype),
                                     images, channels, height * width, context_.stream),
             op, "kernel launch");
}

void CudaConvolution::to_channels_first(TensorView src, std::int64_t channels, std::int64_t height,
                                        std::int64_t width, TensorView dst) {
  context_.activate();
  constexpr const char* op = "to_channels_first";
  const std::int64_t images = checks().channel_permute(op, src, channels, height, width, dst);
  check_cuda(kernels::permute_images(src.data, elem_of(src.dtype), dst.data, elem_of(dst.dtype),
                                     images, height * width, channels, context_.stream),
             op, "kernel launch");
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::ConvolutionFacet, CudaConvolution> kCudaConvolutionRegistration;

}  // namespace mixtrain::backend_cuda
