// The CPU backend's rule for which convolutions run as one GEMM through its GEMM engine instead of
// oneDNN's convolution (the backend option `conv_gemm`; cpu_conv_gemm.h computes them,
// cpu_convolution.cpp asks CpuContext, which applies this rule). The other static rules (the
// blocked layout, Winograd) are cpu_conv_algorithm.h's.
//
// Weight gradients (cpu_conv_gemm.h): a convolution's dw [O, KH·KW·C] is dyᵀ [O, M] ·
// cols [M, KH·KW·C] over its M = N·OH·OW output pixels, cols being x itself (1x1, stride 1, no
// padding) or x's pixels gathered first (im2col). The data gradient of an unpadded 1x1
// convolution, plain or accumulating (conv2d_backward_data_accumulate into an fp32 dx, the
// gradient sum of a ResNet block's input): at stride 1 dx [M, C] (+)= dy [M, O] · w [O, C], beta
// = 1 when accumulating, in place of the convolution (into fp32 scratch and an add when
// accumulating); at a larger stride the product [N·OH·OW, C] goes to scratch and is written to
// every stride-th pixel of dx (the others zero, or left as they are when accumulating). The
// forward of an unpadded 1x1 convolution: y [M, O] = cols [M, C] · wᵀ (+ bias), cols being x
// itself at stride 1, else its every stride-th pixel gathered.
//
// Where each pays, measured on an Intel Xeon with AMX-BF16 with the operands `auto` takes (bf16,
// native): there oneDNN 2.6's convolutions are its jit/brgconv avx512_core_amx_bf16 kernels and
// its bf16 matmul is brg:avx512_core_amx_bf16.
//   Weight gradients, on ResNet-50's shapes (bench/cnn/onednn_wgrad_gemm.cpp: 2 threads, batch 8,
//   bf16, fp32 dw, best of 7; ms):
//     C->O        HxW   kernel/stride   convolution   gather + GEMM
//     64->256      56     1x1/1            1.62          1.04
//     256->64      56     1x1/1            1.93          1.02
//     256->512     56     1x1/2            3.86          0.16 + 0.96
//     512->128     28     1x1/1            1.16          0.58
//     128->512     28     1x1/1            1.07          0.61
//     512->1024    28     1x1/2            3.61          0.05 + 1.04
//     1024->256    14     1x1/1            1.54          0.52
//     1024->2048   14     1x1/2            6.08          0.01 + 1.18
//     2048->512     7     1x1/1            2.60          0.58
//     512->2048     7     1x1/1            2.59          0.55
//     256->256     28     3x3/2            2.35          0.19 + 1.12
//     512->512     14     3x3/2            4.88          0.07 + 1.10
//     512->512      7     3x3/1            2.45          0.04 + 1.11
//     256->256     14     3x3/1            1.31          0.15 + 1.14
//     128->128     56     3x3/2            1.63          0.42 + 1.59
//     128->128     28     3x3/1            0.90          0.32 + 1.48
//     64->64       56     3x3/1            0.90          0.70 + 3.13
//     3->64       224     7x7/2            4.58          11.0 + 3.65
//   So every 1x1 (1.6-5.1x) and the wide 3x3s (1.8-4.2x: C and O at least 256 and a stride of 2,
//   or at least 512); the 3x3 at 256 channels and stride 1 tied, and narrower ones and the stem
//   lost (their columns are 9-49 copies of x). A 3x3's columns in (kh, kw, c) order make its
//   product OHWI, reordered into OIHW once more (the convolution's weight gradient is reordered
//   from its own layout too); see the column order below. On the same CPU the fp32 1x1s
//   (jit_1x1:avx512_core against brg:avx512_core) measured 0.86-1.36x either way, so fp32, tf32,
//   fp16, fp8 and emulated bf16 keep the convolution; other CPUs were not measured. (Session 73
//   measured fp32 again inside whole ResNet-50 steps, below: there the small-map 1x1s do pay.)
//   Data gradients: the accumulating 1x1 one saved about 10 ms of ResNet-50's 320 ms bf16 step at
//   batch 8 there (its 16 block inputs' sums without a bf16 contribution and an axpy; RESULTS.md,
//   session 63). The other 1x1 data gradients, measured on the same CPU in session 65
//   (bench/cnn/onednn_dgrad_gemm.cpp: oneDNN's backward-data convolution,
//   jit:avx512_core_amx_bf16, against the matmul and, past stride 1, the write of its rows to
//   every stride-th pixel; 2 threads, batch 8, filled operands; ms):
//     C->O        HxW  stride  dx     convolution   GEMM (+ strided write)
//     64->256      56     1    fp32      1.03          0.74
//     256->64      56     1    fp32      1.38          1.07
//     128->512     28     1    fp32      0.66          0.54
//     256->1024    14     1    fp32      0.58          0.54
//     512->2048     7     1    fp32      0.91          0.68
//     256->512     56     2    fp32      3.27          1.02 + 0.51
//     512->1024    28     2    fp32      2.95          0.99 + 0.20
//     1024->2048   14     2    fp32      3.34          1.47 + 0.07
//     256->512     56     2    bf16      2.68          0.99 + 0.51
//   ResNet-50's Bottleneck conv3 (stride 1) and its downsample shortcut (stride 2, accumulating
//   into the block input's sum) take these.
//   Forwards of an unpadded 1x1 convolution (session 67, bench/cnn/onednn_fprop_gemm.cpp:
//   oneDNN's forward convolution, brgconv_1x1:avx512_core_amx_bf16, with the reorder of the
//   caller's OIHW weights into its blocked layout that every call makes (the weights change every
//   step), against the matmul reading w [O, C] transposed where it is, past stride 1 after a
//   gather of the strided pixels; 2 threads, bf16, operands rotated over 60 copies so that they
//   come from memory, as in training; ms at batch 8 | 16 | 32):
//     C->O        HxW  stride   convolution + reorder    gather + GEMM
//     512->2048     7     1     0.98 | 1.62 | 2.89       0.83 | 1.39 | 2.75
//     2048->512     7     1     1.04 | 1.68 | 2.99       0.67 | 1.39 | 2.64
//     1024->512    14     1     1.11 | 2.02 | 3.72       1.06 | 2.14 | 4.17
//     1024->256    14     1     0.59 | 1.07 | 2.00       0.67 | 1.27 | 2.39
//     256->1024    14     1     0.66 | 1.16 | 2.05       0.85 | 1.60 | 2.96
//     1024->2048   14     2     2.16 | 3.55 | 6.53       1.25 | 2.54 | 4.98
//     512->1024    28     2     1.70 | 2.09 | 4.35       1.82 | 3.01 | 5.18
//     256->512     56     2     1.54 | 2.86 | 6.26       1.79 | 3.44 | 7.13
//   The GEMM wins where the output map is 7x7, at every batch; elsewhere the convolution wins or
//   ties, the more the wider the map. Session 65's onednn_dgrad_gemm.cpp, which timed the
//   convolution with its weights already blocked and in the cache, found no gain: the weights'
//   reorder (0.2-0.5 ms for 1-2 M weights) is what the GEMM saves. 3x3 forwards as a GEMM over
//   gathered columns lost even at 512 channels and 7x7 (2.10 against 1.86 ms, batch 8), and stay
//   convolutions. fprop_gemm_pays()
//   takes the 7x7 maps, and any map where the weights outnumber the product's rows 1024 to one
//   (a small batch). In ResNet-50's bf16 step at batch 8 (`train --profile`) it takes layer4's
//   five 1x1s at stride 1 and its downsampling shortcut: layer4.0.downsample.0 2.35 -> 1.70 ms,
//   conv3 1.03 -> 0.78-0.99.
//   A 3x3 weight gradient's column order (the same aid): its columns in (kh, kw, c) order are a
//   copy of whole pixels, and make the product OHWI, reordered into dw's OIHW (8 bytes a weight);
//   in (c, kh, kw) order the gather writes an element at a time and the GEMM writes dw itself; ms
//   at batch 8 | 16 | 32:
//     C->O        HxW  stride   (kh, kw, c) gather + reorder   (c, kh, kw) gather
//     512->512      7     1     0.91 | 1.06 | 1.12             0.35 | 0.72 | 1.51
//     512->512     14     2     0.99 | 1.15 | 1.40             0.41 | 0.87 | 1.82
//     256->256     28     2     0.53 | 0.91 | 1.55             0.94 | 1.68 | 3.45
//   The channel-major gather grows with M, the reorder with O·C·9: wgrad_columns() takes it
//   where M <= 3·O (the six cases it takes won, the three it leaves lost). The same bits either
//   way: each dw element sums the same terms over M in the same order; only its column moved.
//   ResNet-50's layer4 3x3 weight gradients, 3.0-3.3 -> 2.6-2.9 ms.
//   FP32 (both operands fp32, no tf32 rounding; session 73): oneDNN 2.6's avx512_core fp32 1x1
//   convolutions against its fp32 matmul, measured per layer inside ResNet-50 fp32 training steps
//   (`train --profile`'s node table, batch 8, 224 px, 2 threads, conv_gemm = gemm against
//   convolution, two runs of each alternated; the GEMM's time over the convolution's, the
//   accumulating data gradient against the convolution's plus the core's axpy):
//     layer              map     M      C·O/M     weight grad  data grad  accumulating  forward
//     layer1             56x56   25088  0.2-0.7   1.04-1.45    0.83-0.96  0.76-0.78     1.09-1.11
//     layer2, l3.0.conv1 28-56   6272+  1.3-21    1.04-1.24    0.92-1.10  0.91-1.02     1.09-1.32
//     layer3             14x14   1568   167       0.91-1.16    0.93-1.05  1.00-1.09     1.02-1.10
//     l3.0.downsample.0  14x14   1568   334       1.02         0.98                     1.05
//     l4.0.conv1         14x14   1568   334       0.75                    0.84          1.03
//     layer4             7x7     392    2675-5350 0.58-0.84    0.62-0.83  0.82-0.83     0.83-0.92
//   So the GEMM pays where the weights outnumber the product's rows 256 to one (one shape there
//   tied) or the map is 7x7 (fp32_gemm_pays), and for data gradients also on the wide stride-1
//   maps (56x56: layer1), where oneDNN's fp32 backward-data kernel trails its matmul; on the maps
//   between, the convolution wins or ties. The 3x3 weight gradients as GEMMs lost in fp32 at every
//   layer but one (1.1-2.2x slower, the stem 3x; layer4.0.conv2 0.87) and stay convolutions.
//   ResNet-50 fp32 with this rule: its 1x1 convolutions and axpys took 6-8 % less time against
//   its unchanged 3x3s (two alternated profiled pairs; bench/RESULTS.md, session 73).
// How `conv_gemm` chooses:
// - automatic ("auto", the default), where the CPU has AMX-BF16 (the CPU class measured; the fp32
//   rule's kernels are avx512_core's, but no other CPU was measured):
//   - the native bf16 route (both operands bf16, read as stored, and the GEMM engine's bf16 GEMMs
//     native too): the shapes wgrad_gemm_pays() takes (weight gradients), dgrad_gemm_shape()
//     (data gradients; the facet offers the accumulating one) and fprop_gemm_pays() (forwards);
//   - the fp32 route: fp32_gemm_pays() (weight gradients, forwards), fp32_dgrad_gemm_pays() (data
//     gradients, plain or accumulating; the facet offers the accumulating one);
//   - any other operands (tf32, fp16, fp8, emulated bf16): the convolution.
// - gemm ("gemm"): every weight gradient the GEMM can take (wgrad_gemm_shape, and no fp8 dy with
//   a bias gradient), every data gradient of dgrad_gemm_shape() (accumulating: into an fp32 dx)
//   and every forward of fprop_gemm_shape(), on any route: the GEMM engine's precision rules,
//   which are the convolution's (exact FP32 on the rounded operands, FP32 accumulation). For
//   measurements and for tests on any CPU.
// - convolution ("convolution"): never, and the accumulating data gradient is not offered.
// The sum runs in another order than the convolution's: the same FP32 accumulation, other bits.
// Static, so a shape takes the same route in every run on one CPU.
#pragma once

#include <cstdint>

#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cpu {

enum class ConvGemm { automatic, gemm, convolution };

// A convolution whose weight gradient the GEMM computes: one group (any kernel, stride, padding
// and dilation).
inline bool wgrad_gemm_shape(const sdk::Conv2dGeometry& g) {
  return g.groups == 1;
}

// A 1x1 kernel at stride 1 without padding: x's pixels are dy's, so x itself is a GEMM operand.
inline bool unit_stride_unpadded_1x1(const sdk::Conv2dGeometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 &&
         g.pad_w == 0;
}

// A convolution whose data gradient the GEMM computes: a 1x1 kernel without padding, one group,
// any stride (each dy pixel's product lands on one x pixel; a 1x1 kernel's dilation changes
// nothing).
inline bool dgrad_gemm_shape(const sdk::Conv2dGeometry& g) {
  return g.kernel_h == 1 && g.kernel_w == 1 && g.pad_h == 0 && g.pad_w == 0 && g.groups == 1;
}

// A convolution whose forward the GEMM computes: the same shapes (each output pixel reads one
// input pixel).
inline bool fprop_gemm_shape(const sdk::Conv2dGeometry& g) {
  return dgrad_gemm_shape(g);
}

// The wide-3x3 thresholds of the weight gradients' rule.
inline constexpr std::int64_t kWgradGemmWideChannels = 256;
inline constexpr std::int64_t kWgradGemmWiderChannels = 512;

// The weight-gradient shapes `auto` takes where the route and the CPU allow (the table above): a
// 1x1 kernel without padding; a 3x3 kernel (dilation 1) with C and O at least
// kWgradGemmWideChannels and a stride above 1, or C at least kWgradGemmWiderChannels.
inline bool wgrad_gemm_pays(const sdk::Conv2dGeometry& g) {
  if (!wgrad_gemm_shape(g)) return false;
  if (g.kernel_h == 1 && g.kernel_w == 1) return g.pad_h == 0 && g.pad_w == 0;
  const bool wide_3x3 = g.kernel_h == 3 && g.kernel_w == 3 && g.dilation_h == 1 &&
                        g.dilation_w == 1 && g.in_channels >= kWgradGemmWideChannels &&
                        g.out_channels >= kWgradGemmWideChannels;
  return wide_3x3 && (g.stride_h > 1 || g.stride_w > 1 || g.in_channels >= kWgradGemmWiderChannels);
}

// The forward's thresholds (the table above): an output map of at most kFpropGemmMaxPixels, or at
// least kFpropGemmWeightsPerRow weights (C·O) per row of the product (M = N·OH·OW).
inline constexpr std::int64_t kFpropGemmMaxPixels = 7 * 7;
inline constexpr std::int64_t kFpropGemmWeightsPerRow = 1024;

// The forward shapes `auto` takes where the route and the CPU allow.
inline bool fprop_gemm_pays(const sdk::Conv2dGeometry& g) {
  if (!fprop_gemm_shape(g)) return false;
  const std::int64_t pixels = g.out_height() * g.out_width();
  return pixels <= kFpropGemmMaxPixels ||
         g.batch * pixels * kFpropGemmWeightsPerRow <= g.in_channels * g.out_channels;
}

// The operands a convolution's route reads, as the rule tells them apart (above).
enum class ConvGemmOperands {
  native_bf16,  // both bf16, read as stored by oneDNN's bf16 convolution
  fp32,         // both fp32 storage, FP32 compute (no tf32 rounding, no fp8 scale)
  other,        // tf32, fp16, fp8 or emulated bf16
};

// The fp32 rule's thresholds (the table above): an output map of at most kFpropGemmMaxPixels, or
// at least kFp32GemmWeightsPerRow weights (C·O) per row of the product (M = N·OH·OW); data
// gradients also at stride 1 on maps of at least kFp32DgradGemmMinPixels.
inline constexpr std::int64_t kFp32GemmWeightsPerRow = 256;
inline constexpr std::int64_t kFp32DgradGemmMinPixels = 56 * 56;

// The fp32 weight-gradient and forward shapes `auto` takes on the CPU class measured: an unpadded
// 1x1 convolution (one group) on a small map or with many weights per product row.
inline bool fp32_gemm_pays(const sdk::Conv2dGeometry& g) {
  if (!fprop_gemm_shape(g)) return false;
  const std::int64_t pixels = g.out_height() * g.out_width();
  return pixels <= kFpropGemmMaxPixels ||
         g.batch * pixels * kFp32GemmWeightsPerRow <= g.in_channels * g.out_channels;
}

// The fp32 data-gradient shapes `auto` takes: fp32_gemm_pays()'s, and stride-1 ones on wide maps.
inline bool fp32_dgrad_gemm_pays(const sdk::Conv2dGeometry& g) {
  if (fp32_gemm_pays(g)) return true;
  return dgrad_gemm_shape(g) && g.stride_h == 1 && g.stride_w == 1 &&
         g.out_height() * g.out_width() >= kFp32DgradGemmMinPixels;
}

// The order of a weight gradient's gathered columns, named by the layout of the product they
// make: (kh, kw, c), whole pixels copied, an OHWI product reordered into dw; or OIHW's (c, kh, kw),
// the GEMM writing dw itself.
enum class WgradColumns { ohwi, oihw };

// The rows per output channel up to which the columns take OIHW's order (the table above).
inline constexpr std::int64_t kWgradOihwRowsPerChannel = 3;

// The column order of a weight gradient as a GEMM (under any conv_gemm choice): past a 1x1 kernel,
// OIHW's where M <= kWgradOihwRowsPerChannel·O, else OHWI's. A 1x1 kernel's are the same.
inline WgradColumns wgrad_columns(const sdk::Conv2dGeometry& g) {
  const bool pointwise = g.kernel_h == 1 && g.kernel_w == 1;
  const std::int64_t rows = g.batch * g.out_height() * g.out_width();
  return !pointwise && rows <= kWgradOihwRowsPerChannel * g.out_channels ? WgradColumns::oihw
                                                                         : WgradColumns::ohwi;
}

}  // namespace mixtrain::backend_cpu
