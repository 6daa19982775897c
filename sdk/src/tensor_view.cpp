#include "mixtrain/sdk/tensor_view.h"

#include <stdexcept>

namespace mixtrain::sdk {

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
