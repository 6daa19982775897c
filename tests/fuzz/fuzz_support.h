// Helpers shared by the libFuzzer harnesses: the readers under test take file paths, so each input
// is written to a scratch file of this process first.
//
// Contract: scratch_file() returns a path in $TMPDIR (or /tmp) unique to this process and `tag`,
// overwritten by every call and removed at exit. Nothing here throws on a valid path; an I/O
// failure aborts, because it is a broken fuzzing host, never a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>

namespace mixtrain::fuzz {

inline std::filesystem::path scratch_file(const std::string& tag, std::string_view bytes) {
  static std::map<std::string, std::filesystem::path> paths;
  auto [it, fresh] = paths.try_emplace(tag);
  if (fresh) {
    const char* dir = std::getenv("TMPDIR");
    it->second = std::filesystem::path(dir != nullptr && *dir != 0 ? dir : "/tmp") /
                 ("mixtrain-fuzz-" + std::to_string(getpid()) + "-" + tag);
    static const bool registered = [] {
      std::atexit([] {
        std::error_code ec;
        for (const auto& [t, p] : paths) std::filesystem::remove(p, ec);
      });
      return true;
    }();
    (void)registered;
  }
  std::FILE* f = std::fopen(it->second.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  if (std::fclose(f) != 0) std::abort();
  return it->second;
}

// Splits `input` at the first `separator`: (before, after), or (input, nullopt-like empty) with
// `found` false when it does not occur.
struct Split {
  std::string_view first, second;
  bool found = false;
};
inline Split split_at(std::string_view input, std::string_view separator) {
  const auto pos = input.find(separator);
  if (pos == std::string_view::npos) return {input, {}, false};
  return {input.substr(0, pos), input.substr(pos + separator.size()), true};
}

inline std::string_view as_view(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace mixtrain::fuzz
