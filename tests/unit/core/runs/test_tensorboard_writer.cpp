// TensorBoard event files (runs/tensorboard_writer.h): every record is whole and on disk when the
// call returns, so a run killed at any point leaves a file TensorBoard reads up to the kill.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "little_endian.h"
#include "runs/tensorboard_sink.h"
#include "runs/tensorboard_writer.h"
#include "runs/tfrecord.h"

namespace {

using mixtrain::test::read_le;

namespace fs = std::filesystem;
using mixtrain::core::masked_crc32c;
using mixtrain::core::TensorBoardWriter;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Whole records with valid checksums, or -1 when the bytes end inside one or a CRC is wrong.
int whole_records(const std::string& bytes) {
  int n = 0;
  std::size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 16) return -1;
    const auto length = read_le(bytes, at, 8);
    if (at + 16 + length > bytes.size()) return -1;
    if (read_le(bytes, at + 8, 4) != masked_crc32c(std::string_view(bytes).substr(at, 8)))
      return -1;
    if (read_le(bytes, at + 12 + length, 4) != masked_crc32c(bytes.substr(at + 12, length)))
      return -1;
    at += 16 + length;
    ++n;
  }
  return n;
}

// A skipped step's underflow and FP8 records (tagged by the trainer) measured its overflowed pass:
// no scalars, as `compare` leaves them out; the same records of an applied step give them.
TEST(TensorBoardScalars, DiagnosticsOfASkippedStepAreNotPlotted) {
  const auto underflow = nlohmann::json::parse(
      R"({"step": 3, "underflow_scale": 1024.0,
          "underflow": {"fc1 input gradient": {"flushed_share": 0.5}}})");
  const auto fp8 = nlohmann::json::parse(
      R"({"step": 3, "fp8": {"fc1.matmul.input": {"amax": null, "scale": 2.0}}})");
  EXPECT_EQ(mixtrain::core::tensorboard_scalars(underflow).size(), 2u);
  EXPECT_EQ(mixtrain::core::tensorboard_scalars(fp8).size(), 2u);
  for (auto record : {underflow, fp8}) {
    record["skipped"] = true;
    EXPECT_TRUE(mixtrain::core::tensorboard_scalars(record).empty()) << record.dump();
  }
  // A step record's own `skipped` is a scalar of its own.
  const auto step = nlohmann::json::parse(R"({"step": 3, "loss": 1.5, "skipped": true})");
  EXPECT_EQ(mixtrain::core::tensorboard_scalars(step).size(), 2u);
}

TEST(TensorBoardWriter, EachRecordIsWholeOnDiskWhenTheCallReturns) {
  const fs::path dir = fs::temp_directory_path() / ("mixtrain-tb-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    TensorBoardWriter w(dir);
    EXPECT_EQ(w.path().parent_path(), dir);
    EXPECT_EQ(w.path().filename().string().rfind("events.out.tfevents.", 0), 0u);
    const std::string version = read(w.path());
    EXPECT_EQ(whole_records(version), 1);  // file_version, before any data
    EXPECT_NE(version.find("brain.Event:2"), std::string::npos);
    w.add_scalars(10, {{"train/loss", 0.5f}, {"train/lr", 0.001f}});
    EXPECT_EQ(whole_records(read(w.path())), 2);
    w.add_scalars(20, {});  // nothing to say: no record
    EXPECT_EQ(whole_records(read(w.path())), 2);
    w.add_text(0, "run/config", "    [run]\n    steps = 10\n");
    w.add_session_start(11);
    EXPECT_EQ(whole_records(read(w.path())), 4);
  }
  fs::remove_all(dir);
}

TEST(TensorBoardWriter, ANewFileSortsAfterTheFolderOnes) {
  // A resume within the same second (and a smaller pid) must still be read last.
  const fs::path dir = fs::temp_directory_path() / ("mixtrain-tb2-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string later = "events.out.tfevents.4102444800.zzzz.99999999";  // year 2100
  std::ofstream(dir / later).put('\0');
  const TensorBoardWriter first(dir);
  EXPECT_GT(first.path().filename().string(), later);
  const TensorBoardWriter second(dir);  // same second, same pid
  EXPECT_GT(second.path().filename().string(), first.path().filename().string());
  fs::remove_all(dir);
}

}  // namespace
