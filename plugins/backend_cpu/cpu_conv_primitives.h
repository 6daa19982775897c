// oneDNN's convolution primitives for the CPU backend's conv2d ops (cpu_convolution.cpp).
//
// Contract
// - Activations are the caller's nhwc ({N, C, H, W} dims, channels-last memory); weights PyTorch's
//   [O, C/g, KH, KW] (oihw), fp32 or bf16 as the route decides; weight gradients fp32 OIHW.
// - forward_entry / backward_data_entry / backward_weights_entry return the cached entry of one
//   (direction, method, geometry, dtypes, bias): the primitive, the weights' reorder into its
//   layout, and each activation's layout. A direct entry passes nhwc as it is; a blocked-direct
//   or Winograd entry asks oneDNN for its blocked layout and carries the reorders (none where the
//   blocked layout is nhwc byte for byte: one channel block holding every channel).
// - A blocked-direct or Winograd key oneDNN cannot serve (creation fails, or only a reference
//   kernel) gives an entry with usable = false and the reason in `implementation`: the caller
//   then runs direct. A direct key that oneDNN cannot create throws BackendError naming the
//   geometry.
// - A weight gradient never runs oneDNN 2.6's jit_1x1 kernels where they overrun their buffer
//   (a strided 1x1 convolution with fewer than 16 input channels per group): it takes oneDNN's
//   next implementation, or throws BackendError when there is none.
// - to_primitive / primitive_output / from_primitive move an activation into and out of the
//   entry's layout through the cache's scratch `slot` (no copy when no reorder is needed).
// - Entries live in the PrimitiveCache as long as the backend; not thread-safe (one backend, one
//   stream).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "cpu_primitive_cache.h"
#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cpu {

// How a convolution runs: oneDNN's direct convolution on the caller's nhwc activations as they
// are; the direct convolution in oneDNN's own blocked activation layout (nChw8c with AVX2),
// reordered around the call; or Winograd F(4,3), blocked too (cpu_conv_algorithm.h decides).
enum class ConvMethod { direct, direct_blocked, winograd };

struct WeightsReorder {
  dnnl::memory::desc plain_md, blocked_md;
  std::optional<dnnl::reorder> reorder;
};

// An activation between the caller's nhwc and the layout the primitive was created with: no
// reorder when they agree (every direct convolution) or are the same bytes, else one cached
// reorder, nhwc -> the primitive's layout for an input and back for an output.
struct ActivationLayout {
  dnnl::memory::desc plain_md, primitive_md;
  std::optional<dnnl::reorder> reorder;
};

// Every entry: `usable` is false only for a blocked-direct or Winograd key oneDNN has no JIT kernel
// for (creation failed, or a reference kernel); `implementation` then says why, and the op runs
// direct.
struct ForwardEntry {
  dnnl::convolution_forward primitive;
  ActivationLayout src, dst;
  dnnl::memory::desc bias_md;
  WeightsReorder weights;
  std::string implementation;
  bool usable = true;
};

struct BackwardDataEntry {
  dnnl::convolution_backward_data primitive;
  ActivationLayout diff_dst, diff_src;
  WeightsReorder weights;
  std::string implementation;
  bool usable = true;
};

struct BackwardWeightsEntry {
  dnnl::convolution_backward_weights primitive;
  ActivationLayout src, diff_dst;
  dnnl::memory::desc diff_weights_md, plain_md, diff_bias_md;
  dnnl::reorder to_plain, add_to_plain;  // the primitive's layout -> OIHW fp32: =, +=
  bool plain = false;                    // the primitive writes OIHW itself
  std::string implementation;
  bool usable = true;
};

// The forward primitive descriptor of a geometry (also what the backward ones are hinted with).
dnnl::convolution_forward::primitive_desc forward_pd(const dnnl::engine& engine,
                                                     const sdk::Conv2dGeometry& g,
                                                     dnnl::memory::data_type dt,
                                                     dnnl::memory::data_type dst_dt, bool bias,
                                                     ConvMethod method);

ForwardEntry& forward_entry(PrimitiveCache& cache, std::string_view op,
                            const sdk::Conv2dGeometry& g, dnnl::memory::data_type dt,
                            dnnl::memory::data_type dst_dt, bool bias,
                            ConvMethod method = ConvMethod::direct);
BackwardDataEntry& backward_data_entry(PrimitiveCache& cache, std::string_view op,
                                       const sdk::Conv2dGeometry& g, dnnl::memory::data_type dt,
                                       dnnl::memory::data_type diff_src_dt,
                                       ConvMethod method = ConvMethod::direct);
BackwardWeightsEntry& backward_weights_entry(PrimitiveCache& cache, std::string_view op,
                                             const sdk::Conv2dGeometry& g,
                                             dnnl::memory::data_type dt, bool bias,
                                             ConvMethod method = ConvMethod::direct);

const void* to_primitive(PrimitiveCache& cache, const ActivationLayout& a, const void* data,
                         PrimitiveCache::Slot slot);
void* primitive_output(PrimitiveCache& cache, const ActivationLayout& a, void* dst,
                       PrimitiveCache::Slot slot);
void from_primitive(PrimitiveCache& cache, const ActivationLayout& a, const void* written,
                    void* dst);

}  // namespace mixtrain::backend_cpu
