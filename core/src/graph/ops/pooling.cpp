#include "graph/ops/pooling.h"

#include <algorithm>

#include "graph/ops/image_options.h"
#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"

namespace mixtrain::core {

using ops::storage_of;
using sdk::DType;
using sdk::TensorView;

Pool2dLayer::Pool2dLayer(std::string name, std::string type, const sdk::Pool2dGeometry& geometry,
                         bool global, bool plain_input)
    : Layer(std::move(name), std::move(type), geometry.width,
            global ? geometry.channels : geometry.out_width()),
      geometry_(geometry),
      global_(global) {
  input_.configure(plain_input, geometry.channels, geometry.height, geometry.width);
  // One compare or add per window element and output.
  const std::int64_t window = geometry_.kernel_h * geometry_.kernel_w;
  traits_.forward_flops_per_row = global_ ? window : geometry_.out_width() * window;
  traits_.backward_reads_inputs = geometry_.kind == sdk::PoolKind::max;
  traits_.backward_reads_output = geometry_.kind == sdk::PoolKind::max;
}

DType Pool2dLayer::dtype() const {
  return storage_of(precision_.activation);
}

sdk::Pool2dGeometry Pool2dLayer::at_rows(std::int64_t rows) const {
  sdk::Pool2dGeometry g = geometry_;
  // Output rows per sample: 1 for the global pool's [C], else C·OH of [C, OH, OW].
  g.batch = global_ ? rows : rows / (g.channels * g.out_height());
  return g;
}

void Pool2dLayer::allocate(const std::shared_ptr<sdk::DeviceBackend>& backend,
                           std::int64_t max_rows) {
  Layer::allocate(backend, max_rows);
  if (geometry_.kind != sdk::PoolKind::max) {
    workspace_.allocate(backend, 0);
    return;
  }
  const sdk::Pool2dGeometry g = at_rows(max_rows);
  workspace_.allocate(backend, facets()
                                   .get<sdk::ConvolutionFacet>("pool2d_workspace_bytes")
                                   ->pool2d_workspace_bytes(g, dtype()));
}

std::vector<BackendNeed> Pool2dLayer::backend_needs(DType input) const {
  const DType d = dtype();
  const DType grad = storage_of(precision_.activation_grad);
  std::vector<BackendNeed> needs = {{sdk::ConvolutionOp::pool2d_forward, {d, d}},
                                    {sdk::ConvolutionOp::pool2d_backward, {grad, grad}}};
  if (input_.plain()) {
    needs.push_back({sdk::ConvolutionOp::to_channels_last, {input, d}});
    needs.push_back({sdk::ConvolutionOp::to_channels_first, {grad, grad}});
  }
  return needs;
}

void Pool2dLayer::forward(TensorView x, std::int64_t rows) {
  const sdk::Pool2dGeometry g = at_rows(rows);
  x_cl_ = input_.forward(backend_, facets(), x, g.batch, dtype());
  const TensorView out = output(rows);
  const TensorView y{out.data, out.dtype,
                     sdk::Shape{g.batch, g.out_height(), g.out_width(), g.channels}};
  facets()
      .call(sdk::ConvolutionOp::pool2d_forward)
      ->pool2d_forward(g, x_cl_, y, training() ? workspace_.view() : TensorView{});
}

void Pool2dLayer::backward(TensorView, TensorView dy, TensorView dx, std::int64_t rows) {
  if (dx.empty()) return;
  const sdk::Pool2dGeometry g = at_rows(rows);
  const sdk::Shape y_shape{g.batch, g.out_height(), g.out_width(), g.channels};
  const sdk::Shape x_shape{g.batch, g.height, g.width, g.channels};
  const DType grad = dx.dtype;
  // dy in dx's dtype, or as it is where the facet reads an fp32 dy into a 16-bit dx (the sum of
  // several readers' gradients, ResNet's max pool: no cast into a scratch of its own, 49 MiB at
  // ResNet-50's shape, and one rounding fewer). supports() is a query, not a call: find(), so the
  // profiler records no entry for it.
  const sdk::DType mixed[] = {dy.dtype, grad};
  const sdk::ConvolutionFacet* conv = facets().find<sdk::ConvolutionFacet>();
  const bool reads_dy = dy.dtype != grad && conv != nullptr &&
                        conv->supports(sdk::ConvolutionOp::pool2d_backward, mixed);
  const TensorView dys = reads_dy ? TensorView{dy.data, dy.dtype, y_shape}
                                  : as_dtype({dy.data, dy.dtype, y_shape}, grad, dy_scratch_);
  const TensorView out = output(rows);
  const TensorView target = input_.grad_target(backend_, dx, g.batch);
  facets()
      .call(sdk::ConvolutionOp::pool2d_backward)
      ->pool2d_backward(g, dys, x_cl_, {out.data, out.dtype, y_shape}, workspace_.view(),
                        {target.data, grad, x_shape});
  input_.finish_grad(facets(), target, dx);
}

// --- Definitions ---------------------------------------------------------------------------------

namespace {
BuiltOp build_pool(const OpNode& node, const char* type, sdk::PoolKind kind) {
  const ops::ImageIn in = ops::image_input(node, type);
  const ops::Window win =
      ops::read_window(node, /*default_stride_is_kernel=*/true, /*with_dilation=*/false);
  sdk::Pool2dGeometry g;
  g.kind = kind;
  g.channels = in.channels;
  g.height = in.height;
  g.width = in.width;
  ops::apply_window(win, g);
  if (kind == sdk::PoolKind::average)
    g.count_include_pad = node.options.get_bool("count_include_pad");
  if (2 * g.pad_h > g.kernel_h || 2 * g.pad_w > g.kernel_w)
    throw OpSpecError("padding",
                      "padding " + std::to_string(g.pad_h) + "×" + std::to_string(g.pad_w) +
                          " is more than half the " + std::to_string(g.kernel_h) + "×" +
                          std::to_string(g.kernel_w) + " kernel",
                      "PyTorch's rule: padding at most kernel / 2 (a window must see the image)");
  ops::check_window_fits(in, g.kernel_h, g.kernel_w, g.pad_h, g.pad_w, 1, 1);
  return BuiltOp{std::make_unique<Pool2dLayer>(node.name, type, g, false, in.plain),
                 PerSampleShape{g.channels, g.out_height(), g.out_width()},
                 TensorLayout::channels_last};
}
}  // namespace

OpDefinition maxpool2d_op() {
  OpDefinition op;
  op.type = "maxpool2d";
  op.summary = "maximum over windows of [C, H, W] images (PyTorch's MaxPool2d)";
  op.reads_images = true;
  op.schema = [] {
    sdk::OptionSchema schema;
    ops::add_window_options(schema, /*with_dilation=*/false, /*default_stride_is_kernel=*/true);
    return schema;
  };
  op.build = [](const OpNode& node) { return build_pool(node, "maxpool2d", sdk::PoolKind::max); };
  return op;
}

OpDefinition avgpool2d_op() {
  OpDefinition op;
  op.type = "avgpool2d";
  op.summary = "mean over windows of [C, H, W] images (PyTorch's AvgPool2d)";
  op.reads_images = true;
  op.schema = [] {
    sdk::OptionSchema schema;
    ops::add_window_options(schema, /*with_dilation=*/false, /*default_stride_is_kernel=*/true);
    schema.push_back(sdk::OptionSpec::boolean(
        "count_include_pad", true, "divide by the whole window, padding included (PyTorch's)"));
    return schema;
  };
  op.build = [](const OpNode& node) {
    return build_pool(node, "avgpool2d", sdk::PoolKind::average);
  };
  return op;
}

OpDefinition global_avgpool_op() {
  OpDefinition op;
  op.type = "global_avgpool";
  op.summary = "mean over H and W of [C, H, W] images → [C] (AdaptiveAvgPool2d(1) + flatten)";
  op.reads_images = true;
  op.build = [](const OpNode& node) {
    const ops::ImageIn in = ops::image_input(node, "global_avgpool");
    sdk::Pool2dGeometry g;
    g.kind = sdk::PoolKind::average;
    g.channels = in.channels;
    g.height = in.height;
    g.width = in.width;
    g.kernel_h = g.stride_h = in.height;
    g.kernel_w = g.stride_w = in.width;
    return BuiltOp{std::make_unique<Pool2dLayer>(node.name, "global_avgpool", g, true, in.plain),
                   PerSampleShape{in.channels}, TensorLayout::plain};
  };
  return op;
}

}  // namespace mixtrain::core
