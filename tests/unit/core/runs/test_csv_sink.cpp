// metrics.csv's rows and quoting (runs/csv_sink.h).
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "mixtrain/sdk/error.h"
#include "runs/csv_sink.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using mixtrain::core::csv_columns;
using mixtrain::core::csv_field;
using mixtrain::core::csv_row;
using mixtrain::core::CsvSink;

std::string header() {
  std::string h;
  for (const auto& c : csv_columns()) h += (h.empty() ? "" : ",") + c;
  return h;
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CsvField, PlainTextStaysAsIs) {
  EXPECT_EQ(csv_field("fc1 output"), "fc1 output");
  EXPECT_EQ(csv_field(""), "");
}

TEST(CsvField, CommasQuotesAndLineBreaksAreQuoted) {
  EXPECT_EQ(csv_field("micro-batch 1 of 2: fc1, output"), "\"micro-batch 1 of 2: fc1, output\"");
  EXPECT_EQ(csv_field("node 'fc1' said \"inf\""), "\"node 'fc1' said \"\"inf\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(csv_field("cr\r"), "\"cr\r\"");
}

TEST(CsvRow, StepRecordFillsItsColumnsAsMetricsJsonlSpellsThem) {
  const json rec = {
      {"step", 30},           {"loss", 0.5}, {"loss_scale", 65536.0},           {"skipped", true},
      {"grad_norm", nullptr}, {"epoch", 1},  {"nonfinite", "fc1 output, row 3"}};
  const std::string row = csv_row(rec);
  // step, epoch, loss, loss_scale, next_loss_scale, skipped, lr, grad_norm, ..., nonfinite, ...
  EXPECT_EQ(row.rfind("30,1,0.5,65536.0,,true,,,", 0), 0u) << row;
  EXPECT_NE(row.find(",\"fc1 output, row 3\","), std::string::npos) << row;
}

TEST(CsvRow, EvaluationTopKBecomesAColumnPair) {
  const json rec = {
      {"step", 100}, {"eval_loss", 0.25}, {"eval_accuracy", 0.9}, {"eval_top5_accuracy", 1.0}};
  const std::string row = csv_row(rec);
  EXPECT_EQ(row, "100,,,,,,,,,,,,,0.25,0.9,5,1.0");
}

// A diverged step's NaN is a double in the record (metrics.jsonl writes it null): its field is
// empty like a null's, not the word "null", which CSV readers take for text.
TEST(CsvRow, NonFiniteNumbersAreEmptyFieldsLikeNulls) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const json rec = {{"step", 15}, {"loss", nan}, {"grad_norm", nullptr}, {"eval_loss", inf}};
  const std::string row = csv_row(rec);
  EXPECT_EQ(row.find("null"), std::string::npos) << row;
  EXPECT_EQ(row.rfind("15,,,", 0), 0u) << row;
  EXPECT_EQ(row, "15,,,,,,,,,,,,,,,,");
}

TEST(CsvRow, PerTensorRecordsAreNotRows) {
  EXPECT_EQ(csv_row(json{{"step", 5}, {"underflow", json::object()}}), "");
  EXPECT_EQ(csv_row(json{{"step", 5}, {"fp8", json::object()}}), "");
}

TEST(CsvSink, WritesTheHeaderOnceAndAppendsOnResume) {
  const fs::path dir = fs::temp_directory_path() / ("mixtrain-csv-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "metrics.csv";
  {
    CsvSink sink(file);
    sink.write(json{{"step", 1}, {"loss", 2.0}});
  }
  {
    CsvSink sink(file);  // a resumed run
    sink.write(json{{"step", 2}, {"loss", 1.0}});
    sink.write(json{{"step", 2}, {"underflow", json::object()}});
  }
  const std::string text = read(file);
  EXPECT_EQ(text, header() + "\n1,,2.0,,,,,,,,,,,,,,\n2,,1.0,,,,,,,,,,,,,,\n");
  fs::remove_all(dir);
}

TEST(CsvSink, RefusesAFileWithOtherColumns) {
  const fs::path dir = fs::temp_directory_path() / ("mixtrain-csv2-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "metrics.csv") << "step,loss\n1,2\n";
  EXPECT_THROW(CsvSink(dir / "metrics.csv"), mixtrain::sdk::UserError);
  fs::remove_all(dir);
}

}  // namespace
