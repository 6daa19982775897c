// Token ids on the command line (`sample --prompt-ids`, `--print-ids`): the form in which mixtrain
// takes and prints the tokens of a model whose vocabulary is not bytes. mixtrain ships no
// tokenizer (README, "Tokens for a pretrained GPT-2", says why); the model's own tokenizer turns
// text into these ids and back, outside mixtrain.
//
// Contract
// - The form: whole decimal numbers separated by commas, spaces around each allowed
//   ("464,3290, 318"), line ends too (a Windows file's "\r\n"), every one in [0, 2^31 - 1];
//   format_token_ids() writes it back without spaces, so `sample --print-ids` output is a valid
//   --prompt-ids.
// - parse_token_ids() throws sdk::UserError naming `flag` and the item (its text and 1-based
//   position) that is empty, not a whole number or out of range, and says the form;
//   token_ids_flag() is the same check as a CLI11 validator, so a malformed list exits 2 as the
//   command line is parsed, as every integer flag does (integer_flag.h).
// - check_in_vocabulary() throws sdk::UserError naming the first id >= `vocab` (or < 0), its
//   position, and the vocabulary size: the ids a model of `vocab` outputs are [0, vocab).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

namespace mixtrain::cli {

std::vector<std::int32_t> parse_token_ids(std::string_view text, std::string_view flag);

CLI::Validator token_ids_flag();

void check_in_vocabulary(std::span<const std::int32_t> ids, std::int64_t vocab,
                         std::string_view flag);

std::string format_token_ids(std::span<const std::int32_t> ids);

}  // namespace mixtrain::cli
