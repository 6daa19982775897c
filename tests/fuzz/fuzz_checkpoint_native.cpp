// Fuzzes the native checkpoint reader (NativeCheckpointFormat::read), past its checksum.
//
// Input, two shapes:
// - starting with "MIXTRAIN": a whole .mxt file. When the preamble's header length fits in the
//   file, the harness rewrites the header CRC after the mutation, so mutated headers reach the
//   JSON and metadata parsing instead of stopping at the checksum.
// - anything else: "<JSON header>\0<data section>". The harness builds a well-formed file around
//   it (preamble, CRC, 64-byte aligned data), so mutations concentrate on the JSON.
// sdk::UserError (CheckpointError) is an expected rejection.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz_support.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"
#include "native_checkpoint_format.h"
#include "native_file_layout.h"

namespace ckpt = mixtrain::checkpoint_native;
namespace sdk = mixtrain::sdk;

namespace {

std::uint32_t crc32_of(std::string_view bytes) {
  return static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

std::string fix_crc(std::string file) {
  if (file.size() < ckpt::kPreambleSize) return file;
  auto p = ckpt::decode_preamble(reinterpret_cast<const std::byte*>(file.data()));
  if (p.header_length > file.size() - ckpt::kPreambleSize) return file;
  p.header_crc32 = crc32_of(std::string_view(file).substr(ckpt::kPreambleSize, p.header_length));
  const auto pre = ckpt::encode_preamble(p);
  std::memcpy(file.data(), pre.data(), pre.size());
  return file;
}

std::string build_file(std::string_view input) {
  const auto parts = mixtrain::fuzz::split_at(input, std::string_view("\0", 1));
  ckpt::Preamble p;
  p.header_length = parts.first.size();
  p.header_crc32 = crc32_of(parts.first);
  const auto pre = ckpt::encode_preamble(p);
  std::string file(reinterpret_cast<const char*>(pre.data()), pre.size());
  file.append(parts.first);
  file.resize(ckpt::data_section_offset(p.header_length), '\0');
  file.append(parts.second);
  return file;
}

const ckpt::NativeCheckpointFormat& format() {
  static const ckpt::NativeCheckpointFormat f(
      sdk::Options::resolve("checkpoint", ckpt::NativeCheckpointFormat::option_schema(), {},
                            sdk::SourceLocation{"fuzz.toml", 1, 1}),
      sdk::PluginContext{});
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto input = mixtrain::fuzz::as_view(data, size);
  const bool whole = input.starts_with(std::string_view(ckpt::kMagic.data(), ckpt::kMagic.size()));
  const auto path = mixtrain::fuzz::scratch_file(
      "ckpt.mxt", whole ? fix_crc(std::string(input)) : build_file(input));
  try {
    (void)format().read(path);
  } catch (const sdk::UserError&) {
  }
  return 0;
}
