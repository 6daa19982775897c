#include "cpu_block_scaled.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "cpu_block_gemm_kernel.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

namespace {

// Quantizations of fewer elements run on the calling thread.
constexpr std::int64_t kParallelElements = std::int64_t{1} << 16;

[[noreturn]] void fail(const std::string& what) {
  throw sdk::BackendError(what, "a host bug: the block-scaled operands do not fit their layout");
}

std::vector<float> read_fp32(const TensorView& v) {
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  switch (v.dtype) {
    case DType::fp32:
    case DType::tf32:
      // An empty source's vector has no storage: memcpy's pointers must not be null even then.
      if (!out.empty()) std::memcpy(out.data(), v.data, out.size() * sizeof(float));
      break;
    case DType::bf16:
    case DType::fp16:
      sdk::convert(
          std::span<const std::uint16_t>(static_cast<const std::uint16_t*>(v.data), out.size()),
          v.dtype, out);
      break;
    default:
      fail("a block-scaled op reads fp32, bf16 or fp16, not " + std::string(dtype_name(v.dtype)));
  }
  return out;
}

void write_fp32(std::span<const float> values, const TensorView& v) {
  switch (v.dtype) {
    case DType::fp32:
      std::memcpy(v.data, values.data(), values.size() * sizeof(float));
      break;
    case DType::bf16:
    case DType::fp16:
      sdk::convert(values,
                   std::span<std::uint16_t>(static_cast<std::uint16_t*>(v.data), values.size()),
                   v.dtype);
      break;
    default:
      fail("a block-scaled GEMM writes fp32, bf16 or fp16, not " +
           std::string(dtype_name(v.dtype)));
  }
}

// The operand's shape as stored: [rows, cols] of a rank-2 (or flattened) view.
void stored_shape(const TensorView& codes, std::int64_t& rows, std::int64_t& cols) {
  cols = codes.shape.cols();
  rows = cols == 0 ? 0 : codes.numel() / cols;
}

void check_operand(const sdk::BlockScaledOperand& op, std::int64_t rows, std::int64_t cols,
                   const char* which) {
  const std::string who = std::string("block-scaled operand ") + which + ": ";
  if (op.codes.empty() || sdk::dtype_size(op.codes.dtype) != 1 || op.codes.numel() != rows * cols)
    fail(who + "codes must be 1-byte storage of " + std::to_string(rows * cols) + " elements");
  sdk::BlockExtent grid{};
  try {
    grid = sdk::block_grid(op.layout, rows, cols);
  } catch (const std::invalid_argument& e) {
    fail(who + e.what());
  }
  if (op.scales.empty() || op.scales.dtype != DType::fp32 ||
      op.scales.numel() != grid.rows * grid.cols)
    fail(who + "scales must be fp32 [" + std::to_string(grid.rows) + ", " +
         std::to_string(grid.cols) + "] for " + sdk::describe(op.layout));
  if (op.layout.tensor_scale && (op.tensor_scale.empty() || op.tensor_scale.dtype != DType::fp32 ||
                                 op.tensor_scale.numel() != 1))
    fail(who + "a layout with a tensor scale needs an fp32 [1] tensor_scale");
}

// op(X)[i][kk] of an operand, its block indices and values, as the GEMM reads them.
struct OperandReader {
  const std::uint8_t* codes;
  const float* scales;
  std::array<float, 256> values;
  std::int64_t cols, grid_cols, block_rows, block_cols;
  bool transpose;
  float tensor_scale;

  OperandReader(const sdk::BlockScaledOperand& op, std::int64_t cols_stored)
      : codes(static_cast<const std::uint8_t*>(op.codes.data)),
        scales(static_cast<const float*>(op.scales.data)),
        values(block_element_values(op.layout.element)),
        cols(cols_stored),
        grid_cols((cols_stored + op.layout.block_cols - 1) / op.layout.block_cols),
        block_rows(op.layout.block_rows),
        block_cols(op.layout.block_cols),
        transpose(op.transpose),
        tensor_scale(1.0f) {
    if (op.layout.tensor_scale) std::memcpy(&tensor_scale, op.tensor_scale.data, sizeof(float));
  }
  // Element (outer, k) of op(X) where op(X) is [outer, k] (A) — B is read as op(B)ᵀ, the same.
  float value(std::int64_t outer, std::int64_t k) const {
    const std::int64_t r = transpose ? k : outer, c = transpose ? outer : k;
    return values[codes[r * cols + c]];
  }
  float scale(std::int64_t outer, std::int64_t k) const {
    const std::int64_t r = transpose ? k : outer, c = transpose ? outer : k;
    return scales[(r / block_rows) * grid_cols + c / block_cols];
  }
  std::int64_t block_along_k() const { return transpose ? block_rows : block_cols; }
};

// out [cols, rows] = in [rows, cols] transposed.
template <class T>
void transpose_into(const T* in, std::int64_t rows, std::int64_t cols, T* out) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

}  // namespace

std::array<float, 256> block_element_values(sdk::BlockElement element) {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    switch (element) {
      case sdk::BlockElement::e4m3:
        t[static_cast<std::size_t>(c)] = sdk::decode_fp8_e4m3(code);
        break;
      case sdk::BlockElement::e5m2:
        t[static_cast<std::size_t>(c)] = sdk::decode_fp8_e5m2(code);
        break;
      case sdk::BlockElement::e2m1:
        t[static_cast<std::size_t>(c)] = sdk::decode_fp4_e2m1(static_cast<std::uint8_t>(c & 0xF));
        break;
    }
  }
  return t;
}

std::array<float, 256> scale_code_values(sdk::BlockScale scale) {
  if (scale == sdk::BlockScale::fp32 || scale == sdk::BlockScale::fp32_pow2)
    throw sdk::BackendError("scale_code_values: fp32 block scales are stored as values, not codes");
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c)
    t[static_cast<std::size_t>(c)] = scale == sdk::BlockScale::e4m3
                                         ? sdk::decode_fp8_e4m3(static_cast<std::uint8_t>(c))
                                         : sdk::decode_e8m0(static_cast<std::uint8_t>(c));
  return t;
}

void quantize_block_scaled_cpu(const sdk::BlockQuantizeArgs& args) {
  std::int64_t rows = 0, cols = 0;
  stored_shape(args.src, rows, cols);
  const std::vector<float> x = read_fp32(args.src);
  sdk::BlockQuantizeOptions options;
  if (args.stochastic_rounding) options.stochastic_rounding_seed = args.seed;
  for (const sdk::BlockScaledOperand& given : args.outputs) {
    if (given.codes.empty()) continue;
    // A transposed output (facet 1.4) is src quantized under the transposed layout, then
    // transposed: the same blocks, encodings and stochastic bits (keyed by src's index).
    sdk::BlockScaledOperand out = given;
    std::vector<std::uint8_t> staged;
    std::vector<float> staged_scales;
    if (given.transpose) {
      check_operand(given, cols, rows, "output (transposed)");
      std::swap(out.layout.block_rows, out.layout.block_cols);
      staged.resize(static_cast<std::size_t>(rows * cols));
      const sdk::BlockExtent g = sdk::block_grid(out.layout, rows, cols);
      staged_scales.resize(static_cast<std::size_t>(g.rows * g.cols));
      out.codes.data = staged.data();
      out.codes.shape = sdk::Shape{rows, cols};
      out.scales.data = staged_scales.data();
      out.scales.shape = sdk::Shape{g.rows, g.cols};
    }
    check_operand(out, rows, cols, "output");
    const sdk::BlockEncodings encodings = sdk::block_encodings(x, rows, cols, out.layout);
    const std::span<std::uint8_t> codes(static_cast<std::uint8_t*>(out.codes.data),
                                        static_cast<std::size_t>(rows * cols));
    // The element pass, split by rows over the team: each code depends on its own value, its
    // block's encoding and (stochastic rounding) its index alone.
    std::exception_ptr error;
#pragma omp parallel if (rows * cols >= kParallelElements)
    {
      const std::int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
      const std::int64_t per = (rows + team - 1) / team;
      const std::int64_t r0 = std::min(rows, t * per), r1 = std::min(rows, r0 + per);
      try {
        sdk::encode_block_rows(x, rows, cols, out.layout, encodings, options, r0, r1, codes);
      } catch (...) {
#pragma omp critical
        error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    const sdk::BlockExtent grid = sdk::block_grid(out.layout, rows, cols);
    auto* scales = static_cast<float*>(out.scales.data);
    for (std::int64_t b = 0; b < grid.rows * grid.cols; ++b)
      scales[b] = sdk::block_scale_value(out.layout, encodings.blocks[static_cast<std::size_t>(b)]);
    if (out.layout.tensor_scale)
      std::memcpy(out.tensor_scale.data, &encodings.tensor_scale, sizeof(float));
    if (given.transpose) {
      transpose_into(staged.data(), rows, cols, static_cast<std::uint8_t*>(given.codes.data));
      transpose_into(staged_scales.data(), grid.rows, grid.cols,
                     static_cast<float*>(given.scales.data));
    }
  }
}

void gemm_block_scaled_cpu(
    const sdk::BlockScaledGemmArgs& args,
    const std::function<void(sdk::Activation, const sdk::TensorView&)>& activation) {
  std::int64_t ar = 0, ac = 0, br = 0, bc = 0;
  stored_shape(args.a.codes, ar, ac);
  stored_shape(args.b.codes, br, bc);
  check_operand(args.a, ar, ac, "A");
  check_operand(args.b, br, bc, "B");
  const std::int64_t m = args.a.transpose ? ac : ar, k = args.a.transpose ? ar : ac;
  const std::int64_t kb = args.b.transpose ? bc : br, n = args.b.transpose ? br : bc;
  if (k != kb)
    fail("block-scaled GEMM: op(A) is [" + std::to_string(m) + ", " + std::to_string(k) +
         "] but op(B) is [" + std::to_string(kb) + ", " + std::to_string(n) + "]");
  const OperandReader a(args.a, ac);
  // op(B)[k][j] is read as (op(B)ᵀ)[j][k]: B's stored orientation flips.
  sdk::BlockScaledOperand b_t = args.b;
  b_t.transpose = !args.b.transpose;
  const OperandReader b(b_t, bc);
  const std::int64_t block = a.block_along_k();
  if (block != b.block_along_k())
    fail("block-scaled GEMM: A blocks the reduction dim by " + std::to_string(block) + ", B by " +
         std::to_string(b.block_along_k()) + "; the k-blocks must pair up");
  if (args.c.numel() != m * n) fail("block-scaled GEMM: C must hold [m, n] elements");
  if (!args.bias.empty() && (args.bias.dtype != DType::fp32 || args.bias.numel() != n))
    fail("block-scaled GEMM: bias must be fp32 [n]");
  const std::vector<float> c_old =
      args.beta != 0.0f ? read_fp32(args.c) : std::vector<float>(static_cast<std::size_t>(m * n));
  const float* bias = static_cast<const float*>(args.bias.data);
  const float tensor_scale = a.tensor_scale * b.tensor_scale;
  // acc[i][j] is the fp32 sum of the scaled k-block dots, k-blocks in ascending order.
  std::vector<float> acc(static_cast<std::size_t>(m * n), 0.0f);
  std::vector<double> a_block(static_cast<std::size_t>(m * block));  // [m, kb]
  std::vector<double> b_block(static_cast<std::size_t>(block * n));  // [kb, n]
  std::vector<float> a_scale(static_cast<std::size_t>(m)), b_scale(static_cast<std::size_t>(n));
  for (std::int64_t k0 = 0; k0 < k; k0 += block) {
    const std::int64_t kb = std::min(k, k0 + block) - k0;
    for (std::int64_t i = 0; i < m; ++i) {
      a_scale[static_cast<std::size_t>(i)] = a.scale(i, k0);
      for (std::int64_t t = 0; t < kb; ++t)
        a_block[static_cast<std::size_t>(i * kb + t)] = a.value(i, k0 + t);
    }
    for (std::int64_t j = 0; j < n; ++j) b_scale[static_cast<std::size_t>(j)] = b.scale(j, k0);
    for (std::int64_t t = 0; t < kb; ++t)
      for (std::int64_t j = 0; j < n; ++j)
        b_block[static_cast<std::size_t>(t * n + j)] = b.value(j, k0 + t);
    accumulate_k_block(a_block.data(), b_block.data(), a_scale.data(), b_scale.data(), acc.data(),
                       m, n, kb);
  }
  std::vector<float> z(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const std::size_t ij = static_cast<std::size_t>(i * n + j);
      float v = args.alpha * (acc[ij] * tensor_scale);
      if (args.beta != 0.0f) v += args.beta * c_old[ij];
      if (bias != nullptr) v += bias[j];
      z[ij] = v;
    }
  if (!args.has_activation) {
    write_fp32(z, args.c);
    return;
  }
  if (!args.pre_activation.empty()) {
    if (args.pre_activation.numel() != m * n)
      fail("block-scaled GEMM: pre_activation must hold [m, n] elements");
    write_fp32(z, args.pre_activation);
  }
  activation(args.activation, TensorView{z.data(), DType::fp32, sdk::Shape{m, n}});
  write_fp32(z, args.c);
}

}  // namespace mixtrain::backend_cpu
