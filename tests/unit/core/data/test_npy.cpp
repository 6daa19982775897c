#include "data_test_util.h"

#include "mixtrain/core/data/dataset.h"
#include "scoped_filesystem_user.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace mixtrain::core {
namespace {

using test::Bytes;
using test::expect_data_error;
using test::le_array;
using test::npy_bytes;
using test::npy_dict;
using test::ScratchDir;
using test::write_file;

// Exactly representable feature values, so float64 → float32 conversion is lossless.
double feature_value(std::size_t i) { return static_cast<double>(static_cast<int>(i % 17) - 8) * 0.25; }

std::vector<float> features_f32(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(feature_value(i));
  return v;
}

std::vector<double> features_f64(std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = feature_value(i);
  return v;
}

std::int32_t label_value(std::size_t i) { return static_cast<std::int32_t>((i * 7) % 5); }

template <class T>
std::vector<T> labels_as(std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(label_value(i));
  return v;
}

class Npy : public ::testing::Test {
 protected:
  static constexpr std::uint64_t kRows = 12, kCols = 6;

  // Writes valid features x.npy [kRows, kCols] f4 and labels y.npy [kRows] i8.
  void write_valid() {
    write_file(x_, npy_bytes(npy_dict("<f4", {kRows, kCols}), le_array(features_f32(kRows * kCols))));
    write_file(y_, npy_bytes(npy_dict("<i8", {kRows}), le_array(labels_as<std::int64_t>(kRows))));
  }
  void write_x(const Bytes& b) { write_file(x_, b); }
  void write_y(const Bytes& b) { write_file(y_, b); }

  void expect_loaded(const Dataset& d, std::int64_t features = kCols) {
    ASSERT_EQ(d.rows, static_cast<std::int64_t>(kRows));
    ASSERT_EQ(d.features, features);
    EXPECT_EQ(d.classes, 5);
    for (std::size_t i = 0; i < d.x.size(); ++i)
      ASSERT_EQ(d.x[i], static_cast<float>(feature_value(i))) << i;
    for (std::size_t i = 0; i < d.y.size(); ++i) ASSERT_EQ(d.y[i], label_value(i)) << i;
  }
  void expect_x_error(const std::vector<std::string>& contains = {}) {
    expect_data_error([&] { load_npy(x_, y_); }, x_.string(), contains);
  }
  void expect_y_error(const std::vector<std::string>& contains = {}) {
    expect_data_error([&] { load_npy(x_, y_); }, y_.string(), contains);
  }

  ScratchDir dir_;
  test::fs::path x_ = dir_ / "x.npy", y_ = dir_ / "y.npy";
};

TEST_F(Npy, Float32WithEveryIntegerLabelType) {
  write_valid();
  expect_loaded(load_npy(x_, y_));
  auto check = [&](const std::string& descr, const Bytes& data) {
    SCOPED_TRACE(descr);
    write_y(npy_bytes(npy_dict(descr, {kRows}), data));
    expect_loaded(load_npy(x_, y_));
  };
  check("|i1", le_array(labels_as<std::int8_t>(kRows)));
  check("|u1", le_array(labels_as<std::uint8_t>(kRows)));
  check("<i2", le_array(labels_as<std::int16_t>(kRows)));
  check("<u2", le_array(labels_as<std::uint16_t>(kRows)));
  check("<i4", le_array(labels_as<std::int32_t>(kRows)));
  check("<u4", le_array(labels_as<std::uint32_t>(kRows)));
  check("<u8", le_array(labels_as<std::uint64_t>(kRows)));
}

TEST_F(Npy, Float64IsConverted) {
  write_valid();
  write_x(npy_bytes(npy_dict("<f8", {kRows, kCols}), le_array(features_f64(kRows * kCols))));
  expect_loaded(load_npy(x_, y_));
}

TEST_F(Npy, HigherRankIsFlattenedAndLabelsMayBeAColumn) {
  write_valid();
  write_x(npy_bytes(npy_dict("<f4", {kRows, 2, 3}), le_array(features_f32(kRows * kCols))));
  write_y(npy_bytes(npy_dict("<i4", {kRows, 1}), le_array(labels_as<std::int32_t>(kRows))));
  expect_loaded(load_npy(x_, y_), 6);
}

TEST_F(Npy, FormatVersions2And3AndHeaderVariants) {
  write_valid();
  write_x(npy_bytes(npy_dict("<f4", {kRows, kCols}), le_array(features_f32(kRows * kCols)), 2));
  write_y(npy_bytes(npy_dict("<i8", {kRows}), le_array(labels_as<std::int64_t>(kRows)), 3));
  expect_loaded(load_npy(x_, y_));
  // Key order, quotes, spacing and the trailing comma are free in a Python literal.
  write_x(npy_bytes("{ \"shape\" :(12,6),\"fortran_order\":False,'descr':'=f4'}",
                    le_array(features_f32(kRows * kCols))));
  expect_loaded(load_npy(x_, y_));
  write_y(npy_bytes("{'descr': '|i1', 'fortran_order': False, 'shape': (12L,), }",
                    le_array(labels_as<std::int8_t>(kRows))));
  expect_loaded(load_npy(x_, y_));
}

TEST_F(Npy, DeclaredClasses) {
  write_valid();
  EXPECT_EQ(load_npy(x_, y_, 9).classes, 9);
  expect_data_error([&] { load_npy(x_, y_, 4); }, y_.string(), {"label 4", "4 classes"});
}

TEST_F(Npy, MissingFile) {
  write_valid();
  test::fs::remove(x_);
  expect_x_error({"no such file"});
  write_valid();
  test::fs::remove(y_);
  expect_y_error({"no such file"});
}

TEST_F(Npy, DirectoryInsteadOfFile) {
  write_valid();
  test::fs::remove(x_);
  test::fs::create_directory(x_);
  expect_x_error({"directory"});
}

TEST_F(Npy, UnreadableFile) {
  write_valid();
  test::fs::permissions(x_, test::fs::perms::none);
  // As root, permissions bind only once this thread opens files as an unprivileged user.
  const test::ScopedFilesystemUser nobody;
  if (!nobody.permissions_bind()) GTEST_SKIP() << "root, and no unprivileged filesystem user";
  expect_x_error({"cannot open"});
}

TEST_F(Npy, TruncatedFiles) {
  write_valid();
  Bytes full = test::read_file(x_);
  write_x(Bytes(full.begin(), full.end() - 5));
  expect_x_error({"truncated", "288 bytes"});
  write_x(Bytes(full.begin(), full.begin() + 40));  // inside the header
  expect_x_error({"truncated"});
  write_x(Bytes(full.begin(), full.begin() + 9));  // inside the preamble
  expect_x_error({"too small"});
  write_x({});
  expect_x_error({"too small"});
}

TEST_F(Npy, TrailingBytes) {
  write_valid();
  Bytes full = test::read_file(y_);
  full.push_back(0);
  write_y(full);
  expect_y_error({"unexpected bytes"});
}

TEST_F(Npy, BadMagicAndVersion) {
  write_valid();
  write_x(Bytes(100, 'a'));
  expect_x_error({"bad magic"});
  Bytes zip(100, 0);  // a .npz is a zip archive: "PK\x03\x04"
  zip[0] = 'P';
  zip[1] = 'K';
  zip[2] = 3;
  zip[3] = 4;
  write_x(zip);
  expect_data_error([&] { load_npy(x_, y_); }, x_.string(), {"bad magic"});
  Bytes v4 = npy_bytes(npy_dict("<f4", {kRows, kCols}), le_array(features_f32(kRows * kCols)));
  v4[6] = 4;
  write_x(v4);
  expect_x_error({"version 4.0"});
}

TEST_F(Npy, MalformedHeaders) {
  write_valid();
  const Bytes data = le_array(features_f32(kRows * kCols));
  for (const std::string header : {
           "",
           "{",
           "['descr', '<f4']",
           "{'descr': '<f4', 'fortran_order': False}",                            // no shape
           "{'descr': '<f4', 'shape': (12, 6)}",                                  // no order
           "{'fortran_order': False, 'shape': (12, 6)}",                          // no descr
           "{'descr': '<f4', 'fortran_order': False, 'shape': (12, 6), 'x': 1}",  // extra key
           "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (12, 6)}",
           "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (12, 6)}",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (12, -6)}",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (12 6)}",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999, 6)}",
           "{'descr': '<f4', 'fortran_order': False, 'shape': [12, 6]}",
           "{'descr': <f4, 'fortran_order': False, 'shape': (12, 6)}",
           "{'descr': '<f4, 'fortran_order': False, 'shape': (12, 6)}",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (12, 6)} junk",
           "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (12,)}",
       }) {
    SCOPED_TRACE(header);
    write_x(npy_bytes(header, data));
    expect_x_error({"header"});
  }
}

TEST_F(Npy, HeaderLengthBeyondTheFile) {
  write_valid();
  Bytes full = test::read_file(x_);
  full[8] = 0xff;
  full[9] = 0xff;
  write_x(full);
  expect_x_error({"truncated"});
}

TEST_F(Npy, BigEndianIsRefusedAndFortranOrderIsReadInCOrder) {
  write_valid();
  const Bytes data = le_array(features_f32(kRows * kCols));
  write_x(npy_bytes(npy_dict(">f4", {kRows, kCols}), data));
  expect_x_error({"big-endian"});
  // Column-major: the file's element k is (k % rows, k / rows).
  write_x(npy_bytes(npy_dict("<f4", {kRows, kCols}, /*fortran=*/true), data));
  const Dataset d = load_npy(x_, y_);
  const auto f = features_f32(kRows * kCols);
  for (std::size_t r = 0; r < kRows; ++r)
    for (std::size_t c = 0; c < kCols; ++c)
      ASSERT_EQ(d.x[r * kCols + c], f[c * kRows + r]) << r << ", " << c;
  write_valid();
  write_y(npy_bytes(npy_dict(">i4", {kRows}), le_array(labels_as<std::int32_t>(kRows))));
  expect_y_error({"big-endian"});
}

TEST_F(Npy, WrongDtypes) {
  write_valid();
  write_x(npy_bytes(npy_dict("<i4", {kRows, kCols}), le_array(labels_as<std::int32_t>(kRows * kCols))));
  // Integer pixels: the hint scales them (a bare float cast would feed 0..65535 for [0, 1]).
  expect_x_error({"'<i4'", "float32", "np.uint8", "/ 65535"});
  write_x(npy_bytes(npy_dict("|O", {kRows, kCols}), Bytes(kRows * kCols * 8, 0)));
  expect_x_error({"dtype"});
  write_x(npy_bytes(npy_dict("<c8", {kRows, kCols}), Bytes(kRows * kCols * 8, 0)));
  expect_x_error({"'<c8'"});
  write_valid();
  write_y(npy_bytes(npy_dict("<f4", {kRows}), le_array(features_f32(kRows))));
  expect_y_error({"'<f4'", "integer"});
  write_y(npy_bytes(npy_dict("|b1", {kRows}), Bytes(kRows, 0)));
  expect_y_error({"'|b1'"});
}

TEST_F(Npy, WrongRanks) {
  write_valid();
  write_x(npy_bytes(npy_dict("<f4", {kRows}), le_array(features_f32(kRows))));
  expect_x_error({"rank 1", "[N, D]"});
  write_x(npy_bytes(npy_dict("<f4", {}), le_array(features_f32(1))));
  expect_x_error({"rank 0"});
  write_valid();
  write_y(npy_bytes(npy_dict("<i8", {kRows, 2}), le_array(labels_as<std::int64_t>(kRows * 2))));
  expect_y_error({"(12, 2)", "[N]"});
}

TEST_F(Npy, ZeroRowsOrFeatures) {
  write_valid();
  write_x(npy_bytes(npy_dict("<f4", {0, kCols}), {}));
  expect_x_error({"zero rows"});
  write_x(npy_bytes(npy_dict("<f4", {kRows, 0}), {}));
  expect_x_error({"zero features"});
  write_valid();
  write_y(npy_bytes(npy_dict("<i8", {0}), {}));
  expect_y_error({"zero rows"});
}

TEST_F(Npy, RowCountMismatch) {
  write_valid();
  write_y(npy_bytes(npy_dict("<i8", {kRows - 1}), le_array(labels_as<std::int64_t>(kRows - 1))));
  expect_data_error([&] { load_npy(x_, y_); }, x_.string(), {"12 rows", "11", y_.string()});
}

TEST_F(Npy, BadLabels) {
  write_valid();
  auto labels = labels_as<std::int64_t>(kRows);
  labels[3] = -2;
  write_y(npy_bytes(npy_dict("<i8", {kRows}), le_array(labels)));
  expect_y_error({"-2", "row 3", "negative"});
  labels[3] = std::int64_t{1} << 40;
  write_y(npy_bytes(npy_dict("<i8", {kRows}), le_array(labels)));
  expect_y_error({"too large"});
  auto unsigned_labels = labels_as<std::uint64_t>(kRows);
  unsigned_labels[0] = ~std::uint64_t{0};
  write_y(npy_bytes(npy_dict("<u8", {kRows}), le_array(unsigned_labels)));
  expect_y_error({"too large"});
}

TEST_F(Npy, NonFiniteFeatures) {
  write_valid();
  auto x = features_f32(kRows * kCols);
  x[2 * kCols + 3] = std::numeric_limits<float>::quiet_NaN();
  write_x(npy_bytes(npy_dict("<f4", {kRows, kCols}), le_array(x)));
  expect_x_error({"[2, 3]", "NaN"});
  x[2 * kCols + 3] = -std::numeric_limits<float>::infinity();
  write_x(npy_bytes(npy_dict("<f4", {kRows, kCols}), le_array(x)));
  expect_x_error({"[2, 3]", "infinite"});
  auto x64 = features_f64(kRows * kCols);
  x64[5] = 1e300;  // finite in float64, infinite in float32
  write_x(npy_bytes(npy_dict("<f8", {kRows, kCols}), le_array(x64)));
  expect_x_error({"[0, 5]", "infinite"});
}

TEST_F(Npy, HugeShapeFailsWithoutAllocating) {
  write_valid();
  write_x(npy_bytes(npy_dict("<f4", {1000000000000ULL, 1000000ULL}), Bytes(64, 0)));
  expect_x_error({"truncated"});
  write_x(npy_bytes(npy_dict("<f8", {1ULL << 62, 1ULL << 62}), Bytes(64, 0)));
  expect_x_error({"truncated"});
}

// ---- files written by real NumPy ------------------------------------------------------------

constexpr const char* kPython = "/usr/bin/python3";

bool numpy_available() {
  static const bool available =
      std::system((std::string(kPython) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0;
  return available;
}

int run_python(const test::fs::path& script_file, const std::string& script,
               const std::string& args) {
  std::ofstream(script_file) << script;
  const std::string command =
      std::string(kPython) + " '" + script_file.string() + "' " + args + " 2>&1";
  return std::system(command.c_str());
}

TEST(NpyFromNumPy, MatchesWhatNumPyWrote) {
  if (!numpy_available())
    GTEST_SKIP() << kPython << " has no numpy (apt install python3-numpy to run this test)";
  ScratchDir dir;
  const char* script = R"PY(
import sys, numpy as np
out = sys.argv[1]
n, h, w = 10, 3, 4
x = ((np.arange(n * h * w) % 17) - 8).astype(np.float32).reshape(n, h, w) * np.float32(0.25)
y = (np.arange(n) * 7) % 5
np.save(out + '/x_f4.npy', x)
np.save(out + '/x_f8.npy', x.astype(np.float64))
for t in ['int8', 'uint8', 'int16', 'uint16', 'int32', 'uint32', 'int64', 'uint64']:
    np.save(out + '/y_' + t + '.npy', y.astype(t))
np.save(out + '/x_fortran.npy', np.asfortranarray(x.reshape(n, h * w)))
np.save(out + '/x_fortran3.npy', np.asfortranarray(x))
np.save(out + '/x_big.npy', x.astype('>f4'))
np.save(out + '/x_strided.npy', x[:, ::-1, :])
with open(out + '/x_v2.npy', 'wb') as f:
    np.lib.format.write_array(f, x, version=(2, 0))
with open(out + '/x_v3.npy', 'wb') as f:
    np.lib.format.write_array(f, x, version=(3, 0))
np.savez(out + '/archive.npz', x=x)
)PY";
  ASSERT_EQ(run_python(dir / "write.py", script, "'" + dir.path().string() + "'"), 0);

  auto expect_matches = [](const Dataset& d) {
    ASSERT_EQ(d.rows, 10);
    ASSERT_EQ(d.features, 12);
    EXPECT_EQ(d.classes, 5);
    for (std::size_t i = 0; i < d.x.size(); ++i)
      ASSERT_EQ(d.x[i], static_cast<float>(feature_value(i))) << i;
    for (std::size_t i = 0; i < d.y.size(); ++i) ASSERT_EQ(d.y[i], label_value(i)) << i;
  };
  for (const char* x : {"x_f4.npy", "x_f8.npy", "x_v2.npy", "x_v3.npy"}) {
    for (const char* t : {"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"}) {
      SCOPED_TRACE(std::string(x) + " / " + t);
      expect_matches(load_npy(dir / x, dir / ("y_" + std::string(t) + ".npy")));
    }
  }
  // np.save writes a C-ordered copy of a strided view.
  const Dataset strided = load_npy(dir / "x_strided.npy", dir / "y_int64.npy");
  EXPECT_EQ(strided.x[0], static_cast<float>(feature_value(8)));
  // An F-contiguous array reads back with the same element at each index, as numpy.load's.
  expect_matches(load_npy(dir / "x_fortran.npy", dir / "y_int64.npy"));
  expect_matches(load_npy(dir / "x_fortran3.npy", dir / "y_int64.npy"));
  expect_data_error([&] { load_npy(dir / "x_big.npy", dir / "y_int64.npy"); },
                    (dir / "x_big.npy").string(), {"big-endian"});
  expect_data_error([&] { load_npy(dir / "archive.npz", dir / "y_int64.npy"); },
                    (dir / "archive.npz").string(), {"bad magic"});
}

TEST(NpyFromNumPy, SampleScriptOutputLoads) {
  if (!numpy_available())
    GTEST_SKIP() << kPython << " has no numpy (apt install python3-numpy to run this test)";
  ScratchDir dir;
  const test::fs::path tool =
      test::fs::path(MIXTRAIN_TEST_SOURCE_DIR) / "samples/data_tools/make_npy_dataset.py";
  ASSERT_TRUE(test::fs::exists(tool)) << tool;
  const std::string command = std::string(kPython) + " '" + tool.string() + "' --kind spiral" +
                              " --rows 600 --classes 3 --out '" + dir.path().string() +
                              "/spiral' >/dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const Dataset d = load_npy(dir / "spiral_x.npy", dir / "spiral_y.npy");
  EXPECT_EQ(d.rows, 600);
  EXPECT_EQ(d.features, 2);
  EXPECT_EQ(d.classes, 3);
}

// Arguments that would write a dataset mixtrain refuses, or crash the tool, exit 2 with a message;
// an existing pair is replaced only with --force; blobs has every class even at one row each.
TEST(NpyFromNumPy, SampleScriptRefusesBadArgumentsAndExistingFiles) {
  if (!numpy_available())
    GTEST_SKIP() << kPython << " has no numpy (apt install python3-numpy to run this test)";
  ScratchDir dir;
  const test::fs::path tool =
      test::fs::path(MIXTRAIN_TEST_SOURCE_DIR) / "samples/data_tools/make_npy_dataset.py";
  auto exit_code = [&](const std::string& args) {
    const int status = std::system((std::string(kPython) + " '" + tool.string() + "' " + args +
                                    " --out '" + dir.path().string() + "/d' >/dev/null 2>&1")
                                       .c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  for (const char* bad : {"--kind blobs --features 0", "--kind blobs --features -1", "--noise -1",
                          "--noise nan", "--rows 2 --classes 3", "--classes 1"})
    EXPECT_EQ(exit_code(bad), 2) << bad;
  EXPECT_FALSE(test::fs::exists(dir / "d_x.npy"));
  ASSERT_EQ(exit_code("--kind blobs --rows 5 --classes 5 --features 3"), 0);
  EXPECT_EQ(load_npy(dir / "d_x.npy", dir / "d_y.npy").classes, 5);
  const auto first = test::read_file(dir / "d_x.npy");
  EXPECT_EQ(exit_code("--kind blobs --rows 5 --classes 5 --features 3 --seed 1"), 2);
  EXPECT_EQ(test::read_file(dir / "d_x.npy"), first);
  ASSERT_EQ(exit_code("--kind blobs --rows 5 --classes 5 --features 3 --seed 1 --force"), 0);
  EXPECT_NE(test::read_file(dir / "d_x.npy"), first);
}

}  // namespace
}  // namespace mixtrain::core
