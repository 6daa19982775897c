#include "graph/ops/block_quantizer.h"

#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "mixtrain/core/graph/random.h"
#include "mixtrain/sdk/support/block_scaling.h"

namespace mixtrain::core {

using sdk::DType;
using sdk::GemmPass;
using sdk::OperandRole;
using sdk::ReductionAxis;

namespace {

int role_index(OperandRole role) {
  switch (role) {
    case OperandRole::input:
      return 0;
    case OperandRole::weight:
      return 1;
    default:
      return 2;
  }
}

struct PassAxis {
  GemmPass pass;
  ReductionAxis axis;
};

// The two passes that read a role and the operand dim each reduces over (the header's table).
std::array<PassAxis, 2> passes_of(OperandRole role) {
  switch (role) {
    case OperandRole::input:
      return {{{GemmPass::forward, ReductionAxis::cols}, {GemmPass::wgrad, ReductionAxis::rows}}};
    case OperandRole::weight:
      return {{{GemmPass::forward, ReductionAxis::cols}, {GemmPass::dgrad, ReductionAxis::rows}}};
    default:
      return {{{GemmPass::dgrad, ReductionAxis::cols}, {GemmPass::wgrad, ReductionAxis::rows}}};
  }
}

}  // namespace

BlockQuantizer::BlockQuantizer(const std::string& node, const std::string& gemm)
    : gemm_key_(node + "." + gemm) {
  for (auto role : {OperandRole::input, OperandRole::weight, OperandRole::grad_output})
    slots_.emplace_back(node, gemm, role);
}

bool BlockQuantizer::hadamard_on(OperandRole role) const {
  if (role == OperandRole::weight) return false;
  // The host calls only what the policy's minor declares (policy_block_scaling.h).
  if (facet_->version() < sdk::FacetVersion{1, 1}) return false;
  return facet_->random_hadamard_transform(slots_[0]);
}

bool BlockQuantizer::varies_per_step() const {
  if (facet_ == nullptr) return false;
  if (hadamard_on(OperandRole::input)) return true;
  for (OperandRole role : {OperandRole::input, OperandRole::weight, OperandRole::grad_output})
    for (const PassAxis& p : passes_of(role))
      if (facet_->operand_plan(slots_[static_cast<std::size_t>(role_index(role))], p.pass, p.axis)
              .stochastic_rounding)
        return true;
  return false;
}

std::uint64_t BlockQuantizer::hadamard_seed(std::uint64_t run_seed, std::int64_t step,
                                            std::int64_t draw) const {
  const std::string key =
      gemm_key_ + ".wgrad.hadamard.step" + std::to_string(step) + ".micro" + std::to_string(draw);
  return derive_seed(run_seed, key.c_str());
}

// src [rows, cols] → M·src per 16 rows, fp32 [rows16, cols], rows16 = rows rounded up to 16: the
// padding rows are zero before the transform (as the wgrad GEMM pads the batch; both of its inputs
// are padded and transformed alike, so dyᵀ·x keeps its value). One strided-batched GEMM with M
// broadcast: out_b[16, cols] = M[16, 16] · src_b[16, cols].
sdk::TensorView BlockQuantizer::hadamard_rows(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                              sdk::GemmFacet& gemm, sdk::TensorView src,
                                              std::uint64_t sign_seed) {
  const std::int64_t rows = src.shape.rows(), cols = src.shape.cols();
  const std::int64_t rows16 = (rows + 15) / 16 * 16;
  Hadamard& h = hadamard_;
  if (h.matrix.empty()) h.matrix = Tensor(backend, DType::fp32, sdk::Shape{16, 16});
  // x and dy of one wgrad share M: it is uploaded once per (step, micro-batch).
  if (h.matrix_seed != sign_seed) {
    const std::array<float, 256> m = sdk::hadamard16(sign_seed);
    backend->copy_from_host(h.matrix.view(), m.data());
    h.matrix_seed = sign_seed;
  }
  sdk::TensorView in = src;
  if (rows16 != rows) {
    if (h.padded.empty() || h.padded.shape().numel() < rows16 * cols)
      h.padded = Tensor(backend, DType::fp32, sdk::Shape{rows16, cols});
    in = sdk::TensorView{h.padded.view().data, DType::fp32, sdk::Shape{rows16, cols}};
    backend->fill(in, 0.0f);
    backend->cast(src, sdk::TensorView{in.data, DType::fp32, sdk::Shape{rows, cols}});
  }
  if (h.out.empty() || h.out.shape().numel() < rows16 * cols)
    h.out = Tensor(backend, DType::fp32, sdk::Shape{rows16, cols});
  const sdk::TensorView out{h.out.view().data, DType::fp32, sdk::Shape{rows16, cols}};
  sdk::GemmBatchedArgs g;
  g.gemm.a.view = h.matrix.view();
  g.gemm.b.view = sdk::TensorView{in.data, in.dtype, sdk::Shape{16, cols}};
  g.gemm.c = sdk::TensorView{out.data, DType::fp32, sdk::Shape{16, cols}};
  g.batch = rows16 / 16;
  g.stride_a = 0;
  g.stride_b = 16 * cols;
  g.stride_c = 16 * cols;
  gemm.gemm_strided_batched(g);
  return out;
}

std::uint64_t BlockQuantizer::seed(std::uint64_t run_seed, const sdk::OperandSlot& slot,
                                   GemmPass pass, std::int64_t step, std::int64_t draw) {
  const std::string key = slot.name() + "." + std::string(sdk::gemm_pass_name(pass)) + ".step" +
                          std::to_string(step) + ".micro" + std::to_string(draw);
  return derive_seed(run_seed, key.c_str());
}

void BlockQuantizer::quantize(const std::shared_ptr<sdk::DeviceBackend>& backend,
                              sdk::GemmFacet& gemm, sdk::TensorView src, OperandRole role,
                              std::uint64_t run_seed, std::int64_t step, std::int64_t draw,
                              bool both_passes) {
  const int r = role_index(role);
  const sdk::OperandSlot& slot = slots_[static_cast<std::size_t>(r)];
  const auto passes = passes_of(role);
  sdk::BlockScaledOperandPlan plans[2];
  for (int p = 0; p < 2; ++p) plans[p] = facet_->operand_plan(slot, passes[p].pass, passes[p].axis);
  // The wgrad pass (the second of x and dy) may read the Hadamard transform of src instead.
  sdk::TensorView sources[2] = {src, src};
  const bool hadamard = both_passes && hadamard_on(role);
  if (hadamard) sources[1] = hadamard_rows(backend, gemm, src, hadamard_seed(run_seed, step, draw));
  // A pass reducing along the rows is stored transposed where the backend asks for it (facet
  // 1.4; the host calls only what the backend's minor declares).
  const bool transposing = gemm.version() >= sdk::FacetVersion{1, 4} && gemm.quantizes_transposed();
  bool transposed[2];
  for (int p = 0; p < 2; ++p)
    transposed[p] = transposing && passes[p].axis == sdk::ReductionAxis::rows;
  // Stochastic rounding draws per pass, so only two nearest-even quantizations of one layout
  // (of one source, stored alike) are the same tensor.
  shared_[r] = !hadamard && plans[0].layout == plans[1].layout && !plans[0].stochastic_rounding &&
               !plans[1].stochastic_rounding && transposed[0] == transposed[1];
  sdk::BlockQuantizeArgs args;
  args.src = src;
  // One call rounds its outputs alike, with one seed: a stochastically rounded pass has a call
  // of its own (its own bits), the nearest-even ones share one read of src.
  const bool one_call = !hadamard && !plans[0].stochastic_rounding && !plans[1].stochastic_rounding;
  for (int p = 0; p < (shared_[r] || !both_passes ? 1 : 2); ++p) {
    // The stored tensor: the source, or its transpose with the layout transposed alike.
    const bool t = transposed[p];
    const std::int64_t rows = t ? sources[p].shape.cols() : sources[p].shape.rows();
    const std::int64_t cols = t ? sources[p].shape.rows() : sources[p].shape.cols();
    sdk::BlockScaledLayout layout = plans[p].layout;
    if (t) std::swap(layout.block_rows, layout.block_cols);
    Buffers& b = buffers_[r][p];
    const sdk::BlockExtent grid = sdk::block_grid(layout, rows, cols);
    if (b.codes.empty() || b.codes.shape().numel() < rows * cols)
      b.codes = Tensor(backend, DType::fp8_e4m3, sdk::Shape{rows, cols});
    if (b.scales.empty() || b.scales.shape().numel() < grid.rows * grid.cols)
      b.scales = Tensor(backend, DType::fp32, sdk::Shape{grid.rows, grid.cols});
    if (b.tensor_scale.empty()) b.tensor_scale = Tensor(backend, DType::fp32, sdk::Shape{1});
    b.view.codes = sdk::TensorView{b.codes.view().data, DType::fp8_e4m3, sdk::Shape{rows, cols}};
    b.view.scales =
        sdk::TensorView{b.scales.view().data, DType::fp32, sdk::Shape{grid.rows, grid.cols}};
    b.view.tensor_scale = layout.tensor_scale ? b.tensor_scale.view() : sdk::TensorView{};
    b.view.layout = layout;
    b.view.transpose = t;
    if (one_call) {
      args.outputs[p] = b.view;
    } else {
      sdk::BlockQuantizeArgs single;
      single.src = sources[p];
      single.outputs[0] = b.view;
      single.stochastic_rounding = plans[p].stochastic_rounding;
      if (single.stochastic_rounding)
        single.seed = seed(run_seed, slot, passes[p].pass, step, draw);
      gemm.quantize_block_scaled(single);
    }
  }
  if (one_call) gemm.quantize_block_scaled(args);
}

sdk::BlockScaledOperand BlockQuantizer::operand(OperandRole role, GemmPass pass,
                                                bool op_transpose) const {
  const int r = role_index(role);
  const auto passes = passes_of(role);
  const int p = (shared_[r] || passes[0].pass == pass) ? 0 : 1;
  sdk::BlockScaledOperand view = buffers_[r][p].view;
  // The quantize output's `transpose` said how it is stored; the GEMM's says op(): transposing a
  // transposed storage reads it as stored.
  view.transpose = op_transpose != view.transpose;
  return view;
}

}  // namespace mixtrain::core
