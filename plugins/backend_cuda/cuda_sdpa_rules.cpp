// The flash attention's host-side rules (cuda_sdpa_rules.h).
#include "cuda_sdpa_rules.h"

#include <bit>
#include <functional>
#include <sstream>

namespace mixtrain::backend_cuda::sdpa {

bool Key::operator==(const Key& o) const {
  return batch == o.batch && tokens == o.tokens && heads == o.heads && head_dim == o.head_dim &&
         dtype == o.dtype &&
         std::bit_cast<std::uint32_t>(scale) == std::bit_cast<std::uint32_t>(o.scale) &&
         deterministic == o.deterministic;
}

std::size_t KeyHash::operator()(const Key& k) const noexcept {
  std::size_t h = 0;
  auto mix = [&h](std::uint64_t v) {
    h ^= std::hash<std::uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  };
  for (std::int64_t v : {k.batch, k.tokens, k.heads, k.head_dim})
    mix(static_cast<std::uint64_t>(v));
  mix(static_cast<std::uint64_t>(k.dtype));
  mix(std::bit_cast<std::uint32_t>(k.scale));
  mix(k.deterministic ? 1 : 0);
  return h;
}

std::string key_text(const Key& k) {
  std::ostringstream s;
  s << "N " << k.batch << " T " << k.tokens << " H " << k.heads << " D " << k.head_dim << " "
    << sdk::dtype_name(k.dtype) << " scale " << k.scale
    << (k.deterministic ? " deterministic" : " non-deterministic");
  return s.str();
}

std::string static_refusal(std::int64_t tokens, std::int64_t head_dim, sdk::DType dtype, int sm) {
  if (dtype != sdk::DType::bf16 && dtype != sdk::DType::fp16)
    return "cuDNN's flash attention reads fp16 or bf16, not " + std::string(sdk::dtype_name(dtype));
  if (sm < 80)
    return "cuDNN's flash attention needs sm_80 or newer; this device is sm_" + std::to_string(sm);
  if (tokens < 1) return "a sequence needs at least one token";
  if (head_dim < 8 || head_dim % 8 != 0)
    return "cuDNN's flash attention needs a head dimension that is a multiple of 8 (16-byte "
           "rows); this one is " +
           std::to_string(head_dim);
  const std::int64_t most = sm >= 90 ? 256 : 128;
  if (head_dim > most)
    return "cuDNN's flash attention backward takes a head dimension of at most " +
           std::to_string(most) + " on sm_" + std::to_string(sm) + "; this one is " +
           std::to_string(head_dim);
  return {};
}

namespace {
std::int64_t sequences(const Key& k) {
  return k.batch > 0 ? k.batch : 1;
}
}  // namespace

Strided qkv_part(const Key& k, int part) {
  // Element (n, h, t, d) of part p sits at ((n·T + t)·3 + p)·H·D + h·D + d.
  const std::int64_t hd = k.heads * k.head_dim, row = 3 * hd;
  return {{sequences(k), k.heads, k.tokens, k.head_dim},
          {k.tokens * row, k.head_dim, row, 1},
          part * hd};
}

Strided token_major(const Key& k) {
  // Element (n, h, t, d) at (n·T + t)·H·D + h·D + d.
  const std::int64_t hd = k.heads * k.head_dim;
  return {{sequences(k), k.heads, k.tokens, k.head_dim}, {k.tokens * hd, k.head_dim, hd, 1}, 0};
}

Strided stats(const Key& k) {
  // Element (n, h, t) at (n·H + h)·T + t.
  return {{sequences(k), k.heads, k.tokens, 1}, {k.heads * k.tokens, k.tokens, 1, 1}, 0};
}

}  // namespace mixtrain::backend_cuda::sdpa
