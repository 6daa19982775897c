// Resume trusts no counter: a native checkpoint edited with a correct CRC (so the edit reaches the
// JSON) whose progress, sampler, scaler, optimizer or policy counter is out of range, mistyped or
// wrapped makes `train --resume` exit 2 naming the field and the file. Also: the newest
// checkpoint and keep-pruning go by step number, and stale temp files of killed saves are removed
// while a live writer's are kept. Through the real executable.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <thread>

#include "cli_test_support.h"
#include "native_file_layout.h"

namespace mixtrain::test {
namespace {

namespace ckpt = mixtrain::checkpoint_native;
constexpr auto kInt64Max = std::numeric_limits<std::int64_t>::max();

std::uint32_t zlib_crc(const std::string& s) {
  return static_cast<std::uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(s.data()), s.size()));
}

// Copies native checkpoint `in` to `out` with its metadata passed through `edit` (values are JSON
// texts, as the trainer writes them), re-encoding the header with a correct CRC.
void rewrite_checkpoint(const fs::path& in, const fs::path& out,
                        const std::function<void(json& metadata)>& edit) {
  const std::string bytes = slurp(in);
  ASSERT_GT(bytes.size(), ckpt::kPreambleSize);
  const auto pre = ckpt::decode_preamble(reinterpret_cast<const std::byte*>(bytes.data()));
  auto header = json::parse(bytes.substr(ckpt::kPreambleSize, pre.header_length));
  const std::string data = bytes.substr(ckpt::data_section_offset(pre.header_length));
  edit(header["metadata"]);
  const std::string text = header.dump();
  ckpt::Preamble p = pre;
  p.header_length = text.size();
  p.header_crc32 = zlib_crc(text);
  const auto encoded = ckpt::encode_preamble(p);
  std::string file(reinterpret_cast<const char*>(encoded.data()), encoded.size());
  file += text;
  file.resize(ckpt::data_section_offset(text.size()), '\0');
  file += data;
  std::ofstream(out, std::ios::binary | std::ios::trunc) << file;
}

// Edits one metadata entry that holds a JSON object text ("progress", "sampler", "scaler", ...).
std::function<void(json&)> entry(const std::string& key, std::function<void(json&)> edit) {
  return [key, edit](json& metadata) {
    auto j = json::parse(metadata.at(key).get<std::string>());
    edit(j);
    metadata[key] = j.dump();
  };
}

class CheckpointCounters : public CliTest {
 protected:
  // Quickstart with a dynamic loss scaler, 4 steps, a checkpoint at step 2 and 4.
  const std::string common_ =
      " --set run.steps=4 --set run.log_every=1 --set checkpoint.every=2 --set scaler.type=dynamic";

  fs::path base_checkpoint(const std::string& extra = "") {
    const auto run_dir = dir_ / "base";
    auto r = run("train " + quickstart() + common_ + extra + " --run-dir " + run_dir.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return run_dir / "checkpoints" / "step-00000002.mxt";
  }

  // Resumes from `base` edited by `edit`; returns the result.
  CliResult resume_edited(const fs::path& base, const std::string& name,
                          const std::function<void(json&)>& edit, const std::string& extra = "") {
    const auto edited = dir_ / (name + ".mxt");
    rewrite_checkpoint(base, edited, edit);
    return run("train " + quickstart() + common_ + extra + " --resume " + edited.string() +
               " --run-dir " + (dir_ / ("run-" + name)).string());
  }

  void expect_rejected(const CliResult& r, const std::string& name, const std::string& field) {
    EXPECT_EQ(r.exit_code, 2) << name << ": " << r.err;
    EXPECT_NE(r.err.find("error:"), std::string::npos) << name << ": " << r.err;
    EXPECT_NE(r.err.find(name + ".mxt"), std::string::npos) << name << ": " << r.err;
    EXPECT_NE(r.err.find(field), std::string::npos) << name << ": " << r.err;
  }
};

struct Case {
  std::string name;
  std::function<void(json&)> edit;
  std::string field;  // the message names it
};

TEST_F(CheckpointCounters, ARewrittenButUneditedCheckpointResumes) {
  // The control for every case below: the rewrite alone is accepted.
  const auto base = base_checkpoint();
  auto r = resume_edited(base, "same", [](json&) {});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("at step 2"), std::string::npos) << r.err;
}

TEST_F(CheckpointCounters, EveryOutOfRangeCounterExits2NamingTheField) {
  const auto base = base_checkpoint();
  const std::uint64_t wrap = std::numeric_limits<std::uint64_t>::max();  // 2^64-1 reads as -1
  auto values = [](const char* key, json v) { return [key, v](json& j) { j["values"][key] = v; }; };
  const std::vector<Case> cases = {
      {"step-negative", entry("progress", [](json& j) { j["step"] = -1000000000000LL; }),
       "progress.step"},
      {"step-wraps", entry("progress", [&](json& j) { j["step"] = wrap; }), "progress.step"},
      {"step-float", entry("progress", [](json& j) { j["step"] = 1.5; }), "progress.step"},
      {"step-string", entry("progress", [](json& j) { j["step"] = "2"; }), "progress.step"},
      {"step-beyond-run", entry("progress", [](json& j) { j["step"] = 5; }), "run.steps"},
      {"applied-negative", entry("progress", [](json& j) { j["applied_steps"] = -1; }),
       "progress.applied_steps"},
      {"applied-beyond-step", entry("progress", [](json& j) { j["applied_steps"] = 3; }),
       "progress.applied_steps"},
      {"skipped-mismatch", entry("progress", [](json& j) { j["skipped_steps"] = 1; }),
       "progress.skipped_steps"},
      {"skipped-int-max", entry("progress", [](json& j) { j["skipped_steps"] = kInt64Max; }),
       "progress.skipped_steps"},
      {"last-loss-overflows-float", entry("progress", [](json& j) { j["last_loss"] = 1e300; }),
       "progress.last_loss"},
      {"epoch-int-max", entry("sampler", [](json& j) { j["epoch"] = kInt64Max; }), "sampler.epoch"},
      {"epoch-negative", entry("sampler", [](json& j) { j["epoch"] = -1; }), "sampler.epoch"},
      {"epoch-beyond-step", entry("sampler", [](json& j) { j["epoch"] = 3; }), "sampler.epoch"},
      {"position-negative", entry("sampler", [](json& j) { j["position"] = -1; }),
       "sampler.position"},
      {"position-beyond-epoch", entry("sampler", [](json& j) { j["position"] = 1000000; }),
       "sampler.position"},
      // In range, but not where two steps leave the cursor (epoch 0, batch 2).
      {"cursor-not-from-step", entry("sampler", [](json& j) { j["position"] = 0; }),
       "do not follow from progress.step = 2"},
      {"scaler-steps-negative", entry("scaler", values("steps", {{"int", -1}})), "'steps'"},
      {"scaler-steps-wraps", entry("scaler", values("steps", {{"int", wrap}})), "'steps'"},
      {"scaler-skipped-beyond-steps",
       entry("scaler", values("skipped_steps", {{"int", kInt64Max}})), "'skipped_steps'"},
      {"scaler-growth-tracker", entry("scaler", values("growth_tracker", {{"int", -1}})),
       "'growth_tracker'"},
      {"scaler-hysteresis", entry("scaler", values("hysteresis_left", {{"int", 0}})),
       "'hysteresis_left'"},
      {"scaler-growth-tracker-beyond-steps",
       entry("scaler", values("growth_tracker", {{"int", kInt64Max}})), "'growth_tracker'"},
      {"scaler-hysteresis-beyond-budget",
       entry("scaler", values("hysteresis_left", {{"int", kInt64Max}})), "'hysteresis_left'"},
      {"scaler-scale-overflows-float", entry("scaler", values("scale", {{"double", 1e300}})),
       "'scale'"},
      {"scaler-int-as-float", entry("scaler", values("steps", {{"int", 2.5}})), "'steps'"},
      {"scaler-version", entry("scaler", [](json& j) { j["version"] = kInt64Max; }), "version"},
      {"optimizer-step-negative", entry("optimizer", values("step", {{"int", -1}})), "'step'"},
      {"optimizer-step-int-max", entry("optimizer", values("step", {{"int", kInt64Max}})),
       "'step'"},
      {"optimizer-step-wraps", entry("optimizer", values("step", {{"int", wrap}})), "'step'"},
      // In range for the component, but not the run's own count.
      {"scaler-steps-not-the-runs", entry("scaler", values("steps", {{"int", kInt64Max}})),
       "progress.step"},
      {"scaler-skipped-not-the-runs", entry("scaler", values("skipped_steps", {{"int", 1}})),
       "progress.skipped_steps"},
      {"optimizer-step-not-the-runs", entry("optimizer", values("step", {{"int", kInt64Max - 1}})),
       "progress.applied_steps"},
      {"state-version-2", [](json& m) { m["mixtrain.state_version"] = "2"; },
       "mixtrain.state_version"},
      {"state-version-missing", [](json& m) { m.erase("mixtrain.state_version"); },
       "mixtrain.state_version"},
  };
  for (const auto& c : cases) expect_rejected(resume_edited(base, c.name, c.edit), c.name, c.field);
}

TEST_F(CheckpointCounters, Fp8PolicyCountersAndHistoriesOutOfRangeExit2) {
  const std::string fp8 = " --set precision.policy=fp8-delayed --set precision.amax_history_len=4";
  const auto base = base_checkpoint(fp8);
  auto policy_value = [](const char* key, json v) {
    return entry("policy", [key, v](json& j) { j["values"][key] = v; });
  };
  const std::vector<Case> cases = {
      {"fp8-applied-negative", policy_value("applied_steps", {{"int", -1}}), "'applied_steps'"},
      {"fp8-applied-not-the-runs", policy_value("applied_steps", {{"int", 7}}),
       "progress.applied_steps"},
      {"fp8-history-len", policy_value("amax_history_len", {{"int", 0}}), "'amax_history_len'"},
      {"fp8-history-short", policy_value("slot.0.amax_history", {{"floats", {1.0}}}),
       "slot.0.amax_history"},
      {"fp8-history-overflows-float",
       policy_value("slot.0.amax_history", {{"floats", {1e300, 0, 0, 0}}}), "slot.0.amax_history"},
      {"fp8-position", policy_value("slot.0.position", {{"int", 4}}), "slot.0.position"},
  };
  // The control: unedited, it resumes.
  auto ok = resume_edited(
      base, "fp8-same", [](json&) {}, fp8);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  for (const auto& c : cases)
    expect_rejected(resume_edited(base, c.name, c.edit, fp8), c.name, c.field);
}

// A checkpoint written before FP8 slots were per GEMM (policy state version 1, slots
// "<layer>.<role>") resumes with each slot renamed "<layer>.matmul.<role>" and continues exactly
// as the uninterrupted run; a policy state version from the future is refused, named.
TEST_F(CheckpointCounters, Fp8StateOfVersion1ResumesWithItsSlotsRenamed) {
  const std::string fp8 = " --set precision.policy=fp8-delayed --set precision.amax_history_len=4";
  const auto base = base_checkpoint(fp8);
  auto as_version_1 = entry("policy", [](json& j) {
    ASSERT_EQ(j["version"], 2);
    j["version"] = 1;
    for (auto& [key, value] : j["values"].items())
      if (key.ends_with(".name")) {
        auto name = value["string"].get<std::string>();
        const auto at = name.find(".matmul.");
        ASSERT_NE(at, std::string::npos) << name;
        value["string"] = name.erase(at, std::string(".matmul").size());
      }
  });
  auto r = resume_edited(base, "fp8-v1", as_version_1, fp8);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // quickstart's FP8 linears fc1 and fc2 (head, the logits node, computes in bf16): three roles
  // each.
  EXPECT_NE(r.err.find("state has version 1, which named scaling slots \"<layer>.<role>\"; "
                       "renamed its 6 slots to \"<layer>.matmul.<role>\""),
            std::string::npos)
      << r.err;
  std::map<int, double> uninterrupted;
  for (const auto& j : records(dir_ / "base" / "metrics.jsonl"))
    if (j.contains("loss")) uninterrupted[j["step"].get<int>()] = j["loss"].get<double>();
  int compared = 0;
  for (const auto& j : records(dir_ / "run-fp8-v1" / "metrics.jsonl"))
    if (j.contains("loss")) {
      EXPECT_EQ(j["loss"].get<double>(), uninterrupted.at(j["step"].get<int>()))
          << "step " << j["step"];
      ++compared;
    }
  EXPECT_EQ(compared, 2);

  auto future =
      resume_edited(base, "fp8-v3", entry("policy", [](json& j) { j["version"] = 3; }), fp8);
  expect_rejected(future, "fp8-v3", "state has version 3, this build reads 1..2");
}

TEST_F(CheckpointCounters, NewestCheckpointAndKeepPruningGoByStepNumber) {
  // step-999999999 sorts after step-1000000000 by name; by number it is the older one.
  const auto base = base_checkpoint();
  const auto run_dir = dir_ / "big";
  const auto folder = run_dir / "checkpoints";
  fs::create_directories(folder);
  for (std::int64_t step : {999999999LL, 1000000000LL})
    rewrite_checkpoint(base, folder / ("step-" + std::to_string(step) + ".mxt"), [&](json& m) {
      entry("progress", [&](json& j) {
        j["step"] = step;
        j["applied_steps"] = step;
        j["skipped_steps"] = 0;
      })(m);
      entry("scaler", [&](json& j) { j["values"]["steps"] = {{"int", step}}; })(m);
      entry("optimizer", [&](json& j) { j["values"]["step"] = {{"int", step}}; })(m);
      // The cursor follows from the step: quickstart trains on 8192 - 819 held-out rows, in 57
      // batches of 128 per epoch.
      constexpr std::int64_t kBatchesPerEpoch = 57;
      entry("sampler", [&](json& j) {
        j["epoch"] = (step - 1) / kBatchesPerEpoch;
        j["position"] = (step - 1) % kBatchesPerEpoch + 1;
      })(m);
    });
  // One more step: the newest by number (1000000000) is resumed, and keep = 1 prunes by number.
  auto r = run("train " + quickstart() + common_ +
               " --set run.steps=1000000001 --set checkpoint.keep=1 --resume " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("at step 1000000000"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(folder / "step-1000000001.mxt"));
  EXPECT_FALSE(fs::exists(folder / "step-1000000000.mxt"));
  EXPECT_FALSE(fs::exists(folder / "step-999999999.mxt"));
}

TEST_F(CheckpointCounters, AMetricsRecordWithAMistypedStepDoesNotStopAResume) {
  // Resuming inside the run folder splits metrics.jsonl at the checkpoint's step.
  const auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() + common_ + " --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ofstream(run_dir / "metrics.jsonl", std::ios::app)
      << "{\"step\": \"7\"}\n{\"step\": 1e300}\n{\"step\": 18446744073709551615}\n[1]\n";
  auto r2 = run("train " + quickstart() + common_ + " --resume " +
                (run_dir / "checkpoints" / "step-00000002.mxt").string());
  EXPECT_EQ(r2.exit_code, 0) << r2.err;
  const auto side = slurp(run_dir / "metrics.discarded-after-step-2.jsonl");
  EXPECT_NE(side.find("18446744073709551615"), std::string::npos) << side;
}

// A child that holds an exclusive flock on `path` until killed, as a live writer does.
pid_t hold_lock(const fs::path& path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
    for (;;) ::pause();
  }
  // Wait until the child holds it: our own attempt fails with EWOULDBLOCK.
  for (int i = 0; i < 1000; ++i) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    const bool held = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    if (fd >= 0) ::close(fd);  // also drops our lock when we got it
    if (held) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "the child never locked " << path;
  return pid;
}

TEST_F(CheckpointCounters, StaleTempFilesAreRemovedAndALiveWritersAreKept) {
  const auto run_dir = dir_ / "run";
  auto r = run("train " + quickstart() + common_ + " --run-dir " + run_dir.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto folder = run_dir / "checkpoints";
  // What a save killed with -9 leaves: nobody holds its lock.
  const auto stale = folder / ".step-00000004.mxt.tmp.4194303.0";
  std::ofstream(stale) << "half a checkpoint";
  // A save in progress in another process.
  const auto live = folder / ".step-00000006.mxt.tmp.1.0";
  const pid_t writer = hold_lock(live);
  // Not a temp file of ours.
  const auto other = folder / ".notes.tmp.txt";
  std::ofstream(other) << "keep me";

  auto r2 = run("train " + quickstart() + common_ + " --set run.steps=6 --resume " +
                (folder / "step-00000004.mxt").string());
  ::kill(writer, SIGKILL);
  ::waitpid(writer, nullptr, 0);
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_FALSE(fs::exists(stale)) << r2.err;
  EXPECT_NE(r2.err.find(stale.filename().string()), std::string::npos) << r2.err;
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(folder / "step-00000006.mxt"));
}

}  // namespace
}  // namespace mixtrain::test
