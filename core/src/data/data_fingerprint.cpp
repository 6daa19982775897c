#include "data/data_fingerprint.h"

#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "distributed/rank_agreement.h"

namespace mixtrain::core {

std::string data_fingerprint(const Dataset& d) {
  std::vector<std::byte> pieces;
  auto take = [&](std::span<const std::byte> bytes) {
    constexpr std::size_t kPiece = 64 * 1024, kPieces = 64;
    if (bytes.size() <= kPiece * kPieces) {
      pieces.insert(pieces.end(), bytes.begin(), bytes.end());
      return;
    }
    const std::size_t step = (bytes.size() - kPiece) / (kPieces - 1);
    for (std::size_t i = 0; i < kPieces; ++i) {
      const auto piece = bytes.subspan(i * step, kPiece);
      pieces.insert(pieces.end(), piece.begin(), piece.end());
    }
  };
  take(std::as_bytes(std::span(d.x)));
  take(std::as_bytes(std::span(d.y)));
  take(std::as_bytes(std::span(d.tokens)));
  take(std::as_bytes(std::span(d.pixels)));
  // Image files: each one's class folder and name (not the root, so that a folder moved or
  // mounted elsewhere is the same data; not the pixels, which would mean reading every file).
  std::string names;
  for (const auto& f : d.image_files)
    names += f.parent_path().filename().string() + "/" + f.filename().string() + '\n';
  take(std::as_bytes(std::span(names)));
  char text[16];
  std::snprintf(text, sizeof text, "crc %08x", static_cast<unsigned>(crc32_of(pieces)));
  return text;
}

}  // namespace mixtrain::core
