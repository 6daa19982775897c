// Unit tests of the `native` checkpoint format: round trips, the on-disk layout, every class of
// damaged or hostile file, atomic writes, options, and loading the real plugin module.
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <boost/dll/import.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "mixtrain/sdk/format_partial_read.h"
#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "native_checkpoint_format.h"
#include "native_file_layout.h"
#include "scoped_filesystem_user.h"

// ------------------------------------------------------------------------------------------------
// Every plain `new` of this binary is measured, so hostile-file tests can prove the reader never
// allocates what a header merely claims.
namespace {
std::atomic<std::size_t> g_largest_allocation{0};
void note_allocation(std::size_t n) {
  std::size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
  while (n > seen && !g_largest_allocation.compare_exchange_weak(seen, n)) {
  }
}
void* checked_malloc(std::size_t n) {
  note_allocation(n);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return checked_malloc(n); }
void* operator new[](std::size_t n) { return checked_malloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

namespace fs = std::filesystem;
namespace sdk = mixtrain::sdk;
namespace ckpt = mixtrain::checkpoint_native;
using ckpt::NativeCheckpointFormat;
using sdk::CheckpointError;

sdk::Options resolve_options(const std::vector<sdk::RawOption>& raw) {
  return sdk::Options::resolve("checkpoint", NativeCheckpointFormat::option_schema(), raw,
                               sdk::SourceLocation{"test.toml", 1, 1});
}

NativeCheckpointFormat make_format(bool fsync = false) {
  return NativeCheckpointFormat(resolve_options({{"fsync", fsync, {"test.toml", 2, 1}}}),
                                sdk::PluginContext{});
}

std::vector<std::byte> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xFF);
  return out;
}

sdk::HostTensor make_tensor(std::string name, sdk::DType dtype, std::vector<std::int64_t> shape,
                            std::uint32_t seed) {
  sdk::HostTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes = random_bytes(static_cast<std::size_t>(t.numel()) * sdk::dtype_size(dtype), seed);
  return t;
}

// Every dtype in rank 0..4 and empty shapes, plus metadata that exercises JSON escaping and UTF-8.
sdk::TrainingState sample_state() {
  sdk::TrainingState s;
  std::uint32_t seed = 1;
  const std::vector<std::vector<std::int64_t>> shapes = {
      {}, {7}, {3, 5}, {2, 3, 4}, {2, 1, 3, 5}, {0}, {4, 0, 2}};
  for (const auto dtype : sdk::kAllDTypes)
    for (std::size_t i = 0; i < shapes.size(); ++i)
      s.tensors.push_back(make_tensor(std::string(sdk::dtype_name(dtype)) + ".t" +
                                          std::to_string(i),
                                      dtype, shapes[i], seed++));
  s.tensors.push_back(make_tensor("model.fc1.weight/主", sdk::DType::fp32, {33, 17}, seed++));
  s.metadata["step"] = "1234";
  s.metadata["unicode"] = "Grüße, 世界, emoji 🚀, math ∑∫";
  s.metadata["escapes"] = "quote \" backslash \\ newline \n tab \t nul-free";
  s.metadata["empty"] = "";
  s.metadata["ключ"] = "значение";
  s.metadata["config"] = R"({"optimizer":{"type":"adamw","lr":0.001}})";
  return s;
}

void expect_same_state(const sdk::TrainingState& a, const sdk::TrainingState& b) {
  EXPECT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    SCOPED_TRACE(a.tensors[i].name);
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype);
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    EXPECT_TRUE(a.tensors[i].bytes == b.tensors[i].bytes);
  }
}

std::vector<std::byte> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

void write_file(const fs::path& p, const std::vector<std::byte>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::uint32_t zlib_crc(const void* data, std::size_t n) {
  return static_cast<std::uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), static_cast<const Bytef*>(data), n));
}

std::vector<std::string> temp_files_in(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos)
      found.push_back(e.path().filename().string());
  return found;
}

// The message of the CheckpointError that `fn` throws; fails the test when it throws nothing.
template <class Fn>
std::string checkpoint_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.full_message();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return {};
}

// Assembles a file from a header text, with a correct preamble unless told otherwise.
struct CraftedFile {
  std::string header;
  std::vector<std::byte> data;  // the data section
  std::uint32_t version = ckpt::kFormatVersion;
  std::uint32_t flags = 0;

  std::vector<std::byte> bytes() const {
    ckpt::Preamble p;
    p.format_version = version;
    p.flags = flags;
    p.header_length = header.size();
    p.header_crc32 = zlib_crc(header.data(), header.size());
    const auto pre = ckpt::encode_preamble(p);
    std::vector<std::byte> out(pre.begin(), pre.end());
    for (char c : header) out.push_back(static_cast<std::byte>(c));
    out.resize(ckpt::data_section_offset(header.size()), std::byte{0});
    out.insert(out.end(), data.begin(), data.end());
    return out;
  }
};

// One fp32 [4] tensor "w" at offset 0 with zero bytes: a valid file to mutate.
nlohmann::json valid_header() {
  const std::vector<std::byte> zeros(16);
  return {{"metadata", {{"step", "1"}}},
          {"tensors",
           {{{"name", "w"},
             {"dtype", "fp32"},
             {"shape", {4}},
             {"offset", 0},
             {"length", 16},
             {"crc32", zlib_crc(zeros.data(), zeros.size())}}}},
          {"data_length", 16}};
}

// Suite names are snake_case so that `ctest -R checkpoint_native` selects exactly these tests.
class checkpoint_native : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "mixtrain-ckpt-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }

  // Reads a crafted file and checks the error; also checks no allocation exceeded the file.
  std::string read_error_of(const CraftedFile& file) {
    const auto path = dir_ / "crafted.mxt";
    const auto bytes = file.bytes();
    write_file(path, bytes);
    g_largest_allocation = 0;
    const std::string message = checkpoint_error_of([&] { format_.read(path); });
    EXPECT_LE(g_largest_allocation.load(), std::max<std::size_t>(bytes.size(), 4096))
        << "the reader allocated more than the file holds";
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    return message;
  }
  std::string read_error_of(const nlohmann::json& header) {
    return read_error_of(CraftedFile{header.dump(), std::vector<std::byte>(16)});
  }

  fs::path dir_;
  NativeCheckpointFormat format_ = make_format();
};

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

// ------------------------------------------------------------------------------------------------
// Round trips and layout

TEST_F(checkpoint_native, RoundTripsEveryDTypeRankAndUnicodeMetadata) {
  const auto state = sample_state();
  const auto path = dir_ / "state.mxt";
  format_.write(path, state);
  expect_same_state(state, format_.read(path));
}

TEST_F(checkpoint_native, RoundTripsAnEmptyState) {
  const auto path = dir_ / "empty.mxt";
  format_.write(path, sdk::TrainingState{});
  const auto back = format_.read(path);
  EXPECT_TRUE(back.tensors.empty());
  EXPECT_TRUE(back.metadata.empty());
}

TEST_F(checkpoint_native, PreservesSpecialFloatBitPatternsExactly) {
  // NaN payloads, signed zeros, subnormals and infinities must come back bit for bit.
  const std::uint32_t patterns[] = {0x7fc00001u, 0xffbfffffu, 0x80000000u, 0x00000001u,
                                    0x7f800000u, 0xff800000u, 0x00000000u, 0x3f800000u};
  sdk::TrainingState s;
  sdk::HostTensor t;
  t.name = "special";
  t.shape = {8};
  t.bytes.resize(sizeof(patterns));
  std::memcpy(t.bytes.data(), patterns, sizeof(patterns));
  s.tensors.push_back(t);
  const auto path = dir_ / "special.mxt";
  format_.write(path, s);
  EXPECT_TRUE(format_.read(path).tensors.at(0).bytes == t.bytes);
}

TEST_F(checkpoint_native, RewritingAReadStateGivesAnIdenticalFile) {
  const auto a = dir_ / "a.mxt";
  const auto b = dir_ / "b.mxt";
  format_.write(a, sample_state());
  format_.write(b, format_.read(a));
  EXPECT_TRUE(read_file(a) == read_file(b));
}

TEST_F(checkpoint_native, FileFollowsTheDocumentedLayout) {
  const auto state = sample_state();
  const auto path = dir_ / "layout.mxt";
  format_.write(path, state);
  const auto bytes = read_file(path);
  ASSERT_GE(bytes.size(), ckpt::kPreambleSize);
  EXPECT_EQ(std::memcmp(bytes.data(), "MIXTRAIN", 8), 0);
  // Little-endian fields at fixed offsets, decoded by hand rather than with the code under test.
  auto le = [&](std::size_t at, std::size_t n) {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::to_integer<std::uint64_t>(bytes[at + i]) << (8 * i);
    return v;
  };
  EXPECT_EQ(le(8, 4), 1u);
  EXPECT_EQ(le(12, 4), 0u);
  const std::uint64_t header_length = le(16, 8);
  ASSERT_LE(ckpt::kPreambleSize + header_length, bytes.size());
  EXPECT_EQ(le(24, 4), zlib_crc(bytes.data() + 28, header_length));

  const std::string text(reinterpret_cast<const char*>(bytes.data()) + 28, header_length);
  const auto header = nlohmann::json::parse(text);
  const std::uint64_t data_start = (28 + header_length + 63) / 64 * 64;
  EXPECT_EQ(bytes.size(), data_start + header.at("data_length").get<std::uint64_t>());
  EXPECT_EQ(header.at("metadata").at("unicode").get<std::string>(), state.metadata.at("unicode"));
  ASSERT_EQ(header.at("tensors").size(), state.tensors.size());
  for (std::size_t i = 0; i < state.tensors.size(); ++i) {
    const auto& entry = header.at("tensors")[i];
    const auto& t = state.tensors[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(entry.at("name").get<std::string>(), t.name);
    EXPECT_EQ(entry.at("dtype").get<std::string>(), sdk::dtype_name(t.dtype));
    EXPECT_EQ(entry.at("shape").get<std::vector<std::int64_t>>(), t.shape);
    const auto offset = entry.at("offset").get<std::uint64_t>();
    const auto length = entry.at("length").get<std::uint64_t>();
    EXPECT_EQ(offset % 64, 0u);
    EXPECT_EQ((data_start + offset) % 64, 0u);
    EXPECT_EQ(length, t.bytes.size());
    EXPECT_TRUE(length == 0 ||
                std::memcmp(bytes.data() + data_start + offset, t.bytes.data(), length) == 0);
    EXPECT_EQ(entry.at("crc32").get<std::uint32_t>(), zlib_crc(t.bytes.data(), t.bytes.size()));
  }
}

TEST_F(checkpoint_native, ChecksumsOfTensorsLargerThanOneHashChunkMatchZlib) {
  // The writer and reader hash big tensors in parallel chunks; the result must be plain CRC-32.
  sdk::TrainingState s;
  sdk::HostTensor big;
  big.name = "big";
  big.shape = {10, 1 << 20};
  big.bytes.resize(std::size_t{40} << 20);
  for (std::size_t i = 0; i < big.bytes.size(); ++i)
    big.bytes[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  s.tensors.push_back(big);
  s.tensors.push_back(make_tensor("small", sdk::DType::fp16, {3}, 4));
  const auto path = dir_ / "big.mxt";
  format_.write(path, s);
  const auto bytes = read_file(path);
  const auto header_length = ckpt::decode_preamble(bytes.data()).header_length;
  const auto header = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(bytes.data()) + 28, header_length));
  EXPECT_EQ(header.at("tensors")[0].at("crc32").get<std::uint32_t>(),
            zlib_crc(big.bytes.data(), big.bytes.size()));
  expect_same_state(s, format_.read(path));
  // A flip in the last chunk of the big tensor is still caught and attributed.
  auto damaged = bytes;
  damaged[ckpt::data_section_offset(header_length) + big.bytes.size() - 5] ^= std::byte{4};
  write_file(path, damaged);
  EXPECT_HAS(checkpoint_error_of([&] { format_.read(path); }), "'big'");
}

TEST_F(checkpoint_native, ReportsTheExtension) { EXPECT_EQ(format_.file_extension(), ".mxt"); }

TEST_F(checkpoint_native, WritesWithFsyncOn) {
  const auto fsyncing = make_format(true);
  const auto path = dir_ / "synced.mxt";
  fsyncing.write(path, sample_state());
  expect_same_state(sample_state(), fsyncing.read(path));
}

TEST_F(checkpoint_native, WritesToARelativePathInTheCurrentFolder) {
  const auto previous = fs::current_path();
  fs::current_path(dir_);
  format_.write("relative.mxt", sample_state());
  fs::current_path(previous);
  expect_same_state(sample_state(), format_.read(dir_ / "relative.mxt"));
}

// ------------------------------------------------------------------------------------------------
// Damaged files

TEST_F(checkpoint_native, MissingFileIsNamedAsMissing) {
  const auto path = dir_ / "nope.mxt";
  const auto message = checkpoint_error_of([&] { format_.read(path); });
  EXPECT_HAS(message, path.string());
  EXPECT_HAS(message, "does not exist");
  EXPECT_HAS(message, "HINT");
}

TEST_F(checkpoint_native, ADirectoryIsNotACheckpoint) {
  const auto message = checkpoint_error_of([&] { format_.read(dir_); });
  EXPECT_HAS(message, "directory");
}

TEST_F(checkpoint_native, TruncationAtEveryOffsetIsACheckpointError) {
  sdk::TrainingState s;
  s.metadata["step"] = "7";
  s.tensors.push_back(make_tensor("a", sdk::DType::fp32, {10}, 1));
  s.tensors.push_back(make_tensor("b", sdk::DType::bf16, {3, 3}, 2));
  s.tensors.push_back(make_tensor("c", sdk::DType::fp8_e4m3, {5}, 3));
  const auto path = dir_ / "full.mxt";
  format_.write(path, s);
  const auto bytes = read_file(path);
  const auto cut = dir_ / "cut.mxt";
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    SCOPED_TRACE("truncated to " + std::to_string(size) + " of " + std::to_string(bytes.size()));
    write_file(cut, std::vector<std::byte>(bytes.begin(), bytes.begin() + static_cast<long>(size)));
    const auto message = checkpoint_error_of([&] { format_.read(cut); });
    EXPECT_HAS(message, cut.string());
    if (size < ckpt::kPreambleSize) {
      EXPECT_HAS(message, "preamble");
    }
  }
}

TEST_F(checkpoint_native, TruncationInsideALargeTensorSaysTruncated) {
  sdk::TrainingState s;
  s.tensors.push_back(make_tensor("big", sdk::DType::fp32, {1 << 16}, 9));
  const auto path = dir_ / "big.mxt";
  format_.write(path, s);
  fs::resize_file(path, fs::file_size(path) - 1000);
  EXPECT_HAS(checkpoint_error_of([&] { format_.read(path); }), "truncated");
}

TEST_F(checkpoint_native, FlippedDataByteNamesTheTensor) {
  const auto state = sample_state();
  const auto path = dir_ / "state.mxt";
  format_.write(path, state);
  const auto clean = read_file(path);
  const auto header_length = ckpt::decode_preamble(clean.data()).header_length;
  const auto data_start = ckpt::data_section_offset(header_length);
  const auto header = nlohmann::json::parse(std::string(
      reinterpret_cast<const char*>(clean.data()) + 28, header_length));
  int checked = 0;
  for (const auto& entry : header.at("tensors")) {
    const auto length = entry.at("length").get<std::uint64_t>();
    if (length == 0) continue;
    const auto name = entry.at("name").get<std::string>();
    SCOPED_TRACE(name);
    auto damaged = clean;
    damaged[data_start + entry.at("offset").get<std::uint64_t>() + length / 2] ^= std::byte{0x10};
    write_file(path, damaged);
    const auto message = checkpoint_error_of([&] { format_.read(path); });
    EXPECT_HAS(message, "'" + name + "'");
    EXPECT_HAS(message, "checksum");
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

// read_only (sdk/format_partial_read.h), found as the host finds it: the wanted tensors, in the
// file's order, as read() gives them, with the same metadata; a damaged tensor it skips goes
// unread, one it reads is named, and the header is checked whole.
TEST_F(checkpoint_native, ReadOnlyReadsAndChecksTheWantedTensorsAlone) {
  const auto* facet = dynamic_cast<const sdk::PartialReadFacet*>(
      static_cast<const sdk::CheckpointFormat*>(&format_));
  ASSERT_TRUE(sdk::facet_serves<sdk::PartialReadFacet>(facet, 0));
  const auto state = sample_state();
  const auto path = dir_ / "state.mxt";
  format_.write(path, state);
  // Every other tensor with data: the skipped ones interleave with the read ones on disk.
  std::vector<std::string> kept, skipped;
  for (const auto& t : state.tensors)
    ((t.bytes.empty() || kept.size() <= skipped.size()) ? kept : skipped).push_back(t.name);
  ASSERT_GT(skipped.size(), 10u);
  std::size_t asked = 0;
  const auto wanted = [&](std::string_view name) {
    ++asked;
    return std::find(kept.begin(), kept.end(), name) != kept.end();
  };
  sdk::TrainingState expected = format_.read(path);
  std::erase_if(expected.tensors, [&](const sdk::HostTensor& t) {
    return std::find(kept.begin(), kept.end(), t.name) == kept.end();
  });
  expect_same_state(expected, facet->read_only(path, wanted));
  EXPECT_EQ(asked, state.tensors.size()) << "wanted() is asked once per tensor";

  const auto clean = read_file(path);
  const auto header_length = ckpt::decode_preamble(clean.data()).header_length;
  const auto data_start = ckpt::data_section_offset(header_length);
  const auto header = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(clean.data()) + 28, header_length));
  const auto damaged_copy = [&](const std::string& name) {
    auto bytes = clean;
    for (const auto& entry : header.at("tensors"))
      if (entry.at("name") == name)
        bytes[data_start + entry.at("offset").get<std::uint64_t>()] ^= std::byte{0x10};
    return bytes;
  };
  write_file(path, damaged_copy(skipped.front()));
  EXPECT_NO_THROW(facet->read_only(path, wanted)) << "a skipped tensor is not read";
  EXPECT_HAS(checkpoint_error_of([&] { format_.read(path); }), "'" + skipped.front() + "'");
  const std::string read_one = *std::find_if(kept.begin(), kept.end(), [&](const auto& name) {
    return state.find(name)->bytes.size() > 0;
  });
  write_file(path, damaged_copy(read_one));
  const auto message = checkpoint_error_of([&] { facet->read_only(path, wanted); });
  EXPECT_HAS(message, "'" + read_one + "'");
  EXPECT_HAS(message, "checksum");
  auto header_damaged = clean;
  header_damaged[28 + header_length / 2] ^= std::byte{0x01};
  write_file(path, header_damaged);
  EXPECT_HAS(
      checkpoint_error_of([&] { facet->read_only(path, [](std::string_view) { return false; }); }),
      "header checksum mismatch");
}

TEST_F(checkpoint_native, FlippedHeaderByteIsAHeaderChecksumError) {
  const auto path = dir_ / "state.mxt";
  format_.write(path, sample_state());
  auto bytes = read_file(path);
  const auto header_length = ckpt::decode_preamble(bytes.data()).header_length;
  for (const std::size_t at : {std::size_t{0}, std::size_t{header_length / 2},
                               std::size_t{header_length - 1}}) {
    auto damaged = bytes;
    damaged[ckpt::kPreambleSize + at] ^= std::byte{0x01};
    write_file(path, damaged);
    EXPECT_HAS(checkpoint_error_of([&] { format_.read(path); }), "header checksum mismatch");
  }
  // The stored checksum itself damaged.
  bytes[25] ^= std::byte{0x80};
  write_file(path, bytes);
  EXPECT_HAS(checkpoint_error_of([&] { format_.read(path); }), "header checksum mismatch");
}

TEST_F(checkpoint_native, BadMagicIsNotANativeCheckpoint) {
  const auto path = dir_ / "state.mxt";
  format_.write(path, sample_state());
  auto bytes = read_file(path);
  bytes[3] = std::byte{'x'};
  write_file(path, bytes);
  EXPECT_HAS(checkpoint_error_of([&] { format_.read(path); }),
             "not a mixtrain native checkpoint");

  // A safetensors file: u64 header length, then JSON.
  static constexpr char kSafetensors[] = "\x13\0\0\0\0\0\0\0{\"__metadata__\":{}}    ";
  const std::string safetensors(kSafetensors, sizeof(kSafetensors) - 1);
  std::vector<std::byte> st(safetensors.size());
  std::memcpy(st.data(), safetensors.data(), st.size());
  write_file(path, st);
  // The fix is the file's name: the extension picks the format that reads it.
  EXPECT_HAS(checkpoint_error_of([&] { format_.read(path); }), "name it *.safetensors");
}

TEST_F(checkpoint_native, FutureVersionNamesBothVersions) {
  CraftedFile file{valid_header().dump(), std::vector<std::byte>(16)};
  file.version = 7;
  const auto message = read_error_of(file);
  EXPECT_HAS(message, "format version 7 is newer");
  EXPECT_HAS(message, "version 1");
  EXPECT_HAS(message, "upgrade");
  file.version = 0;
  EXPECT_HAS(read_error_of(file), "invalid");
}

TEST_F(checkpoint_native, UnknownFlagsAreRejected) {
  CraftedFile file{valid_header().dump(), std::vector<std::byte>(16)};
  file.flags = 0x4;
  EXPECT_HAS(read_error_of(file), "flags");
}

TEST_F(checkpoint_native, TheValidCraftedFileReads) {
  // Guards the crafted-file tests below: each differs from this one in one defect only.
  const auto path = dir_ / "crafted.mxt";
  write_file(path, CraftedFile{valid_header().dump(), std::vector<std::byte>(16)}.bytes());
  const auto state = format_.read(path);
  ASSERT_EQ(state.tensors.size(), 1u);
  EXPECT_EQ(state.metadata.at("step"), "1");
}

TEST_F(checkpoint_native, HeaderLengthBeyondTheFileIsRejected) {
  CraftedFile file{valid_header().dump(), {}};
  auto bytes = file.bytes();
  ckpt::Preamble p = ckpt::decode_preamble(bytes.data());
  for (const std::uint64_t claimed : {std::uint64_t{1} << 40, ~std::uint64_t{0}, std::uint64_t{0}}) {
    p.header_length = claimed;
    const auto pre = ckpt::encode_preamble(p);
    std::copy(pre.begin(), pre.end(), bytes.begin());
    const auto path = dir_ / "crafted.mxt";
    write_file(path, bytes);
    g_largest_allocation = 0;
    EXPECT_HAS(checkpoint_error_of([&] { format_.read(path); }), "header length");
    EXPECT_LT(g_largest_allocation.load(), std::size_t{1} << 20);
  }
}

TEST_F(checkpoint_native, HugeTensorClaimsFailWithoutHugeAllocations) {
  {
    // A consistent claim of a 4 TiB tensor in a tiny file.
    auto h = valid_header();
    h["tensors"][0]["shape"] = {std::int64_t{1} << 40};
    h["tensors"][0]["length"] = std::uint64_t{4} << 40;
    h["data_length"] = std::uint64_t{4} << 40;
    EXPECT_HAS(read_error_of(h), "truncated");
  }
  {
    // data_length matches the file, but the tensor points far beyond it.
    auto h = valid_header();
    h["tensors"][0]["offset"] = std::uint64_t{1} << 50;
    EXPECT_HAS(read_error_of(h), "outside");
  }
  {
    // offset + length wraps around 2^64.
    auto h = valid_header();
    h["tensors"][0]["offset"] = ~std::uint64_t{63};
    EXPECT_HAS(read_error_of(h), "outside");
  }
  {
    auto h = valid_header();
    h["tensors"][0]["shape"] = {std::int64_t{1} << 62, std::int64_t{1} << 62};
    EXPECT_HAS(read_error_of(h), "overflows");
  }
  {
    auto h = valid_header();
    h["tensors"][0]["shape"] = {std::uint64_t{1} << 63};
    EXPECT_HAS(read_error_of(h), "overflows a 64-bit");
  }
  {
    auto h = valid_header();
    h["data_length"] = 1e30;
    EXPECT_HAS(read_error_of(h), "must be a non-negative integer");
  }
}

TEST_F(checkpoint_native, TensorTableDefectsAreNamed) {
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> damage;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"unknown dtype", [](auto& h) { h["tensors"][0]["dtype"] = "fp64"; }, "not a known dtype"},
      {"dtype alias", [](auto& h) { h["tensors"][0]["dtype"] = "float32"; }, "not a known dtype"},
      {"size mismatch", [](auto& h) { h["tensors"][0]["shape"] = {5}; }, "need 20 bytes"},
      {"negative dim", [](auto& h) { h["tensors"][0]["shape"] = {-4}; }, "negative"},
      {"fractional dim", [](auto& h) { h["tensors"][0]["shape"] = {4.5}; }, "non-negative integer"},
      {"rank 5", [](auto& h) { h["tensors"][0]["shape"] = {1, 1, 1, 1, 4}; }, "more than 4"},
      {"shape not array", [](auto& h) { h["tensors"][0]["shape"] = "4"; }, "must be an array"},
      {"name not string", [](auto& h) { h["tensors"][0]["name"] = 3; }, "must be a string"},
      {"empty name", [](auto& h) { h["tensors"][0]["name"] = ""; }, "is empty"},
      {"negative offset", [](auto& h) { h["tensors"][0]["offset"] = -64; }, "must not be negative"},
      {"misaligned", [](auto& h) { h["tensors"][0]["offset"] = 8; }, "not a multiple of 64"},
      {"crc too wide", [](auto& h) { h["tensors"][0]["crc32"] = 1ull << 33; }, "32 bits"},
      {"missing crc", [](auto& h) { h["tensors"][0].erase("crc32"); }, "lacks the field 'crc32'"},
      {"missing tensors", [](auto& h) { h.erase("tensors"); }, "lacks the field 'tensors'"},
      {"missing data_length", [](auto& h) { h.erase("data_length"); }, "'data_length'"},
      {"metadata not strings", [](auto& h) { h["metadata"]["step"] = 1; }, "must be a string"},
      {"metadata array", [](auto& h) { h["metadata"] = {1, 2}; }, "must be an object"},
      {"tensors object", [](auto& h) { h["tensors"] = {{"a", 1}}; }, "must be an array"},
      {"entry not object", [](auto& h) { h["tensors"][0] = 5; }, "must be an object"},
      {"header not object", [](auto& h) { h = {1, 2, 3}; }, "must be a JSON object"},
      {"trailing bytes", [](auto& h) { h["data_length"] = 8; }, "unexpected bytes"},
      {"duplicate name",
       [](auto& h) {
         auto second = h["tensors"][0];
         second["offset"] = 64;
         h["tensors"].push_back(second);
         h["data_length"] = 16;  // keeps the data extent check quiet; the name check comes first
       },
       "'w' appears twice"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto h = valid_header();
    c.damage(h);
    EXPECT_HAS(read_error_of(h), c.expected);
  }
}

TEST_F(checkpoint_native, OverlappingTensorsAreRejected) {
  auto h = valid_header();
  auto second = h["tensors"][0];
  second["name"] = "v";
  second["shape"] = {8};
  second["length"] = 32;
  h["tensors"].push_back(second);
  h["data_length"] = 32;
  EXPECT_HAS(read_error_of(CraftedFile{h.dump(), std::vector<std::byte>(32)}), "overlap");
}

TEST_F(checkpoint_native, MalformedJsonIsReported) {
  const std::vector<std::string> texts = {
      "{\"metadata\": {", "not json at all",
      R"({"metadata":{},"tensors":[],"data_length":0} trailing)",
      "{\"metadata\":{\"k\":\"\xff\"}}"};
  for (const auto& text : texts) {
    SCOPED_TRACE(text);
    EXPECT_HAS(read_error_of(CraftedFile{text, {}}), "not valid JSON");
  }
}

TEST_F(checkpoint_native, DuplicateJsonKeysAreRejected) {
  const std::string dup_metadata =
      R"({"metadata":{"a":"1","a":"2"},"tensors":[],"data_length":0})";
  EXPECT_HAS(read_error_of(CraftedFile{dup_metadata, {}}), "appears twice");
  const std::string dup_root = R"({"metadata":{},"tensors":[],"data_length":0,"data_length":0})";
  EXPECT_HAS(read_error_of(CraftedFile{dup_root, {}}), "appears twice");
}

TEST_F(checkpoint_native, UnknownFieldsAreSkippedEvenWhenDeeplyNested) {
  // Forward compatibility within format version 1: additive fields are ignored, and a hostile
  // nesting depth must not exhaust the stack.
  auto h = valid_header();
  h["tensors"][0]["note"] = {{"x", {1, 2, {{"y", nullptr}}}}};
  std::string text = h.dump();
  text.pop_back();
  text += ",\"future\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  const auto path = dir_ / "crafted.mxt";
  write_file(path, CraftedFile{text, std::vector<std::byte>(16)}.bytes());
  const auto state = format_.read(path);
  ASSERT_EQ(state.tensors.size(), 1u);
  EXPECT_EQ(state.tensors[0].name, "w");
}

TEST_F(checkpoint_native, RandomCorruptionNeverCrashes) {
  sdk::TrainingState s;
  s.metadata["k"] = "v";
  s.tensors.push_back(make_tensor("a", sdk::DType::fp16, {4, 4}, 5));
  s.tensors.push_back(make_tensor("b", sdk::DType::int32, {3}, 6));
  const auto path = dir_ / "state.mxt";
  format_.write(path, s);
  const auto clean = read_file(path);
  std::mt19937 rng(42);
  for (int round = 0; round < 2000; ++round) {
    auto damaged = clean;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i)
      damaged[rng() % damaged.size()] ^= static_cast<std::byte>(1 + rng() % 255);
    write_file(path, damaged);
    try {
      format_.read(path);  // a flip in padding is harmless and may read fine
    } catch (const CheckpointError&) {
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Atomic writes

TEST_F(checkpoint_native, OverwritingAnExistingCheckpointSucceeds) {
  const auto path = dir_ / "ckpt.mxt";
  format_.write(path, sample_state());
  sdk::TrainingState second;
  second.metadata["step"] = "2";
  second.tensors.push_back(make_tensor("only", sdk::DType::bf16, {3}, 77));
  format_.write(path, second);
  expect_same_state(second, format_.read(path));
  EXPECT_TRUE(temp_files_in(dir_).empty());
}

TEST_F(checkpoint_native, StaleTempFilesAreRemovedLiveWritersAreKept) {
  // A killed save leaves an unlocked temp file; a writer alive in this process or in another one
  // holds a lock on its own, and unrelated files never match.
  const auto stale = dir_ / ".step-00000004.mxt.tmp.4194303.0";
  write_file(stale, {std::byte{1}});
  sdk::AtomicFileWriter in_process(dir_ / "step-00000006.mxt", /*durable=*/false, "checkpoint");
  in_process.write("x", 1);
  const auto other_process = dir_ / ".step-00000008.mxt.tmp.1.0";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    const int fd = ::open(other_process.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
    (void)!::write(ready[1], "k", 1);
    for (;;) ::pause();
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  const std::vector<std::string> unrelated = {".notes.tmp.txt", "step-00000002.mxt",
                                              ".step-1.mxt.tmp.12x.0", "a.tmp.1.2"};
  for (const auto& name : unrelated) write_file(dir_ / name, {std::byte{2}});

  const auto removed = sdk::remove_stale_temp_files(dir_);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);

  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0], stale);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(in_process.temp_path()));
  EXPECT_TRUE(fs::exists(other_process));
  for (const auto& name : unrelated) EXPECT_TRUE(fs::exists(dir_ / name)) << name;
  // Its writer is dead now, so the next pass takes it; the live in-process writer still commits.
  EXPECT_EQ(sdk::remove_stale_temp_files(dir_), std::vector<fs::path>{other_process});
  EXPECT_TRUE(in_process.commit().empty());
  EXPECT_TRUE(fs::exists(dir_ / "step-00000006.mxt"));
}

TEST_F(checkpoint_native, OverwritingKeepsTheFilePermissions) {
  const auto path = dir_ / "ckpt.mxt";
  format_.write(path, sample_state());
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
  format_.write(path, sample_state());
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(checkpoint_native, TargetThatIsADirectoryFailsCleanly) {
  const auto target = dir_ / "ckpt.mxt";
  fs::create_directory(target);
  fs::path inside = target / "keep";
  write_file(inside, {std::byte{1}});
  const auto message = checkpoint_error_of([&] { format_.write(target, sample_state()); });
  EXPECT_HAS(message, target.string());
  EXPECT_HAS(message, "Is a directory");
  EXPECT_HAS(message, "HINT");
  EXPECT_TRUE(fs::is_directory(target));
  EXPECT_TRUE(fs::exists(inside));
  EXPECT_TRUE(temp_files_in(dir_).empty());
}

TEST_F(checkpoint_native, RemovedFolderFailsWithTheOsError) {
  const auto folder = dir_ / "run";
  fs::create_directory(folder);
  fs::remove(folder);
  const auto target = folder / "ckpt.mxt";
  const auto message = checkpoint_error_of([&] { format_.write(target, sample_state()); });
  EXPECT_HAS(message, target.string());
  EXPECT_HAS(message, std::strerror(ENOENT));
  EXPECT_HAS(message, "HINT");
  EXPECT_TRUE(temp_files_in(dir_).empty());
}

TEST_F(checkpoint_native, ReadOnlyFolderLeavesTheCheckpointUntouched) {
  const auto path = dir_ / "ckpt.mxt";
  format_.write(path, sample_state());
  const auto before = read_file(path);
  // Readable and searchable by everyone, writable by nobody: as root, the write runs as an
  // unprivileged user so that the permissions bind.
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::others_read |
                            fs::perms::others_exec);
  sdk::TrainingState other;
  other.tensors.push_back(make_tensor("x", sdk::DType::fp32, {2}, 3));
  std::string message;
  {
    const mixtrain::test::ScopedFilesystemUser nobody;
    if (!nobody.permissions_bind()) {
      fs::permissions(dir_, fs::perms::owner_all);
      GTEST_SKIP() << "root, and no unprivileged filesystem user";
    }
    message = checkpoint_error_of([&] { format_.write(path, other); });
  }
  fs::permissions(dir_, fs::perms::owner_all);
  EXPECT_HAS(message, std::strerror(EACCES));
  EXPECT_TRUE(read_file(path) == before);
  EXPECT_TRUE(temp_files_in(dir_).empty());
}

TEST_F(checkpoint_native, FailureMidWriteLeavesTheOldCheckpointByteIdentical) {
  // RLIMIT_FSIZE makes write(2) fail with EFBIG part-way through the temp file: a real I/O failure
  // after the temp file exists, which also works when the tests run as root.
  const auto path = dir_ / "ckpt.mxt";
  format_.write(path, sample_state());
  const auto before = read_file(path);

  sdk::TrainingState large;
  large.tensors.push_back(make_tensor("big", sdk::DType::fp32, {1 << 20}, 11));
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* previous_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit limited = saved;
  limited.rlim_cur = 256 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  const auto message = checkpoint_error_of([&] { format_.write(path, large); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, previous_handler);

  EXPECT_HAS(message, path.string());
  EXPECT_HAS(message, std::strerror(EFBIG));
  EXPECT_TRUE(read_file(path) == before);
  EXPECT_TRUE(temp_files_in(dir_).empty());
  expect_same_state(sample_state(), format_.read(path));
}

TEST_F(checkpoint_native, InvalidStatesAreRejectedBeforeTouchingTheDisk) {
  const auto path = dir_ / "ckpt.mxt";
  format_.write(path, sample_state());
  const auto before = read_file(path);
  struct Case {
    const char* what;
    std::function<void(sdk::TrainingState&)> damage;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"byte count", [](auto& s) { s.tensors[0].bytes.push_back(std::byte{0}); }, "holds"},
      {"duplicate", [](auto& s) { s.tensors.push_back(s.tensors[0]); }, "two tensors are named"},
      {"empty name", [](auto& s) { s.tensors[0].name.clear(); }, "empty name"},
      {"negative dim", [](auto& s) { s.tensors[0].shape = {-1}; }, "negative"},
      {"rank 5", [](auto& s) { s.tensors[0].shape = {1, 1, 1, 1, 1}; }, "rank 5"},
      {"bad utf-8", [](auto& s) { s.metadata["k"] = "\xc3\x28"; }, "UTF-8"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    sdk::TrainingState s;
    s.tensors.push_back(make_tensor("w", sdk::DType::fp32, {1}, 1));
    c.damage(s);
    EXPECT_HAS(checkpoint_error_of([&] { format_.write(path, s); }), c.expected);
    EXPECT_TRUE(read_file(path) == before);
    EXPECT_TRUE(temp_files_in(dir_).empty());
  }
}

TEST_F(checkpoint_native, StaleTempFilesDoNotBlockWrites) {
  // A crashed earlier process may have left a temp file; the writer picks another name.
  const auto path = dir_ / "ckpt.mxt";
  for (int n = 0; n < 4; ++n)
    write_file(dir_ / (".ckpt.mxt.tmp." + std::to_string(::getpid()) + "." + std::to_string(n)),
               {std::byte{0}});
  format_.write(path, sample_state());
  expect_same_state(sample_state(), format_.read(path));
}

// ------------------------------------------------------------------------------------------------
// Options and the plugin module

TEST(checkpoint_native_options, FsyncDefaultsToTrue) {
  const auto options = resolve_options({});
  EXPECT_TRUE(options.get_bool("fsync"));
  EXPECT_FALSE(options.was_set("fsync"));
}

TEST(checkpoint_native_options, UnknownKeyIsRejectedWithASuggestion) {
  try {
    resolve_options({{"fsynk", true, {"run.toml", 12, 1}}});
    FAIL() << "expected a ConfigError";
  } catch (const sdk::ConfigError& e) {
    EXPECT_HAS(e.full_message(), "did you mean 'fsync'");
    EXPECT_HAS(e.full_message(), "run.toml:12");
  }
}

TEST(checkpoint_native_options, WrongTypeIsRejected) {
  EXPECT_THROW(resolve_options({{"fsync", std::string("yes"), {"run.toml", 3, 1}}}),
               sdk::ConfigError);
}

TEST(checkpoint_native_plugin, ModuleProvidesTheNativeFormat) {
  const boost::dll::fs::path module = MIXTRAIN_CHECKPOINT_NATIVE_MODULE;
  auto descriptor_fn = boost::dll::import_alias<const sdk::PluginDescriptor*()>(
      module, "mixtrain_plugin_descriptor", boost::dll::load_mode::rtld_now);
  const sdk::PluginDescriptor* d = descriptor_fn();
  EXPECT_EQ(d->abi_version, sdk::kSdkAbiVersion);
  EXPECT_STREQ(d->build_fingerprint, sdk::kBuildFingerprint);
  EXPECT_STREQ(d->name, "checkpoint_native");
  EXPECT_STREQ(d->version, "0.1.0");
  const auto components = d->components();
  ASSERT_EQ(components.size(), 1u);
  EXPECT_EQ(components[0].kind, sdk::ComponentKind::checkpoint_format);
  EXPECT_EQ(components[0].name, "native");
  ASSERT_EQ(components[0].options.size(), 1u);
  EXPECT_EQ(components[0].options[0].name, "fsync");

  const auto options = sdk::Options::resolve("checkpoint", components[0].options,
                                             {{"fsync", false, {}}}, {});
  auto component = components[0].create(options, sdk::PluginContext{});
  auto* format = dynamic_cast<sdk::CheckpointFormat*>(component.get());
  ASSERT_NE(format, nullptr);
  EXPECT_EQ(format->file_extension(), ".mxt");

  std::string pattern = (fs::temp_directory_path() / "mixtrain-ckpt-plugin-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const fs::path path = fs::path(pattern) / "via-plugin.mxt";
  format->write(path, sample_state());
  expect_same_state(sample_state(), format->read(path));
  // The error type must cross the module boundary as the SDK's CheckpointError.
  EXPECT_THROW(format->read(fs::path(pattern) / "missing.mxt"), CheckpointError);
  component.reset();  // before the module unloads
  fs::remove_all(pattern);
}

// ------------------------------------------------------------------------------------------------
// Throughput (opt-in: MIXTRAIN_CKPT_BENCH_MB=400 ctest -R Throughput -V)

TEST_F(checkpoint_native, Throughput) {
  const char* env = std::getenv("MIXTRAIN_CKPT_BENCH_MB");
  if (env == nullptr) GTEST_SKIP() << "set MIXTRAIN_CKPT_BENCH_MB to measure";
  const std::size_t total = std::stoull(env) << 20;
  sdk::TrainingState s;
  // A realistic mix: a few big matrices, many small vectors.
  std::size_t placed = 0;
  for (int i = 0; placed < total; ++i) {
    const std::int64_t rows = (i % 8 == 7) ? 1 : 2048;
    const std::int64_t cols = std::min<std::int64_t>(
        4096, static_cast<std::int64_t>((total - placed) / 4 / static_cast<std::size_t>(rows)) + 1);
    sdk::HostTensor t;
    t.name = "layer" + std::to_string(i);
    t.shape = {rows, cols};
    t.bytes.resize(static_cast<std::size_t>(rows * cols) * 4);
    std::memset(t.bytes.data(), i & 0xFF, t.bytes.size());
    placed += t.bytes.size();
    s.tensors.push_back(std::move(t));
  }
  for (const bool fsync : {false, true}) {
    const auto format = make_format(fsync);
    const auto path = dir_ / "bench.mxt";
    const auto t0 = std::chrono::steady_clock::now();
    format.write(path, s);
    const auto t1 = std::chrono::steady_clock::now();
    const auto back = format.read(path);
    const auto t2 = std::chrono::steady_clock::now();
    const double mb = static_cast<double>(fs::file_size(path)) / (1 << 20);
    const double w = std::chrono::duration<double>(t1 - t0).count();
    const double r = std::chrono::duration<double>(t2 - t1).count();
    std::printf("[throughput] %zu tensors, %.0f MiB, fsync=%d: write %.3f s (%.0f MiB/s), "
                "read %.3f s (%.0f MiB/s)\n",
                s.tensors.size(), mb, fsync ? 1 : 0, w, mb / w, r, mb / r);
    EXPECT_EQ(back.tensors.size(), s.tensors.size());
  }
}

}  // namespace
