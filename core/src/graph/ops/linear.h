// The linear op: y = x · Wᵀ + b on the last dimension.
//
// Contract
// - Epilogue fusion: a Linear followed by an activation can run the activation as its GEMM's
//   epilogue (LinearLayer::fuse_reader). The Linear then writes act(z) into the activation
//   layer's output, rounded once, and z into its own output only where the backward needs it
//   (gelu); the activation layer's forward does nothing and its relu backward reads its own
//   output (relu(z) > 0 exactly where z > 0). A Linear fused with a relu therefore writes no
//   output until it first runs unfused, and then into the relu's output, which the relu then
//   rectifies in place (memory_plan.h's output_home); until then output() is a view without
//   data.
//   set_fusion(false) runs the pair unfused again (the non-finite replay names every tensor that
//   way). A gelu stays apart, forward and backward, where this layer's GEMMs are bf16 and the
//   backend lists sdk::kFeatureGemmBf16GeluUnfused (choose_kernels): the same bits as unfused.
// - Backward epilogues (gemm facet 1.5's gemm_gradient, where the backend offers it for this
//   layer's dtypes and its operands are not FP8- or block-scaled):
//   - the bias gradient is summed by the wgrad GEMM when that GEMM reads dy as stored;
//   - a linear whose input is a gelu that another linear runs as its epilogue, and that it alone
//     reads (fuse_input), computes that gelu's gradient in its dgrad, dz = (dy·W)·gelu'(z) rounded
//     once, and the producer's bias gradient from dz; the gelu's backward and the producer's
//     bias_grad then do nothing (activation.h). In FP32 the results are the unfused ones bit for
//     bit; in 16-bit dz is rounded once where the unfused ops round dy·W and then dz.
//   set_fusion(false) and model.fuse_epilogues = false run them unfused too.
// - FP8 operands (a per-tensor-scaled policy, operand_scaler.h): the forward stages x for its GEMM
//   and keeps xᵀ for the wgrad (x itself where the backend's gemm facet has no cast_transpose;
//   nothing in evaluation or under a frozen weight), keeps W and Wᵀ once per optimizer step; the
//   backward stages dy and dyᵀ for its two GEMMs. Each GEMM reads its FP8 operands in the layout
//   that keeps the reduction dim contiguous where both exist. Where the backend's gemm facet
//   offers cast_transpose_gradient (1.7) for the gradient's dtype into both FP8 dtypes, under
//   delayed scaling and with fusion on, dy's cast also sums the bias gradient, and for a gelu this
//   linear runs as its epilogue, computes that gelu's gradient (casts_gelu_gradient; the gelu's
//   backward then leaves dy as it is, activation.h), reading z, which the plan then keeps alive
//   until this backward (backward_reads_output). The codes and amax are the unfused ops' exactly;
//   the bias gradient is their sum within FP32 rounding.
// - An input read by other ops as well (LoRA's A and its base read one x): the dgrad adds its
//   contribution into the FP32 sum as the GEMM's beta = 1 (layer.h), when fusion is on and the
//   operands are 16/32-bit.
// - A sum of linears (AddLayer::fuse_input, add.h): an add that alone reads this linear and a
//   second one may run both GEMMs into its own output, this one's writing it (beta 0) and the
//   other's adding to it (beta 1): LoRA's base output plus its B adapter's, with no output of
//   either in memory and no pass of the add. While it does (runs_in_reader), forward() keeps x
//   and the add calls forward_into at its own step; the output is deferred and, unfused (the
//   replay), written as usual, the first of the two (`home`) into the add's output.
// - Weight tying: with tie_weight = "<node>.<param>" the linear owns no weight; it reads and
//   accumulates into that parameter (an [out, in] matrix, e.g. a token embedding [vocab, C] for
//   an LM head with in = C, out = vocab). When the owner's working copy is not in this layer's
//   planned weight dtype, the layer casts the master itself each forward.
// - scale s (default 1) multiplies the product and not the bias, y = s·x·Wᵀ + b, as the GEMMs'
//   alpha: dx = s·dy·W and dW = s·dyᵀ·x. LoRA's B adapter carries alpha/r this way, so its output
//   is PEFT's lora_B(·)·scaling with no extra op. zero_init starts W and b at 0 (LoRA's B).
// - The chunked loss's blocks (layer.h) read one weight operand per pass, and a bias-free head
//   may pad them to a multiple of model.loss_pad_classes: a zero-padded copy of W, the padded
//   columns at the logits dtype's lowest finite value, dW summed in a padded scratch whose first
//   `out` rows are added once a pass (declarations below).
// - What the backward reads: x only for the weight gradient, so a frozen own weight (LoRA's base,
//   train.frozen) declares backward_reads_inputs false and the memory plan keeps x for no
//   backward of this op. Recomputed (model.recompute, memory_plan.h) unless it runs its gelu as
//   its epilogue (forward_writes_only_its_output): a second forward casts and scales x again,
//   the same codes and amax. Run in its reader (a sum of linears), it has no output to recompute:
//   the sum is recomputed instead, this forward run again first to keep x for forward_into.
// - Quantized base (train.frozen_format = "nf4", "fp8-block", "mxfp8"): a frozen own weight may be
//   stored so (can_quantize); each GEMM that reads it (forward, and backward's dx) decodes it into
//   the model's shared working copy in the weight's compute dtype, through the backend's
//   quantized_weight facet, which backend_needs() then asks for.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/ops/block_quantizer.h"
#include "graph/ops/operand_scaler.h"
#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

class ActivationLayer;

// y = x · Wᵀ + b with W [out, in] (PyTorch layout), FP32 accumulation.
class LinearLayer final : public Layer {
 public:
  // The one logical GEMM of a linear: forward y = x·Wᵀ, dgrad dx = dy·W, wgrad dW = dyᵀ·x. Its
  // FP8 scaling slots are "<node>.matmul.<input|weight|grad_output>".
  static constexpr const char* kGemm = "matmul";

  LinearLayer(std::string name, std::int64_t in, std::int64_t out, bool bias,
              std::string tie_weight = {}, sdk::SourceLocation tie_where = {},
              double init_std = 0.0, double scale = 1.0, bool zero_init = false);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void init_parameters(std::uint64_t seed) override;
  bool can_quantize(const std::string& suffix) const override {
    return suffix == "weight" && tie_weight_.empty();
  }
  // Takes a relu/gelu reader as this GEMM's epilogue (non-owning; both belong to one model).
  bool fuse_reader(Layer& reader) override;
  // Takes a gelu input (k = 0) that another linear runs as its epilogue: see the contract above.
  bool fuse_input(std::size_t k, Layer& input) override;
  void set_fusion(bool on) override;
  // Asks the backend for gemm_gradient (the backward epilogues) in this layer's dtypes.
  void choose_kernels(sdk::DeviceBackend& backend) override;
  // The sum of linears (the contract above). defer_into_reader(home): the add takes this linear
  // in, before choose_kernels. can_run_in_reader: what this linear allows (16/32-bit operands, no
  // FP8 or block scaling, no epilogue, not the chunked loss's logits), asked by the add's
  // choose_kernels, which then gives its verdict (allow_run_in_reader). runs_in_reader: now
  // (fusion on). forward_into: the GEMM of the x forward() kept into y (the add's output rows),
  // with beta.
  void defer_into_reader(bool home);
  bool can_run_in_reader() const;
  void allow_run_in_reader(bool allowed);
  bool runs_in_reader() const { return into_reader_ && reader_allows_ && fusion_on_; }
  // Not while it runs its activation as the GEMM's epilogue.
  bool forward_writes_only_its_output() const override { return !fused(); }
  void forward_into(sdk::TensorView y, float beta);
  bool can_accumulate_input_gradient(std::size_t k) const override;
  // dgrad's C in FP32 with beta = 0: what can_accumulate_input_gradient allows with beta = 1.
  bool writes_first_input_gradient_in_fp32(std::size_t k) const override {
    return can_accumulate_input_gradient(k);
  }
  // Block-scaled GEMMs (block_quantizer.h): no fused epilogue change, the three GEMMs become
  // gemm_block_scaled on operands quantized per pass.
  bool set_block_scaling(const sdk::BlockScalingFacet* facet) override;
  bool block_scaled() const override { return blocks_.active(); }
  // The chunked loss (layer.h): a linear under a 16/32-bit GEMM computes any block of rows on its
  // own; FP8 operand scaling (one amax over the whole batch), block scaling and an epilogue are
  // refused.
  std::string row_block_refusal() const override;
  void forward_rows(sdk::TensorView x, sdk::TensorView y) override;
  // The loss blocks of one pass (layer.h) read one weight operand, made (cast) at
  // begin_loss_blocks(), not at every block.
  // Padded classes (layer.h): a bias-free linear that computes row blocks pads out to a multiple
  // of m. Its blocks read a copy of W with zero rows appended, [padded, in], refreshed by
  // begin_loss_blocks(), and a bias [padded] of 0 then the logits dtype's lowest finite value;
  // their dW is summed into an fp32 [padded, in] scratch whose first `out` rows, a contiguous
  // prefix, end_loss_blocks() adds into the weight's gradient (take_grad_beta(), once a pass).
  void set_loss_block_padding(std::int64_t multiple) override;
  std::int64_t loss_block_columns() const override { return padded_out_ > 0 ? padded_out_ : out_; }
  void begin_loss_blocks() override;
  void end_loss_blocks() override;
  // A tied weight (GPT-2's LM head) read in bf16 or fp16 by GEMMs that take that dtype as stored
  // asks for a working copy of it (layer.h), in place of weight_operand()'s cast of the whole
  // master at every pass. Not where the GEMMs decode the dtype (begin_loss_blocks then rounds
  // slices of the master without a whole copy), not for FP8 (its scale is the scaler's).
  std::optional<sdk::DType> shared_working_dtype(const std::string& suffix) override;

 private:
  void add_decoding_need(std::vector<BackendNeed>& needs) const;
  ModelParameter* tied() const { return shared_parameter("weight"); }
  ModelParameter& weight() { return tied() != nullptr ? *tied() : params_[0]; }
  ModelParameter& bias() { return params_.back(); }
  // The weight as this layer's GEMMs read it: the (owner's) working copy, or a cast of the master
  // when a tied owner keeps its working copy in another dtype.
  sdk::TensorView weight_operand();
  // forward's GEMM but its output: x (cast, or FP8-scaled) times Wᵀ, the bias, alpha, compute.
  sdk::GemmArgs forward_args(sdk::TensorView x);
  void forward_block_scaled(sdk::TensorView x, std::int64_t rows);
  void backward_block_scaled(sdk::TensorView dy, sdk::TensorView dx);

  bool bias_;
  double init_std_;         // 0: PyTorch's nn.Linear init
  double scale_;            // the GEMMs' alpha
  bool zero_init_;
  std::string tie_weight_;  // "<node>.<param>" when the weight is another node's
  sdk::SourceLocation tie_where_;
  Tensor x_scratch_, dy_scratch_, w_scratch_;
  OperandScaler scaler_;  // FP8 operands, when the policy scales them
  BlockQuantizer blocks_;       // block-scaled operands, when the policy block-scales them
  std::uint64_t run_seed_ = 0;  // init_parameters()'s: keys stochastic rounding
  ActivationLayer* fused_ = nullptr;
  bool fusion_on_ = true;
  // The sum of linears: taken in by an add (into_reader_, home_in_reader_) and allowed by its
  // choose_kernels (reader_allows_); reader_x_ is the input forward() kept for forward_into.
  bool into_reader_ = false, home_in_reader_ = false, reader_allows_ = false;
  sdk::TensorView reader_x_;
  // The backend runs this layer's (bf16) GEMMs faster without a gelu epilogue, forward or
  // backward (sdk::kFeatureGemmBf16GeluUnfused; choose_kernels): a gelu reader, or the gelu input
  // whose gradient the dgrad would compute, then runs as its own op.
  bool gelu_unfused_ = false;
  bool declines(const ActivationLayer* act) const;
  void update_fusion();  // epilogue_fused_ and output_deferred from fused_ and fusion_on_
  // Backward epilogues. gradient_gemm_: the backend runs gemm_gradient for this layer's dtypes;
  // grad_input_: the gelu input whose gradient this dgrad may compute; input_gradient_done_:
  // whether the last backward did (the gelu and its producer, whose backwards come after this
  // one's, read it).
  friend class ActivationLayer;
  bool gradient_gemm_ = false;
  ActivationLayer* grad_input_ = nullptr;
  bool input_gradient_done_ = false;
  bool input_gradient_fusable() const;
  bool bias_grad_in_reader() const;  // the reader's dgrad summed this bias's gradient
  // FP8 gradients: gradient_cast_, the backend runs cast_transpose_gradient (1.7) for this
  // layer's gradient dtype (choose_kernels); folds_gradient_cast(), this backward may use it.
  bool gradient_cast_ = false;
  sdk::DType gradient_cast_dtype_ = sdk::DType::fp32;  // the gradient dtype it was asked for
  bool folds_gradient_cast(sdk::DType grad) const;
  // Whether this backward computes fused_'s gelu gradient in dy's cast, for an output gradient of
  // dtype `grad` (the gelu asks in its backward, which runs just before this one).
  bool casts_gelu_gradient(sdk::DType grad) const;
  void dgrad(const sdk::GemmOperand& dy, const sdk::GemmOperand& w, sdk::TensorView dx,
             std::int64_t rows);
  // Padded classes: padded_out_ is 0 when off; wgrad_padded_ is set once a block of the pass has
  // written padded_dw_, until end_loss_blocks() adds it.
  std::int64_t padded_out_ = 0;
  Tensor padded_w_, padded_bias_, padded_dw_;
  // Between begin_loss_blocks() and end_loss_blocks(): the weight operand of the pass's blocks,
  // made once (weight_operand() returns it), empty otherwise; decoded_w_ holds it in fp32 where
  // the backend's GEMMs decode the weight's dtype (gemm_decodes), and padded_w_ is then fp32 too.
  sdk::TensorView block_weight_;
  Tensor decoded_w_;
  // Whether the backend's gemm takes `weight` (bf16 or fp16) by decoding it to fp32
  // (BackendCapabilities: supported, not native); asked once.
  bool gemm_decodes(sdk::DType weight);
  bool gemm_decodes_known_ = false, decodes_bf16_ = false, decodes_fp16_ = false;
  bool wgrad_padded_ = false;
  bool padded_block(sdk::TensorView y) const {
    return padded_out_ > 0 && y.shape.cols() == padded_out_;
  }
};

}  // namespace mixtrain::core
