#include "train/skip_blame.h"

namespace mixtrain::core {

SkipBlame SkipBlame::in_micro_batch(std::int64_t index, std::int64_t count) const {
  if (!found()) return *this;
  return {
      "micro-batch " + std::to_string(index + 1) + " of " + std::to_string(count) + ": " + tensor,
      node, scale_made};
}

bool SkipBlame::in_backward() const {
  std::string_view t = tensor;
  if (t.starts_with("micro-batch "))
    if (const auto colon = t.find(": "); colon != std::string_view::npos)
      t.remove_prefix(colon + 2);
  return t.starts_with("backward ");
}

// The tensor, then the node after the first newline: a tensor name may be anything a node and a
// role make, a node name never holds a newline.
std::string SkipBlame::to_text() const {
  return found() ? tensor + '\n' + node : std::string();
}

SkipBlame SkipBlame::from_text(std::string_view text) {
  const auto cut = text.find('\n');
  if (cut == std::string_view::npos) return {std::string(text), {}};
  return {std::string(text.substr(0, cut)), std::string(text.substr(cut + 1))};
}

}  // namespace mixtrain::core
