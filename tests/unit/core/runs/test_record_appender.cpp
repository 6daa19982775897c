// Run-folder files that grow by whole records (runs/record_appender.h): a write the OS refuses
// part way leaves the file at its last whole record, later records land again, and a metrics
// sink that cannot be opened leaves no metric file behind (runs/metrics_log.h).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "mixtrain/sdk/error.h"
#include "runs/metrics_log.h"
#include "runs/record_appender.h"

namespace {

namespace fs = std::filesystem;
using mixtrain::core::RecordAppender;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / (name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The file size limit (RLIMIT_FSIZE) makes the OS write part of a record and then refuse the
// rest (EFBIG), as a disk that fills mid-write does; SIGXFSZ is ignored so that the write fails
// instead of killing the test.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &old_);
    rlimit limited = old_;
    limited.rlim_cur = bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
};

TEST(RecordAppender, AFailedWriteLeavesOnlyWholeRecordsAndLaterRecordsLand) {
  const fs::path dir = fresh_dir("mixtrain-appender");
  const fs::path file = dir / "metrics.jsonl";
  const std::string a(100, 'a'), b(100, 'b'), c(100, 'c'), d(100, 'd');
  RecordAppender out(file);
  EXPECT_EQ(out.bytes_on_open(), 0u);
  out.append(a);
  {
    const FileSizeLimit limit(150);  // b fits half: the OS writes 50 bytes of it, then refuses
    out.append(b);
    EXPECT_EQ(read(file), a);
    out.append(c);
    EXPECT_EQ(read(file), a);
    EXPECT_EQ(out.records_lost(), 2u);
  }
  out.append(d);  // space again
  EXPECT_EQ(read(file), a + d);
  EXPECT_EQ(out.records_lost(), 0u);
  const RecordAppender reopened(file);
  EXPECT_EQ(reopened.bytes_on_open(), 200u);
  fs::remove_all(dir);
}

TEST(RecordAppender, AFileThatCannotBeOpenedNamesTheReason) {
  const fs::path dir = fresh_dir("mixtrain-appender-open");
  try {
    const RecordAppender out(dir / "missing" / "metrics.jsonl");
    ADD_FAILURE() << "opened a file in a folder that does not exist";
  } catch (const mixtrain::sdk::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// metrics.csv cannot be opened (a folder holds its name): opening the sinks fails, and the
// metrics.jsonl it had created is gone again, so that the folder does not count as a run's; one
// that was there before (a resumed run's) stays.
TEST(MetricsLog, AFailedOpenRemovesTheMetricFilesItCreated) {
  const fs::path dir = fresh_dir("mixtrain-metrics-open");
  fs::create_directories(dir / "metrics.csv");
  const std::vector<mixtrain::core::MetricsSinkKind> sinks = {
      mixtrain::core::MetricsSinkKind::tensorboard, mixtrain::core::MetricsSinkKind::csv};
  mixtrain::core::MetricsLog log;
  EXPECT_THROW(log.open(dir, sinks, 0), mixtrain::sdk::UserError);
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(dir)) left.push_back(f.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"metrics.csv"});

  std::ofstream(dir / "metrics.jsonl") << "{\"step\":1}\n";
  EXPECT_THROW(log.open(dir, sinks, 1), mixtrain::sdk::UserError);
  EXPECT_EQ(read(dir / "metrics.jsonl"), "{\"step\":1}\n");
  fs::remove_all(dir);
}

}  // namespace
