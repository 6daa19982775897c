// The [model.lora] table: low-rank adapters beside linear nodes (graph/lora.h), optionally
// started from a PEFT adapter folder. Read after [train] (the adapters join train.trainable) into
// Experiment::model and Experiment::from_peft, with the resolved section. Internal to the core.
//
// Contract
// - Without the table the model is left as it is. r, alpha, dropout as lora_schema(); targets is
//   a list of node names or fnmatch globs, each matching at least one linear node.
// - from_peft = "DIR" (checkpoint/peft_adapter.h; relative to the config file's folder): r, alpha,
//   dropout and targets the table leaves out come from DIR/adapter_config.json (targets: the
//   linear nodes whose PEFT module name its target_modules adapts, by PEFT's rule); r and alpha
//   the table states must equal the file's (they shape the tensors and scale them), targets it
//   states must select the same nodes, and a dropout it states wins (training noise, not the
//   function). A module target_modules adapts that is not a linear node, or none at all, is
//   refused. The resolved config states all four and from_peft's absolute path, so a run's
//   config.toml does not need the folder to be read: when DIR is gone and the table states r,
//   alpha and targets, the folder is not opened here (a new run's start then fails to load it;
//   resume, eval, predict and sample never do).
// - Errors are sdk::ConfigError at the key's file:line:col (the folder's own errors, quoted, at
//   from_peft).
#pragma once

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"

namespace mixtrain::core {

void read_lora(const Config& config, Experiment& e);

}  // namespace mixtrain::core
