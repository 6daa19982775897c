// The CPU backend's static rules for how a convolution runs (cpu_convolution.cpp applies them,
// cpu_conv_primitives.h builds the primitives): oneDNN's direct convolution in oneDNN's blocked
// activation layout where its nhwc kernel is the slower one (the default, conv_algorithm =
// "direct") and Winograd F(4,3) (conv_algorithm = "winograd"). Which convolutions run as one
// GEMM instead (conv_gemm) is cpu_conv_gemm_rule.h's rule.
//
// The blocked layout for the direct convolution (blocked_pays below):
// - oneDNN 2.6's AVX2 direct kernel (jit:avx2, CPUs without AVX-512) runs 3x3 convolutions faster
//   in its blocked layout (nChw8c) than in nhwc, even with the reorders nhwc -> nChw8c and back
//   around each call. So a convolution takes the blocked layout when all of:
//   CpuContext::blocked_layout_pays() (the probe's nhwc 3x3 kernel is jit:avx2), a 3x3 kernel,
//   dilation 1, groups 1, at least 32 channels on both sides, and for backward-data an input of
//   at least 28x28 pixels. Any route (fp32, tf32, decoded 16- and 8-bit operands): it is the same
//   direct sum with FP32 accumulation, in another order. Static, so a shape takes the same kernel
//   in every run on one CPU.
// - Measured by bench/cnn/bench_conv_algorithm.cpp (`--compare blocked`, each call as the trainer
//   makes it, the reorders included), AMD EPYC with AVX2 + FMA only, oneDNN 2.6.3, fp32, ms nhwc /
//   blocked, best of 15 calls with 2 threads | best of 9 with 1:
//     ResNet-50, batch 8
//     C->O      HxW s  forward                backward-data          backward-weights
//     64->64    56  1  20.8/13.8 | 38.4/34.1  18.2/14.5 | 46.6/33.4  34.2/25.1 | 70.7/53.0
//     128->128  56  2  35.8/19.1 | 88.5/31.3  20.3/14.4 | 32.4/28.0  32.7/17.9 | 50.9/35.3
//     128->128  28  1  18.8/14.8 | 31.6/25.4  15.2/14.0 | 33.1/25.4  27.7/24.0 | 51.7/42.8
//     256->256  28  2  22.5/18.5 | 46.6/26.9  18.0/18.3 | 29.8/28.4  32.7/21.1 | 46.9/35.8
//     256->256  14  1  19.3/15.5 | 29.0/23.3  14.1/14.6 | 22.7/21.4  21.6/18.8 | 32.8/31.4
//     512->512  14  2  27.8/25.1 | 34.8/32.6  25.2/23.6 | 37.9/36.7  39.4/32.8 | 66.0/45.9
//     512->512   7  1  24.7/19.3 | 29.4/28.8  14.6/20.2 | 27.4/29.3  34.1/28.1 | 53.9/42.7
//     ResNet-20, batch 128, 2 threads
//     16->16    32  1  5.25/7.35              4.97/7.22              6.97/9.30
//     32->32    16  1  5.26/5.34              5.19/5.05              6.51/6.43
//     64->64     8  1  5.93/5.63              4.69/5.03              6.74/6.31
//   Forward and backward-weights won or tied from 32 channels; backward-data tied at 14x14 and
//   lost at 7x7 and 8x8; with 16 channels nhwc won everywhere. 1x1 convolutions won in nhwc in
//   most of a separate sweep once the reorders were paid, and are left in nhwc.
// - On AVX-512 (Zen 4, session 9's measurements on ResNet-20's shapes) the blocked direct
//   convolution was not faster than nhwc: the rule stays off there (the probe's kernel is not
//   jit:avx2).
//
// oneDNN's Winograd F(4,3) (jit_wino_4x3:avx512_core; oneDNN 2.6 has it for fp32
//   on AVX-512 CPUs only) for a convolution that is all of: on the pure fp32 route (both operands
//   fp32 as stored, compute fp32 — not tf32, not bf16 native or emulated, not fp16/fp8, whose
//   contract is exact FP32 on the rounded operands); 3x3, stride 1, dilation 1, groups 1; taken by
//   the rule below; and one oneDNN creates a non-reference Winograd kernel for (else the entry
//   records why not and the call runs direct, unchanged). The output's dtype, bias, dbias, the
//   accumulate of dw/dbias work as on the direct path (an fp8 scale cannot occur on this route).
//   Winograd takes blocked activations only (nChw16c; creating it with nhwc fails), so each call
//   reorders its activation inputs nhwc -> blocked and its activation output back, with reorders
//   cached in the entry and the blocked buffers in the cache's blocked_a / blocked_b scratch.
//   Its transforms round differently: against a double reference its rel-L2 error is ≈ 5e-7..9e-7
//   (the direct convolution's ≈ 1e-7..4e-7; the unit tests bound it at 3e-6).
// - The rule, static so that the same shape always takes the same algorithm (runs reproduce; no
//   timing at run time): Winograd when N·OH·OW·C·O >= 2^23 and C, O >= 16, and for the forward
//   C >= 32, for backward-data O >= 32 (the side Winograd's input transform reads); backward-
//   weights needs nothing more. Measured by bench/cnn/bench_conv_algorithm.cpp (each call as the
//   trainer makes it, so Winograd's time includes the activation and weight reorders), the best
//   of three sittings of 15 calls, 2 threads, AMD EPYC Zen 4 (AVX-512), load 1.9-2.1; ms direct /
//   Winograd, W = the rule takes Winograd:
//     C->O    HxW   N    work  forward          backward-data    backward-weights
//     16->16  32x32 128  2^25  2.68 / 3.53      2.54 / 3.59      2.54 / 2.06 W
//     32->32  16x16 128  2^25  2.48 / 1.68 W    2.38 / 1.50 W    2.47 / 1.62 W
//     64->64   8x8  128  2^25  2.23 / 1.19 W    2.19 / 1.10 W    2.34 / 1.30 W
//     16->32  32x32 128  2^26  5.57 / 5.94      5.97 / 4.52 W    5.35 / 4.68 W
//     32->16  32x32 128  2^26  5.81 / 4.39 W    5.15 / 6.16      5.66 / 5.44 W
//     16->16  16x16 128  2^23  0.69 / 0.89      0.60 / 0.91      0.63 / 0.55 W
//     32->32   8x8  128  2^23  0.61 / 0.45 W    0.56 / 0.43 W    0.60 / 0.42 W
//     128->128 4x4   32  2^23  0.63 / 0.49 W    0.55 / 0.61 W    0.72 / 0.59 W
//     64->64   8x8   32  2^23  0.62 / 0.34 W    0.58 / 0.36 W    0.67 / 0.38 W
//     16->32  32x32   8  2^22  0.33 / 0.61      0.32 / 0.27      0.33 / 0.27
//     32->32   8x8   32  2^21  0.17 / 0.13      0.15 / 0.13      0.16 / 0.28
//     64->64   8x8    8  2^21  0.20 / 0.18      0.17 / 0.20      0.18 / 0.23
//   With 16 channels in x the forward lost everywhere, with 16 in dy backward-data did; below
//   2^23 the fixed costs (the weights' transform, a reorder per activation) take over, and
//   backward-weights loses first. Misfits: 128->128 4x4 N=32 backward-data is taken and loses
//   0.06 ms; at 2^22 some directions would win ≈ 0.05 ms and are left direct.
//   16-channel activations need no reorder: nChw16c with 16 channels is nhwc byte for byte.
#pragma once

#include <cstdint>

#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cpu {

// The static Winograd rule's thresholds (measurements in the header): at least kWinogradMinWork
// multiply-adds per kernel tap (N·OH·OW·C·O), C and O at least kWinogradMinChannels (the fewest
// measured), and kWinogradInputChannels on the side the input transform reads in the forward
// (C) and backward-data (O).
inline constexpr double kWinogradMinWork = 8388608.0;  // 2^23
inline constexpr std::int64_t kWinogradMinChannels = 16;
inline constexpr std::int64_t kWinogradInputChannels = 32;

// The shapes oneDNN's Winograd F(4,3) computes: 3x3, stride 1, no dilation, no groups.
inline bool winograd_shape(const sdk::Conv2dGeometry& g) {
  return g.kernel_h == 3 && g.kernel_w == 3 && g.stride_h == 1 && g.stride_w == 1 &&
         g.dilation_h == 1 && g.dilation_w == 1 && g.groups == 1;
}

enum class Direction { forward, backward_data, backward_weights };

// The static rule (measurements in the file's header): whether Winograd, with the reorders of
// its activations, is faster than the direct convolution for this direction and shape: at least
// 2^23 multiply-adds per tap and 16 channels on both sides, and for the forward at least 32
// input channels (x's C), for backward-data at least 32 in dy (O): with 16 there Winograd lost
// in every measurement. Backward-weights won down to 16 channels. Deterministic: the same shape
// always takes the same algorithm, so runs are reproducible.
inline bool winograd_pays(Direction dir, const sdk::Conv2dGeometry& g) {
  const double work = static_cast<double>(g.batch) * static_cast<double>(g.out_height()) *
                      static_cast<double>(g.out_width()) * static_cast<double>(g.in_channels) *
                      static_cast<double>(g.out_channels);
  if (work < kWinogradMinWork || g.in_channels < kWinogradMinChannels ||
      g.out_channels < kWinogradMinChannels)
    return false;
  switch (dir) {
    case Direction::forward:
      return g.in_channels >= kWinogradInputChannels;
    case Direction::backward_data:
      return g.out_channels >= kWinogradInputChannels;
    case Direction::backward_weights:
      return true;
  }
  return false;
}

// The blocked-layout rule's thresholds (measurements above): channels on each side below which
// nhwc won, and the input pixels below which backward-data did not gain.
inline constexpr std::int64_t kBlockedMinChannels = 32;
inline constexpr std::int64_t kBlockedMinDataPixels = 28 * 28;

// The blocked-layout rule's shape test (the CPU test, blocked_layout_pays(), is the caller's):
// 3x3, dilation 1, groups 1, at least kBlockedMinChannels on both sides, any stride and padding;
// backward-data also at least kBlockedMinDataPixels in x.
inline bool blocked_pays(Direction dir, const sdk::Conv2dGeometry& g) {
  const bool shape = g.kernel_h == 3 && g.kernel_w == 3 && g.dilation_h == 1 && g.dilation_w == 1 &&
                     g.groups == 1 && g.in_channels >= kBlockedMinChannels &&
                     g.out_channels >= kBlockedMinChannels;
  if (dir == Direction::backward_data) return shape && g.height * g.width >= kBlockedMinDataPixels;
  return shape;
}

}  // namespace mixtrain::backend_cpu
