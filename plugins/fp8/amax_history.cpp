#include "amax_history.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace mixtrain::fp8 {

float amax_max(float a, float b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return std::max(a, b);
}

AmaxHistory::AmaxHistory(std::size_t length) : ring_(length, 0.0f) {
  if (length == 0) throw std::invalid_argument("amax history length must be at least 1");
}

AmaxHistory::AmaxHistory(std::vector<float> ring, std::size_t position)
    : ring_(std::move(ring)), position_(position) {
  if (ring_.empty()) throw std::invalid_argument("amax history is empty");
  if (position_ >= ring_.size())
    throw std::invalid_argument("amax history position " + std::to_string(position_) +
                                " is outside a ring of " + std::to_string(ring_.size()));
}

void AmaxHistory::record(float amax) {
  ring_[position_] = amax_max(ring_[position_], amax);
}

float AmaxHistory::max() const {
  float m = 0.0f;
  for (float a : ring_) m = amax_max(m, a);
  return m;
}

float AmaxHistory::max_ignoring_nan() const {
  float m = 0.0f;
  for (float a : ring_) m = std::fmax(m, a);
  return m;
}

void AmaxHistory::roll() {
  position_ = (position_ + 1) % ring_.size();
  ring_[position_] = 0.0f;
}

std::vector<float> AmaxHistory::chronological() const {
  std::vector<float> out;
  out.reserve(ring_.size());
  for (std::size_t i = 1; i <= ring_.size(); ++i)
    out.push_back(ring_[(position_ + i) % ring_.size()]);
  return out;
}

AmaxHistory AmaxHistory::resized(std::size_t length) const {
  if (length == 0) throw std::invalid_argument("amax history length must be at least 1");
  const auto old = chronological();
  const std::size_t keep = std::min(length, old.size());
  std::vector<float> ring(length, 0.0f);
  std::copy(old.end() - static_cast<std::ptrdiff_t>(keep), old.end(),
            ring.end() - static_cast<std::ptrdiff_t>(keep));
  // Chronological order with the step in progress last, i.e. at the ring's last index.
  return AmaxHistory(std::move(ring), length - 1);
}

}  // namespace mixtrain::fp8
