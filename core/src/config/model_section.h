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
// - Errors are sdk::ConfigError at the entry's file:line:col: an unknown block (with a "did you
//   mean"), a block that uses itself, repeat < 1, a repeated block with several inputs, `set` for
//   a node the block lacks, a block node without a name or with a '.' in it.
#pragma once

#include "mixtrain/core/config/config.h"
#include "mixtrain/core/config/experiment.h"

namespace mixtrain::core {

void read_model_config(const Config& config, Experiment& e);

}  // namespace mixtrain::core
