#include "integer_flag.h"

#include <charconv>
#include <string>
#include <system_error>
#include <type_traits>

namespace mixtrain::cli {

namespace {

template <class T>
std::string range_text(T min, T max) {
  if (max == std::numeric_limits<T>::max()) return std::to_string(min) + " or more";
  return "from " + std::to_string(min) + " to " + std::to_string(max);
}

template <class T>
CLI::Validator whole_number_in(T min, T max) {
  const std::string range = range_text(min, max);
  return CLI::Validator(
      [min, max, range](std::string& input) -> std::string {
        T value{};
        const char* end = input.data() + input.size();
        const auto [ptr, ec] = std::from_chars(input.data(), end, value);
        // A minus sign is a number out of an unsigned flag's range, not a typo.
        const bool negative_unsigned =
            std::is_unsigned_v<T> && ec == std::errc::invalid_argument && input.size() > 1 &&
            input[0] == '-' && input.find_first_not_of("0123456789", 1) == std::string::npos;
        std::string what;
        if (ec == std::errc::result_out_of_range || negative_unsigned ||
            (ec == std::errc() && ptr == end && (value < min || value > max)))
          what = " is out of range";
        else if (ec != std::errc() || ptr != end || input.empty())
          what = " is not a whole number";
        if (!what.empty()) return input + what + ": give a whole number " + range;
        input = std::to_string(value);
        return {};
      },
      range);
}

}  // namespace

CLI::Validator integer_flag(std::int64_t min, std::int64_t max) {
  return whole_number_in(min, max);
}

CLI::Validator unsigned_flag() {
  return whole_number_in<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max());
}

}  // namespace mixtrain::cli
