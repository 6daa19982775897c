#include "mixtrain/sdk/tensor_view.h"

#include <stdexcept>

#include "mixtrain/sdk/error.h"

namespace mixtrain::sdk {

void throw_size_overflow(const std::vector<std::int64_t>& dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  throw UserError("a tensor of shape " + text + "]" +
                      " has more elements or bytes than a 64-bit size can count",
                  "reduce the sizes that make it (layer widths, batch sizes, features or rows)");
}

Shape Shape::from_vector(const std::vector<std::int64_t>& d) {
  if (d.size() > static_cast<std::size_t>(kMaxRank))
    throw std::invalid_argument("tensor rank " + std::to_string(d.size()) + " exceeds " +
                                std::to_string(kMaxRank));
  Shape s;
  for (auto v : d) s.dims[static_cast<std::size_t>(s.rank++)] = v;
  return s;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[static_cast<std::size_t>(i)]);
  }
  return s + "]";
}

}  // namespace mixtrain::sdk
