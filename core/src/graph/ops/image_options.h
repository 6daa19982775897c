// What the image ops (conv2d, pooling) share at build time: reading their [C, H, W] input and
// their window options (kernel, stride, padding, dilation), with PyTorch's rules and plan-time
// errors naming the key.
//
// Options: `kernel`, `stride`, `padding`, `dilation` are square (one integer); `kernel_h` /
// `kernel_w`, `stride_h` / `stride_w`, `padding_h` / `padding_w`, `dilation_h` / `dilation_w`
// override one side (0, or -1 for padding: as the square value).
#pragma once

#include <string>

#include "graph/ops/op_registry.h"
#include "graph/ops/op_support.h"

namespace mixtrain::core::ops {

struct ImageIn {
  std::int64_t channels = 1, height = 1, width = 1;
  bool plain = false;  // the input is plain [C, H, W] (the batch), not channels-last
};

// The node's one input as an image; OpSpecError unless it is [C, H, W].
inline ImageIn image_input(const OpNode& node, const std::string& op) {
  const PerSampleShape& in = node.inputs[0];
  if (in.size() != 3)
    throw OpSpecError("", "a " + op + " reads images [C, H, W], got " + shape_text(in),
                      "feed it an image data source (idx, cifar10, npy [N, C, H, W], "
                      "synthetic images) or a reshape to [C, H, W]");
  return {in[0], in[1], in[2], node.layouts[0] == TensorLayout::plain};
}

inline void add_window_options(sdk::OptionSchema& schema, bool with_dilation,
                               bool default_stride_is_kernel) {
  using sdk::OptionSpec;
  const double max = static_cast<double>(kMaxDim);
  schema.push_back(OptionSpec::required("kernel", sdk::OptionType::integer, "window size (square)")
                       .at_least(1)
                       .at_most(max));
  schema.push_back(OptionSpec::integer("kernel_h", 0, "window height (0: kernel)").at_least(0));
  schema.push_back(OptionSpec::integer("kernel_w", 0, "window width (0: kernel)").at_least(0));
  schema.push_back(OptionSpec::integer("stride", default_stride_is_kernel ? 0 : 1,
                                       default_stride_is_kernel ? "step (0: the kernel size)"
                                                                : "step between windows")
                       .at_least(default_stride_is_kernel ? 0 : 1)
                       .at_most(max));
  schema.push_back(OptionSpec::integer("stride_h", 0, "vertical step (0: stride)").at_least(0));
  schema.push_back(OptionSpec::integer("stride_w", 0, "horizontal step (0: stride)").at_least(0));
  schema.push_back(
      OptionSpec::integer("padding", 0, "zeros added on each side").at_least(0).at_most(max));
  schema.push_back(
      OptionSpec::integer("padding_h", -1, "zeros above and below (-1: padding)").at_least(-1));
  schema.push_back(
      OptionSpec::integer("padding_w", -1, "zeros left and right (-1: padding)").at_least(-1));
  if (with_dilation) {
    schema.push_back(
        OptionSpec::integer("dilation", 1, "spacing of the kernel taps").at_least(1).at_most(max));
    schema.push_back(
        OptionSpec::integer("dilation_h", 0, "vertical spacing (0: dilation)").at_least(0));
    schema.push_back(
        OptionSpec::integer("dilation_w", 0, "horizontal spacing (0: dilation)").at_least(0));
  }
}

struct Window {
  std::int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  std::int64_t dilation_h = 1, dilation_w = 1;
};

inline Window read_window(const OpNode& node, bool default_stride_is_kernel, bool with_dilation) {
  const sdk::Options& o = node.options;
  auto side = [&](const char* key, std::int64_t square, std::int64_t unset) {
    const std::int64_t v = o.get_int(key);
    return v == unset ? square : v;
  };
  Window w{};
  const std::int64_t k = o.get_int("kernel");
  w.kernel_h = side("kernel_h", k, 0);
  w.kernel_w = side("kernel_w", k, 0);
  std::int64_t s = o.get_int("stride");
  w.stride_h = side("stride_h", s == 0 && default_stride_is_kernel ? w.kernel_h : s, 0);
  w.stride_w = side("stride_w", s == 0 && default_stride_is_kernel ? w.kernel_w : s, 0);
  const std::int64_t p = o.get_int("padding");
  w.pad_h = side("padding_h", p, -1);
  w.pad_w = side("padding_w", p, -1);
  if (with_dilation) {
    const std::int64_t d = o.get_int("dilation");
    w.dilation_h = side("dilation_h", d, 0);
    w.dilation_w = side("dilation_w", d, 0);
  }
  return w;
}

// Copies a window's sizes into a convolution's or pool's geometry (the same field names).
template <class Geometry>
void apply_window(const Window& w, Geometry& g) {
  g.kernel_h = w.kernel_h;
  g.kernel_w = w.kernel_w;
  g.stride_h = w.stride_h;
  g.stride_w = w.stride_w;
  g.pad_h = w.pad_h;
  g.pad_w = w.pad_w;
}

// A (dilated) kernel must fit the padded input: PyTorch's "Kernel size can't be greater than
// actual input size".
inline void check_window_fits(const ImageIn& in, std::int64_t kh, std::int64_t kw, std::int64_t ph,
                              std::int64_t pw, std::int64_t dh, std::int64_t dw) {
  const std::int64_t eh = dh * (kh - 1) + 1, ew = dw * (kw - 1) + 1;
  if (eh > in.height + 2 * ph || ew > in.width + 2 * pw)
    throw OpSpecError("kernel",
                      "the " + std::to_string(eh) + "×" + std::to_string(ew) +
                          " kernel (dilated) is larger than its padded input " +
                          std::to_string(in.height + 2 * ph) + "×" +
                          std::to_string(in.width + 2 * pw) + " (input [" +
                          std::to_string(in.channels) + ", " + std::to_string(in.height) + ", " +
                          std::to_string(in.width) + "])",
                      "use a smaller kernel or more padding, or fewer downsampling steps before "
                      "this node");
}

}  // namespace mixtrain::core::ops
