// Layer: one op of the model graph — its forward/backward pair over buffers allocated once, and
// what it is (OpTraits) as data.
//
// Contract
// - Shapes: an op sees each input as [rows, cols] (GraphPlan: a per-sample shape [d1..dk] is
//   d1·..·d(k-1) rows of dk per sample; ops that read images see [C, H, W] through their
//   geometry). in_features()/out_features() are the last dimensions of its (first) input and of
//   its output; rows <= the max_rows given to allocate().
// - The op owns its output activation (stored in precision().activation), its parameters (FP32
//   master + FP32 gradient + optional low-precision working copy) and anything it saves for
//   backward. Inputs are views owned by the executor's memory plan, valid until the next forward.
// - The core pair: forward(x, rows) writes output(rows); backward(x, dy, dx, rows) contributes to
//   the FP32 parameter gradients and, when dx is not empty, writes the input's gradient in dx's
//   dtype. Ops with several inputs (traits().inputs > 1: add) implement forward_inputs /
//   backward_inputs instead; an empty dxs[i] means input i needs no gradient. A parameter
//   gradient is zeroed once per optimizer step: the first contribution of a step overwrites it,
//   every later one (the next micro-batch, a tied parameter's other user) adds to it; ops ask
//   ModelParameter::take_grad_beta() which of the two a write is.
// - Data, not code: traits() (GEMMs and their operand roles, precision sensitivity, which tensors
//   backward reads, views, pass-through gradients, FLOPs, owned and shared parameter shapes) is
//   filled by the op's constructor and by the graph rewrites it takes part in (fuse_reader,
//   take_relu, set_fusion), before the plans read it.
// - Freezing (graph/freezing.h): freeze(suffix) before allocate() makes that parameter frozen.
//   Its backward then skips that parameter's gradient work (a GEMM, a reduction, a scatter-add),
//   reading `frozen` of the parameters it uses, a tied one included; the input gradient is still
//   written when dx is given.
// - Buffers: non-trainable FP32 state an op keeps across steps (batch norm's running statistics),
//   named "<layer>.<buffer>", saved in checkpoints and exported beside the parameters. Never
//   touched by the optimizer; an op updates them itself, usually in training mode only.
// - Mode: set_training(false) puts the op in evaluation mode (no buffer updates, inference
//   behaviour); the model sets every op's mode at once (Model::set_mode).
// - Shared parameters (weight tying): an op may use another node's parameter instead of owning
//   one (traits().shared_parameters names them; the executor binds them after allocate()).
//   parameters() lists only what the op owns, so the optimizer and checkpoints see a tied
//   parameter once; used_parameters() lists everything the op reads and writes. Where the user
//   reads it narrower than it is stored (shared_working_dtype) and the owner reads only masters
//   (reads_parameter_masters), the executor gives the parameter a working copy in that dtype.
// - FP8 operand scaling: an op with scaled GEMM operands registers its OperandScaler
//   (use_operand_scaler); the model drives it through set_operand_scaling, begin_micro_batch and
//   flush_operand_amaxes.
// - Math runs on the backend; a layer performs only the casts its precision plan asks for.
// - Ops live one per file under core/src/graph/ops/ and are registered in one table
//   (core/src/graph/ops/op_registry.cpp); the rest of the core sees only this interface.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mixtrain/core/graph/backend_needs.h"
#include "mixtrain/core/graph/bound_facets.h"
#include "mixtrain/core/graph/freezing.h"
#include "mixtrain/core/graph/quantized_weight.h"
#include "mixtrain/core/graph/tensor.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/policy_block_scaling.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::core {

// A frozen parameter (graph/freezing.h) has no grad and is stored once, in the dtype its op
// computes with: in `working` when it has a low-precision copy (master empty), else in `master`;
// or, a frozen linear weight under a quantized train.frozen_format, in `quant` alone (master and
// working empty): its op decodes it into a working copy before each GEMM (Layer::dequantized).
// The samples of a micro-batch's global batch that one data-parallel replica computes: `count`
// of them from `first` (0 and 0 in one process: all of them).
struct SampleRange {
  std::int64_t first = 0;
  std::int64_t count = 0;
};

struct ModelParameter {
  std::string name;  // "<layer>.weight"
  Tensor master;     // fp32; empty for a frozen parameter stored in `working`
  Tensor grad;       // fp32; empty when frozen, or when the model plans no training pass
  Tensor working;    // low-precision copy; empty when the weight dtype is fp32 / tf32
  QuantizedWeight quant;  // a frozen weight stored quantized (NF4, an FP8 block format); else empty
  bool weight_decay = true;
  bool frozen = false;
  // Set only while Model::init_parameters runs, for a parameter that a checkpoint's load fills
  // next: its random draw is skipped and it is zeroed instead (ops/op_support.h, fill_uniform and
  // fill_normal).
  bool filled_by_load = false;
  // Whether grad holds a contribution of the current optimizer step (Model::begin_micro_batch
  // clears it): the next write adds to it instead of overwriting.
  bool grad_started = false;
  sdk::TensorView compute_view() const { return working.empty() ? master.view() : working.view(); }
  // The weights as stored: the master, or a frozen parameter's one copy; not for a quantized one,
  // which has no such view (parameter_to_host_fp32 reads every kind).
  sdk::TensorView value() const { return master.empty() ? working.view() : master.view(); }
  bool quantized() const { return !quant.empty(); }
  sdk::Shape shape() const { return quantized() ? quant.shape : value().shape; }
  std::int64_t numel() const { return shape().numel(); }
  // Device bytes of its stored weights (not its gradient or working copies).
  std::size_t stored_bytes() const { return quantized() ? quant.bytes() : value().bytes(); }
  // The beta (0: overwrite, 1: add) for a kernel writing the next contribution into grad; marks
  // the gradient started.
  float take_grad_beta() {
    const float beta = grad_started ? 1.0f : 0.0f;
    grad_started = true;
    return beta;
  }
};

// Writes FP32 host values (numel() floats) into p: its master, or a frozen parameter's one copy,
// rounded there as refresh_working_copies rounds a master into its working copy, or quantized on
// the host (graph/quantized_weight.h; a non-finite value is std::invalid_argument).
void set_parameter_from_fp32(const std::shared_ptr<sdk::DeviceBackend>& backend, ModelParameter& p,
                             const float* host);
// p's stored weights as FP32 on the host: a master as it is, a narrower copy widened exactly, a
// quantized weight decoded by the SDK's reference (bit for bit what the backend decodes in fp32).
std::vector<float> parameter_to_host_fp32(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                          const ModelParameter& p);

// Non-trainable state of an op, kept in FP32 on the device.
struct ModelBuffer {
  std::string name;  // "<layer>.<buffer>", e.g. "bn1.running_mean"
  Tensor value;      // fp32
};

// A parameter this op uses but another node owns: `suffix` is the op's own slot ("weight"),
// `source` the owner's parameter name ("embed.weight").
struct SharedParameter {
  std::string suffix, source;
  sdk::SourceLocation where;        // the config line that asks for the tie
  std::string key;                  // the node key that names it ("tie_weight")
  std::vector<std::int64_t> shape;  // the shape this op needs it to have
};

// A dimension of an op's GEMM or convolution that Tensor Cores want aligned
// (precision/tensor_core_lint.h).
struct TensorCoreDim {
  std::string what;  // "input features", "output channels"
  std::int64_t size = 0;
  bool input_channels = false;  // a convolution's input channels (the first layer's exception)
};

class OperandScaler;

// What one op keeps across the decode steps of one sequence (Layer::make_decode_state), owned by
// the Decoder that decodes it.
struct DecodeState {
  virtual ~DecodeState() = default;
};

// What an op is, as data (see the contract above).
struct OpTraits {
  // Its GEMMs with their operand roles, as the precision policy sees them (sdk/op_description.h).
  std::vector<sdk::GemmDescription> gemms;
  // Statistics, softmax, loss: the host keeps every tensor of it in FP32 whatever the policy.
  bool precision_sensitive = false;
  // The dimensions of its GEMMs that Tensor Cores want in multiples of 8 (16 for FP8); the Layer
  // constructor sets the last dimensions of input and output.
  std::vector<TensorCoreDim> tensor_core_dims;
  std::size_t inputs = 1;  // how many inputs it reads (add: two or more)
  // A view (reshape, flatten, an absorbed relu) computes nothing: its output is its input's
  // memory seen with another shape, and its input's gradient is its output's gradient.
  bool view = false;
  // What backward reads besides dy, for the activation liveness plan: an input that is read must
  // stay intact until this op's backward. The defaults are the safe answers for a new op.
  bool backward_reads_inputs = true;
  bool backward_reads_output = false;
  // Every input's gradient is the output's gradient itself (dx_k = dy, a sum): the memory plan may
  // give one input whose only reader is this op the memory of the output's gradient (same dtype),
  // and backward_inputs finds that dx at dy's address, already written.
  bool passes_gradient_through = false;
  // Its backward reads its output's gradient and never writes it (a linear: dy is a GEMM
  // operand), so a pass-through op may lend its output gradient's memory to it and to a second
  // such input at once (memory_plan.h).
  bool backward_keeps_output_gradient = false;
  // allocate() leaves the output unallocated (a view; a linear whose fused relu writes for it);
  // materialise_output() makes it later.
  bool output_deferred = false;
  // A deferred output that, when it materialises, may be written into the output of its one
  // reader, which then works in place (a batch norm that an add runs in its pass: unfused, batch
  // norm writes into the add's output and the add adds the residual to it; a linear's z, which
  // its relu rectifies in place). memory_plan.h.
  bool output_in_reader = false;
  // Its output is written during the forward of the op producing its input 0 (a layer norm that
  // the add before it runs in its pass, the activation a linear runs as its GEMM epilogue), so it
  // lives from that op's forward on. memory_plan.h.
  bool output_written_by_input = false;
  // Its forward runs inside its one reader's pass, at that reader's step (a batch norm that the
  // add after it runs: BN + add), so its inputs are read then. memory_plan.h.
  bool forward_in_reader = false;
  // Its input is read only as a GEMM operand, rounded to its plan's gemm_input dtype (a linear:
  // forward and wgrad).
  bool reads_input_as_gemm_operand = false;
  // A precision-sensitive op whose output may be stored in bf16 when every reader reads it as a
  // bf16 GEMM operand, which rounds it to bf16 on every read anyway (a layer norm before its
  // linears; precision/planning.h).
  bool output_may_take_readers_gemm_dtype = false;
  // Its forward or backward passes the backend an argument that changes from step to step (a
  // dropout mask's key): a recorded step graph would replay a stale one, so a model with such an
  // op is never recorded (train/step_graph.h).
  bool varies_per_step = false;
  // Training statistics that data parallel can sum over the ranks (synchronized batch norm): the
  // op takes a StatisticsReducer (set_statistics_reducer) and then needs synchronized_needs().
  bool reduces_statistics = false;
  // Its GEMMs read fp8 operands only as a policy scales them (a convolution: its channels-last
  // input is cast by its operand scaler), so a plan of fp8 GEMM inputs that no policy scales is
  // refused for it at planning; a linear casts them at a scale of 1.
  bool fp8_only_scaled = false;
  // Forward FLOPs per output row (a multiply-add is 2): what `mixtrain check` sums per sample.
  // The Layer constructor sets out_features.
  std::int64_t forward_flops_per_row = 0;
  // The parameters the op owns or would own, by suffix ("weight" -> [out, in]); a tie is checked
  // against them.
  struct Parameter {
    std::string suffix;
    std::vector<std::int64_t> shape;
  };
  std::vector<Parameter> parameters;
  std::vector<SharedParameter> shared_parameters;  // taken from other nodes (weight tying)
};

class Layer {
 public:
  Layer(std::string name, std::string type, std::int64_t in, std::int64_t out);
  virtual ~Layer();

  const std::string& name() const { return name_; }
  const std::string& type() const { return type_; }
  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  const OpTraits& traits() const { return traits_; }
  const std::vector<sdk::GemmDescription>& gemms() const { return traits_.gemms; }
  bool precision_sensitive() const { return traits_.precision_sensitive; }
  bool has_gemm() const { return !traits_.gemms.empty(); }
  const std::vector<TensorCoreDim>& tensor_core_dims() const { return traits_.tensor_core_dims; }
  std::size_t input_count() const { return traits_.inputs; }
  bool is_view() const { return traits_.view; }
  bool backward_reads_inputs() const { return traits_.backward_reads_inputs; }
  bool backward_reads_output() const { return traits_.backward_reads_output; }
  bool passes_gradient_through() const { return traits_.passes_gradient_through; }
  std::int64_t forward_flops_per_row() const { return traits_.forward_flops_per_row; }
  // The shape of the parameter "<name>.<suffix>" this op owns or would own, empty when it has
  // none by that name.
  std::vector<std::int64_t> parameter_shape(const std::string& suffix) const;
  const std::vector<SharedParameter>& shared_parameters() const {
    return traits_.shared_parameters;
  }
  sdk::OpDescription description() const;

  void set_precision(const sdk::OpPrecision& p) { precision_ = p; }
  const sdk::OpPrecision& precision() const { return precision_; }
  // For policies whose GEMM operands carry per-tensor scales (FP8): the op's OperandScaler asks
  // the policy for each operand's dtype and scale, casts with saturation and a fused amax, and
  // reports the amax back. Non-owning; the policy outlives the model. Ops without a scaler ignore
  // it.
  void set_operand_scaling(sdk::PrecisionPolicy* policy);
  // For policies with block-scaled GEMM operands (policy_block_scaling.h): an op with a
  // block-scaled path takes the policy's facet and returns true; any other op returns false, and
  // the host refuses the plan naming it. Non-owning; the policy outlives the model.
  virtual bool set_block_scaling(const sdk::BlockScalingFacet* /*facet*/) { return false; }
  // Whether this op's GEMMs run on block-scaled operands (set_block_scaling took a facet).
  virtual bool block_scaled() const { return false; }
  // The op's FP8 operand scaler (nullptr: none): the model binds its amaxes into one table and
  // hands them to the policy (Model::flush_operand_amaxes).
  OperandScaler* operand_scaler() const { return operand_scaler_; }
  // Called at the start of every micro-batch (index 0 opens an optimizer step `step`): the FP8
  // amax of delayed scaling spans the step, and random ops key their draws on the step, which a
  // resumed run restores and a replay of the step does not advance. `draw` numbers the
  // micro-batch among every data-parallel replica's (Model::begin_micro_batch; index, one
  // process's): stochastic rounding draws per replica. `samples` is which samples of the
  // micro-batch's global batch this replica computes (all of them in one process, {0, 0}):
  // dropout draws per global sample, so a sample gets the mask it gets in one process, whichever
  // rank computes it.
  void begin_micro_batch(std::int64_t index, std::int64_t step, std::int64_t draw,
                         SampleRange samples = {});
  void begin_micro_batch(std::int64_t index, std::int64_t step) {
    begin_micro_batch(index, step, index);  // one process
  }
  std::int64_t step() const { return step_; }
  std::int64_t micro_batch() const { return micro_batch_; }
  std::int64_t draw() const { return draw_; }
  SampleRange samples() const { return samples_; }

  // Per scaled operand of the last step (when collection is on): what the FP8 cast did to it.
  struct ScaledOperandStats {
    std::string slot;  // sdk::OperandSlot::name(): "<node>.<gemm>.<role>"
    sdk::DType dtype;
    float amax = 0.0f, scale = 1.0f;
    std::int64_t count = 0, saturated = 0, underflowed = 0, nonzero = 0;
  };
  void collect_operand_stats(bool on) {
    collect_stats_ = on;
    stats_.clear();
  }
  const std::vector<ScaledOperandStats>& operand_stats() const { return stats_; }

  virtual void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows);
  virtual void forward(sdk::TensorView x, std::int64_t rows) = 0;
  virtual void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                        std::int64_t rows) = 0;
  virtual void forward_inputs(std::span<const sdk::TensorView> xs, std::int64_t rows) {
    forward(xs[0], rows);
  }
  virtual void backward_inputs(std::span<const sdk::TensorView> xs, sdk::TensorView dy,
                               std::span<const sdk::TensorView> dxs, std::int64_t rows) {
    backward(xs[0], dy, dxs[0], rows);
  }
  // Input gradients added in place. A tensor read by several ops has one FP32 gradient, the sum
  // of their contributions: the first overwrites it, the others are written apart and added by
  // the executor (a cast or an axpy over the whole tensor). An op that can add its contribution
  // for input k into an fp32 buffer in its own pass (a GEMM's beta = 1, a kernel that adds)
  // answers can_accumulate_input_gradient(k) true, asked after choose_kernels; the executor then
  // hands it the sum itself as that dx, with accumulate_input_gradient(k) true for that one
  // backward call (never in a backward with a visitor, which reads each contribution apart: the
  // non-finite replay, the underflow measurement, a step observer).
  virtual bool can_accumulate_input_gradient(std::size_t /*k*/) const { return false; }
  // The same into a 16-bit sum of `dtype` (model.fp32_gradient_sums = false): the op adds its
  // contribution and rounds the sum once into dtype.
  virtual bool can_accumulate_input_gradient_in(std::size_t /*k*/, sdk::DType /*dtype*/) const {
    return false;
  }
  // The first contribution to an FP32 sum, written by the op in FP32 (a GEMM's C in FP32, beta 0)
  // rather than in its activation_grad dtype, then cast: the executor hands it the sum itself as
  // that dx (accumulate_input_gradient(k) false), never in a backward with a visitor. The sum
  // then holds every contribution unrounded, the first as the later ones that the op adds
  // itself. The memory plan still reserves the contribution's buffer apart (the replay's).
  virtual bool writes_first_input_gradient_in_fp32(std::size_t /*k*/) const { return false; }
  bool accumulate_input_gradient(std::size_t k) const {
    return k < accumulate_dx_.size() && accumulate_dx_[k];
  }
  void set_input_gradient_accumulation(std::vector<bool> on) { accumulate_dx_ = std::move(on); }
  // Step workspaces: device bytes a pass of the op can use for `rows` rows of its output (a
  // convolution's scratch, convolution facet 1.2: cuDNN's workspace on CUDA, the operands decoded
  // to fp32 on the CPU), planned by the step's memory plan live
  // at that pass's step only (memory_plan.h), asked after choose_kernels; 0 by default. The
  // executor binds the workspace (set_step_workspace) for the one call of that pass in the step's
  // own forward and backward (the non-finite replay's too, which keep the same schedule), and in
  // the all-FP32 pass's backward one from that pass's own plan, and clears it after; in every
  // other pass (decoding, a forward run by a reader or by the chunked loss) step_workspace() is
  // empty and the op runs without one.
  // For a backward, the plan says what the executor will hand each input's gradient as, so an op
  // asks only for the calls it will make.
  enum class Pass { forward, backward };
  struct WorkspaceAsk {
    Pass pass = Pass::forward;
    std::int64_t rows = 0;
    // Backward, per input: whether it needs a gradient, and the dtype of its sum where several
    // ops' contributions are summed (the op may add into it: can_accumulate_input_gradient).
    std::vector<bool> input_needs_gradient;
    std::vector<std::optional<sdk::DType>> input_gradient_sum;
    // The all-FP32 pass's backward (the underflow measurement): every input gradient written in
    // FP32, none added into a sum.
    bool fp32_gradients = false;
  };
  virtual std::size_t step_workspace_bytes(const WorkspaceAsk& /*ask*/) const { return 0; }
  void set_step_workspace(sdk::TensorView workspace) { step_workspace_ = workspace; }
  sdk::TensorView step_workspace() const { return step_workspace_; }
  // Host-side initialisation of parameters from a seed (PyTorch's defaults for the layer type),
  // and of buffers to their starting values.
  virtual void init_parameters(std::uint64_t /*seed*/) {}
  // The backend facet ops this layer calls under its precision plan, given its input's storage
  // dtype: asked before the first step, so a backend that lacks one stops the plan. A function of
  // the precision plan, which is set after construction, hence not a trait.
  virtual std::vector<BackendNeed> backend_needs(sdk::DType /*input*/) const { return {}; }
  // Ops with traits().reduces_statistics: `reducer` sums a host vector over the ranks in place
  // (empty: local statistics), and the facet ops that path adds to backend_needs().
  using StatisticsReducer = std::function<void(std::span<double>)>;
  virtual void set_statistics_reducer(StatisticsReducer /*reducer*/) {}
  virtual std::vector<BackendNeed> synchronized_needs() const { return {}; }

  // Graph rewrites (GraphPlan::build), each answering whether the op took part:
  // - fuse_reader: the plan offers each op its single reader; an op that can run that reader
  //   inside its own kernel (a linear and a relu/gelu, as a GEMM epilogue) takes it; set_fusion
  //   switches such a pair between fused and unfused runs (the non-finite replay runs unfused).
  // - take_relu: a relu as part of this op (batch norm + ReLU, add + ReLU), forward and backward:
  //   offered to an op whose only reader is a relu; answering true applies it for good, and the
  //   relu node becomes a view of this op's output.
  // - fuse_input: the plan offers each op each input k whose producer it alone reads (directly,
  //   not through a view); an op that can run that producer inside its own pass (an add and the
  //   batch norm before it: BN + add + ReLU; a linear and the gelu before it, whose gradient its
  //   dgrad computes) takes it, and set_fusion switches it as above.
  // - fuse_one_reader: the plan offers each op each of its direct readers, however many it has;
  //   an op that can write that reader's output in its own pass while still writing its own for
  //   the others (an add and the layer norm reading its sum: add + layer norm) takes it, and
  //   set_fusion switches it as above.
  virtual bool fuse_reader(Layer& /*reader*/) { return false; }
  virtual bool fuse_one_reader(Layer& /*reader*/) { return false; }
  virtual bool fuse_input(std::size_t /*k*/, Layer& /*input*/) { return false; }
  virtual void set_fusion(bool /*on*/) {}
  bool fused() const { return epilogue_fused_; }
  virtual bool take_relu() { return false; }
  // model.recompute (GraphPlan::build, before the rewrites above): the output is not kept for the
  // backward; the executor runs this op's forward again, into a buffer of its own, just before
  // the first backward that reads the output (memory_plan.h). No reader takes such an op as its
  // epilogue, so the forward and the recomputation run the same kernel, bit for bit.
  void set_recomputes_output(bool on) { recomputes_output_ = on; }
  bool recomputes_output() const { return recomputes_output_; }
  // Whether this op's forward, run again, writes its own output alone (not one it runs as its
  // epilogue: a linear's gelu): the memory plan recomputes no other.
  virtual bool forward_writes_only_its_output() const { return true; }
  // An op recomputed because its inputs are, whatever model.recompute lists: a sum of linears
  // (add.h, LoRA's adapted linear) whose linears recompute their outputs is their output.
  virtual bool recomputed_with_its_inputs() const { return false; }

  // Called by the executor before its memory plans, with the backend the op will run on and its
  // precision plan set: an op whose kernels (and so what its backward keeps) depend on what the
  // backend offers chooses them here and sets its traits to match (attention: flash or not).
  virtual void choose_kernels(sdk::DeviceBackend& /*backend*/) {}

  // The chunked loss (graph/chunked_loss.h): the logits node may compute its output a block of
  // rows at a time inside the loss, so that the whole logits never exist.
  // - row_block_refusal(): why this op cannot ("" when it can); asked under its precision plan.
  // - forward_rows(x, y): y [rows, out] for x [rows, in], into the caller's memory; the op's own
  //   output is not written. The block's backward is backward() on the same rows: parameter
  //   gradients follow take_grad_beta(), so the blocks of one pass sum.
  // - set_loss_chunk_rows(r), by the executor before allocate(): r > 0 leaves the output
  //   unplanned and unallocated until something asks for the whole logits (a prediction, a
  //   decode step), when forward() materialises it; 0 (the default) is the ordinary op.
  virtual std::string row_block_refusal() const {
    return "a " + type_ + " node computes its output whole";
  }
  virtual void forward_rows(sdk::TensorView /*x*/, sdk::TensorView /*y*/) {
    throw std::logic_error("forward_rows: node '" + name_ + "' has no row-block forward");
  }
  void set_loss_chunk_rows(std::int64_t rows) { loss_chunk_rows_ = rows; }
  std::int64_t loss_chunk_rows() const { return loss_chunk_rows_; }
  // - set_loss_block_padding(m), by the executor after set_loss_chunk_rows(): an op that can
  //   computes its blocks with out_features() padded to a multiple of m (ModelSpec::
  //   loss_pad_classes; 0 or 1: none), the padded columns at the logits dtype's lowest finite
  //   value, so the loss gives them probability 0 and their gradient 0; loss_block_columns() is
  //   then a block's width. begin_loss_blocks() and end_loss_blocks() bracket one pass's blocks
  //   (a padded op refreshes its padded weight before them and adds its weight gradient after).
  virtual void set_loss_block_padding(std::int64_t /*multiple*/) {}
  virtual std::int64_t loss_block_columns() const { return out_; }
  virtual void begin_loss_blocks() {}
  virtual void end_loss_blocks() {}

  // The model's activation plan places this op's output in its arena (non-owning; set before
  // allocate(), and again whenever the executor's placement changes: Executor::set_evaluating).
  // Without it the layer allocates its own output.
  void use_output_storage(void* data) { planned_output_ = data; }
  // Where a deferred output goes once it materialises (the op runs unfused): the executor's plan
  // of deferred outputs (memory_plan.h), non-owning, set before allocate() and with the output's.
  // Without it the layer allocates that output itself.
  void use_deferred_output_storage(void* data) { deferred_output_ = data; }
  // Bytes of the output at `max_rows` rows (stored in `as_dtype` when given), 0 when it is
  // deferred or a view (nothing to plan).
  std::size_t planned_output_bytes(std::int64_t max_rows,
                                   std::optional<sdk::DType> as_dtype = std::nullopt) const;

  // While on, a scratch tensor that as_dtype() or scratch_tensor() makes where the op held none
  // belongs to the pass that asked for it, and release_pass_scratch() frees it: the all-FP32
  // underflow measurement casts every gradient into each op's dtype, and no step reads those
  // casts again, so each op's go when its backward is done instead of staying for the run.
  // Scratch the op already held (a step's own) is never freed.
  void set_pass_scratch(bool on) { pass_scratch_ = on; }
  void release_pass_scratch();

  // Training (the default) or evaluation mode; ops whose behaviour differs override on_mode().
  void set_training(bool training) {
    training_ = training;
    on_mode(training);
  }
  bool training() const { return training_; }

  // Decoding one sequence token by token (graph/decoder.h) is a pass of its own, not a mode of
  // the op: the Decoder asks each op once for what it keeps across the sequence's steps
  // (attention: a KV cache of `capacity` positions; nullptr where nothing is kept, as in row-wise
  // ops) and owns it. decode_forward runs one step whose rows are the new tokens at positions
  // [start, start + rows), with that state; it writes only the op's output and per-pass scratch,
  // which every forward overwrites, so the model may train between decode steps.
  // make_decode_state throws sdk::UserError when the op cannot decode `capacity` positions.
  virtual std::unique_ptr<DecodeState> make_decode_state(std::int64_t /*capacity*/) const {
    return nullptr;
  }
  virtual void decode_forward(std::span<const sdk::TensorView> xs, std::int64_t /*start*/,
                              std::int64_t rows, DecodeState* /*state*/) {
    forward_inputs(xs, rows);
  }

  // false: the model plans no training pass (an evaluation-only allocation), so allocate() gives
  // the op's parameters no gradient tensor (p.grad empty, as a frozen one's); set by the executor
  // before allocate().
  void set_parameter_gradients(bool on) { parameter_gradients_ = on; }
  // Marks the parameter "<name>.<suffix>" frozen; before allocate() (see the contract).
  void freeze(const std::string& suffix);
  bool frozen(const std::string& suffix) const;
  // Whether the frozen parameter `suffix` may be stored quantized (a linear's own weight), and
  // storing it so, in `format` (NF4 in blocks of `block`), decoding into `scratch`: one working
  // copy that every quantized weight of the model shares, since ops run one at a time. Before
  // allocate(), after freeze().
  virtual bool can_quantize(const std::string& /*suffix*/) const { return false; }
  void quantize_frozen(const std::string& suffix, FrozenFormat format, std::int64_t block,
                       std::shared_ptr<Tensor> scratch);
  bool quantized(const std::string& suffix) const;

  // Binds a parameter another node owns to this op's `suffix` slot, after allocate(): `source`
  // outlives this op (both belong to one model).
  void bind_shared_parameter(const std::string& suffix, ModelParameter& source);
  // The dtype in which this op reads the shared parameter `suffix`, when it would read it from a
  // working copy of that dtype that the optimizer refreshes with each update instead of rounding
  // the master itself at every pass; nullopt: it reads the parameter as it is stored. Asked after
  // bind_shared_parameter.
  virtual std::optional<sdk::DType> shared_working_dtype(const std::string& /*suffix*/) {
    return std::nullopt;
  }
  // Whether this op reads its own parameters from their FP32 masters whatever working copies they
  // have (an embedding's gather): a copy that another op asks for then changes nothing here.
  virtual bool reads_parameter_masters() const { return false; }

  // The output activation; a view without data (data == nullptr) while it is not materialised.
  sdk::TensorView output(std::int64_t rows) const;
  // The parameters this op owns (see the contract for shared ones).
  std::vector<ModelParameter>& parameters() { return params_; }
  const std::vector<ModelParameter>& parameters() const { return params_; }
  // Every parameter this op reads and writes gradients into: the shared ones, then its own.
  std::vector<ModelParameter*> used_parameters();
  std::vector<ModelBuffer>& buffers() { return buffers_; }
  const std::vector<ModelBuffer>& buffers() const { return buffers_; }

 protected:
  // An FP32 master and gradient, and a working copy in `weight` when that is narrower than FP32
  // (nullopt: none); frozen, only the copy its op reads (see ModelParameter).
  ModelParameter make_parameter(const std::string& suffix, sdk::Shape shape, bool decay,
                                std::optional<sdk::DType> weight = std::nullopt);
  // An FP32 buffer "<layer>.<suffix>" filled with `value` (call from allocate()).
  ModelBuffer make_buffer(const std::string& suffix, sdk::Shape shape, float value);
  virtual void on_mode(bool /*training*/) {}
  void materialise_output();
  // `x` as `dtype`: x itself when it already is, else a cast into `scratch` (grown on demand).
  sdk::TensorView as_dtype(sdk::TensorView x, sdk::DType dtype, Tensor& scratch);
  // `scratch` viewed as `shape` of `dtype`, made anew when it is empty, smaller or of another
  // dtype.
  sdk::TensorView scratch_tensor(Tensor& scratch, sdk::DType dtype, sdk::Shape shape);
  // The parameter bound to `suffix` by bind_shared_parameter, or nullptr.
  ModelParameter* shared_parameter(const std::string& suffix) const;
  // A quantized parameter decoded into the shared scratch as `dtype` (the backend's
  // quantized_weight facet), valid until the next op decodes; p is quantized().
  sdk::TensorView dequantized(const ModelParameter& p, sdk::DType dtype);
  // Registers the op's FP8 operand scaler (a member of the op; nullptr: none).
  void use_operand_scaler(OperandScaler* scaler) { operand_scaler_ = scaler; }

  // The backend's facets, bound by allocate(): what forward and backward call kernels through.
  const BoundFacets& facets() const { return facets_; }

  std::shared_ptr<sdk::DeviceBackend> backend_;
  BoundFacets facets_;
  std::string name_, type_;
  std::int64_t in_, out_;
  OpTraits traits_;
  sdk::OpPrecision precision_;
  std::int64_t max_rows_ = 0;
  Tensor output_;
  void* planned_output_ = nullptr;   // in the model's activation arena, when planned
  std::int64_t loss_chunk_rows_ = 0;  // set_loss_chunk_rows()
  std::vector<bool> accumulate_dx_;   // set_input_gradient_accumulation(), by the executor
  sdk::TensorView step_workspace_;    // set_step_workspace(), by the executor
  void* deferred_output_ = nullptr;  // in the executor's deferred-output arena, when planned
  bool output_unfused_ = false;      // materialise_output() made the output deferred_output_
  std::vector<ModelParameter> params_;
  std::vector<ModelBuffer> buffers_;
  std::vector<std::string> frozen_;  // suffixes of the frozen parameters (freeze())
  std::vector<std::string> quantized_;  // of those, the ones stored quantized (quantize_frozen())
  FrozenFormat quant_format_ = FrozenFormat::compute;
  std::int64_t quant_block_ = 0;
  std::shared_ptr<Tensor> dequant_scratch_;  // shared by the model's quantized weights
  bool training_ = true;
  bool parameter_gradients_ = true;                     // set_parameter_gradients()
  std::int64_t step_ = 0, micro_batch_ = 0, draw_ = 0;  // the last begin_micro_batch()'s
  SampleRange samples_;
  bool epilogue_fused_ = false;  // runs a reader as its epilogue now (fuse_reader, set_fusion)
  bool recomputes_output_ = false;  // set_recomputes_output()
  bool collect_stats_ = false;
  std::vector<ScaledOperandStats> stats_;

 private:
  std::vector<std::pair<std::string, ModelParameter*>> shared_;  // bound shared parameters
  OperandScaler* operand_scaler_ = nullptr;
  bool pass_scratch_ = false;
  std::vector<Tensor*> pass_made_;  // members scratch_tensor() made for the pass
};

}  // namespace mixtrain::core
