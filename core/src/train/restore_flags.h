// The command-line flags that give a resumed run back the values its checkpoint was trained with:
// what a warning of a change on resume offers, since the run folder's config.toml then already
// holds the new values. Internal to the core.
//
// Contract
// - restore_flags(changes): for each change "key = old -> new" (resolved_values.h's
//   changed_values, resume_terms.h's changed_* lists), "--set key=old", space-separated, each
//   one word for a POSIX shell and, typed as it is, parsed back by --set to the old value: a key
//   "model.layers[1].type" becomes "model.layers.1.type", a string value that --set reads as the
//   same string without its quotes loses them ("optimizer.schedule=cosine"), and a word holding
//   what the shell reads specially is single-quoted whole (--set 'k=[1, 2]'). A change whose old
//   side is "(none)" (a key the run did not have) or that is not of that form gives no flag. Empty
//   when no change gives one.
#pragma once

#include <string>
#include <vector>

namespace mixtrain::core {

std::string restore_flags(const std::vector<std::string>& changes);

}  // namespace mixtrain::core
