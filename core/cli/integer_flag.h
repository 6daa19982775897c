// The one check every integer flag of the command line goes through (CLI11's own conversion
// saturates: `--steps 99999999999999999999` would become 2^63-1 and run).
//
// Contract: the validator accepts a decimal whole number in [min, max] and rewrites it in plain
// decimal, so CLI11 converts exactly that value (no octal "010", no hex); anything else (a sign
// below 0 for an unsigned flag, a number past the type's range, trailing text) is a
// CLI::ValidationError that names the value, the range and how to fix it: exit 2 with the
// other command-line errors.
#pragma once

#include <cstdint>
#include <limits>

#include <CLI/CLI.hpp>

namespace mixtrain::cli {

CLI::Validator integer_flag(std::int64_t min,
                            std::int64_t max = std::numeric_limits<std::int64_t>::max());
// The full range of a std::uint64_t flag (a seed).
CLI::Validator unsigned_flag();

}  // namespace mixtrain::cli
