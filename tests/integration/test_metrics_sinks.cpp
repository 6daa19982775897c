// The metrics sinks (run.metrics) through the real executable: TensorBoard event files read back
// with TensorBoard's own reader (the PyPI peer, tensorboard_reader.py) and with the core's
// generated protobuf classes, checking every record's CRCs; metrics.csv; both against
// metrics.jsonl, also across a resume into the run folder. Bad sink names exit 2.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "cli_test_support.h"
#include "little_endian.h"
#include "python_peers.h"
#include "runs/tensorboard_writer.h"
#include "runs/tfrecord.h"
#include "tensorboard/event.pb.h"

namespace mixtrain::test {
namespace {

// A small fp16 run that writes every kind of record the sinks map: steps, evaluations with top-5
// accuracy, and per-tensor gradient underflow.
const std::string kSmallRun =
    " --set run.steps=40 --set run.log_every=10 --set run.eval_every=20 --set eval.top_k=5"
    " --set precision.policy=fp16-mixed --set scaler.type=dynamic --set run.underflow_every=20"
    " --set checkpoint.every=20 --set data.synthetic.rows=2048";
const std::string kAllSinks = " --set 'run.metrics=[\"jsonl\", \"tensorboard\", \"csv\"]'";

using Series = std::vector<std::pair<std::int64_t, std::optional<double>>>;  // nullopt: NaN

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(f.path());
  std::sort(out.begin(), out.end());  // TensorBoard reads a folder's files in name order
  return out;
}

// The offline reader: TFRecord frames with both CRCs checked, each parsed as a tensorboard::Event;
// a session start drops what came before from its step on, as TensorBoard does. Returns the same
// JSON shape as tensorboard_reader.py.
json read_events_with_generated_classes(const fs::path& dir) {
  json out = {{"scalars", json::object()}, {"texts", json::object()}, {"plugins", json::object()}};
  std::vector<std::string> versions;
  for (const auto& file : event_files(dir)) {
    const std::string bytes = slurp(file);
    std::size_t at = 0;
    bool first = true;
    while (at < bytes.size()) {
      EXPECT_GE(bytes.size() - at, 12u) << file << ": torn record header at " << at;
      if (bytes.size() - at < 12) break;
      const auto length = read_le(bytes, at, 8);
      EXPECT_EQ(read_le(bytes, at + 8, 4),
                core::masked_crc32c(std::string_view(bytes).substr(at, 8)))
          << file << ": length CRC at " << at;
      EXPECT_LE(at + 16 + length, bytes.size()) << file << ": torn record at " << at;
      if (at + 16 + length > bytes.size()) break;
      const std::string data = bytes.substr(at + 12, length);
      EXPECT_EQ(read_le(bytes, at + 12 + length, 4), core::masked_crc32c(data))
          << file << ": data CRC at " << at;
      at += 16 + length;
      tensorboard::Event e;
      EXPECT_TRUE(e.ParseFromString(data)) << file;
      if (first) {
        EXPECT_EQ(e.file_version(), "brain.Event:2") << file;
        first = false;
        continue;
      }
      if (e.has_session_log() && e.session_log().status() == tensorboard::SessionLog::START) {
        for (auto* kind : {&out["scalars"], &out["texts"]})
          for (auto& [tag, series] : kind->items()) {
            json kept = json::array();
            for (const auto& point : series)
              if (point[0].get<std::int64_t>() < e.step()) kept.push_back(point);
            series = kept;
          }
        continue;
      }
      for (const auto& v : e.summary().value()) {
        if (v.has_tensor()) {
          out["plugins"][v.tag()] = v.metadata().plugin_data().plugin_name();
          EXPECT_EQ(v.tensor().dtype(), tensorboard::DT_STRING);
          EXPECT_EQ(v.tensor().string_val_size(), 1);
          out["texts"][v.tag()].push_back(json::array({e.step(), v.tensor().string_val(0)}));
        } else {
          const double x = v.simple_value();
          out["scalars"][v.tag()].push_back(
              json::array({e.step(), std::isfinite(x) ? json(x) : json(nullptr)}));
        }
      }
    }
  }
  return out;
}

json read_events_with_tensorboard(const fs::path& dir, const fs::path& scratch) {
  const fs::path out = scratch / "tensorboard_reader.json";
  const std::string cmd = peers_python() + " " + std::string(MIXTRAIN_SOURCE_DIR) +
                          "/tests/integration/tensorboard_reader.py '" + dir.string() + "' >'" +
                          out.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return json::parse(slurp(out));
}

// What the event files must hold for metrics.jsonl's records: the tags runs/tensorboard_sink.h
// documents, written out here independently of the sink.
std::map<std::string, Series> expected_scalars(const std::vector<json>& records) {
  const std::vector<std::pair<std::string, std::string>> step_tags = {
      {"loss", "train/loss"},
      {"loss_scale", "train/loss_scale"},
      {"lr", "train/lr"},
      {"grad_norm", "train/grad_norm"},
      {"samples_per_s", "train/samples_per_s"},
      {"skipped", "train/skipped"},
      {"epoch", "train/epoch"},
      {"device_memory_bytes", "memory/device_bytes"},
      {"device_peak_memory_bytes", "memory/device_peak_bytes"},
      {"host_peak_rss_bytes", "memory/host_peak_rss_bytes"}};
  std::map<std::string, Series> out;
  auto add = [&](const std::string& tag, std::int64_t step, const json& v) {
    std::optional<double> x;
    if (v.is_boolean()) x = v.get<bool>() ? 1.0 : 0.0;
    if (v.is_number()) x = v.get<double>();
    out[tag].emplace_back(step, x);
  };
  for (const auto& r : records) {
    const auto step = r["step"].get<std::int64_t>();
    if (r.contains("loss"))
      for (const auto& [key, tag] : step_tags)
        if (r.contains(key) && !(key == "grad_norm" && r[key].is_null())) add(tag, step, r[key]);
    for (const auto& [key, v] : r.items())
      if (key.rfind("eval_", 0) == 0) add("eval/" + key.substr(5), step, v);
    if (r.contains("underflow")) {
      add("underflow/loss_scale", step, r["underflow_scale"]);
      for (const auto& [tensor, stats] : r["underflow"].items())
        add("underflow/" + tensor, step, stats["flushed_share"]);
    }
  }
  return out;
}

void expect_scalars_match(const json& read, const std::vector<json>& records,
                          const std::string& reader) {
  const auto expected = expected_scalars(records);
  std::set<std::string> want, got;
  for (const auto& [tag, _] : expected) want.insert(tag);
  for (const auto& [tag, _] : read["scalars"].items()) got.insert(tag);
  EXPECT_EQ(got, want) << reader;
  for (const auto& [tag, series] : expected) {
    if (!read["scalars"].contains(tag)) continue;
    const auto& points = read["scalars"][tag];
    ASSERT_EQ(points.size(), series.size()) << reader << " " << tag;
    for (std::size_t i = 0; i < series.size(); ++i) {
      EXPECT_EQ(points[i][0].get<std::int64_t>(), series[i].first) << reader << " " << tag;
      if (!series[i].second) {
        EXPECT_TRUE(points[i][1].is_null()) << reader << " " << tag;
        continue;
      }
      // TensorBoard keeps scalars as float32.
      EXPECT_EQ(static_cast<float>(points[i][1].get<double>()),
                static_cast<float>(*series[i].second))
          << reader << " " << tag << " at step " << series[i].first;
    }
  }
}

void expect_plan_text(const json& read, const std::string& reader) {
  EXPECT_EQ(read["plugins"].value("run/precision_plan", ""), "text") << reader;
  EXPECT_EQ(read["plugins"].value("run/config", ""), "text") << reader;
  ASSERT_TRUE(read["texts"].contains("run/precision_plan")) << reader;
  const std::string plan = read["texts"]["run/precision_plan"][0][1].get<std::string>();
  EXPECT_EQ(read["texts"]["run/precision_plan"][0][0].get<std::int64_t>(), 0) << reader;
  for (const char* part :
       {"fp16-mixed", "scaler **dynamic**", "weight/gemm_in/act/act_grad", "fc1", "head", "fp16"})
    EXPECT_NE(plan.find(part), std::string::npos) << reader << ": " << part << " in\n" << plan;
  const std::string config = read["texts"]["run/config"][0][1].get<std::string>();
  EXPECT_NE(config.find("metrics = [\"jsonl\", \"tensorboard\", \"csv\"]"), std::string::npos)
      << config;
}

// One CSV line into fields (RFC 4180 quoting; the test's lines hold no line breaks).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      out.back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

void expect_csv_matches(const fs::path& csv, const std::vector<json>& records) {
  std::ifstream in(csv);
  std::string line;
  ASSERT_TRUE(std::getline(in, line)) << csv;
  const auto columns = csv_fields(line);
  EXPECT_EQ(columns.front(), "step");
  std::vector<json> rows_expected;
  for (const auto& r : records)
    if (r.contains("loss") || r.contains("eval_loss")) rows_expected.push_back(r);
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ASSERT_LT(n, rows_expected.size()) << "extra row: " << line;
    const json& r = rows_expected[n++];
    const auto fields = csv_fields(line);
    ASSERT_EQ(fields.size(), columns.size()) << line;
    for (std::size_t i = 0; i < columns.size(); ++i) {
      std::string want;
      const std::string& c = columns[i];
      if (c == "eval_top_k" && r.contains("eval_top5_accuracy"))
        want = "5";
      else if (c == "eval_top_k_accuracy" && r.contains("eval_top5_accuracy"))
        want = r["eval_top5_accuracy"].dump();
      else if (r.contains(c) && !r[c].is_null())
        want = r[c].is_string() ? r[c].get<std::string>() : r[c].dump();
      EXPECT_EQ(fields[i], want) << "column " << c << " of " << line;
    }
  }
  EXPECT_EQ(n, rows_expected.size());
}

class MetricsSinks : public CliTest {
 protected:
  // Both readers against metrics.jsonl; TensorBoard's own only where the peer imports.
  void expect_events_match(const fs::path& run_dir, const std::vector<json>& records,
                           bool check_plan) {
    const json offline = read_events_with_generated_classes(run_dir);
    expect_scalars_match(offline, records, "generated classes");
    if (check_plan) expect_plan_text(offline, "generated classes");
    if (!peers_import("tensorboard")) {
      std::cout << "[ NOTE ] "
                << peers_missing_message("tensorboard",
                                         "checked with the core's own protobuf classes only")
                << "\n";
      return;
    }
    const json tb = read_events_with_tensorboard(run_dir, dir_);
    expect_scalars_match(tb, records, "TensorBoard EventAccumulator");
    if (check_plan) expect_plan_text(tb, "TensorBoard EventAccumulator");
  }
};

TEST_F(MetricsSinks, EventFilesAndCsvHoldWhatMetricsJsonlHolds) {
  const fs::path run_dir = dir_ / "run";
  auto r = run("train " + quickstart() + kSmallRun + kAllSinks + " --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto recs = records(run_dir / "metrics.jsonl");
  ASSERT_FALSE(recs.empty());
  // Memory is in the step records themselves.
  for (const auto& rec : recs)
    if (rec.contains("loss")) {
      EXPECT_GT(rec.value("device_peak_memory_bytes", 0), 0) << rec.dump();
      EXPECT_GT(rec.value("host_peak_rss_bytes", 0), 0) << rec.dump();
    }
  ASSERT_EQ(event_files(run_dir).size(), 1u);
  expect_events_match(run_dir, recs, /*check_plan=*/true);
  expect_csv_matches(run_dir / "metrics.csv", recs);
}

TEST_F(MetricsSinks, ResumeInTheRunFolderDropsTheAbandonedSteps) {
  const fs::path run_dir = dir_ / "run";
  ASSERT_EQ(run("train " + quickstart() + kSmallRun + kAllSinks + " --run-dir " + run_dir.string())
                .exit_code,
            0);
  // The continuation stops at 30, short of the abandoned run's evaluation at 40: no reader may
  // show that one (TensorBoard's data server ignores session starts; runs/tensorboard_writer.h).
  auto r = run("train " + quickstart() + kSmallRun + kAllSinks + " --set run.steps=30 --resume " +
               (run_dir / "checkpoints" / "step-00000020.mxt").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto recs = records(run_dir / "metrics.jsonl");
  EXPECT_EQ(event_files(run_dir).size(), 2u);  // the resumed run adds its own file
  std::int64_t last_step = 0;
  for (const auto& file : event_files(run_dir)) {
    const std::string bytes = slurp(file);  // the records are views into it
    for (const auto record : core::tfrecord_records(bytes)) {
      tensorboard::Event e;
      ASSERT_TRUE(e.ParseFromArray(record.data(), static_cast<int>(record.size())));
      last_step = std::max<std::int64_t>(last_step, e.step());
    }
  }
  EXPECT_EQ(last_step, 30);
  expect_events_match(run_dir, recs, /*check_plan=*/false);
  expect_csv_matches(run_dir / "metrics.csv", recs);
  EXPECT_TRUE(fs::exists(run_dir / "metrics.discarded-after-step-20.csv"));
  // The first run's file, whole, is kept aside under a name TensorBoard does not load.
  const fs::path aside = run_dir / "tensorboard.discarded-after-step-20";
  ASSERT_TRUE(fs::is_directory(aside));
  std::int64_t aside_last = 0;
  for (const auto& f : fs::directory_iterator(aside)) {
    EXPECT_EQ(f.path().filename().string().find("tfevents"), std::string::npos) << f.path();
    const std::string bytes = slurp(f.path());
    for (const auto record : core::tfrecord_records(bytes)) {
      tensorboard::Event e;
      ASSERT_TRUE(e.ParseFromArray(record.data(), static_cast<int>(record.size())));
      aside_last = std::max<std::int64_t>(aside_last, e.step());
    }
  }
  EXPECT_EQ(aside_last, 40);
}

// The steps of an event file's events (the file-version record aside), in order.
std::vector<std::int64_t> event_steps(const fs::path& file) {
  const std::string bytes = slurp(file);
  std::vector<std::int64_t> out;
  for (const auto record : core::tfrecord_records(bytes)) {
    tensorboard::Event e;
    EXPECT_TRUE(e.ParseFromArray(record.data(), static_cast<int>(record.size())));
    if (!e.has_file_version()) out.push_back(e.step());
  }
  return out;
}

// A folder an earlier version resumed in place: file A holds steps 10..60, file B (a resume from
// 20) its session start at 21, then 30 and 40. Resuming it now from 30 drops what B's start had
// abandoned in A (21..60) and B's 40; both originals stay whole aside, out of TensorBoard's
// sight; a trimmed copy a killed resume left behind is removed; a second call finds nothing.
TEST(EventFiles, AResumeDropsEveryAbandonedStepAlsoOfAnEarlierResume) {
  const fs::path dir = fs::temp_directory_path() / ("mixtrain-events-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path a_path, b_path;
  {
    core::TensorBoardWriter a(dir);
    for (std::int64_t step : {10, 20, 30, 40, 50, 60})
      a.add_scalars(step, {{"train/loss", static_cast<float>(step)}});
    a_path = a.path();
  }
  {
    core::TensorBoardWriter b(dir);
    b.add_session_start(21);
    for (std::int64_t step : {30, 40}) b.add_scalars(step, {{"train/loss", 1.0f}});
    b_path = b.path();
  }
  std::ofstream(dir / ".events-trimmed.left-by-a-kill") << "half";
  const auto a_before = slurp(a_path), b_before = slurp(b_path);
  EXPECT_EQ(core::drop_events_after_step(dir, 30, dir / "aside"), 5);
  EXPECT_EQ(event_steps(a_path), (std::vector<std::int64_t>{10, 20}));
  EXPECT_EQ(event_steps(b_path), (std::vector<std::int64_t>{21, 30}));
  EXPECT_FALSE(fs::exists(dir / ".events-trimmed.left-by-a-kill"));
  std::multiset<std::string> kept;
  for (const auto& f : fs::directory_iterator(dir / "aside")) {
    EXPECT_EQ(f.path().filename().string().find("tfevents"), std::string::npos) << f.path();
    kept.insert(slurp(f.path()));
  }
  EXPECT_EQ(kept, (std::multiset<std::string>{a_before, b_before}));
  EXPECT_EQ(core::drop_events_after_step(dir, 30, dir / "aside-2"), 0);
  EXPECT_FALSE(fs::exists(dir / "aside-2"));
  fs::remove_all(dir);
}

// The text tags of an event file in order, as "step tag".
std::vector<std::string> event_texts(const fs::path& file) {
  const std::string bytes = slurp(file);
  std::vector<std::string> out;
  for (const auto record : core::tfrecord_records(bytes)) {
    tensorboard::Event e;
    EXPECT_TRUE(e.ParseFromArray(record.data(), static_cast<int>(record.size())));
    for (const auto& v : e.summary().value())
      if (v.has_tensor()) out.push_back(std::to_string(e.step()) + " " + v.tag());
  }
  return out;
}

// A continuation resumed from step 10 wrote its config and precision plan at step 10; resuming
// from 10 again drops them with its steps, where the new run writes its own. What the run that
// made the checkpoint wrote up to step 10, texts included, stays.
TEST(EventFiles, AResumeDropsTheRunTextsOfTheContinuationItReplaces) {
  const fs::path dir = fs::temp_directory_path() / ("mixtrain-texts-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::path a_path, b_path;
  {
    core::TensorBoardWriter a(dir);
    a.add_text(0, "run/config", "steps = 30");
    a.add_scalars(10, {{"train/loss", 1.0f}});
    a.add_text(10, "precision/escalation", "fc1 to fp32");
    a.add_scalars(20, {{"train/loss", 0.5f}});
    a_path = a.path();
  }
  {
    core::TensorBoardWriter b(dir);
    b.add_session_start(11);
    b.add_text(10, "run/config", "steps = 40");
    b.add_text(10, "run/precision_plan", "plan");
    b.add_scalars(20, {{"train/loss", 0.25f}});
    b_path = b.path();
  }
  EXPECT_EQ(core::drop_events_after_step(dir, 10, dir / "aside"), 5);
  EXPECT_EQ(event_texts(a_path),
            (std::vector<std::string>{"0 run/config", "10 precision/escalation"}));
  EXPECT_EQ(event_steps(a_path), (std::vector<std::int64_t>{0, 10, 10}));
  EXPECT_TRUE(event_steps(b_path).empty());
  fs::remove_all(dir);
}

// The reader of the event files keeps every whole record and stops at a torn or corrupt one.
TEST(TfRecord, RecordsStopAtATornOrCorruptRecord) {
  const std::string a = core::tfrecord_frame("first"), b = core::tfrecord_frame("second record");
  auto texts = [](const std::string& bytes) {
    std::vector<std::string> out;
    for (const auto r : core::tfrecord_records(bytes)) out.emplace_back(r);
    return out;
  };
  EXPECT_EQ(texts(a + b), (std::vector<std::string>{"first", "second record"}));
  EXPECT_EQ(texts(a + b.substr(0, b.size() - 1)), (std::vector<std::string>{"first"}));
  EXPECT_EQ(texts(a + b.substr(0, 5)), (std::vector<std::string>{"first"}));
  std::string flipped = a + b;
  flipped[a.size() + 14] ^= 0x20;  // a byte of the second record's data
  EXPECT_EQ(texts(flipped), (std::vector<std::string>{"first"}));
  flipped = a + b;
  flipped[a.size() + 3] ^= 0x01;  // its length: the length CRC no longer matches
  EXPECT_EQ(texts(flipped), (std::vector<std::string>{"first"}));
  EXPECT_TRUE(texts("").empty());
}

TEST_F(MetricsSinks, DefaultWritesMetricsJsonlOnly) {
  const fs::path run_dir = dir_ / "run";
  ASSERT_EQ(
      run("train " + quickstart() + " --set run.steps=5 --run-dir " + run_dir.string()).exit_code,
      0);
  EXPECT_TRUE(fs::exists(run_dir / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(run_dir / "metrics.csv"));
  EXPECT_TRUE(event_files(run_dir).empty());
}

TEST_F(MetricsSinks, UnknownSinkNamesItsEntryAndTheNearestName) {
  const auto cfg =
      write_file("bad.toml", "[run]\nsteps = 5\nmetrics = [\"jsonl\", \"tensorbord\"]\n");
  auto r = run("train " + cfg.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("bad.toml:3:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("run.metrics"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'tensorboard'?"), std::string::npos) << r.err;

  auto s = run("train " + quickstart() + " --set run.metrics=csvv");
  EXPECT_EQ(s.exit_code, 2) << s.err;
  EXPECT_NE(s.err.find("did you mean 'csv'?"), std::string::npos) << s.err;
  auto n = run("train " + quickstart() + " --set run.metrics=7");
  EXPECT_EQ(n.exit_code, 2);
  EXPECT_NE(n.err.find("'run.metrics': expected an array of strings"), std::string::npos) << n.err;
}

TEST_F(MetricsSinks, DescribeListsTheSinks) {
  auto r = run("plugins --describe host/run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("metrics"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("jsonl, tensorboard, csv"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace mixtrain::test
