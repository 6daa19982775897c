// [model.lora] from_peft's adapters into a new run's model (config/lora_section.h reads the
// table; checkpoint/peft_adapter.h the folder). Internal to the core.
//
// Contract
// - load_peft_adapter() runs once the base weights are in (the seeded initialisation, then
//   checkpoint.init_from): every adapter parameter of the model (n.lora_A.weight [r, in],
//   n.lora_B.weight [out, r]) takes the tensor PEFT names for it in adapter_model.safetensors
//   (peft_tensor_name of n's module), in FP32 (the safetensors reader widens fp16 and bf16
//   exactly); the working copies and the EMA start from them. A step-0 state: a resume takes
//   its adapters from its checkpoint and never calls it.
// - sdk::ConfigError at [model.lora]'s keys: the folder's own errors (open_peft_adapter_at), a
//   config that disagrees with it (check_peft_agreement: a run's config.toml states r, alpha and
//   targets, checked only here), and a checkpoint.init_from whose trained adapters it would
//   replace. sdk::CheckpointError naming the file and tensor: an adapter the file lacks (its
//   two files are of different adapters), a shape other than the parameter's (another base
//   model or r), a tensor that is not floating point, and a tensor the model has no adapter for
//   (PEFT's lora_embedding_A, a bias, modules_to_save), which would be dropped.
#pragma once

#include "train/trainer_state.h"

namespace mixtrain::core {

void load_peft_adapter(Trainer::State& s);

}  // namespace mixtrain::core
