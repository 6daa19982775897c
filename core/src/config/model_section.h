// The [model] table: its scalar keys, the node list in either form, and reusable blocks, read
// into Experiment::model with the resolved sections. Internal to the core.
//
// Contract
// - `layers = [...]` (each reads the one before) or `nodes = [...]` (each names its inputs); not
//   both. Unnamed layers of the sequential form are numbered per type (relu1, relu2, ...).
// - [model.blocks.<block>]: `inputs = [...]` (the block's formal inputs), `nodes = [...]` (each
//   named, reading block nodes or formal inputs), optional `output` (default: the last node).
// - A node with `block = "<block>"` instantiates it: `inputs` as for any node, `repeat = R` (>= 1;
//   repetition r > 0 reads repetition r - 1, so a repeated block takes one input) and
//   `set = { <node> = { <option> = value } }` to change a block node's options in this instance.
//   Instance nodes are named "<instance>.<node>" (R = 1) or "<instance>.<r>.<node>", so globs such
//   as "res.*.fc1" select them; other nodes name the instance to read its output. Blocks nest.
// - The model is expanded here: ModelSpec holds only op nodes (blocks gone, graph form when a
//   block is used), and the resolved config writes that expanded form back.
// - `from_pretrained = "DIR"` (a Hugging Face GPT-2 folder, checkpoint/hf_folder.h) builds the
//   gpt preset (preset may be absent or "gpt"; no layers/nodes) with DIR/config.json's sizes;
//   a size [model.gpt] also gives must equal it, and bias must stay true. The data's vocab_size
//   must be the folder's, and its block_size at most the folder's n_positions. Experiment::from_pretrained keeps the folder and its model.safetensors
//   for read_checkpoint; fields the preset accepts without modelling them (dropout) become
//   config_warnings. The resolved config writes preset = "gpt" with every size, each commented
//   with its source, and from_pretrained = "". The folder's errors are sdk::ConfigError at the
//   key, quoting the folder's own message (path, field, value).
// - Errors are sdk::ConfigError at the entry's file:line:col: an unknown block (with a "did you
//   mean"), a block that uses itself, repeat < 1, a repeated block with several inputs, `set` for
//   a node the block lacks, a block node without a name or with a '.' in it.
#pragma once

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"

namespace mixtrain::core {

void read_model_config(const Config& config, Experiment& e);

}  // namespace mixtrain::core
