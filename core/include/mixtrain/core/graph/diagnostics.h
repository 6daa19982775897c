// Step diagnostics over a model's executor: the first non-finite tensor of a step, and the share
// of gradient values that underflow in the dtype the plan stores them in. Both replay the current
// batch through the executor's visitor hooks; neither changes how the model addresses a tensor.
//
// Contract
// - locate_first_nonfinite re-runs forward, loss and backward on the current batch (input(rows),
//   labels(rows)), unfused so that every node's output is written, checking every tensor as it
//   is written, and names the first one holding an inf or NaN ("forward fc2.output", "loss",
//   "backward fc1.weight.grad", "backward relu1 input gradient"); empty when all are finite.
//   NonfiniteSite::node is the node whose forward or backward wrote that tensor (the logits'
//   producer for the loss gradient), empty for the input batch and the loss: what automatic
//   escalation promotes. It overwrites parameter gradients: call it only for a step that will not
//   be applied. The model's buffers (batch norm's running statistics, which the replay's
//   training-mode forward would move a second time) and its fusion setting are as before the
//   call when it returns or throws. It allocates no device memory: what running unfused writes
//   is in the memory plan (the deferred outputs, memory_plan.h), and the rest is what a training
//   step already uses. Under
//   the chunked loss (chunked_loss.h) each block's logits and then its gradient are checked in
//   block order, and the name says from which row the block starts.
// - first_nonfinite_parameter names the first parameter (parameters() order) whose stored weights
//   (the FP32 master, or a frozen parameter's one copy) hold an inf or NaN; empty when all are
//   finite. A quantized weight is never checked: its formats encode finite values only. One
//   facet call over them all, and no device memory: cheap enough for every skipped step, where it
//   tells weights that no loss scale can recover from an overflow that the next scale avoids.
// - measure_gradient_underflow replays the loss and backward of the last forward with every
//   activation gradient kept in FP32, and counts for each layer boundary the non-zero values that
//   would round to zero when stored (still multiplied by grad_scale) in the planned dtype. It
//   overwrites parameter gradients; call it before the first micro-batch's backward. The FP32
//   arena it needs is the model's own when reserved (Model::allocate), else allocated per call.
//   The casts of those FP32 gradients into each op's dtype are freed as that op's backward ends
//   (Layer::set_pass_scratch): the pass holds one op's at a time, and keeps none. Under the
//   chunked loss there is no whole FP32 logits gradient, and it is not counted. A value counts as
//   flushed when its magnitude is at most underflow_threshold(dtype).
// - underflow_threshold: the largest float magnitude that storing in `dtype` (sdk/support's
//   encoders, round to nearest even, FP8 saturating) rounds to zero; 0 for a dtype that keeps
//   every non-zero float (fp32). Found by bisection with the encoder itself, so it is that rule.
// - Neither fires the gradient-ready hook.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {

struct NonfiniteSite {
  std::string where;  // "forward fc2.output", ...; empty: every tensor is finite
  std::string node;   // "fc2"; empty for the input batch and the loss
};
NonfiniteSite locate_first_nonfinite(Model& model, std::int64_t rows, float grad_scale);
std::string first_nonfinite_parameter(Model& model);

struct UnderflowCount {
  std::string tensor;  // "fc2 input gradient", "logits gradient"
  sdk::DType dtype;
  std::int64_t nonzero = 0, flushed = 0;
};
std::vector<UnderflowCount> measure_gradient_underflow(Model& model, std::int64_t rows,
                                                       float grad_scale);
float underflow_threshold(sdk::DType dtype);

}  // namespace mixtrain::core
