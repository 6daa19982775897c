// Model: the graph plan, its ops and the executor, put together; see model.h for the contract.
#include "mixtrain/core/graph/model.h"

#include <algorithm>

#include "graph/backend_check.h"
#include "graph/ops/operand_scaler.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/graph/memory_plan.h"
#include "mixtrain/sdk/backend_residual.h"
#include "mixtrain/sdk/support/backend_features.h"

namespace mixtrain::core {

namespace {
// A 16-bit gradient sum adds its later contributions with the residual facet's add in place
// (Executor::backward): a backend without it keeps FP32 sums.
bool adds_in_16_bits(sdk::DeviceBackend& backend) {
  const auto* residual = sdk::facet<sdk::ResidualFacet>(backend);
  if (residual == nullptr) return false;
  for (const sdk::DType d : {sdk::DType::bf16, sdk::DType::fp16}) {
    const sdk::DType pair[2] = {d, d};
    if (!residual->supports(sdk::ResidualOp::add, pair)) return false;
  }
  return true;
}
}  // namespace

std::int64_t default_loss_chunk_rows(const sdk::DeviceBackend& backend, std::int64_t classes) {
  if (classes < kLossChunkClasses) return 0;
  return sdk::has_feature(backend.capabilities(), sdk::kFeatureGemmFullRateAtFewRows)
             ? kLossChunkRowsFewRows
             : kLossChunkRows;
}

std::int64_t default_loss_pad_classes(const sdk::DeviceBackend& backend, std::int64_t classes) {
  if (classes % 8 == 0) return 0;
  return sdk::has_feature(backend.capabilities(), sdk::kFeatureGemmWantsAlignedRows)
             ? kLossPadClasses
             : 0;
}

Model::Model(std::shared_ptr<sdk::DeviceBackend> backend, const ModelSpec& spec,
             std::int64_t input_features, std::int32_t classes, InputSpec input)
    : backend_(std::move(backend)),
      plan_(GraphPlan::build(spec, input_features, classes, input, ops_)),
      executor_(backend_, plan_, ops_),
      label_smoothing_(static_cast<float>(spec.label_smoothing)),
      epilogue_fusion_(spec.fuse_epilogues),
      loss_chunk_rows_(spec.loss_chunk_rows.value_or(default_loss_chunk_rows(*backend_, classes))),
      // Padded classes would take a share of label smoothing's ε / classes.
      loss_pad_classes_(
          spec.label_smoothing != 0.0
              ? 0
              : spec.loss_pad_classes.value_or(default_loss_pad_classes(*backend_, classes))) {
  if (!plan_.fp32_gradient_sums() && !adds_in_16_bits(*backend_)) {
    plan_.keep_fp32_gradient_sums();
    core_logger("model").info(
        "model.fp32_gradient_sums = false: the backend's residual facet cannot add 16-bit "
        "gradients in place, so tensors read several times keep FP32 gradient sums");
  }
}

void Model::check_backend() const {
  core::check_backend(plan_, ops_, *backend_);
}

void Model::allocate(Executor::PassRows rows, bool reserve_fp32_gradients) {
  check_backend();
  executor_.allocate(rows, reserve_fp32_gradients, loss_chunk_rows_, loss_pad_classes_);
  bind_operand_amaxes();
  set_mode(mode_);
}

LivenessPlan Model::plan_activations(std::int64_t max_rows,
                                     std::optional<sdk::DType> as_dtype) const {
  return core::plan_activations(plan_, ops_, max_rows, as_dtype);
}

void Model::set_mode(Mode mode) {
  mode_ = mode;
  for (auto& l : ops_) l->set_training(mode == Mode::train);
  executor_.set_evaluating(mode == Mode::eval);
}

void Model::begin_micro_batch(std::int64_t index, std::int64_t count, std::int64_t step,
                              std::int64_t replica, SampleRange samples) {
  if (index == 0) {
    executor_.start_gradients();
    // A step's delayed-scaling amaxes start from zero: one fill of the table, not one per cast.
    bool fp8 = false;
    for (const OperandScaler* s : scalers_) fp8 = fp8 || s->active();
    if (fp8) {
      backend_->fill(operand_amaxes_.view(), 0.0f);
      for (OperandScaler* s : scalers_) s->table_zeroed();
    }
  }
  open_micro_batch_ = MicroBatch{index + 1 == count};
  // Replica 0's draws are a single process's, so one rank (or none) trains as before.
  for (auto& l : ops_) l->begin_micro_batch(index, step, replica * count + index, samples);
}

void Model::init_parameters(std::uint64_t seed,
                            const std::function<bool(const ModelParameter&)>& filled_by_load) {
  if (filled_by_load)
    for (auto& l : ops_)
      for (auto& p : l->parameters()) p.filled_by_load = filled_by_load(p);
  for (auto& l : ops_) l->init_parameters(seed);
  for (auto& l : ops_)
    for (auto& p : l->parameters()) p.filled_by_load = false;
  refresh_working_copies();
}

void Model::refresh_working_copies() {
  for (auto& l : ops_)
    for (auto& p : l->parameters())
      if (!p.working.empty() && !p.master.empty())  // a frozen copy has no master to follow
        backend_->cast(p.master.view(), p.working.view());
}

void Model::compute_loss(std::int64_t rows, float grad_scale, bool with_grad) {
  executor_.compute_loss(rows, grad_scale, label_smoothing_,
                         with_grad ? std::optional(executor_.planned_gradients()) : std::nullopt);
}

LossValues Model::evaluation_loss(std::int64_t rows) {
  executor_.compute_loss(rows, 1.0f, 0.0f, std::nullopt);
  return read_loss();
}

LossValues Model::loss(std::int64_t rows, float grad_scale, bool with_grad) {
  compute_loss(rows, grad_scale, with_grad);
  return read_loss();
}

void Model::backward(std::int64_t rows, const Executor::BackwardVisitor& visit) {
  // Without begin_micro_batch() a backward is a whole step: it starts the gradients afresh.
  if (!open_micro_batch_) executor_.start_gradients();
  const bool last = open_micro_batch_.value_or(MicroBatch{}).last;
  open_micro_batch_.reset();
  executor_.backward(Extent::batch_of(rows), executor_.planned_gradients(), last, visit);
}

void Model::set_epilogue_fusion(bool on) {
  epilogue_fusion_ = on;
  for (auto& l : ops_) l->set_fusion(on);
}

std::int64_t Model::fused_pairs() const {
  std::int64_t n = 0;
  for (const auto& l : ops_)
    if (l->fused()) ++n;
  return n;
}

void Model::bind_operand_amaxes() {
  scalers_.clear();
  for (auto& l : ops_)
    if (OperandScaler* s = l->operand_scaler()) scalers_.push_back(s);
  operand_amaxes_ = Tensor();
  if (scalers_.empty()) return;
  const auto count = static_cast<std::int64_t>(scalers_.size());
  operand_amaxes_ = Tensor(backend_, sdk::DType::fp32, sdk::Shape{3 * count});
  backend_->fill(operand_amaxes_.view(), 0.0f);
  for (std::size_t i = 0; i < scalers_.size(); ++i)
    scalers_[i]->bind_amaxes({static_cast<float*>(operand_amaxes_.view().data) + 3 * i,
                              sdk::DType::fp32, sdk::Shape{3}});
  // One staging for all: a transient layout lives only from its cast to the GEMMs right after.
  operand_staging_ = std::make_shared<OperandStaging>();
  for (OperandScaler* s : scalers_) s->bind_staging(operand_staging_.get());
}

void Model::flush_operand_amaxes(const std::function<void(std::span<float>)>& reduce) {
  const std::vector<OperandScaler*>& scalers = scalers_;
  bool pending = false;
  for (const OperandScaler* s : scalers) pending = pending || s->amaxes_pending();
  // One read of the table for every layer's amaxes: on a GPU each read is a wait.
  std::vector<float> host, amaxes;
  if (pending) {
    host.resize(static_cast<std::size_t>(operand_amaxes_.view().numel()));
    backend_->copy_to_host(host.data(), operand_amaxes_.view());
    for (std::size_t i = 0; i < scalers.size(); ++i)
      scalers[i]->pending_amaxes(host.data() + 3 * i, amaxes);
    if (reduce) reduce(amaxes);
  }
  std::size_t at = 0;
  for (OperandScaler* s : scalers)
    at += s->record_amaxes(std::span<const float>(amaxes).subspan(at));
}

std::vector<ModelParameter*> Model::parameters() {
  std::vector<ModelParameter*> out;
  for (auto& l : ops_)
    for (auto& p : l->parameters()) out.push_back(&p);
  return out;
}

std::vector<ModelParameter*> Model::trainable_parameters() {
  std::vector<ModelParameter*> out;
  for (ModelParameter* p : parameters())
    if (!p->frozen) out.push_back(p);
  return out;
}

std::vector<ModelBuffer*> Model::buffers() {
  std::vector<ModelBuffer*> out;
  for (auto& l : ops_)
    for (auto& b : l->buffers()) out.push_back(&b);
  return out;
}

std::int64_t Model::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& l : ops_)
    for (const auto& p : l->parameters()) n += p.numel();
  return n;
}

}  // namespace mixtrain::core
