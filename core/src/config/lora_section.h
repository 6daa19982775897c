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
//   config.toml does not need the folder to be read: a table that states r, alpha and targets
//   is not checked against the folder here (a new run's start checks it, before loading the
//   adapters; a resume, eval, predict and sample never open it, whatever the folder now holds).
// - Errors are sdk::ConfigError at the key's file:line:col (the folder's own errors, quoted, at
//   from_peft).
#pragma once

#include "mixtrain/core/checkpoint/peft_adapter.h"
#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"

namespace mixtrain::core {

void read_lora(const Config& config, Experiment& e);

// from_peft's folder opened (open_peft_adapter), its errors as sdk::ConfigError at the key; a
// folder that is gone says a run started from it resumes from its own config.toml.
PeftAdapterFolder open_peft_adapter_at(const PeftAdapterSource& source);

// The folder's adapter_config.json against the experiment's [model.lora] once read: r and alpha
// equal, the targets the nodes its target_modules adapts. sdk::ConfigError at the key that
// disagrees. read_lora() calls it when it opened the folder, and a new run's start always
// (train/peft_import.h), before it loads the adapters.
void check_peft_agreement(const Experiment& e, const PeftAdapterFolder& adapter);

}  // namespace mixtrain::core
