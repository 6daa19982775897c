#include "token_ids.h"

#include <charconv>
#include <limits>
#include <system_error>

#include "mixtrain/sdk/error.h"

namespace mixtrain::cli {

namespace {

constexpr const char* kForm = "give token ids as whole numbers separated by commas, e.g. 464,3290";

// Line ends too: ids kept in a file written on Windows arrive as "464,3290\r\n".
std::string_view trim(std::string_view s) {
  constexpr const char* kSpace = " \t\r\n";
  const auto b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

}  // namespace

std::vector<std::int32_t> parse_token_ids(std::string_view text, std::string_view flag) {
  std::vector<std::int32_t> ids;
  std::size_t item = 0;
  for (std::size_t from = 0;; ++item) {
    const auto comma = text.find(',', from);
    const auto part =
        trim(text.substr(from, comma == std::string_view::npos ? comma : comma - from));
    const std::string where = (flag.empty() ? "" : std::string(flag) + ": ") + "item " +
                              std::to_string(item + 1) + " of '" + std::string(text) + "'";
    if (part.empty()) throw sdk::UserError(where + " is empty", kForm);
    std::int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    const bool whole = ec != std::errc::invalid_argument && ptr == part.data() + part.size();
    if (!whole)
      throw sdk::UserError(where + ", '" + std::string(part) + "', is not a whole number", kForm);
    if (ec == std::errc::result_out_of_range || value < 0 ||
        value > std::numeric_limits<std::int32_t>::max())
      throw sdk::UserError(where + ", " + std::string(part) +
                               ", is out of range: a token id is from 0 to " +
                               std::to_string(std::numeric_limits<std::int32_t>::max()),
                           kForm);
    ids.push_back(static_cast<std::int32_t>(value));
    if (comma == std::string_view::npos) break;
    from = comma + 1;
  }
  return ids;
}

CLI::Validator token_ids_flag() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        try {
          parse_token_ids(input, {});  // CLI11 puts the flag's name before the message
        } catch (const sdk::UserError& e) {
          return std::string(e.what()) + ": " + e.hint();
        }
        return {};
      },
      "ID,ID,...");
}

void check_in_vocabulary(std::span<const std::int32_t> ids, std::int64_t vocab,
                         std::string_view flag) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw sdk::UserError(std::string(flag) + ": token id " + std::to_string(ids[i]) + " (item " +
                               std::to_string(i + 1) + ") is outside this model's vocabulary of " +
                               std::to_string(vocab) + " tokens (ids 0 to " +
                               std::to_string(vocab - 1) + ")",
                           flag == "--stop-ids"
                               ? "give the ids of tokens the model can produce (a byte-level "
                                 "model's are its bytes: --stop-ids 10 stops after a newline)"
                               : "encode the prompt with the tokenizer the model was trained with");
}

std::string format_token_ids(std::span<const std::int32_t> ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace mixtrain::cli
