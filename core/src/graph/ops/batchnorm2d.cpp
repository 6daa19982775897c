#include "graph/ops/batchnorm2d.h"

#include "graph/ops/image_options.h"
#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"

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
  // Sized for the largest batch (a backend's workspace may grow with the batch).
  const std::int64_t max_batch = max_rows / (channels_ * height_);
  workspace_.allocate(
      backend, batch_norm_of(*backend).batchnorm_workspace_bytes(shape_at(max_batch), dtype()));
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

std::vector<BackendNeed> BatchNorm2dLayer::backend_needs(DType input) const {
  const DType d = dtype();
  std::vector<BackendNeed> needs = {{sdk::BatchNormOp::batchnorm_forward_training, {d}},
                                    {sdk::BatchNormOp::batchnorm_forward_inference, {d}},
                                    {sdk::BatchNormOp::batchnorm_backward, {d}}};
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
  x_cl_ = input_.forward(backend_, x, batch, dtype());
  const TensorView xs{x_cl_.data, x_cl_.dtype, sdk::Shape{shape.rows, channels_}};
  const TensorView out = output(rows);
  const TensorView y{out.data, out.dtype, sdk::Shape{shape.rows, channels_}};
  auto& norm = batch_norm_of(*backend_);
  if (training())
    norm.batchnorm_forward_training(xs, gamma(), beta(), shape, momentum_, y, save_mean_.view(),
                                    save_var_.view(), buffers_[0].value.view(),
                                    buffers_[1].value.view(), workspace_.view());
  else
    norm.batchnorm_forward_inference(xs, gamma(), beta(), buffers_[0].value.view(),
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
  if (!direct && (dx_scratch_.empty() || dx_scratch_.shape().numel() < flat.numel()))
    dx_scratch_ = Tensor(backend_, d, sdk::Shape{flat.numel()});
  const TensorView target{direct ? dx.data : dx_scratch_.view().data, d, flat};
  bool accumulate = false;
  if (affine_) {
    // weight and bias are written together, so they start a step together.
    accumulate = params_[0].take_grad_beta() != 0.0f;
    params_[1].take_grad_beta();
  }
  batch_norm_of(*backend_).batchnorm_backward(
      dys, {x_cl_.data, x_cl_.dtype, flat}, {out.data, out.dtype, flat}, gamma(), save_mean_.view(),
      save_var_.view(), shape, workspace_.view(), target,
      affine_ ? params_[0].grad.view() : TensorView{},
      affine_ ? params_[1].grad.view() : TensorView{}, accumulate);
  if (dx.empty() || direct) return;
  if (input_.plain())  // the permute rounds into dx's dtype once
    input_.finish_grad(backend_, target, dx);
  else
    backend_->cast(target, {dx.data, dx.dtype, flat});
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
