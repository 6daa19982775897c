// Integration: how a training run ends and what it tells the person watching, through the real
// executable — divergence (exit 3, "diverged" in summary.json, on_nonfinite = "stop"), Ctrl-C
// (a clean stop with exit 128 + the signal, a checkpoint that --resume continues; a second Ctrl-C
// quits at once), progress output on a terminal (a pseudo-terminal) and piped, and the one-line
// gradient-underflow log.
#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "cli_test_support.h"
#include "spawned_process.h"

namespace mixtrain::test {
namespace {

using RunControl = CliTest;
using namespace std::chrono_literals;

// Why no pseudo-terminal pair can be opened (openpty's error), or nullopt when one can.
std::optional<std::string> pseudo_terminal_unavailable() {
  int master = -1, slave = -1;
  if (::openpty(&master, &slave, nullptr, nullptr, nullptr) != 0)
    return std::string("openpty: ") + std::strerror(errno);
  ::close(master);
  ::close(slave);
  return std::nullopt;
}

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}

// --- Divergence ---------------------------------------------------------------------------------

// The largest lr the schema allows, at once (no warm-up), in fp16 without a loss scaler: the first
// applied step moves every weight by ~10, the next forward pass overflows fp16 and the loss is NaN
// from then on.
const std::string kDiverge =
    " --set optimizer.lr=10 --set optimizer.schedule=constant --set precision.policy=fp16-mixed";

TEST_F(RunControl, ADivergedRunExitsWith3AndItsSummarySaysDiverged) {
  const std::string common = " --set run.steps=6 --set run.log_every=1 --set run.eval_every=0";
  auto bad = dir_ / "bad";
  auto r = run("train " + quickstart() + common + kDiverge + " --run-dir " + bad.string());
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("the run diverged"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("HINT"), std::string::npos) << r.err;
  // Without a scaler, the hint names the dynamic one and what the run had.
  EXPECT_NE(r.err.find("use a dynamic loss scaler (scaler.type = \"dynamic\"; this run's is "
                       "\"none\")"),
            std::string::npos)
      << r.err;
  auto s = summary(bad);
  EXPECT_TRUE(s["diverged"].get<bool>()) << s.dump();
  EXPECT_FALSE(s["interrupted"].get<bool>());
  EXPECT_NE(s["divergence"].get<std::string>().find("not finite"), std::string::npos) << s.dump();
  EXPECT_GT(s["skipped_steps"].get<int>(), 0);

  // The same run with a sane learning rate is not diverged and exits 0.
  auto good = dir_ / "good";
  auto r2 = run("train " + quickstart() + common + " --run-dir " + good.string());
  EXPECT_EQ(r2.exit_code, 0) << r2.err;
  auto g = summary(good);
  EXPECT_FALSE(g["diverged"].get<bool>()) << g.dump();
  EXPECT_FALSE(g["interrupted"].get<bool>());
  EXPECT_FALSE(g.contains("divergence"));
}

TEST_F(RunControl, EverySkippedStepIsADivergence) {
  // A loss scale of 2^100 overflows fp16 activation gradients on every step, and the loss itself
  // stays finite: only the skip count tells.
  auto d = dir_ / "run";
  auto r = run("train " + quickstart() +
               " --set precision.policy=fp16-mixed --set scaler.type=dynamic"
               " --set scaler.init_scale=1.2676506002282294e30 --set run.steps=3"
               " --set run.eval_every=0 --run-dir " +
               d.string());
  EXPECT_EQ(r.exit_code, 3) << r.err;
  auto s = summary(d);
  EXPECT_EQ(s["applied_steps"].get<int>(), 0);
  EXPECT_TRUE(s["diverged"].get<bool>());
  EXPECT_NE(s["divergence"].get<std::string>().find("skipped"), std::string::npos) << s.dump();
}

TEST_F(RunControl, OnNonfiniteStopIsADivergenceNotAnInternalError) {
  auto d = dir_ / "run";
  auto r = run("train " + quickstart() + kDiverge +
               " --set run.on_nonfinite=stop --set run.steps=50"
               " --set run.eval_every=0 --set checkpoint.every=0 --run-dir " +
               d.string());
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("on_nonfinite"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("not finite"), std::string::npos) << r.err;
  auto s = summary(d);
  EXPECT_TRUE(s["diverged"].get<bool>());
  const auto steps = s["steps"].get<std::int64_t>();
  EXPECT_LT(steps, 50) << "it stopped at the first non-finite loss";
  char name[64];
  std::snprintf(name, sizeof name, "step-%08lld.mxt", static_cast<long long>(steps));
  EXPECT_TRUE(fs::exists(d / "checkpoints" / name)) << "the stopped run keeps its state";
}

// --- Ctrl-C -------------------------------------------------------------------------------------

// The quickstart (its config path) with far more steps than a test waits for, into `run`, started
// and past its first metrics record (so a signal lands in the training loop); its output in out.txt
// and err.txt.
std::unique_ptr<Spawned> start_endless_run(const std::string& quickstart, const fs::path& dir,
                                           const fs::path& run) {
  auto p = std::make_unique<Spawned>("train " + quickstart +
                                         " --set run.steps=10000000 --set run.log_every=1"
                                         " --set run.eval_every=0 --set checkpoint.every=0"
                                         " --run-dir " +
                                         run.string(),
                                     dir / "out.txt", dir / "err.txt");
  EXPECT_GT(p->pid(), 0);
  EXPECT_TRUE(eventually([&] { return !slurp(run / "metrics.jsonl").empty(); }, 120s))
      << "no metrics record appeared: " << slurp(dir / "err.txt");
  return p;
}

// Waits for a run that `signal` asked to stop: it must exit by itself (a clean stop, not killed by
// the signal), with 128 + the signal, as a shell reports a process that signal ended.
void expect_clean_stop(Spawned& p, int signal, const fs::path& err) {
  const auto status = p.wait(120s);
  ASSERT_TRUE(status.has_value()) << "still running after signal " << signal;
  ASSERT_TRUE(WIFEXITED(*status)) << "ended by a signal, not by a clean stop";
  EXPECT_EQ(WEXITSTATUS(*status), 128 + signal) << slurp(err);
}

TEST_F(RunControl, CtrlCStopsCleanlyWritesACheckpointAndResumeContinues) {
  auto d = dir_ / "run";
  const auto p = start_endless_run(quickstart(), dir_, d);
  ASSERT_FALSE(HasFailure());
  p->signal(SIGINT);
  expect_clean_stop(*p, SIGINT, dir_ / "err.txt");
  ASSERT_FALSE(HasFailure());

  auto s = summary(d);
  EXPECT_TRUE(s["interrupted"].get<bool>()) << s.dump();
  EXPECT_FALSE(s["diverged"].get<bool>());
  const auto stopped_at = s["steps"].get<std::int64_t>();
  EXPECT_GE(stopped_at, 1);
  EXPECT_LT(stopped_at, 10000000);
  char name[64];
  std::snprintf(name, sizeof name, "step-%08lld.mxt", static_cast<long long>(stopped_at));
  EXPECT_TRUE(fs::exists(d / "checkpoints" / name)) << "no checkpoint for step " << stopped_at;
  // The step it stopped at was logged.
  auto recs = records(d / "metrics.jsonl");
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.back()["step"].get<std::int64_t>(), stopped_at);
  EXPECT_NE(slurp(dir_ / "out.txt").find("interrupted"), std::string::npos);

  // --resume continues from that checkpoint, in the same folder, to a nearer end.
  auto r = run("train " + quickstart() + " --set run.steps=" + std::to_string(stopped_at + 3) +
               " --set run.log_every=1 --set run.eval_every=0 --set checkpoint.every=0"
               " --resume " +
               (d / "checkpoints").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("at step " + std::to_string(stopped_at)), std::string::npos) << r.err;
  auto resumed = summary(d);
  EXPECT_EQ(resumed["steps"].get<std::int64_t>(), stopped_at + 3);
  EXPECT_FALSE(resumed["interrupted"].get<bool>());
  EXPECT_NE(resumed["resumed_from"].get<std::string>().find(name), std::string::npos);
  std::vector<std::int64_t> steps;
  for (const auto& j : records(d / "metrics.jsonl"))
    if (j.contains("loss")) steps.push_back(j["step"].get<std::int64_t>());
  ASSERT_GE(steps.size(), 4u);
  EXPECT_EQ(steps[steps.size() - 4], stopped_at);
  EXPECT_EQ(steps.back(), stopped_at + 3);
}

// A run whose checkpoint format keeps the weights only (safetensors) is told so once, when it
// starts, and its Ctrl-C offers what works for such a checkpoint: a new run from its weights (it
// offered a --resume, which refuses a weights-only file).
TEST_F(RunControl, CtrlCOfAWeightsOnlyRunOffersANewRunFromItsWeights) {
  auto d = dir_ / "run";
  const auto p = start_endless_run(quickstart() + " --set checkpoint.format=safetensors", dir_, d);
  ASSERT_FALSE(HasFailure());
  p->signal(SIGINT);
  expect_clean_stop(*p, SIGINT, dir_ / "err.txt");
  ASSERT_FALSE(HasFailure());
  const std::string said = slurp(dir_ / "out.txt") + slurp(dir_ / "err.txt");
  EXPECT_EQ(lines_with(said, "keeps the weights only").size(), 1u) << said;
  const auto interrupted = lines_with(said, "interrupted after step");
  ASSERT_EQ(interrupted.size(), 1u) << said;
  EXPECT_FALSE(has(interrupted[0], "--resume")) << interrupted[0];
  // The command it gives, run as written (with fewer steps than the run's ten million, and a
  // folder of the test's), starts from the checkpoint's weights.
  const std::string marker = "mixtrain train ";
  const auto at = interrupted[0].find(marker);
  ASSERT_NE(at, std::string::npos) << interrupted[0];
  const auto r =
      run(interrupted[0].substr(at + std::string("mixtrain ").size()) +
          " --set run.steps=2 --set run.eval_every=0 --run-dir " + (dir_ / "new").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "initial weights loaded from " + (d / "checkpoints").string())) << r.err;
}

// A scheduler's SIGTERM stops the run as Ctrl-C does; the exit status names the signal (143), as
// a shell reports a process SIGTERM ended, and summary.json says it was a clean stop.
TEST_F(RunControl, SigtermStopsCleanlyAndExitsWith143) {
  auto d = dir_ / "run";
  const auto p = start_endless_run(quickstart(), dir_, d);
  ASSERT_FALSE(HasFailure());
  p->signal(SIGTERM);
  expect_clean_stop(*p, SIGTERM, dir_ / "err.txt");
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(summary(d)["interrupted"].get<bool>());
}

// A closed terminal (SIGHUP) stops the run as Ctrl-C does, with its checkpoint and summary; a
// hang-up comes twice (shell and kernel), and the second must not cut the stop short.
TEST_F(RunControl, AClosedTerminalStopsCleanlyLikeCtrlC) {
  struct sigaction inherited {};
  sigaction(SIGHUP, nullptr, &inherited);
  if (inherited.sa_handler == SIG_IGN)
    GTEST_SKIP() << "SIGHUP is ignored here (nohup), and the run keeps ignoring it";
  auto d = dir_ / "run";
  const auto p = start_endless_run(quickstart(), dir_, d);
  ASSERT_FALSE(HasFailure());
  p->signal(SIGHUP);
  ASSERT_TRUE(eventually(
      [&] { return slurp(dir_ / "err.txt").find("interrupted:") != std::string::npos; }, 60s));
  p->signal(SIGHUP);
  expect_clean_stop(*p, SIGHUP, dir_ / "err.txt");
  ASSERT_FALSE(HasFailure());
  auto s = summary(d);
  EXPECT_TRUE(s["interrupted"].get<bool>()) << s.dump();
  char name[64];
  std::snprintf(name, sizeof name, "step-%08lld.mxt",
                static_cast<long long>(s["steps"].get<std::int64_t>()));
  EXPECT_TRUE(fs::exists(d / "checkpoints" / name)) << name;
}

TEST_F(RunControl, ASecondCtrlCQuitsAtOnce) {
  // Slow steps (a 4M-parameter MLP, batch 2048, one thread), so the second signal arrives while
  // the step the first one let finish is still running.
  auto d = dir_ / "run";
  Spawned p("train " + quickstart() +
                " --set run.steps=1000 --set run.log_every=1 --set run.eval_every=0"
                " --set backend.threads=1 --set data.batch_size=2048"
                " --set model.layers.0.out=2048 --set model.layers.2.out=2048 --run-dir " +
                d.string(),
            dir_ / "out.txt", dir_ / "err.txt");
  ASSERT_TRUE(eventually([&] { return !slurp(d / "metrics.jsonl").empty(); }, 120s))
      << slurp(dir_ / "err.txt");
  p.signal(SIGINT);
  // The handler announces the clean stop once it has restored the default disposition.
  ASSERT_TRUE(eventually(
      [&] { return slurp(dir_ / "err.txt").find("interrupted:") != std::string::npos; }, 60s));
  p.signal(SIGINT);
  auto status = p.wait(60s);
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFSIGNALED(*status))
      << "exited with " << WEXITSTATUS(*status) << " instead of dying by the second SIGINT";
  EXPECT_EQ(WTERMSIG(*status), SIGINT);
  EXPECT_FALSE(fs::exists(d / "summary.json")) << "it quit without the clean stop's outputs";
}

// --- Progress output ----------------------------------------------------------------------------

TEST_F(RunControl, PipedOutputShowsElapsedTimeAndEta) {
  auto r = run("train " + quickstart() + " --set run.steps=20 --set run.log_every=5 --run-dir " +
               (dir_ / "run").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto step_lines = lines_with(r.err, "step 5/20");
  ASSERT_EQ(step_lines.size(), 1u) << r.err;
  EXPECT_NE(step_lines[0].find("elapsed"), std::string::npos) << step_lines[0];
  EXPECT_NE(step_lines[0].find("ETA"), std::string::npos) << step_lines[0];
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "no live-line redraws when piped";
}

TEST_F(RunControl, OnATerminalLogLinesNeverLandOnTheProgressLine) {
  // The real executable on a pseudo-terminal; evaluations log while the live line is shown.
  const auto run_dir = dir_ / "run";
  const std::string args = "train " + quickstart() +
                           " --set run.steps=300 --set run.eval_every=20 --run-dir " +
                           run_dir.string();
  // A minimal chroot or container may have no /dev/pts: nothing to test there, and no failure.
  if (const auto why = pseudo_terminal_unavailable())
    GTEST_SKIP() << "no pseudo-terminal can be opened here (" << *why
                 << "), so the live progress line cannot be shown; mount devpts to run this test";
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0) << "forkpty: " << std::strerror(errno);
  if (pid == 0) exec_mixtrain(args);
  std::string screen;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n > 0) {
      screen.append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EIO: the child closed the terminal
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << screen;

  // What each screen line ends up holding: split at newlines and at "erase line" redraws.
  std::vector<std::string> pieces;
  std::string cur;
  for (std::size_t i = 0; i < screen.size(); ++i) {
    if (screen[i] == '\n' || screen.compare(i, 4, "\r\033[K") == 0) {
      pieces.push_back(cur);
      cur.clear();
      if (screen[i] != '\n') i += 3;
      continue;
    }
    cur += screen[i];
  }
  pieces.push_back(cur);
  int live = 0, evals = 0;
  for (const auto& p : pieces) {
    const bool is_live =
        p.find("samples/s") != std::string::npos && p.find("ETA") != std::string::npos;
    const bool is_eval_log = p.find("eval at step") != std::string::npos;
    live += is_live;
    evals += is_eval_log;
    EXPECT_FALSE(is_live && is_eval_log) << "a log line printed onto the progress line: " << p;
  }
  EXPECT_GT(live, 0) << "no live progress line on a terminal:\n" << screen;
  EXPECT_EQ(evals, 15) << screen;
}

// --- Gradient underflow log ---------------------------------------------------------------------

// Writes a float32 or int32 .npy file.
void write_npy(const fs::path& p, const std::string& descr, std::int64_t rows, std::int64_t cols,
               const void* data, std::size_t bytes) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows) + (cols > 0 ? ", " + std::to_string(cols) : ",") +
                       "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(p, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<std::uint16_t>(header.size());
  const char le[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(le, 2);
  out << header;
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

// x.npy (`x`, rows × features float32) and y.npy (labels i % 4) in `dir`.
void write_four_class_rows(const fs::path& dir, const std::vector<float>& x, std::int64_t rows,
                           std::int64_t features) {
  std::vector<std::int32_t> y(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i)
    y[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % 4);
  write_npy(dir / "x.npy", "<f4", rows, features, x.data(),
            static_cast<std::size_t>(rows * features) * sizeof(float));
  write_npy(dir / "y.npy", "<i4", rows, 0, y.data(), y.size() * sizeof(std::int32_t));
}

// A skipped step's replay draws each micro-batch's own dropout masks: one input element of 4e4,
// doubled by dropout's 1 / (1 - p), overflows fp16 only where micro-batch 0's mask keeps it. The
// replay must keep it too and name the dropout, whatever the seed (with micro-batch 1's masks it
// found nothing for about half of them).
TEST_F(RunControl, AReplayWithAccumulationDrawsEachMicroBatchsMasks) {
  const std::int64_t rows = 64, features = 8;
  std::vector<float> x(static_cast<std::size_t>(rows * features), 0.5f);
  x[0] = 4e4f;
  write_four_class_rows(dir_, x, rows, features);
  auto cfg = write_file("drop.toml", R"(
[run]
name = "drop"
steps = 1
eval_every = 0
accumulate = 2
[backend]
type = "cpu"
threads = 1
[precision]
policy = "fp16-mixed"
[scaler]
type = "none"
[optimizer]
type = "sgd"
lr = 0.01
[model]
layers = [
  { type = "dropout", name = "drop", p = 0.5 },
  { type = "linear", name = "fc1", out = 16 },
  { type = "relu" },
  { type = "linear", name = "head", out = 4 },
]
[data]
source = "npy"
features = "x.npy"
labels = "y.npy"
batch_size = 16
eval_fraction = 0.0
shuffle = false
)");
  int skipped = 0;
  for (int seed = 1; seed <= 8; ++seed) {
    const auto d = dir_ / ("seed-" + std::to_string(seed));
    auto r = run("train " + cfg.string() + " --set run.seed=" + std::to_string(seed) +
                 " --run-dir " + d.string());
    ASSERT_EQ(r.exit_code == 0 || r.exit_code == 3, true) << r.err;  // 3: diverged (a skip)
    for (const auto& j : records(d / "metrics.jsonl"))
      if (j.contains("skipped") && j["skipped"].get<bool>()) {
        ++skipped;
        ASSERT_TRUE(j.contains("nonfinite") && j["nonfinite"].is_string()) << j.dump();
        EXPECT_EQ(j["nonfinite"].get<std::string>(), "micro-batch 1 of 2: forward drop.output")
            << "seed " << seed << ": " << j.dump();
      }
  }
  EXPECT_GT(skipped, 0) << "no seed kept the large element: the test shows nothing";
}

TEST_F(RunControl, UnderflowLogSaysAllZeroInsteadOfZeroPercent) {
  // All-zero inputs into a linear layer without bias: its output, and so the gradient of the relu
  // after it, is exactly zero, which has no underflow share at all.
  const std::int64_t rows = 256, features = 8;
  write_four_class_rows(dir_, std::vector<float>(static_cast<std::size_t>(rows * features), 0.0f),
                        rows, features);
  auto cfg = write_file("zero.toml", R"(
[run]
name = "zero"
steps = 2
underflow_every = 1
[backend]
type = "cpu"
[precision]
policy = "fp16-mixed"
[scaler]
type = "none"
[optimizer]
type = "sgd"
lr = 0.01
[model]
layers = [
  { type = "linear", name = "fc1", out = 16, bias = false },
  { type = "relu", name = "act1" },
  { type = "linear", name = "fc2", out = 16 },
  { type = "relu", name = "act2" },
  { type = "linear", name = "head", out = 4 },
]
[data]
source = "npy"
features = "x.npy"
labels = "y.npy"
batch_size = 64
)");
  auto d = dir_ / "run";
  auto r = run("train " + cfg.string() + " --run-dir " + d.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_with(r.err, "gradient underflow");
  ASSERT_EQ(lines.size(), 2u) << r.err;
  for (const auto& l : lines) {
    EXPECT_NE(l.find("all zero: act1;"), std::string::npos) << l;
    EXPECT_EQ(l.find("act1 0.0%"), std::string::npos) << l;
  }
  // metrics.jsonl keeps the counts that say why: no non-zero value at all.
  bool seen = false;
  for (const auto& j : records(d / "metrics.jsonl"))
    if (j.contains("underflow")) {
      EXPECT_EQ(j["underflow"]["act1 input gradient"]["nonzero"].get<std::int64_t>(), 0)
          << j.dump();
      seen = true;
    }
  EXPECT_TRUE(seen);
}

TEST_F(RunControl, UnderflowLogIsOneLineForADeepModel) {
  // 41 layers: the per-tensor shares go to metrics.jsonl, the log gets one summary line.
  auto d = dir_ / "run";
  auto r = run("train " + config("underflow-demo.toml") +
               " --set precision.policy=fp16-mixed --set run.steps=1 --set run.underflow_every=1"
               " --set run.eval_every=0 --run-dir " +
               d.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_with(r.err, "gradient underflow");
  ASSERT_EQ(lines.size(), 1u) << r.err;
  const auto message = lines[0].substr(lines[0].find("gradient underflow"));
  EXPECT_LE(message.size(), 160u) << message;
  EXPECT_NE(message.find("worst "), std::string::npos) << message;
  std::size_t tensors = 0;
  for (const auto& j : records(d / "metrics.jsonl"))
    if (j.contains("underflow")) tensors = j["underflow"].size();
  EXPECT_EQ(tensors, 41u);
}

// With run.accumulate = 2 the underflow record names the step's loss scale (each micro-batch is
// seeded with half of it, which gives every row the gradient a whole-batch step at the full scale
// would); it named the half.
TEST_F(RunControl, UnderflowRecordsNameTheStepsLossScaleUnderAccumulation) {
  auto d = dir_ / "run";
  auto r = run("train " + config("underflow-demo.toml") +
               " --set precision.policy=fp16-mixed --set run.steps=2 --set run.underflow_every=1"
               " --set run.accumulate=2 --set run.log_every=1 --set run.eval_every=0 --run-dir " +
               d.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::int64_t, double> loss_scale, underflow_scale;
  for (const auto& j : records(d / "metrics.jsonl")) {
    if (j.contains("loss_scale")) loss_scale[j["step"].get<std::int64_t>()] = j["loss_scale"];
    if (j.contains("underflow_scale"))
      underflow_scale[j["step"].get<std::int64_t>()] = j["underflow_scale"];
  }
  ASSERT_EQ(underflow_scale.size(), 2u);
  for (const auto& [step, scale] : underflow_scale) EXPECT_EQ(scale, loss_scale.at(step)) << step;
}

}  // namespace
// Ctrl-C or SIGTERM stops `predict` between batches: it exits 128 + the signal, deletes its
// temporary file (each interrupted run left one, an output's size) and leaves an existing --out
// as it was. A temporary file a killed writer left (no lock held) is removed by the next predict.
// Every window of a text at stride 1 through a tiny GPT takes minutes: the signal comes first.
TEST_F(RunControl, PredictStopsOnSigtermLeavingNoTemporaryFileAndTheOldOutput) {
  const auto gpt = config("gpt-tiny-fp32.toml");
  ASSERT_EQ(run("export " + gpt + " --initial --out g.safetensors", dir_).exit_code, 0);
  write_file("p.npy", "the previous predictions");
  write_file(".p.npy.tmp.999999999.0", "a killed writer's partial file");
  auto temporaries = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().starts_with(".p.npy.tmp."))
        names.push_back(e.path().filename().string());
    return names;
  };
  Spawned p("predict " + gpt +
                " --checkpoint g.safetensors --input /usr/share/common-licenses/GPL-3"
                " --stride 1 --top-k 1 --force --out p.npy",
            dir_ / "out.txt", dir_ / "err.txt", dir_);
  ASSERT_GT(p.pid(), 0);
  ASSERT_TRUE(eventually(
      [&] {
        const auto t = temporaries();
        return t.size() == 1 && t[0] != ".p.npy.tmp.999999999.0";
      },
      120s))
      << slurp(dir_ / "err.txt");
  p.signal(SIGTERM);
  const auto status = p.wait(120s);
  ASSERT_TRUE(status.has_value()) << "still running after SIGTERM";
  ASSERT_TRUE(WIFEXITED(*status)) << "ended by the signal, not by a clean stop";
  EXPECT_EQ(WEXITSTATUS(*status), 128 + SIGTERM) << slurp(dir_ / "err.txt");
  const auto err = slurp(dir_ / "err.txt");
  EXPECT_TRUE(has(err, "removed ")) << err;
  EXPECT_TRUE(has(err, "p.npy is not written")) << err;
  EXPECT_TRUE(temporaries().empty());
  EXPECT_EQ(slurp(dir_ / "p.npy"), "the previous predictions");
}

}  // namespace mixtrain::test
