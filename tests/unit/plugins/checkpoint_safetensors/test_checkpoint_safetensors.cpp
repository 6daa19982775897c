// Unit tests of the `safetensors` checkpoint format: round trips per dtype, the byte layout of the
// public spec, metadata, what is exported, every class of hostile file, and the plugin module.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <boost/dll/import.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "mixtrain/sdk/plugin.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "safetensors_format.h"

// Every plain `new` of this binary is measured, so hostile-file tests can prove the reader never
// allocates what a header merely claims.
namespace {
std::atomic<std::size_t> g_largest_allocation{0};
void* checked_malloc(std::size_t n) {
  std::size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
  while (n > seen && !g_largest_allocation.compare_exchange_weak(seen, n)) {
  }
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
using mixtrain::checkpoint_safetensors::SafetensorsFormat;
using sdk::CheckpointError;
using json = nlohmann::json;

SafetensorsFormat make_format(const std::string& dtype = "fp32") {
  auto options = sdk::Options::resolve(
      "checkpoint", SafetensorsFormat::option_schema(),
      {{"dtype", dtype, {"test.toml", 2, 1}}, {"fsync", false, {"test.toml", 3, 1}}},
      sdk::SourceLocation{"test.toml", 1, 1});
  return SafetensorsFormat(options, sdk::PluginContext{});
}

sdk::HostTensor fp32_tensor(std::string name, std::vector<std::int64_t> shape,
                            const std::vector<float>& values) {
  sdk::HostTensor t;
  t.name = std::move(name);
  t.dtype = sdk::DType::fp32;
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * 4);
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

std::vector<float> floats_of(const sdk::HostTensor& t) {
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  // Values that exercise rounding: ties, subnormals, overflow for fp16, signed zero.
  if (n >= 6) {
    v[0] = -0.0f;
    v[1] = 1.0f + 0x1p-8f;  // a bf16 tie
    v[2] = 70000.0f;        // overflows fp16
    v[3] = 1e-40f;          // fp32 subnormal
    v[4] = 1.0f + 0x1p-11f;  // an fp16 tie
    v[5] = 3.14159265f;
  }
  return v;
}

sdk::TrainingState sample_state() {
  sdk::TrainingState st;
  st.tensors.push_back(fp32_tensor("param/fc1.weight", {3, 4}, random_floats(12, 1)));
  st.tensors.push_back(fp32_tensor("param/fc1.bias", {3}, random_floats(3, 2)));
  st.tensors.push_back(fp32_tensor("optimizer/fc1.weight.momentum", {3, 4}, random_floats(12, 3)));
  st.tensors.push_back(fp32_tensor("param/head.weight", {2, 3}, random_floats(6, 4)));
  st.metadata["mixtrain.version"] = "0.1.0";
  st.metadata["step"] = "42";
  st.metadata["policy"] = "bf16_mixed";
  return st;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

// A file with this header text and `data_bytes` bytes of data.
std::string file_with(const std::string& header, std::size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\x01');
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("mixtrain-st-") + info->name() + "-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `f` must throw a CheckpointError whose message holds `part`.
  template <class F>
  static void expect_error_saying(F f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "no CheckpointError (expected one saying '" << part << "')";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }

  // read() of these bytes must fail with a CheckpointError mentioning every `needles`.
  void expect_rejected(const std::string& bytes, const std::vector<std::string>& needles) {
    const auto path = dir_ / "hostile.safetensors";
    spit(path, bytes);
    g_largest_allocation = 0;
    try {
      make_format().read(path);
      ADD_FAILURE() << "read() accepted a hostile file";
    } catch (const CheckpointError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
      for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
      EXPECT_FALSE(e.hint().empty());
    }
    // Nothing the header merely claims is allocated: bounded by the real file (plus a small
    // constant for parser bookkeeping).
    EXPECT_LE(g_largest_allocation.load(), bytes.size() + 4096);
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripFp32IsBitExactAndExportsWeightsOnly) {
  const auto st = sample_state();
  const auto path = dir_ / "m.safetensors";
  make_format("fp32").write(path, st);
  const auto back = make_format().read(path);
  ASSERT_EQ(back.tensors.size(), 3u);  // the optimizer slot is not exported
  EXPECT_EQ(back.find("optimizer/fc1.weight.momentum"), nullptr);
  for (const char* name : {"fc1.weight", "fc1.bias", "head.weight"}) {
    const auto* t = back.find(name);
    ASSERT_NE(t, nullptr) << name;
    const auto* orig = st.find(std::string("param/") + name);
    EXPECT_EQ(t->dtype, sdk::DType::fp32);
    EXPECT_EQ(t->shape, orig->shape);
    EXPECT_EQ(t->bytes, orig->bytes);
  }
  EXPECT_EQ(back.metadata, st.metadata);
}

class SafetensorsDTypeTest : public SafetensorsTest,
                             public ::testing::WithParamInterface<const char*> {};

TEST_P(SafetensorsDTypeTest, RoundTripGivesRoundToNearestEvenValues) {
  const std::string dtype = GetParam();
  const auto st = sample_state();
  const auto path = dir_ / "m.safetensors";
  make_format(dtype).write(path, st);
  const auto back = make_format().read(path);
  const auto* t = back.find("fc1.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, sdk::DType::fp32);  // reading yields fp32 masters whatever the file holds
  const auto orig = floats_of(*st.find("param/fc1.weight"));
  const auto got = floats_of(*t);
  ASSERT_EQ(got.size(), orig.size());
  for (std::size_t i = 0; i < orig.size(); ++i) {
    float expected = orig[i];
    if (dtype == "bf16") expected = sdk::decode_bf16(sdk::encode_bf16(orig[i]));
    if (dtype == "fp16") expected = sdk::decode_fp16(sdk::encode_fp16(orig[i]));
    std::uint32_t a, b;
    std::memcpy(&a, &expected, 4);
    std::memcpy(&b, &got[i], 4);
    EXPECT_EQ(a, b) << "element " << i << " of " << orig[i];
  }
  // The file states the dtype in the spec's spelling and has half the bytes for 16-bit types.
  const auto bytes = slurp(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = json::parse(bytes.substr(8, n));
  const std::string expected_name = dtype == "fp32" ? "F32" : dtype == "bf16" ? "BF16" : "F16";
  EXPECT_EQ(header["fc1.weight"]["dtype"], expected_name);
  const std::size_t elem = dtype == "fp32" ? 4 : 2;
  EXPECT_EQ(bytes.size(), 8 + n + (12 + 3 + 6) * elem);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, SafetensorsDTypeTest, ::testing::Values("fp32", "bf16", "fp16"));

TEST_F(SafetensorsTest, Bf16BytesAreTheEncodedValues) {
  sdk::TrainingState st;
  const std::vector<float> values = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f};
  st.tensors.push_back(fp32_tensor("param/w", {4}, values));
  const auto path = dir_ / "w.safetensors";
  make_format("bf16").write(path, st);
  const auto bytes = slurp(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_EQ(bytes.size(), 8 + n + 8);
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::uint16_t got = 0;
    std::memcpy(&got, bytes.data() + 8 + n + 2 * i, 2);
    EXPECT_EQ(got, sdk::encode_bf16(values[i])) << i;
  }
  // Ties go to even: 1 + 2^-8 -> 1.0 (0x3F80); 1 + 3·2^-8 -> 1 + 2^-6 (0x3F82).
  EXPECT_EQ(sdk::encode_bf16(values[1]), 0x3F80);
  EXPECT_EQ(sdk::encode_bf16(values[2]), 0x3F82);
}

TEST_F(SafetensorsTest, HeaderLayoutFollowsTheSpecByteByByte) {
  sdk::TrainingState st;
  st.tensors.push_back(fp32_tensor("param/a", {2, 2}, {1.0f, 2.0f, 3.0f, 4.0f}));
  st.tensors.push_back(fp32_tensor("param/b", {1}, {-1.0f}));
  st.metadata["step"] = "7";
  const auto path = dir_ / "layout.safetensors";
  make_format().write(path, st);
  const auto bytes = slurp(path);

  const std::string expected_json =
      R"({"__metadata__":{"step":"7"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})";
  std::string expected_header = expected_json;
  expected_header.append((8 - expected_header.size() % 8) % 8, ' ');
  ASSERT_EQ(expected_header.size() % 8, 0u);

  ASSERT_GE(bytes.size(), 8u);
  // u64 little-endian header length.
  for (std::size_t i = 0; i < 8; ++i)
    EXPECT_EQ(static_cast<unsigned char>(bytes[i]),
              static_cast<unsigned char>((expected_header.size() >> (8 * i)) & 0xFF))
        << "length byte " << i;
  EXPECT_EQ(bytes.substr(8, expected_header.size()), expected_header);
  // Data: contiguous little-endian fp32, C order, right after the padded header.
  std::string data;
  for (float f : {1.0f, 2.0f, 3.0f, 4.0f, -1.0f}) {
    char b[4];
    std::memcpy(b, &f, 4);
    data.append(b, 4);
  }
  EXPECT_EQ(bytes.substr(8 + expected_header.size()), data);
  EXPECT_EQ(bytes.size(), 8 + expected_header.size() + 20);
}

TEST_F(SafetensorsTest, NoMetadataMeansNoMetadataEntry) {
  sdk::TrainingState st;
  st.tensors.push_back(fp32_tensor("w", {1}, {1.0f}));  // a name without namespace is exported as is
  const auto path = dir_ / "plain.safetensors";
  make_format().write(path, st);
  const auto bytes = slurp(path);
  EXPECT_EQ(bytes.find("__metadata__"), std::string::npos);
  const auto back = make_format().read(path);
  ASSERT_EQ(back.tensors.size(), 1u);
  EXPECT_EQ(back.tensors[0].name, "w");
  EXPECT_TRUE(back.metadata.empty());
}

TEST_F(SafetensorsTest, MetadataRoundTripsWithUnicodeAndJsonText) {
  sdk::TrainingState st;
  st.tensors.push_back(fp32_tensor("param/w", {1}, {1.0f}));
  st.metadata["policy"] = R"({"name":"bf16_mixed","values":{}})";
  st.metadata["note"] = "ünïcødé \"quoted\" \\ line\nbreak";
  st.metadata["format"] = "pt";
  const auto path = dir_ / "meta.safetensors";
  make_format().write(path, st);
  EXPECT_EQ(make_format().read(path).metadata, st.metadata);
}

// The file keeps weights only, and says so: --resume then refuses it at once instead of failing
// late on a missing optimizer slot, or restoring rounded masters without a word.
TEST_F(SafetensorsTest, ATrainingStateIsMarkedWeightsOnly) {
  sdk::TrainingState st;
  st.tensors.push_back(fp32_tensor("param/w", {1}, {1.0f}));
  st.tensors.push_back(fp32_tensor("optimizer/w.exp_avg", {1}, {0.5f}));
  st.metadata["mixtrain.state_version"] = "1";
  st.metadata["step"] = "3";
  const auto path = dir_ / "state.safetensors";
  make_format().write(path, st);
  const auto back = make_format().read(path);
  EXPECT_EQ(back.metadata,
            (std::map<std::string, std::string>{
                {"mixtrain.state_version", "1"}, {"mixtrain.weights_only", "1"}, {"step", "3"}}));
  ASSERT_EQ(back.tensors.size(), 1u);
}

TEST_F(SafetensorsTest, InvalidStatesAreRejectedBeforeTouchingTheDisk) {
  const auto path = dir_ / "bad.safetensors";
  sdk::TrainingState dup;
  dup.tensors.push_back(fp32_tensor("param/w", {1}, {1.0f}));
  dup.tensors.push_back(fp32_tensor("w", {1}, {1.0f}));
  expect_error_saying([&] { make_format().write(path, dup); }, "two tensors are exported as 'w'");
  sdk::TrainingState bad_size;
  bad_size.tensors.push_back(fp32_tensor("param/w", {3}, {1.0f}));
  expect_error_saying([&] { make_format().write(path, bad_size); },
                      "tensor 'param/w' holds 4 bytes, which does not match its shape");
  sdk::TrainingState bad_utf8;
  bad_utf8.tensors.push_back(fp32_tensor("param/w", {1}, {1.0f}));
  bad_utf8.metadata["x"] = "\xff\xfe";
  expect_error_saying([&] { make_format().write(path, bad_utf8); }, "the header cannot be encoded");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir_));  // no temp file left behind
}

TEST_F(SafetensorsTest, WriteReplacesAtomicallyAndLeavesNoTempFile) {
  const auto path = dir_ / "m.safetensors";
  make_format().write(path, sample_state());
  auto st = sample_state();
  st.metadata["step"] = "43";
  make_format("bf16").write(path, st);
  EXPECT_EQ(make_format().read(path).metadata.at("step"), "43");
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& f : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 1u);
}

TEST_F(SafetensorsTest, ReadsF64AndEmptyTensorsAndSkipsIntegerBuffers) {
  // Written the way another tool might: F64, a zero-element tensor, an I64 counter.
  const std::string header =
      R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
      R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[16,16]},)"
      R"("n":{"dtype":"I64","shape":[],"data_offsets":[16,24]}})";
  std::string data;
  for (double d : {0.5, -1.25}) {
    char b[8];
    std::memcpy(b, &d, 8);
    data.append(b, 8);
  }
  data.append(le64(5));
  const auto path = dir_ / "other.safetensors";
  spit(path, le64(header.size()) + header + data);
  const auto st = make_format().read(path);
  ASSERT_EQ(st.tensors.size(), 2u);
  EXPECT_EQ(floats_of(*st.find("d")), (std::vector<float>{0.5f, -1.25f}));
  EXPECT_EQ(st.find("e")->numel(), 0);
  EXPECT_EQ(st.find("n"), nullptr);
}

// ---- hostile files --------------------------------------------------------------------------

TEST_F(SafetensorsTest, RejectsEmptyAndShortFiles) {
  expect_rejected("", {"shorter than the 8-byte header length"});
  expect_rejected("abc", {"shorter than the 8-byte header length"});
}

// A native checkpoint read as safetensors (train --resume under checkpoint.format = "safetensors")
// is named as what it is, with the format that reads it, not as a 5.6e18-byte header.
TEST_F(SafetensorsTest, ANativeCheckpointIsNamedWithTheFormatThatReadsIt) {
  const auto path = dir_ / "step-00000025.mxt";
  spit(path, std::string("MIXTRAIN") + std::string(40, '\1'));
  try {
    make_format().read(path);
    ADD_FAILURE() << "read() accepted a native checkpoint";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("a mixtrain native checkpoint"), std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("header length"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("checkpoint.format=native"), std::string::npos) << e.hint();
  }
}

TEST_F(SafetensorsTest, RejectsTruncatedFile) {
  const auto path = dir_ / "m.safetensors";
  make_format().write(path, sample_state());
  const auto bytes = slurp(path);
  // Cut in the data: the buffer is shorter than the tensors claim.
  expect_rejected(bytes.substr(0, bytes.size() - 3), {"head.weight", "reach past"});
  // Cut in the header.
  expect_rejected(bytes.substr(0, 20), {"header length"});
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  expect_rejected(le64(1000) + R"({"a":1})", {"header length 1000 exceeds"});
}

TEST_F(SafetensorsTest, RejectsHeaderLength2To63) {
  expect_rejected(le64(std::uint64_t{1} << 63) + std::string(64, ' '), {"header length"});
  expect_rejected(le64(~std::uint64_t{0}) + std::string(64, ' '), {"header length"});
}

TEST_F(SafetensorsTest, RejectsBadJson) {
  expect_rejected(file_with(R"({"a": {"dtype": "F32", )", 0), {"not valid JSON"});
  expect_rejected(file_with("[1, 2, 3]    ", 0), {"does not start with '{'"});
  expect_rejected(file_with(R"({"a": [[[[[[1]]]]]]})", 0), {"deeper"});
  expect_rejected(file_with(R"({"__metadata__": {"k": 1}})", 0), {"metadata entry 'k'"});
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  expect_rejected(file_with(R"({"w":{"dtype":"F12","shape":[1],"data_offsets":[0,4]}})", 4),
                  {"tensor 'w'", "unknown dtype \"F12\""});
}

TEST_F(SafetensorsTest, RejectsOffsetsOutOfRange) {
  expect_rejected(file_with(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
                  {"tensor 'w'", "reach past"});
  expect_rejected(
      file_with(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}})",
                4),
      {"tensor 'w'"});
  expect_rejected(file_with(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4),
                  {"tensor 'w'", "end before they begin"});
  expect_rejected(file_with(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
                  {"tensor 'w'", "data_offsets"});
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  expect_rejected(file_with(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            12),
                  {"overlap", "'a'", "'b'"});
}

TEST_F(SafetensorsTest, RejectsHolesAndUnindexedTail) {
  expect_rejected(file_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                  {"tensor 'a'", "hole"});
  expect_rejected(file_with(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 12),
                  {"belong to no tensor"});
}

TEST_F(SafetensorsTest, RejectsShapeSizeMismatch) {
  expect_rejected(file_with(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                  {"tensor 'w'", "needs 12 bytes", "span 8"});
  // numel overflows 64 bits.
  expect_rejected(
      file_with(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
      {"tensor 'w'", "overflowing"});
  expect_rejected(file_with(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                  {"tensor 'w'", "not a non-negative integer"});
  expect_rejected(file_with(R"({"w":{"dtype":"F32","shape":"x","data_offsets":[0,4]}})", 4),
                  {"tensor 'w'", "shape"});
}

TEST_F(SafetensorsTest, RejectsDuplicateNames) {
  expect_rejected(file_with(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                            8),
                  {"'w' twice"});
}

TEST_F(SafetensorsTest, RejectsMissingFileAndFolders) {
  expect_error_saying([&] { make_format().read(dir_ / "nope.safetensors"); },
                      "nope.safetensors': cannot open it");
  expect_error_saying([&] { make_format().read(dir_); }, "it is not a regular file");
}

TEST_F(SafetensorsTest, RandomCorruptionNeverCrashes) {
  const auto path = dir_ / "m.safetensors";
  make_format().write(path, sample_state());
  const auto good = slurp(path);
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    auto bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f)
      bytes[rng() % bytes.size()] = static_cast<char>(rng() & 0xFF);
    if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());
    spit(path, bytes);
    try {
      make_format().read(path);  // a flip in the data section is still a valid file
    } catch (const CheckpointError&) {
    }
  }
}

TEST_F(SafetensorsTest, OptionsRejectUnknownDtype) {
  EXPECT_THROW(sdk::Options::resolve("checkpoint", SafetensorsFormat::option_schema(),
                                     {{"dtype", std::string("fp8"), {"t.toml", 2, 1}}},
                                     sdk::SourceLocation{"t.toml", 1, 1}),
               sdk::ConfigError);
  EXPECT_EQ(make_format("bf16").dtype(), sdk::DType::bf16);
  EXPECT_EQ(make_format().file_extension(), ".safetensors");
}

TEST(SafetensorsPlugin, ModuleDescribesTheComponent) {
  const boost::dll::fs::path module = MIXTRAIN_CHECKPOINT_SAFETENSORS_MODULE;
  auto descriptor_fn = boost::dll::import_alias<const sdk::PluginDescriptor*()>(
      module, "mixtrain_plugin_descriptor", boost::dll::load_mode::rtld_now);
  const sdk::PluginDescriptor* d = descriptor_fn();
  EXPECT_EQ(d->abi_version, sdk::kSdkAbiVersion);
  EXPECT_STREQ(d->name, "checkpoint_safetensors");
  const auto components = d->components();
  ASSERT_EQ(components.size(), 1u);
  EXPECT_EQ(components[0].kind, sdk::ComponentKind::checkpoint_format);
  EXPECT_EQ(components[0].name, "safetensors");
  ASSERT_EQ(components[0].options.size(), 2u);
  EXPECT_EQ(components[0].options[0].name, "dtype");
}

}  // namespace
