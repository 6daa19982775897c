#include "graph/ops/batchnorm2d.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "graph/ops/image_options.h"
#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"
#include "mixtrain/core/graph/backend_needs.h"

namespace mixtrain::core {

using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

BatchNorm2dLayer::BatchNorm2dLayer(std::string name, std::int64_t channels, std::int64_t height,
                                   std::int64_t width, float eps, float momentum, bool affine,
                                   bool plain_input)
    : Layer(std::move(name), "batchnorm2d", width, width),
      channels_(channels),
      height_(height),
      width_(width),
      eps_(eps),
      momentum_(momentum),
      affine_(affine) {
  input_.configure(plain_input, channels, height, width);
  // statistics, normalise, scale and shift: about five per element (a row is W elements of C).
  traits_.forward_flops_per_row = 5 * width_;
  if (affine_) traits_.parameters = {{"weight", {channels_}}, {"bias", {channels_}}};
  traits_.reduces_statistics = true;
}

void BatchNorm2dLayer::set_statistics_reducer(StatisticsReducer reducer) {
  reducer_ = std::move(reducer);
  // The reductions go through the host between the passes: a step graph cannot capture them.
  traits_.varies_per_step = static_cast<bool>(reducer_);
  update_fusion();
}

bool BatchNorm2dLayer::defer_into_reader() {
  if (relu_) return false;
  into_reader_ = true;
  update_fusion();
  return true;
}

void BatchNorm2dLayer::set_fusion(bool on) {
  fusion_on_ = on;
  update_fusion();
}

namespace {
void log_unfused_once(const std::string& node, const std::string& reason) {
  ops::log_once(
      "batchnorm2d", reason,
      "batch norm + add runs unfused (node '" + node +
          "' and the nodes like it write their output and the add reads it back): " + reason);
}
}  // namespace

void BatchNorm2dLayer::choose_kernels(sdk::DeviceBackend& backend) {
  if (!into_reader_) return;
  const std::optional<std::string> why =
      unmet(backend, {sdk::BatchNormOp::batchnorm_add_forward, {dtype()}});
  backend_offers_ = !why.has_value();
  if (why && fusion_on_ && !synchronized()) log_unfused_once(name(), "the backend " + *why);
  update_fusion();
}

void BatchNorm2dLayer::update_fusion() {
  // Synchronized batch norm reduces its statistics on the host between passes: never fused.
  epilogue_fused_ = into_reader_ && fusion_on_ && backend_offers_ && !synchronized();
  traits_.output_deferred = epilogue_fused_;
  traits_.forward_in_reader = epilogue_fused_;  // the add normalises the input in its pass
  // Unfused (the replay), the add sums in place onto batch norm's output.
  traits_.output_in_reader = epilogue_fused_;
}

bool BatchNorm2dLayer::take_relu() {
  relu_ = true;
  traits_.backward_reads_output = true;  // the ReLU's mask
  return true;
}

DType BatchNorm2dLayer::dtype() const {
  return storage_of(precision_.activation);
}

sdk::BatchNormShape BatchNorm2dLayer::shape_at(std::int64_t batch) const {
  return {batch * height_ * width_, channels_, eps_, relu_};
}

void BatchNorm2dLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  params_.clear();
  buffers_.clear();
  if (affine_) {
    params_.push_back(make_parameter("weight", sdk::Shape{channels_}, false));
    params_.push_back(make_parameter("bias", sdk::Shape{channels_}, false));
  }
  buffers_.push_back(make_buffer("running_mean", sdk::Shape{channels_}, 0.0f));
  buffers_.push_back(make_buffer("running_var", sdk::Shape{channels_}, 1.0f));
  save_mean_ = Tensor(backend, DType::fp32, sdk::Shape{channels_});
  save_var_ = Tensor(backend, DType::fp32, sdk::Shape{channels_});
  sum_dy_ = Tensor(backend, DType::fp32, sdk::Shape{channels_});
  sum_dy_xhat_ = Tensor(backend, DType::fp32, sdk::Shape{channels_});
  // Sized for the largest batch (a backend's workspace may grow with the batch).
  const std::int64_t max_batch = max_rows / (channels_ * height_);
  workspace_.allocate(backend, facets()
                                   .get<sdk::BatchNormFacet>("batchnorm_workspace_bytes")
                                   ->batchnorm_workspace_bytes(shape_at(max_batch), dtype()));
}

void BatchNorm2dLayer::init_parameters(std::uint64_t) {
  if (affine_) {
    backend_->fill(params_[0].master.view(), 1.0f);
    backend_->fill(params_[1].master.view(), 0.0f);
  }
  backend_->fill(buffers_[0].value.view(), 0.0f);
  backend_->fill(buffers_[1].value.view(), 1.0f);
}

TensorView BatchNorm2dLayer::gamma() const {
  return affine_ ? params_[0].master.view() : TensorView{};
}
TensorView BatchNorm2dLayer::beta() const {
  return affine_ ? params_[1].master.view() : TensorView{};
}
TensorView BatchNorm2dLayer::parameter_grad(std::size_t k) const {
  return affine_ && !params_[k].frozen ? params_[k].grad.view() : TensorView{};
}

std::vector<BackendNeed> BatchNorm2dLayer::synchronized_needs() const {
  const DType d = dtype();
  return {{sdk::BatchNormOp::batchnorm_statistics, {d}},
          {sdk::BatchNormOp::batchnorm_backward_reduce, {d}},
          {sdk::BatchNormOp::batchnorm_backward_elementwise, {d}}};
}

std::vector<BackendNeed> BatchNorm2dLayer::backend_needs(DType input) const {
  const DType d = dtype();
  std::vector<BackendNeed> needs = {{sdk::BatchNormOp::batchnorm_forward_training, {d}},
                                    {sdk::BatchNormOp::batchnorm_forward_inference, {d}},
                                    {sdk::BatchNormOp::batchnorm_backward, {d}}};
  if (synchronized())
    for (BackendNeed& need : synchronized_needs()) needs.push_back(std::move(need));
  if (input_.plain()) {
    needs.push_back({sdk::ConvolutionOp::to_channels_last, {input, d}});
    needs.push_back(
        {sdk::ConvolutionOp::to_channels_first, {d, storage_of(precision_.activation_grad)}});
  }
  return needs;
}

void BatchNorm2dLayer::forward(TensorView x, std::int64_t rows) {
  const std::int64_t batch = rows / (channels_ * height_);
  const sdk::BatchNormShape shape = shape_at(batch);
  x_cl_ = input_.forward(backend_, facets(), x, batch, dtype());
  if (fused()) return;  // the add that reads this output runs it (forward_with_residual)
  forward_into_output({x_cl_.data, x_cl_.dtype, sdk::Shape{shape.rows, channels_}}, rows, shape);
}

bool BatchNorm2dLayer::forward_with_residual(TensorView residual, bool relu, TensorView y,
                                             std::int64_t rows) {
  const std::int64_t batch = rows / (channels_ * height_);
  sdk::BatchNormShape shape = shape_at(batch);
  const sdk::Shape flat{shape.rows, channels_};
  const TensorView xs{x_cl_.data, x_cl_.dtype, flat};
  const DType d = dtype();
  if (residual.dtype != d || y.dtype != d) {
    log_unfused_once(name(), "the residual is " + std::string(sdk::dtype_name(residual.dtype)) +
                                 " and the sum " + std::string(sdk::dtype_name(y.dtype)) +
                                 " where batch norm writes " + std::string(sdk::dtype_name(d)));
    forward_into_output(xs, rows, shape);
    return false;
  }
  shape.relu = relu;
  sdk::BatchNormAddArgs a;
  a.x = xs;
  a.residual = {residual.data, residual.dtype, flat};
  a.gamma = gamma();
  a.beta = beta();
  a.shape = shape;
  a.training = training();
  a.momentum = momentum_;
  a.y = {y.data, y.dtype, flat};
  a.save_mean = save_mean_.view();
  a.save_var = save_var_.view();
  a.running_mean = buffers_[0].value.view();
  a.running_var = buffers_[1].value.view();
  facets().call(sdk::BatchNormOp::batchnorm_add_forward)->batchnorm_add_forward(a);
  return true;
}

void BatchNorm2dLayer::forward_into_output(TensorView xs, std::int64_t rows,
                                           const sdk::BatchNormShape& shape) {
  materialise_output();  // deferred while fused: made the first time the op runs unfused
  const TensorView out = output(rows);
  const TensorView y{out.data, out.dtype, sdk::Shape{shape.rows, channels_}};
  if (training() && synchronized())
    forward_synchronized(xs, y, shape);
  else if (training())
    facets()
        .call(sdk::BatchNormOp::batchnorm_forward_training)
        ->batchnorm_forward_training(xs, gamma(), beta(), shape, momentum_, y, save_mean_.view(),
                                     save_var_.view(), buffers_[0].value.view(),
                                     buffers_[1].value.view(), workspace_.view());
  else
    facets()
        .call(sdk::BatchNormOp::batchnorm_forward_inference)
        ->batchnorm_forward_inference(xs, gamma(), beta(), buffers_[0].value.view(),
                                      buffers_[1].value.view(), shape, y);
}

void BatchNorm2dLayer::backward(TensorView, TensorView dy, TensorView dx, std::int64_t rows) {
  const std::int64_t batch = rows / (channels_ * height_);
  const sdk::BatchNormShape shape = shape_at(batch);
  const sdk::Shape flat{shape.rows, channels_};
  const DType d = dtype();
  const TensorView dys = as_dtype({dy.data, dy.dtype, flat}, d, dy_scratch_);
  const TensorView out = output(rows);
  // The facet writes dx in x's dtype, channels-last; anything else goes through a scratch.
  const bool direct = !dx.empty() && dx.dtype == d && !input_.plain();
  const TensorView target{
      direct ? dx.data : scratch_tensor(dx_scratch_, d, sdk::Shape{flat.numel()}).data, d, flat};
  bool accumulate = false;
  if (affine_)
    // weight and bias are written together, so they start a step together; dx needs the sums
    // either way, so a frozen one only goes unwritten.
    for (ModelParameter& p : params_)
      if (!p.frozen) accumulate = p.take_grad_beta() != 0.0f;
  // y is read only for the ReLU's mask; without one it may never have been written (fused).
  const TensorView y = relu_ ? TensorView{out.data, out.dtype, flat} : TensorView{};
  if (synchronized())
    backward_synchronized(dys, {x_cl_.data, x_cl_.dtype, flat}, y, shape, target, accumulate);
  else
    facets()
        .call(sdk::BatchNormOp::batchnorm_backward)
        ->batchnorm_backward(dys, {x_cl_.data, x_cl_.dtype, flat}, y, gamma(), save_mean_.view(),
                             save_var_.view(), shape, workspace_.view(), target, parameter_grad(0),
                             parameter_grad(1), accumulate);
  if (dx.empty() || direct) return;
  if (input_.plain())  // the permute rounds into dx's dtype once
    input_.finish_grad(facets(), target, dx);
  else
    backend_->cast(target, {dx.data, dx.dtype, flat});
}

// --- Synchronized batch norm ------------------------------------------------------------------

namespace {

std::vector<float> to_host_floats(sdk::DeviceBackend& b, TensorView v) {
  std::vector<float> h(static_cast<std::size_t>(v.numel()));
  b.copy_to_host(h.data(), v);
  return h;
}

}  // namespace

void BatchNorm2dLayer::forward_synchronized(TensorView xs, TensorView y,
                                            const sdk::BatchNormShape& s) {
  facets()
      .call(sdk::BatchNormOp::batchnorm_statistics)
      ->batchnorm_statistics(xs, s, save_mean_.view(), save_var_.view());
  const auto c = static_cast<std::size_t>(channels_);
  const std::vector<float> mean = to_host_floats(*backend_, save_mean_.view());
  const std::vector<float> var = to_host_floats(*backend_, save_var_.view());
  // Σx = n·mean and Σx² = n·(var + mean²) per channel, and n, summed over the ranks in double:
  // the global variance E[x²] − mean² then loses only what the ranks' fp32 statistics carry.
  const auto n = static_cast<double>(s.rows);
  std::vector<double> sums(2 * c + 1);
  for (std::size_t j = 0; j < c; ++j) {
    const double m = mean[j];
    sums[j] = n * m;
    sums[c + j] = n * (static_cast<double>(var[j]) + m * m);
  }
  sums[2 * c] = n;
  reducer_(sums);
  global_rows_ = sums[2 * c];
  std::vector<float> gmean(c), gvar(c);
  std::vector<double> unbiased(c);
  for (std::size_t j = 0; j < c; ++j) {
    const double m = sums[j] / global_rows_;
    const double v = std::max(0.0, sums[c + j] / global_rows_ - m * m);
    gmean[j] = static_cast<float>(m);
    gvar[j] = static_cast<float>(v);
    unbiased[j] = global_rows_ > 1.0 ? v * global_rows_ / (global_rows_ - 1.0) : v;
  }
  backend_->copy_from_host(save_mean_.view(), gmean.data());
  backend_->copy_from_host(save_var_.view(), gvar.data());
  facets()
      .call(sdk::BatchNormOp::batchnorm_forward_inference)
      ->batchnorm_forward_inference(xs, gamma(), beta(), save_mean_.view(), save_var_.view(), s, y);
  // PyTorch's running statistics, from the global batch: r = (1 − m)·r + m·s, in double.
  const TensorView rm = buffers_[0].value.view(), rv = buffers_[1].value.view();
  std::vector<float> r_mean = to_host_floats(*backend_, rm), r_var = to_host_floats(*backend_, rv);
  const double k = momentum_;
  for (std::size_t j = 0; j < c; ++j) {
    r_mean[j] = static_cast<float>((1.0 - k) * r_mean[j] + k * static_cast<double>(gmean[j]));
    r_var[j] = static_cast<float>((1.0 - k) * r_var[j] + k * unbiased[j]);
  }
  backend_->copy_from_host(rm, r_mean.data());
  backend_->copy_from_host(rv, r_var.data());
}

void BatchNorm2dLayer::backward_synchronized(TensorView dys, TensorView xs, TensorView y,
                                             const sdk::BatchNormShape& s, TensorView dx,
                                             bool accumulate) {
  const TensorView mask = s.relu ? y : TensorView{};
  facets()
      .call(sdk::BatchNormOp::batchnorm_backward_reduce)
      ->batchnorm_backward_reduce(dys, xs, mask, save_mean_.view(), save_var_.view(), s,
                                  sum_dy_.view(), sum_dy_xhat_.view());
  const auto c = static_cast<std::size_t>(channels_);
  const std::vector<float> sum_dy = to_host_floats(*backend_, sum_dy_.view());
  const std::vector<float> sum_dy_xhat = to_host_floats(*backend_, sum_dy_xhat_.view());
  // This rank's sums are its dbeta and dgamma: data parallel averages those afterwards.
  for (std::size_t k = 0; k < 2; ++k) {
    const TensorView grad = parameter_grad(k);
    if (grad.empty()) continue;
    std::vector<float> sums = k == 0 ? sum_dy_xhat : sum_dy;
    if (accumulate) {
      const std::vector<float> before = to_host_floats(*backend_, grad);
      for (std::size_t j = 0; j < c; ++j) sums[j] += before[j];
    }
    backend_->copy_from_host(grad, sums.data());
  }
  std::vector<double> sums(2 * c);
  for (std::size_t j = 0; j < c; ++j) {
    sums[j] = sum_dy[j];
    sums[c + j] = sum_dy_xhat[j];
  }
  reducer_(sums);
  std::vector<float> mean_dy(c), mean_dy_xhat(c);
  for (std::size_t j = 0; j < c; ++j) {
    mean_dy[j] = static_cast<float>(sums[j] / global_rows_);
    mean_dy_xhat[j] = static_cast<float>(sums[c + j] / global_rows_);
  }
  backend_->copy_from_host(sum_dy_.view(), mean_dy.data());
  backend_->copy_from_host(sum_dy_xhat_.view(), mean_dy_xhat.data());
  facets()
      .call(sdk::BatchNormOp::batchnorm_backward_elementwise)
      ->batchnorm_backward_elementwise(dys, xs, mask, gamma(), save_mean_.view(), save_var_.view(),
                                       sum_dy_.view(), sum_dy_xhat_.view(), s, dx);
}

// --- Definition ----------------------------------------------------------------------------------

OpDefinition batchnorm2d_op() {
  OpDefinition op;
  op.type = "batchnorm2d";
  op.summary = "batch norm per channel of [C, H, W] images (FP32 statistics, running stats)";
  op.has_parameters = true;
  op.reads_images = true;
  op.schema = [] {
    return sdk::OptionSchema{
        sdk::OptionSpec::number("eps", 1e-5, "added to the variance").greater_than(0.0),
        sdk::OptionSpec::number("momentum", 0.1,
                                "running statistics: r = (1 - momentum) r + momentum · batch")
            .at_least(0.0)
            .at_most(1.0),
        sdk::OptionSpec::boolean("affine", true, "learn a scale (weight) and shift (bias)")};
  };
  op.build = [](const OpNode& node) {
    const ops::ImageIn in = ops::image_input(node, "batchnorm2d");
    auto layer =
        std::make_unique<BatchNorm2dLayer>(node.name, in.channels, in.height, in.width,
                                           static_cast<float>(node.options.get_double("eps")),
                                           static_cast<float>(node.options.get_double("momentum")),
                                           node.options.get_bool("affine"), in.plain);
    return BuiltOp{std::move(layer), node.inputs[0], TensorLayout::channels_last};
  };
  return op;
}

}  // namespace mixtrain::core
