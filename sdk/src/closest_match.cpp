// sdk::closest_match (options.h): the "did you mean" of every unknown key, choice and name.
#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mixtrain/sdk/options.h"

namespace mixtrain::sdk {

namespace {

// Names users bring from other tools (PyTorch, Hugging Face, Keras) for what mixtrain spells
// otherwise: no edit distance links them.
constexpr std::array<std::pair<std::string_view, std::string_view>, 8> kAliases = {{
    {"learning_rate", "lr"},
    {"learningrate", "lr"},
    {"weightdecay", "weight_decay"},
    {"epsilon", "eps"},
    {"max_steps", "steps"},
    {"num_steps", "steps"},
    {"batchsize", "batch_size"},
    {"random_seed", "seed"},
}};

bool is_candidate(std::string_view name, const std::vector<std::string>& candidates) {
  return std::find(candidates.begin(), candidates.end(), name) != candidates.end();
}

std::string alias_of(std::string_view word, const std::vector<std::string>& candidates) {
  for (const auto& [alias, name] : kAliases)
    if (word == alias && is_candidate(name, candidates)) return std::string(name);
  return {};
}

// The one candidate that is `word` and a suffix after a separator (fp16 -> fp16-mixed): a name
// the user shortened, however far it is by edits.
std::string only_extension_of(std::string_view word, const std::vector<std::string>& candidates) {
  std::string found;
  for (const auto& c : candidates)
    if (c.size() > word.size() + 1 && c.compare(0, word.size(), word) == 0 &&
        (c[word.size()] == '-' || c[word.size()] == '_' || c[word.size()] == '.')) {
      if (!found.empty()) return {};
      found = c;
    }
  return found;
}

std::size_t levenshtein(std::string_view a, std::string_view b) {
  // Two rows, O(|a|·|b|).
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  if (auto alias = alias_of(word, candidates); !alias.empty()) return alias;
  if (auto longer = only_extension_of(word, candidates); !longer.empty()) return longer;
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const auto& c : candidates)
    if (const auto d = levenshtein(word, c); d < best_d) {
      best_d = d;
      best = c;
    }
  // As many edits as the word has letters rewrite it: "lr" is two edits from "dir", and no typo.
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  return best_d <= limit && best_d < word.size() ? best : std::string{};
}

}  // namespace mixtrain::sdk
