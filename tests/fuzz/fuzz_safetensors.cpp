// Fuzzes the safetensors reader (SafetensorsFormat::read).
//
// Input, two shapes:
// - starting with '{': "<JSON header>\0<byte buffer>"; the harness prepends the u64 header
//   length, so mutations concentrate on the JSON and the offsets it names.
// - anything else: a whole .safetensors file, length prefix included.
// sdk::UserError (CheckpointError) is an expected rejection.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"
#include "safetensors_format.h"

namespace st = mixtrain::checkpoint_safetensors;
namespace sdk = mixtrain::sdk;

namespace {

std::string build_file(std::string_view input) {
  const auto parts = mixtrain::fuzz::split_at(input, std::string_view("\0", 1));
  std::string file(8, '\0');
  const std::uint64_t n = parts.first.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((n >> (8 * i)) & 0xFFu);
  file.append(parts.first);
  file.append(parts.second);
  return file;
}

const st::SafetensorsFormat& format() {
  static const st::SafetensorsFormat f(
      sdk::Options::resolve("checkpoint", st::SafetensorsFormat::option_schema(), {},
                            sdk::SourceLocation{"fuzz.toml", 1, 1}),
      sdk::PluginContext{});
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto input = mixtrain::fuzz::as_view(data, size);
  const auto path = mixtrain::fuzz::scratch_file(
      "weights.safetensors", input.starts_with('{') ? build_file(input) : std::string(input));
  try {
    (void)format().read(path);
  } catch (const sdk::UserError&) {
  }
  return 0;
}
