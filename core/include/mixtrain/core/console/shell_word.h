// A word of a command line as a POSIX shell reads it back, for the commands messages print
// (`mixtrain train ... --set ...` to copy and run).
//
// Contract: shell_word(w) is w itself when w is not empty and holds only letters, digits and
// `_./=:,+-@%`; otherwise w in single quotes, each ' in it written '\''. The shell gives back w.
#pragma once

#include <string>

namespace mixtrain::core {

std::string shell_word(const std::string& word);

}  // namespace mixtrain::core
