#include "graph/ops/conv2d.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "graph/ops/image_options.h"
#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"

namespace mixtrain::core {

using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

Conv2dLayer::Conv2dLayer(std::string name, const sdk::Conv2dGeometry& geometry, bool bias,
                         Init init, bool plain_input)
    : Layer(std::move(name), "conv2d", geometry.width, geometry.out_width()),
      geometry_(geometry),
      bias_(bias),
      init_(init),
      scaler_(name_, kGemm) {
  input_.configure(plain_input, geometry.in_channels, geometry.height, geometry.width);
  use_operand_scaler(&scaler_);
  traits_.fp8_only_scaled = true;
  const auto& g = geometry_;
  traits_.gemms = {
      {kGemm, {sdk::OperandRole::input, sdk::OperandRole::weight, sdk::OperandRole::grad_output}}};
  traits_.tensor_core_dims = {{"input channels", g.in_channels / g.groups, true},
                              {"output channels", g.out_channels / g.groups, false}};
  // A row of the output is one (o, oh): OW outputs of C/g·KH·KW multiply-adds each.
  traits_.forward_flops_per_row =
      g.out_width() * (2 * (g.in_channels / g.groups) * g.kernel_h * g.kernel_w + (bias_ ? 1 : 0));
  traits_.parameters = {{"weight", weight_shape()}};
  if (bias_) traits_.parameters.push_back({"bias", {g.out_channels}});
}

std::vector<std::int64_t> Conv2dLayer::weight_shape() const {
  const auto& g = geometry_;
  return {g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
}

DType Conv2dLayer::compute() const {
  // The operands carry their format; the facet's compute only asks for tf32 rounding.
  return precision_.gemm_input == DType::tf32 ? DType::tf32 : DType::fp32;
}

sdk::Conv2dGeometry Conv2dLayer::at_batch(std::int64_t rows) const {
  sdk::Conv2dGeometry g = geometry_;
  g.batch = rows / (g.out_channels * g.out_height());  // rows of the output [O, OH, OW] per sample
  return g;
}

void Conv2dLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                           std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  params_.clear();
  const sdk::Shape w = sdk::Shape::from_vector(weight_shape());
  params_.push_back(make_parameter("weight", w, true, precision_.weight));
  if (bias_) params_.push_back(make_parameter("bias", sdk::Shape{geometry_.out_channels}, false));
}

void Conv2dLayer::init_parameters(std::uint64_t seed) {
  const auto& g = geometry_;
  const double fan_in = static_cast<double>(g.in_channels / g.groups * g.kernel_h * g.kernel_w);
  if (init_ == Init::kaiming_normal) {
    // torchvision's ResNet: kaiming_normal_(mode="fan_out", nonlinearity="relu").
    const double fan_out = static_cast<double>(g.out_channels * g.kernel_h * g.kernel_w);
    ops::fill_normal(backend_, params_[0], std::sqrt(2.0 / fan_out),
                     derive_seed(seed, (name_ + ".weight").c_str()));
  } else {
    // PyTorch's nn.Conv2d: kaiming_uniform(a=√5) → U(-1/√fan_in, 1/√fan_in), bias likewise.
    ops::fill_uniform(backend_, params_[0], 1.0 / std::sqrt(fan_in),
                      derive_seed(seed, (name_ + ".weight").c_str()));
  }
  if (bias_)
    ops::fill_uniform(backend_, params_[1], 1.0 / std::sqrt(fan_in),
                      derive_seed(seed, (name_ + ".bias").c_str()));
}

std::vector<BackendNeed> Conv2dLayer::backend_needs(DType input) const {
  const DType g = precision_.gemm_input;  // tf32 asks for its own support
  const DType act = storage_of(precision_.activation);
  const DType grad = storage_of(precision_.activation_grad);
  std::vector<BackendNeed> needs = {{sdk::ConvolutionOp::conv2d_forward, {g, g, act}},
                                    {sdk::ConvolutionOp::conv2d_backward_weights, {g, g}},
                                    {sdk::ConvolutionOp::conv2d_backward_data, {g, g, grad}}};
  if (bias_ && frozen("weight") && !frozen("bias"))
    needs.push_back({sdk::ActivationOp::bias_grad, {grad, DType::fp32}});
  if (input_.plain()) {
    // FP8 operands are scaled from the permuted input, which keeps the input's dtype.
    needs.push_back(
        {sdk::ConvolutionOp::to_channels_last, {input, sdk::is_fp8(g) ? input : storage_of(g)}});
    needs.push_back({sdk::ConvolutionOp::to_channels_first, {grad, grad}});
  }
  return needs;
}

void Conv2dLayer::choose_kernels(sdk::DeviceBackend& backend) {
  // The operand dtypes of the backward GEMM-like product (tf32 asks for its own support), into
  // the FP32 sum.
  const DType g = precision_.gemm_input;
  const std::optional<std::string> why =
      unmet(backend, {sdk::ConvolutionOp::conv2d_backward_data_accumulate, {g, g, DType::fp32}});
  accumulate_offered_ = !why.has_value();
  // Into a 16-bit sum of the operands' dtype (model.fp32_gradient_sums = false).
  accumulate16_offered_ =
      (g == DType::bf16 || g == DType::fp16) &&
      !unmet(backend, {sdk::ConvolutionOp::conv2d_backward_data_accumulate, {g, g, g}});
  workspace_facet_ = sdk::facet<sdk::ConvolutionFacet>(backend, 2);
  if (why && fusion_on_ && !input_.plain() && !sdk::is_fp8(g))
    ops::log_once("conv2d", "conv2d_backward_data_accumulate",
                  "the backend does not add a convolution's input gradient into the FP32 sum "
                  "of a tensor read several times itself (" +
                      *why + "): such a gradient is written apart and added by an axpy");
}

bool Conv2dLayer::can_accumulate_input_gradient(std::size_t k) const {
  return k == 0 && fusion_on_ && accumulate_offered_ && !input_.plain() && !scaler_.active();
}

bool Conv2dLayer::can_accumulate_input_gradient_in(std::size_t k, DType dtype) const {
  return k == 0 && fusion_on_ && accumulate16_offered_ && !input_.plain() && !scaler_.active() &&
         dtype == storage_of(precision_.gemm_input);
}

std::size_t Conv2dLayer::step_workspace_bytes(const WorkspaceAsk& ask) const {
  const DType g = precision_.gemm_input;
  if (workspace_facet_ == nullptr || sdk::is_fp8(g) || ask.rows <= 0) return 0;
  sdk::Conv2dWorkspaceQuery q;
  q.geometry = at_batch(ask.rows);
  if (q.geometry.batch < 1) return 0;
  q.compute = compute();
  const DType operand = storage_of(g);
  const DType weight = storage_of(precision_.weight);
  // A query the backend refuses plans no workspace: the call, if it comes, says why.
  const auto query = [&](sdk::ConvolutionOp op, DType a, DType b, DType out) -> std::size_t {
    q.op = op;
    q.a = a;
    q.b = b;
    q.out = out;
    try {
      return workspace_facet_->conv2d_workspace_bytes(q);
    } catch (const sdk::BackendError&) {
      return 0;
    }
  };
  if (ask.pass == Pass::forward) {
    q.bias = bias_;
    return query(sdk::ConvolutionOp::conv2d_forward, operand, weight,
                 storage_of(precision_.activation));
  }
  // The backward's calls, one after another: the largest of those it will make. The weight
  // gradient unless frozen; the data gradient where the input needs one, written (the first or
  // only contribution), and added into the sum where several readers' are summed and the op adds
  // its own (can_accumulate_input_gradient).
  std::size_t bytes = 0;
  if (!frozen("weight")) {
    // The first micro-batch writes dw, a later one adds to it (a route may then need scratch
    // for the sum: the larger of the two).
    q.bias = bias_ && !frozen("bias");
    for (const bool accumulate : {false, true}) {
      q.accumulate = accumulate;
      bytes = std::max(
          bytes, query(sdk::ConvolutionOp::conv2d_backward_weights, operand, operand, DType::fp32));
    }
    q.accumulate = false;
  }
  q.bias = false;
  if (ask.input_needs_gradient.empty() || !ask.input_needs_gradient[0]) return bytes;
  // The all-FP32 pass writes every input gradient in FP32.
  bytes = std::max(
      bytes, query(sdk::ConvolutionOp::conv2d_backward_data, operand, weight,
                   ask.fp32_gradients ? DType::fp32 : storage_of(precision_.activation_grad)));
  const std::optional<DType> sum =
      ask.input_gradient_sum.empty() ? std::nullopt : ask.input_gradient_sum[0];
  if (sum && (*sum == DType::fp32 ? can_accumulate_input_gradient(0)
                                  : can_accumulate_input_gradient_in(0, *sum)))
    bytes = std::max(
        bytes, query(sdk::ConvolutionOp::conv2d_backward_data_accumulate, operand, weight, *sum));
  return bytes;
}

void Conv2dLayer::forward(TensorView x, std::int64_t rows) {
  sdk::Conv2dForwardArgs a;
  a.geometry = at_batch(rows);
  const DType g = storage_of(precision_.gemm_input);
  if (scaler_.active()) {
    auto* stats = collect_stats_ ? &stats_ : nullptr;
    const TensorView x_cl = input_.forward(backend_, facets(), x, a.geometry.batch, x.dtype);
    a.x = scaler_.scale(backend_, x_cl, sdk::OperandRole::input, stats);
    a.w = scaler_.scale(backend_, params_[0].compute_view(), sdk::OperandRole::weight, stats);
    a.w.view.shape = sdk::Shape::from_vector(weight_shape());
  } else {
    a.x.view = input_.forward(backend_, facets(), x, a.geometry.batch, g);
    a.w.view = params_[0].compute_view();
  }
  x_operand_ = a.x.view;
  x_scale_inv_ = a.x.scale_inv;
  if (bias_) a.bias = params_[1].master.view();
  const TensorView y = output(rows);
  a.y = {y.data, y.dtype,
         sdk::Shape{a.geometry.batch, a.geometry.out_height(), a.geometry.out_width(),
                    a.geometry.out_channels}};
  a.compute = compute();
  const TensorView workspace = step_workspace();
  if (workspace_facet_ != nullptr && !workspace.empty())
    facets().call(sdk::ConvolutionOp::conv2d_forward)->conv2d_forward_with_workspace(a, workspace);
  else
    facets().call(sdk::ConvolutionOp::conv2d_forward)->conv2d_forward(a);
}

void Conv2dLayer::backward(TensorView, TensorView dy, TensorView dx, std::int64_t rows) {
  const sdk::Conv2dGeometry geo = at_batch(rows);
  const sdk::Shape y_shape{geo.batch, geo.out_height(), geo.out_width(), geo.out_channels};
  sdk::GemmOperand dy_op, w_op;
  if (scaler_.active()) {
    dy_op = scaler_.scale(backend_, {dy.data, dy.dtype, y_shape}, sdk::OperandRole::grad_output,
                          collect_stats_ ? &stats_ : nullptr);
    w_op = scaler_.last(sdk::OperandRole::weight, sdk::Shape::from_vector(weight_shape()));
  } else {
    dy_op.view =
        as_dtype({dy.data, dy.dtype, y_shape}, storage_of(precision_.gemm_input), dy_scratch_);
    w_op.view = params_[0].compute_view();
  }
  const bool bias_trains = bias_ && !params_[1].frozen;
  const TensorView workspace = step_workspace();
  const bool with_workspace = workspace_facet_ != nullptr && !workspace.empty();
  if (!params_[0].frozen) {
    sdk::Conv2dBackwardWeightsArgs bw;
    bw.geometry = geo;
    bw.x = {x_operand_, false, x_scale_inv_};
    bw.dy = dy_op;
    bw.dw = params_[0].grad.view();
    bw.accumulate = params_[0].take_grad_beta() != 0.0f;
    if (bias_trains) {
      bw.dbias = params_[1].grad.view();
      // weight and bias are written together, so they start a step together.
      params_[1].take_grad_beta();
    }
    bw.compute = compute();
    if (with_workspace)
      facets()
          .call(sdk::ConvolutionOp::conv2d_backward_weights)
          ->conv2d_backward_weights_with_workspace(bw, workspace);
    else
      facets().call(sdk::ConvolutionOp::conv2d_backward_weights)->conv2d_backward_weights(bw);
  } else if (bias_trains) {
    // A frozen weight's wgrad is not computed: the bias alone is dy's sum per output channel,
    // dy being channels-last [N·OH·OW, O].
    facets()
        .call(sdk::ActivationOp::bias_grad)
        ->bias_grad(
            {dy.data, dy.dtype, sdk::Shape{y_shape.numel() / geo.out_channels, geo.out_channels}},
            params_[1].grad.view(), params_[1].take_grad_beta() != 0.0f);
  }
  if (dx.empty()) return;
  sdk::Conv2dBackwardDataArgs bd;
  bd.geometry = geo;
  bd.dy = dy_op;
  bd.w = w_op;
  bd.dx = input_.grad_target(backend_, dx, geo.batch);
  bd.compute = compute();
  if (accumulate_input_gradient(0)) {
    // dx is the sum of the input's gradient, FP32 or 16-bit (channels-last: grad_target is dx
    // itself).
    const auto facet = facets().call(sdk::ConvolutionOp::conv2d_backward_data_accumulate);
    if (with_workspace)
      facet->conv2d_backward_data_accumulate_with_workspace(bd, workspace);
    else
      facet->conv2d_backward_data_accumulate(bd);
    return;
  }
  if (with_workspace)
    facets()
        .call(sdk::ConvolutionOp::conv2d_backward_data)
        ->conv2d_backward_data_with_workspace(bd, workspace);
  else
    facets().call(sdk::ConvolutionOp::conv2d_backward_data)->conv2d_backward_data(bd);
  input_.finish_grad(facets(), bd.dx, dx);
}

// --- Definition ----------------------------------------------------------------------------------

OpDefinition conv2d_op() {
  OpDefinition op;
  op.type = "conv2d";
  op.summary = "2-D convolution of [C, H, W] images (PyTorch's Conv2d), channels-last output";
  op.has_parameters = true;
  op.reads_images = true;
  op.schema = [] {
    sdk::OptionSchema schema{
        sdk::OptionSpec::required("out", sdk::OptionType::integer, "output channels")
            .at_least(1)
            .at_most(static_cast<double>(ops::kMaxDim)),
        sdk::OptionSpec::integer("in", 0,
                                 "input channels, checked against the input (0: the input's)")
            .at_least(0),
        sdk::OptionSpec::integer("groups", 1, "channel groups (in and out divisible by it)")
            .at_least(1),
        sdk::OptionSpec::boolean("bias", true, "add a learned bias per output channel"),
        sdk::OptionSpec::string("init", "pytorch",
                                "\"pytorch\" (nn.Conv2d's default) or \"kaiming_normal\" "
                                "(fan_out, as torchvision's ResNets)")
            .one_of({"pytorch", "kaiming_normal"})};
    ops::add_window_options(schema, /*with_dilation=*/true, /*default_stride_is_kernel=*/false);
    return schema;
  };
  op.build = [](const OpNode& node) {
    const ops::ImageIn in = ops::image_input(node, "conv2d");
    const ops::Window win =
        ops::read_window(node, /*default_stride_is_kernel=*/false, /*with_dilation=*/true);
    const std::int64_t declared = node.options.get_int("in");
    if (declared != 0 && declared != in.channels)
      throw OpSpecError("in",
                        "in = " + std::to_string(declared) + " but input 1 has " +
                            std::to_string(in.channels) + " channels (" +
                            ops::shape_text(node.inputs[0]) + ")",
                        "set in = " + std::to_string(in.channels) +
                            " or remove it (it is inferred from the input)");
    sdk::Conv2dGeometry g;
    g.in_channels = in.channels;
    g.height = in.height;
    g.width = in.width;
    g.out_channels = node.options.get_int("out");
    g.groups = node.options.get_int("groups");
    ops::apply_window(win, g);
    g.dilation_h = win.dilation_h;
    g.dilation_w = win.dilation_w;
    if (g.in_channels % g.groups != 0 || g.out_channels % g.groups != 0)
      throw OpSpecError("groups",
                        "groups = " + std::to_string(g.groups) + " does not divide the " +
                            std::to_string(g.in_channels) + " input and " +
                            std::to_string(g.out_channels) + " output channels",
                        "choose groups dividing both (1 for a dense convolution, the channel "
                        "count for a depthwise one)");
    ops::check_window_fits(in, g.kernel_h, g.kernel_w, g.pad_h, g.pad_w, g.dilation_h,
                           g.dilation_w);
    const auto init = node.options.get_string("init") == "kaiming_normal"
                          ? Conv2dLayer::Init::kaiming_normal
                          : Conv2dLayer::Init::pytorch;
    auto layer =
        std::make_unique<Conv2dLayer>(node.name, g, node.options.get_bool("bias"), init, in.plain);
    return BuiltOp{std::move(layer), PerSampleShape{g.out_channels, g.out_height(), g.out_width()},
                   TensorLayout::channels_last};
  };
  return op;
}

}  // namespace mixtrain::core
