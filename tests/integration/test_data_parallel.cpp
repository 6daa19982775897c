// Data-parallel training on 2 ranks under Open MPI (docs/architecture.md, "Data parallel"):
// `mpirun --oversubscribe --allow-run-as-root -np 2 mixtrain train`, one thread per rank, against
// one process training the same global batch. Skips, saying why, where mpirun or the mpi plugin
// is missing.
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>

#include "cli_test_support.h"
#include "npy_test_support.h"

namespace mixtrain::test {
namespace {

bool mpi_available(std::string& why) {
#ifndef MIXTRAIN_MPI_PLUGIN
  why = "the mpi communicator plugin is not built (no MPI found at configure time)";
  return false;
#else
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    why = "mpirun is not on PATH (install openmpi-bin)";
    return false;
  }
  return true;
#endif
}

class DataParallelTest : public CliTest {
 protected:
  // The [run], [backend] and [optimizer] sections every config of these tests starts with.
  static constexpr const char* kRunBackendOptimizer = R"([run]
name = "dp"
seed = 3
log_every = 1
underflow_every = 0
[backend]
type = "cpu"
[backend.cpu]
threads = 1
[optimizer]
type = "adamw"
[optimizer.adamw]
lr = 0.01
)";

  void SetUp() override {
    CliTest::SetUp();
    std::string why;
    if (!mpi_available(why)) GTEST_SKIP() << why;
    // Each test's launches keep Open MPI's session directory (under TMPDIR) in a folder of their
    // own: two mpiruns at once in one TMPDIR race to create it ("mkdir ... File exists",
    // orte_init failed: two tests of a fresh-machine run). Short: its sockets' paths are bounded.
    char folder[] = "/tmp/mxmpi.XXXXXX";
    if (::mkdtemp(folder) != nullptr) mpi_tmpdir_ = folder;
  }
  void TearDown() override {
    if (!mpi_tmpdir_.empty()) {
      std::error_code ec;
      fs::remove_all(mpi_tmpdir_, ec);
    }
    CliTest::TearDown();
  }
  // What an mpirun command line starts with: its session folder.
  std::string launcher() const {
    return mpi_tmpdir_.empty() ? std::string() : "TMPDIR=" + mpi_tmpdir_ + " ";
  }
  std::string mpi_tmpdir_;

  // `mixtrain ARGS` on `ranks` ranks (`args_per_rank`: each rank its own arguments, MPMD).
  CliResult run_ranks(int ranks, const std::string& args) {
    std::vector<std::string> per(static_cast<std::size_t>(ranks), args);
    return run_mpmd(per);
  }
  CliResult run_mpmd(const std::vector<std::string>& args_per_rank) {
    std::vector<std::string> commands;
    for (const auto& args : args_per_rank)
      commands.push_back(std::string(MIXTRAIN_EXE) + " " + args);
    return run_commands(commands);
  }
  // Each rank its own command line, program included.
  CliResult run_commands(const std::vector<std::string>& command_per_rank) {
    CliResult r;
    auto out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    // timeout(1): a hang fails the test (exit 124) instead of stalling the suite.
    std::string cmd =
        launcher() + "timeout 600 mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1";
    for (std::size_t i = 0; i < command_per_rank.size(); ++i)
      cmd += std::string(i ? " :" : "") + " -np 1 " + command_per_rank[i];
    cmd += " >" + out.string() + " 2>" + err.string() + " </dev/null";
    const int status = std::system(cmd.c_str());
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  // An MLP on 512 rows of 2 Gaussian-ish clusters (npy, deterministic), `extra` appended.
  fs::path mlp_config(const std::string& name, const std::string& extra, float outlier = 0.0f) {
    std::vector<float> x(512 * 16);
    std::vector<std::int64_t> y(512);
    std::uint32_t state = 12345;
    auto next = [&] {
      state = state * 1664525u + 1013904223u;
      return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 0.5f;
    };
    for (int i = 0; i < 512; ++i) {
      y[static_cast<std::size_t>(i)] = i % 4;
      for (int j = 0; j < 16; ++j)
        x[static_cast<std::size_t>(i * 16 + j)] = next() + (j % 4 == i % 4 ? 1.0f : 0.0f);
    }
    if (outlier != 0.0f) x[7 * 16] = outlier;  // one row that overflows a narrow format
    write_npy(dir_ / "x.npy", "<f4", {512, 16}, x);
    write_npy(dir_ / "y.npy", "<i8", {512}, y);
    return write_file(name, std::string(kRunBackendOptimizer) + R"([model]
layers = [
  { type = "linear", name = "fc1", out = 32 },
  { type = "relu" },
  { type = "linear", name = "fc2", out = 32 },
  { type = "relu" },
  { type = "linear", name = "head", out = 4 },
]
[data]
source = "npy"
features = "x.npy"
labels = "y.npy"
batch_size = 64
eval_fraction = 0.125
)" + extra);
  }

  static std::vector<json> step_records(const fs::path& run) {
    std::vector<json> out;
    for (auto& r : records(run / "metrics.jsonl"))
      if (r.contains("loss")) out.push_back(r);
    return out;
  }

  static void expect_same_losses(const fs::path& a, const fs::path& b, double rel,
                                 std::int64_t from_step = 1) {
    auto ra = step_records(a), rb = step_records(b);
    std::size_t compared = 0;
    for (const auto& x : ra) {
      if (x["step"].get<std::int64_t>() < from_step) continue;
      for (const auto& y : rb)
        if (y["step"] == x["step"]) {
          // A skipped step's loss may be non-finite (null in JSON): then both must be.
          ASSERT_EQ(x["loss"].is_null(), y["loss"].is_null()) << "step " << x["step"];
          if (!x["loss"].is_null()) {
            // Relative, down to a floor: a loss trained to 1e-4 differs by reduction order in
            // its last bits like any other, which is no divergence (seen: 1.1e-5 of 1.75e-4 on
            // AVX-512 kernels).
            const double la = x["loss"].get<double>(), lb = y["loss"].get<double>();
            EXPECT_LE(std::abs(la - lb), rel * std::max(std::abs(la), 1e-2))
                << "step " << x["step"];
          }
          EXPECT_EQ(x["skipped"], y["skipped"]) << "step " << x["step"];
          EXPECT_EQ(x["loss_scale"], y["loss_scale"]) << "step " << x["step"];
          ++compared;
        }
    }
    EXPECT_GT(compared, 0u);
  }
};

// 2 ranks × 32 rows against 1 rank × 64 rows, same data order, fp32: per-step losses agree to
// 1e-5 relative for 50 steps, unsharded and with the optimizer state sharded.
// `train --resume RUN` works on any launch. A run that mpirun made data-parallel without a
// [distributed] table records the launch as a comment, not a table, so a resume follows its own
// launch; a run whose config has the table continues in one process when no launcher started it.
TEST_F(DataParallelTest, ARunResumesOnAnyLaunch) {
  const std::string tiny = " --set backend.threads=1 --set run.log_every=2 --set run.eval_every=0";
  const auto a = dir_ / "from-launch";
  auto r =
      run_ranks(2, "train " + quickstart() + tiny + " --set run.steps=4 --run-dir " + a.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string written = slurp(a / "config.toml");
  EXPECT_EQ(written.find("\n[distributed"), std::string::npos) << written;
  EXPECT_NE(written.find("# [distributed] type = \"mpi\" came from the launch (2 ranks)"),
            std::string::npos)
      << written;
  auto alone = run("train --resume " + a.string() + " --set run.steps=6");
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  EXPECT_NE(alone.out.find("done: 6 steps"), std::string::npos) << alone.out;
  auto again = run_ranks(2, "train --resume " + a.string() + " --set run.steps=8");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("done: 8 steps"), std::string::npos) << again.out;
  // On 3 ranks the batch of 128 does not split: a resume cannot change the batch, so the hint
  // names the rank counts that would.
  auto three = run_ranks(3, "train --resume " + a.string() + " --set run.steps=10");
  EXPECT_EQ(three.exit_code, 2) << three.err;
  EXPECT_NE(three.err.find("a resume keeps the run's data.batch_size: launch on a rank count that "
                           "divides it (1, 2, 4, 8, 16, 32, ...)"),
            std::string::npos)
      << three.err;

  const auto b = dir_ / "from-table";
  r = run_ranks(2, "train " + quickstart() + tiny +
                       " --set distributed.type=mpi --set distributed.shard_optimizer=true"
                       " --set run.steps=4 --run-dir " +
                       b.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_NE(slurp(b / "config.toml").find("\n[distributed]"), std::string::npos);
  alone = run("train --resume " + b.string() + " --set run.steps=6");
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  EXPECT_NE(alone.err.find("so it continues in one process"), std::string::npos) << alone.err;
  EXPECT_NE(alone.out.find("done: 6 steps"), std::string::npos) << alone.out;
  // The one-process leg keeps the table in the run's record: launched on 2 ranks again, the run
  // shards its optimizer state as it was configured to (it fell back to the defaults).
  const std::string kept = slurp(b / "config.toml");
  EXPECT_NE(kept.find("\n[distributed]"), std::string::npos) << kept;
  EXPECT_NE(kept.find("shard_optimizer = true"), std::string::npos) << kept;
  again = run_ranks(2, "train --resume " + b.string() + " --set run.steps=8");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const auto summary = nlohmann::json::parse(slurp(b / "summary.json"));
  EXPECT_EQ(summary.at("distributed").at("shard_optimizer"), true) << summary.dump();
}

// No rank waits forever: rank 1 exits 0 before it starts MPI (here `mixtrain --version`), and
// rank 0, waiting for it inside MPI's start-up, ends after distributed.mpi.timeout_s with one
// line naming its rank, the call and the option, and a non-zero exit; no run folder is written.
// Which of the two ends the job is a race the machine's load decides: when rank 1 exits before
// rank 0 reaches MPI_Init_thread, rank 0 waits and its timeout ends it (the usual case); when rank
// 0 gets there first (a loaded machine), mpirun itself ends the job at once, reporting that rank
// 1 exited without calling init. Either way nothing hangs; the test names which happened.
TEST_F(DataParallelTest, ARankThatExitsBeforeStartingMpiEndsTheOthersAfterTheTimeout) {
  const auto cfg = mlp_config("dp.toml", "[distributed]\ntype = \"mpi\"\n");
  auto r = run_mpmd({"train " + cfg.string() +
                         " --set distributed.mpi.timeout_s=3 --set run.steps=2 --run-dir " +
                         (dir_ / "r").string(),
                     "--version"});
  EXPECT_NE(r.exit_code, 0) << r.err;
  const bool timed_out = has(r.err,
                             "error: rank 0: MPI start-up (MPI_Init_thread) waited 3 s "
                             "(distributed.mpi.timeout_s)");
  const bool mpirun_ended_it = has(r.err, "exiting improperly");
  EXPECT_TRUE(timed_out || mpirun_ended_it) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "r" / "checkpoints" / "step-00000002.mxt"));
}

TEST_F(DataParallelTest, TwoRanksMatchOneProcessOnTheSameGlobalBatch) {
  const auto single = mlp_config("single.toml", "");
  auto base =
      run("train " + single.string() + " --set run.steps=50 --run-dir " + (dir_ / "r1").string());
  ASSERT_EQ(base.exit_code, 0) << base.err;
  // Unsharded, sharded, and unsharded with the mpi plugin's requests tested between ops instead
  // of its communication thread.
  for (const std::string variant : {"false", "true", "test"}) {
    const std::string shard = variant == "true" ? "true" : "false";
    const std::string progress = variant == "test" ? "test" : "thread";
    const auto cfg =
        mlp_config("dp-" + variant + ".toml",
                   "[distributed]\ntype = \"mpi\"\nshard_optimizer = " + shard +
                       "\nbucket_mb = 0.002\n[distributed.mpi]\nprogress = \"" + progress + "\"\n");
    const auto dir = dir_ / ("r2-" + variant);
    auto r =
        run_ranks(2, "train " + cfg.string() + " --set run.steps=50 --run-dir " + dir.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_same_losses(dir_ / "r1", dir, 1e-5);
    const auto s = summary(dir);
    EXPECT_EQ(s["distributed"]["world_size"], 2);
    EXPECT_TRUE(s["distributed"]["ranks_identical"].get<bool>());
    EXPECT_GT(s["distributed"]["buckets"].get<int>(), 1);  // bucket_mb 0.002: several
    EXPECT_GT(s["distributed"]["buckets_started_in_backward"].get<int>(), 0);
    // Only rank 0 writes and speaks.
    EXPECT_FALSE(has(r.out + r.err, "rank 1 [trainer]")) << r.err;
  }
  // Sharded, each rank holds half of AdamW's two slots (plus the padding of odd buckets).
  const auto full = summary(dir_ / "r2-false")["distributed"]["optimizer_state_bytes_per_rank"];
  const auto half = summary(dir_ / "r2-true")["distributed"]["optimizer_state_bytes_per_rank"];
  EXPECT_LE(half.get<double>(), full.get<double>() * 0.5 + 64.0);
  EXPECT_GE(half.get<double>(), full.get<double>() * 0.5 - 64.0);
}

// Frozen parameters ([train]) have no gradient: the buckets hold the trainable ones alone, the
// optimizer state is theirs, and two ranks still match one process.
TEST_F(DataParallelTest, FrozenParametersAreNeitherReducedNorUpdated) {
  const std::string frozen = "[train]\ntrainable = [\"head\"]\n";
  const auto single = mlp_config("single.toml", frozen);
  auto base =
      run("train " + single.string() + " --set run.steps=20 --run-dir " + (dir_ / "r1").string());
  ASSERT_EQ(base.exit_code, 0) << base.err;
  for (const std::string shard : {"false", "true"}) {
    const auto cfg =
        mlp_config("dp-" + shard + ".toml",
                   frozen + "[distributed]\ntype = \"mpi\"\nshard_optimizer = " + shard +
                       "\nbucket_mb = 0.002\n");
    const auto dir = dir_ / ("r2-" + shard);
    auto r =
        run_ranks(2, "train " + cfg.string() + " --set run.steps=20 --run-dir " + dir.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_same_losses(dir_ / "r1", dir, 1e-5);
    const auto d = summary(dir)["distributed"];
    EXPECT_TRUE(d["ranks_identical"].get<bool>());
    // The head's 32·4 + 4 gradients fit one bucket of bucket_mb = 0.002 (524 floats); the whole
    // MLP's 1732 would take four.
    EXPECT_EQ(d["buckets"].get<int>(), 1);
    if (shard == "false") {  // AdamW's two FP32 slots of the head's 132 parameters
      EXPECT_EQ(d["optimizer_state_bytes_per_rank"].get<std::int64_t>(), 2 * 132 * 4);
    }
  }
}

// Gradient accumulation: the micro-batches add up locally and only the step's last one
// communicates, so each bucket is reduced once per optimizer step.
TEST_F(DataParallelTest, GradientAccumulationCommunicatesOnTheLastMicroBatchOnly) {
  const std::string accumulate =
      " --set run.steps=20 --set run.accumulate=2 --set data.batch_size=32";
  const auto single = mlp_config("single.toml", "");
  auto base = run("train " + single.string() + accumulate + " --run-dir " + (dir_ / "r1").string());
  ASSERT_EQ(base.exit_code, 0) << base.err;
  const auto cfg = mlp_config("dp.toml", "[distributed]\ntype = \"mpi\"\nbucket_mb = 0.002\n");
  auto r =
      run_ranks(2, "train " + cfg.string() + accumulate + " --run-dir " + (dir_ / "r2").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_losses(dir_ / "r1", dir_ / "r2", 1e-5);
  const auto d = summary(dir_ / "r2")["distributed"];
  EXPECT_EQ(d["buckets_communicated"].get<int>(), 20 * d["buckets"].get<int>());
}

// nvfp4's stochastic rounding draws per replica: rank r rounds its rows with the bits of draw r,
// as one process rounds micro-batch r. So 2 ranks train as one process accumulating 2
// micro-batches of the same rows (with the same bits on every rank they did not: the noise was
// correlated across ranks and did not average down).
TEST_F(DataParallelTest, StochasticRoundingDrawsItsOwnBitsOnEveryRank) {
  const std::string sr = "[precision]\npolicy = \"nvfp4\"\n";
  const std::string steps = " --set run.steps=12";
  const auto single = mlp_config("single.toml", sr);
  // Two micro-batches of 16 rows a step: the rows the 2 ranks split a batch of 32 into.
  auto base =
      run("train " + single.string() + steps +
          " --set data.batch_size=16 --set run.accumulate=2 --run-dir " + (dir_ / "r1").string());
  ASSERT_EQ(base.exit_code, 0) << base.err;
  const auto cfg = mlp_config("dp.toml", sr + "[distributed]\ntype = \"mpi\"\n");
  auto r = run_ranks(2, "train " + cfg.string() + steps + " --set data.batch_size=32 --run-dir " +
                            (dir_ / "r2").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_losses(dir_ / "r1", dir_ / "r2", 1e-5);
}

// fp16-mixed with the dynamic scaler and one row that overflows fp16: the row lands in one
// rank's half of the batch only, yet both ranks skip the same steps with the same scales (the
// one-process run skips exactly those), and the replicas end identical.
TEST_F(DataParallelTest, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  const std::string mixed = "[precision]\npolicy = \"fp16-mixed\"\n[scaler]\ntype = \"dynamic\"\n";
  const auto single = mlp_config("single.toml", mixed, 1e30f);
  auto base =
      run("train " + single.string() + " --set run.steps=24 --run-dir " + (dir_ / "r1").string());
  ASSERT_EQ(base.exit_code, 0) << base.err;
  const auto cfg = mlp_config("dp.toml", mixed + "[distributed]\ntype = \"mpi\"\n", 1e30f);
  auto r = run_ranks(
      2, "train " + cfg.string() + " --set run.steps=24 --run-dir " + (dir_ / "r2").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_losses(dir_ / "r1", dir_ / "r2", 1e-3);
  const auto s = summary(dir_ / "r2");
  EXPECT_GT(s["skipped_steps"].get<int>(), 0);
  EXPECT_EQ(s["skipped_steps"], summary(dir_ / "r1")["skipped_steps"]);
  EXPECT_TRUE(s["distributed"]["ranks_identical"].get<bool>());
}

// fp16-mixed with a dynamic scaler that doubles every step until it overflows: the overflows come
// from the scale alone, so one process and two ranks must skip the same steps at the same scales
// (each rank seeds its half of the batch with scale / 2; seeded with the full scale, every row's
// gradient was twice a one-process run's and the two ranks overflowed one doubling earlier).
TEST_F(DataParallelTest, LossScaleOverflowsDoNotDependOnTheRankCount) {
  const std::string mixed =
      "[precision]\npolicy = \"fp16-mixed\"\n[scaler]\ntype = \"dynamic\"\n"
      "init_scale = 1048576.0\ngrowth_interval = 1\n";
  const auto single = mlp_config("single.toml", mixed);
  auto base =
      run("train " + single.string() + " --set run.steps=8 --run-dir " + (dir_ / "r1").string());
  ASSERT_EQ(base.exit_code, 0) << base.err;
  const auto cfg = mlp_config("dp.toml", mixed + "[distributed]\ntype = \"mpi\"\n");
  auto r = run_ranks(
      2, "train " + cfg.string() + " --set run.steps=8 --run-dir " + (dir_ / "r2").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_losses(dir_ / "r1", dir_ / "r2", 1e-5);  // skipped and loss_scale: equal
  EXPECT_GT(summary(dir_ / "r1")["skipped_steps"].get<int>(), 0);
}

// Dropout keys its masks by the global batch's sample, so two ranks drop what one process drops
// (drawn per replica, the losses parted from step 1, by 5e-4 relative and growing): on an MLP,
// a sample a row, and on a token model, a sample T rows.
TEST_F(DataParallelTest, DropoutDrawsOneProcesssMasksOnTwoRanks) {
  const auto with_dropout = [&](const std::string& name, const std::string& extra) {
    std::string text = slurp(mlp_config(name, extra));
    const std::string relu = "{ type = \"relu\" },\n";
    text.replace(text.find(relu), relu.size(),
                 relu + "  { type = \"dropout\", name = \"drop\", p = 0.3 },\n");
    return write_file(name, text);
  };
  const auto single = with_dropout("single.toml", "");
  auto base =
      run("train " + single.string() + " --set run.steps=12 --run-dir " + (dir_ / "r1").string());
  ASSERT_EQ(base.exit_code, 0) << base.err;
  const auto cfg = with_dropout("dp.toml", "[distributed]\ntype = \"mpi\"\n");
  auto r = run_ranks(
      2, "train " + cfg.string() + " --set run.steps=12 --run-dir " + (dir_ / "r2").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_losses(dir_ / "r1", dir_ / "r2", 1e-5);

  const auto tokens = write_file("tokens.toml", std::string(kRunBackendOptimizer) + R"([model]
layers = [
  { type = "embedding", name = "wte", vocab = 256, dim = 32 },
  { type = "dropout", name = "drop", p = 0.3 },
  { type = "linear", name = "head", out = 256 },
]
[data]
source = "text"
block_size = 16
batch_size = 8
eval_fraction = 0.05
[data.text]
path = ["/usr/share/common-licenses/GPL-3"]
)");
  base = run("train " + tokens.string() + " --set run.steps=8 --run-dir " + (dir_ / "t1").string());
  ASSERT_EQ(base.exit_code, 0) << base.err;
  r = run_ranks(2, "train " + tokens.string() + " --set run.steps=8 --run-dir " +
                       (dir_ / "t2").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_losses(dir_ / "t1", dir_ / "t2", 1e-5);
}

// A 2-rank run resumed from its checkpoint continues bit for bit; its checkpoint also resumes in
// one process (the file is a one-rank run's), sharded or not.
TEST_F(DataParallelTest, CheckpointsResumeOnTwoRanksBitExactAndOnOneRank) {
  for (const char* shard : {"false", "true"}) {
    const auto cfg =
        mlp_config(std::string("dp-") + shard + ".toml",
                   std::string("[distributed]\ntype = \"mpi\"\nshard_optimizer = ") + shard +
                       "\nbucket_mb = 0.002\n[checkpoint]\nevery = 10\nkeep = 5\n");
    const auto full = dir_ / (std::string("full-") + shard);
    ASSERT_EQ(
        run_ranks(2, "train " + cfg.string() + " --set run.steps=20 --run-dir " + full.string())
            .exit_code,
        0);
    const auto ckpt = full / "checkpoints" / "step-00000010.mxt";
    ASSERT_TRUE(fs::exists(ckpt));
    const auto resumed = dir_ / (std::string("resumed-") + shard);
    auto r = run_ranks(2, "train " + cfg.string() + " --set run.steps=20 --resume " +
                              ckpt.string() + " --run-dir " + resumed.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_same_losses(full, resumed, 0.0, 11);
    // One process, the same global batch.
    const auto single = mlp_config("single.toml", "[checkpoint]\nevery = 10\n");
    const auto one = dir_ / (std::string("one-") + shard);
    auto r1 = run("train " + single.string() + " --set run.steps=20 --resume " + ckpt.string() +
                  " --run-dir " + one.string());
    ASSERT_EQ(r1.exit_code, 0) << r1.err;
    expect_same_losses(full, one, 1e-5, 11);
  }
}

// A sharded save gathers the slots as rank 0's format reads them while rank 1 serves the gathers
// (distributed/served_slots.h): safetensors reads no slot, keep_best writes through the same
// reads, and a native checkpoint of many buckets still resumes in one process as the two-rank run
// goes on.
TEST_F(DataParallelTest, ShardedSavesGatherAsTheFormatReadsOnEveryFormat) {
  const auto st =
      mlp_config("served-st.toml",
                 "[distributed]\ntype = \"mpi\"\nshard_optimizer = true\n"
                 "bucket_mb = 0.002\n[checkpoint]\nevery = 5\nformat = \"safetensors\"\n"
                 "keep_best = \"eval_loss\"\n");
  const auto run_st = dir_ / "served-st";
  auto r =
      run_ranks(2, "train " + st.string() +
                       " --set run.steps=10 --set run.eval_every=5 --run-dir " + run_st.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(run_st / "checkpoints" / "step-00000010.safetensors"));
  EXPECT_TRUE(fs::exists(run_st / "checkpoints" / "best.safetensors")) << r.err;

  const auto native = mlp_config("served-native.toml",
                                 "[distributed]\ntype = \"mpi\"\nshard_optimizer = true\n"
                                 "bucket_mb = 0.002\n[checkpoint]\nevery = 5\nkeep = 3\n"
                                 "keep_best = \"eval_loss\"\n");
  const auto run_native = dir_ / "served-native";
  r = run_ranks(2, "train " + native.string() +
                       " --set run.steps=10 --set run.eval_every=5 --run-dir " +
                       run_native.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(run_native / "checkpoints" / "best.mxt")) << r.err;
  const auto single = mlp_config("served-single.toml", "[checkpoint]\nevery = 5\n");
  const auto one = dir_ / "served-one";
  r = run("train " + single.string() + " --set run.steps=10 --resume " +
          (run_native / "checkpoints" / "step-00000005.mxt").string() + " --run-dir " +
          one.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_losses(run_native, one, 1e-5, 6);

  // A format that fails on rank 0 after reading every slot (the test plugin's full disk, at the
  // second save): rank 1 is let out of its gathers, and the run ends with the save's error, not
  // a hang (mpirun's timeout would end it with 124).
  const auto faulty = mlp_config("served-faulty.toml",
                                 "[distributed]\ntype = \"mpi\"\nshard_optimizer = true\n"
                                 "bucket_mb = 0.002\n[checkpoint]\nevery = 5\nformat = \"faulty\"\n"
                                 "[plugins]\npaths = [\"" +
                                     std::string(MIXTRAIN_TEST_PLUGIN_DIR) + "/format_faults\"]\n");
  r = run_ranks(2, "train " + faulty.string() +
                       " --set run.steps=10 --set run.eval_every=0"
                       " --set checkpoint.faulty.mode=refuse_second_write --run-dir " +
                       (dir_ / "served-faulty").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("the step-10 checkpoint was not written"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("faulty: simulated full disk"), std::string::npos) << r.err;
}

// Delayed FP8 scaling: the amaxes are MAX-reduced, so both ranks hold the same scales.
TEST_F(DataParallelTest, Fp8ScalesAreIdenticalOnEveryRank) {
  const auto cfg = mlp_config(
      "dp.toml",
      "[precision]\npolicy = \"fp8-delayed\"\n[scaler]\ntype = \"dynamic\"\n[distributed]\n"
      "type = \"mpi\"\n");
  auto r = run_ranks(
      2, "train " + cfg.string() + " --set run.steps=20 --run-dir " + (dir_ / "r2").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(summary(dir_ / "r2")["distributed"]["ranks_identical"].get<bool>());
  // Current scaling takes each operand's scale from the rows at hand, each rank its own: its
  // state (the last amaxes) differs by design and is not compared, while the weights, optimizer
  // and scaler still must agree (they did; the check called every such run out of step).
  r = run_ranks(2, "train " + cfg.string() + " --set precision.policy=fp8-current" +
                       " --set run.steps=10 --run-dir " + (dir_ / "c2").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(has(r.err, "went out of step")) << r.err;
  EXPECT_TRUE(summary(dir_ / "c2")["distributed"]["ranks_identical"].get<bool>());
}

// The shipped ResNet-20 and tiny GPT, shrunk, take a few steps on 2 ranks (batch norm's
// statistics local, residual adds, attention, tied embeddings) and stay replicas of each other.
TEST_F(DataParallelTest, ResNet20AndTinyGptTrainOnTwoRanks) {
  const std::string common =
      " --set run.steps=3 --set run.log_every=1 --set distributed.type=mpi"
      " --set backend.cpu.threads=1 --set run.eval_every=0";
  const std::string resnet = std::string(MIXTRAIN_CONFIGS_DIR) + "/resnet20-bf16.toml" + common +
                             " --set data.batch_size=8 --set data.eval_batch_size=8"
                             " --set data.synthetic.rows=80 --set model.resnet.widths=[4,8,8]";
  const std::string gpt = std::string(MIXTRAIN_CONFIGS_DIR) + "/gpt-tiny-bf16.toml" + common +
                          " --set data.batch_size=4 --set data.eval_batch_size=4"
                          " --set data.block_size=16 --set model.gpt.n_layer=1"
                          " --set model.gpt.n_embd=32 --set model.gpt.n_head=2";
  for (const auto& [name, args] : {std::pair{"resnet", resnet}, std::pair{"gpt", gpt}}) {
    const auto dir = dir_ / name;
    auto r = run_ranks(2, "train " + args + " --run-dir " + dir.string());
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.err;
    const auto s = summary(dir);
    EXPECT_EQ(s["steps"], 3) << name;
    EXPECT_TRUE(std::isfinite(s["final_loss"].get<double>())) << name;
    EXPECT_TRUE(s["distributed"]["ranks_identical"].get<bool>()) << name;
  }
}

// Synchronized batch norm: the shrunk ResNet-20 in fp32 on 2 ranks × 4 images has the per-step
// losses of one process on the same 8 (each batch norm normalises with the global batch's
// statistics, and its backward reduces Σg and Σg·x̂); with local batch norm (each rank's own 4
// images) the losses differ, which is what makes the comparison a test. Augmentation stays on:
// each rank crops and flips its images as one process does those of the global batch. Again with 2
// micro-batches per step (the backward's dgamma / dbeta accumulate), the optimizer sharded and
// evaluations, whose losses show that the running statistics are the global batch's too. The
// first run's small buckets start during backward, between the batch norms' host all-reduces.
TEST_F(DataParallelTest, SyncBatchNormOnTwoRanksMatchesOneProcess) {
  const std::string args =
      std::string(MIXTRAIN_CONFIGS_DIR) + "/resnet20-fp32.toml" +
      " --set run.steps=4 --set run.log_every=1 --set backend.cpu.threads=1"
      " --set data.batch_size=8 --set data.eval_batch_size=8"
      " --set data.synthetic.rows=80 --set model.resnet.widths=[4,8,8]"
      " --set data.augment.crop_padding=4 --set data.augment.horizontal_flip=true";
  const std::string plain = " --set run.eval_every=0";
  const std::string accumulate = " --set run.eval_every=2 --set run.accumulate=2";
  const std::string dp = " --set distributed.type=mpi --set distributed.batch_norm=";
  for (const auto& [name, line] :
       {std::pair{"one", args + plain}, std::pair{"one-acc", args + accumulate}}) {
    auto r = run("train " + line + " --run-dir " + (dir_ / name).string());
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.err;
  }
  for (const auto& [name, line] :
       {std::pair{"sync", args + plain + " --set distributed.bucket_mb=0.002" + dp + "sync"},
        std::pair{"sync-acc",
                  args + accumulate + " --set distributed.shard_optimizer=true" + dp + "sync"},
        std::pair{"local", args + plain + dp + "local"}}) {
    auto r = run_ranks(2, "train " + line + " --run-dir " + (dir_ / name).string());
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_TRUE(summary(dir_ / name)["distributed"]["ranks_identical"].get<bool>()) << name;
    // The start-up line says which batch norm trains (a resume that fell back to the default
    // would otherwise not show).
    const std::string said = std::string(name) == "local"
                                 ? "batch-norm statistics per rank (batch_norm = \"local\")"
                                 : "batch-norm statistics synchronized across ranks";
    EXPECT_NE(r.err.find(said), std::string::npos) << name << ": " << r.err;
  }
  EXPECT_GT(summary(dir_ / "sync")["distributed"]["buckets_started_in_backward"].get<int>(), 0);
  expect_same_losses(dir_ / "one", dir_ / "sync", 1e-4);
  expect_same_losses(dir_ / "one-acc", dir_ / "sync-acc", 1e-4);
  auto evals = [](const fs::path& run) {
    std::vector<double> out;
    for (auto& r : records(run / "metrics.jsonl"))
      if (r.contains("eval_loss")) out.push_back(r["eval_loss"].get<double>());
    return out;
  };
  const auto eval_one = evals(dir_ / "one-acc"), eval_sync = evals(dir_ / "sync-acc");
  ASSERT_EQ(eval_one.size(), 2u);
  ASSERT_EQ(eval_sync.size(), 2u);
  for (std::size_t i = 0; i < eval_one.size(); ++i)
    EXPECT_NEAR(eval_sync[i], eval_one[i], 1e-4 * std::abs(eval_one[i])) << "evaluation " << i;
  double largest = 0.0;
  const auto a = step_records(dir_ / "one"), b = step_records(dir_ / "local");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 4u);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double la = a[i]["loss"].get<double>(), lb = b[i]["loss"].get<double>();
    largest = std::max(largest, std::abs(la - lb) / std::abs(la));
  }
  EXPECT_GT(largest, 1e-3) << "local batch norm should not match the global batch's";
}

// Under mpirun a config without [distributed] trains data-parallel by itself, and its resolved
// config says so; rank 1 logs only warnings, each line marked with its rank.
TEST_F(DataParallelTest, AnMpiLaunchWithoutADistributedTableChoosesMpi) {
  const auto cfg = mlp_config("plain.toml", "");
  auto r = run_ranks(2, "train " + cfg.string() +
                            " --set run.steps=3 --set optimizer.step_size=5 --run-dir " +
                            (dir_ / "r").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(summary(dir_ / "r")["distributed"]["world_size"], 2);
  const std::string resolved = slurp(dir_ / "r" / "config.toml");
  // Chosen by the launch, so recorded as a comment: a resume follows its own launch.
  EXPECT_FALSE(has(resolved, "\n[distributed]")) << resolved;
  EXPECT_TRUE(has(resolved, "# [distributed] type = \"mpi\" came from the launch (2 ranks)"))
      << resolved;
  // optimizer.step_size is unread by the constant schedule: every rank warns, rank 1 marked.
  EXPECT_TRUE(has(r.err, "rank 1 [trainer] optimizer.step_size")) << r.err;
  EXPECT_FALSE(has(r.err, "rank 1 rank 1")) << r.err;              // the prefix once, not per sink
  EXPECT_FALSE(has(r.err, "rank 1 [trainer] run 'dp'")) << r.err;  // its info lines stay quiet
  // Open MPI would kill the ranks 1 s after a Ctrl-C: rank 0 says so, once.
  EXPECT_TRUE(has(r.err, "[trainer] Ctrl-C would lose this run")) << r.err;
  EXPECT_FALSE(has(r.err, "rank 1 [trainer] Ctrl-C")) << r.err;
}

// Only train runs on several ranks: predict under mpirun would write one --out from every rank
// (both passing the overwrite check before either wrote). Refused before anything is written.
TEST_F(DataParallelTest, CommandsOtherThanTrainRefuseSeveralRanks) {
  const auto cfg = mlp_config("one.toml", "");
  // check and describe write nothing: refused for what they would do, the same work and output
  // once per rank, not for outputs they do not write.
  for (const std::string& args :
       {"check " + cfg.string() + " --skip-rehearsal", std::string("describe run")}) {
    auto r = run_ranks(2, args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    const std::string command = args.substr(0, args.find(' '));
    EXPECT_TRUE(has(r.err, "`mixtrain " + command +
                               "` runs in one process, but an MPI launcher started this "
                               "one as rank 0 of 2: every rank would do the same work and print "
                               "the same output, once per rank"))
        << r.err;
    EXPECT_FALSE(has(r.err, "write the same outputs")) << r.err;
  }
  auto r = run_ranks(
      2, "export --initial " + cfg.string() + " --out " + (dir_ / "w.safetensors").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "`mixtrain export` runs in one process")) << r.err;
  EXPECT_TRUE(has(r.err, "every rank would write the same outputs")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "w.safetensors"));
}

// Only rank 0 writes the run folder: another rank started with another --run-dir is told on rank
// 0, and nothing is written there.
TEST_F(DataParallelTest, AnotherRunDirOnAnotherRankIsAWarning) {
  const auto cfg = mlp_config("one.toml", "");
  const std::string train = "train " + cfg.string() + " --set run.steps=2 --run-dir ";
  const auto r = run_mpmd({train + (dir_ / "a").string(), train + (dir_ / "b").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "rank 1 was started with --run-dir " + (dir_ / "b").string() +
                             " and rank 0 with --run-dir " + (dir_ / "a").string() +
                             ": only rank 0 writes the run"))
      << r.err;
  EXPECT_FALSE(has(r.err, "rank 1 [trainer] rank 1 was started")) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "a" / "summary.json"));
  EXPECT_FALSE(fs::exists(dir_ / "b"));
}

TEST_F(DataParallelTest, ADistributedConfigWithoutMpirunExitsWithTheLaunchLine) {
  const auto cfg = mlp_config("dp.toml", "[distributed]\ntype = \"mpi\"\n");
  auto r = run("train " + cfg.string() + " --set run.steps=2 --run-dir " + (dir_ / "r").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "mpirun -np 2 mixtrain train")) << r.err;
  EXPECT_TRUE(has(r.err, "dp.toml:")) << r.err;  // where [distributed] type is
  // The line to paste runs what was asked: the user's own arguments with it.
  EXPECT_TRUE(has(r.err, " --set run.steps=2 --run-dir " + (dir_ / "r").string() + "`")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "r"));
  // A type given by --set is located at that --set, not at another of the table's.
  r = run("train " + mlp_config("one.toml", "").string() +
          " --set distributed.type=mpi --set distributed.shard_optimizer=true --set run.steps=2"
          " --run-dir " +
          (dir_ / "s").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.err, "error: --set distributed.type=mpi: ")) << r.err;
  EXPECT_TRUE(has(r.err, "--set distributed.type=mpi --set distributed.shard_optimizer=true"))
      << r.err;
  // The config itself is valid: `check` passes it and says how train must be launched.
  auto c = run("check " + cfg.string() + " --skip-rehearsal");
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_TRUE(has(c.out, "# launch: [distributed] type = \"mpi\" runs one process per rank"))
      << c.out;
  EXPECT_TRUE(has(c.out, "mpirun -np 2 mixtrain train " + cfg.string())) << c.out;
  // Its memory figures are one process's, and said to be.
  EXPECT_TRUE(has(c.out, "# memory under [distributed]: the figures above are of one process"))
      << c.out;
  // One process of a config without [distributed] needs no launch line.
  c = run("check " + mlp_config("one.toml", "").string() + " --skip-rehearsal");
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_FALSE(has(c.out, "# launch:")) << c.out;
  EXPECT_FALSE(has(c.out, "# memory under [distributed]")) << c.out;
}

TEST_F(DataParallelTest, RanksWithDifferentConfigsExitTwoNamingTheKey) {
  const auto cfg = mlp_config("dp.toml", "[distributed]\ntype = \"mpi\"\n");
  const std::string common =
      "train " + cfg.string() + " --set run.steps=2 --run-dir " + (dir_ / "r").string();
  auto r = run_mpmd({common + " --set run.seed=3", common + " --set run.seed=4"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "rank 1's differs from rank 0's at run.seed: `3` against `4`")) << r.err;
  // Each rank prints it, rank 1's prefixed "rank 1: " (README: "prefixed `rank N`"), in one write
  // each: an unprefixed line is rank 0's alone. mpirun ends the other rank when the first exits,
  // so either rank may be ended before it prints (rank 0 was, once in about ten runs on 2 busy
  // cores): at most one unprefixed line, and at least one of the two.
  const auto count = [](const std::string& err, const std::string& what) {
    std::size_t n = 0;
    for (auto at = err.find(what); at != std::string::npos; at = err.find(what, at + 1)) ++n;
    return n;
  };
  const auto one_write_each = [&](const std::string& err, const std::string& what) {
    const std::size_t unprefixed = count(err, "error: " + what);
    const std::size_t prefixed = count(err, "error: rank 1: " + what);
    EXPECT_LE(unprefixed, 1u) << err;
    EXPECT_LE(prefixed, 1u) << err;
    EXPECT_GE(unprefixed + prefixed, 1u) << err;
  };
  one_write_each(r.err, "the ranks run different configs");
  // So does an error each rank finds alone before the ranks meet (an unknown key).
  r = run_ranks(2, common + " --set run.stepz=3");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  one_write_each(r.err, "--set run.stepz=3");
}

// Ranks that resume different checkpoints (a stale copy on one node) would issue different
// collectives; they exit 2 at once, every rank, naming both positions.
TEST_F(DataParallelTest, RanksThatResumeDifferentCheckpointsExitTwoNamingBoth) {
  const auto cfg =
      mlp_config("dp.toml", "[distributed]\ntype = \"mpi\"\n[checkpoint]\nevery = 10\nkeep = 10\n");
  const auto a = dir_ / "a";
  auto first =
      run_ranks(2, "train " + cfg.string() + " --set run.steps=20 --run-dir " + a.string());
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string common = "train " + cfg.string() + " --set run.steps=30 --run-dir " +
                             (dir_ / "b").string() + " --resume " + (a / "checkpoints").string() +
                             "/";
  auto r = run_mpmd({common + "step-00000010.mxt", common + "step-00000020.mxt"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "the ranks start from different places: rank 0 has")) << r.err;
  EXPECT_TRUE(has(r.err, "resumed at step 10 (sampler epoch")) << r.err;
  EXPECT_TRUE(has(r.err, "rank 1 has")) << r.err;
  EXPECT_TRUE(has(r.err, "resumed at step 20 (sampler epoch")) << r.err;
  // The same checkpoint on both: they agree and train on.
  r = run_ranks(2, common + "step-00000020.mxt");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Ranks whose starting weights differ (an init_from file whose copy on one node is another
// seed's; the same holds for two checkpoints of one step) exit 2 at once, naming both states'
// checksums, rather than train apart until the end-of-run check. Rank 1 sees the other file at
// the path through a bind mount (skipped where unshare is not allowed).
TEST_F(DataParallelTest, RanksThatStartFromDifferentWeightsExitTwoNamingBoth) {
  if (std::system("unshare -m true >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "unshare -m is not allowed here (it needs CAP_SYS_ADMIN)";
  const auto cfg = mlp_config("dp.toml", "[distributed]\ntype = \"mpi\"\n");
  for (const char* seed : {"3", "99"}) {
    const auto e = run("export " + cfg.string() + " --initial --set run.seed=" + seed + " --out " +
                       (dir_ / (std::string("init") + seed + ".safetensors")).string());
    ASSERT_EQ(e.exit_code, 0) << e.err;
  }
  const auto init = dir_ / "init3.safetensors";
  const std::string train = "train " + cfg.string() + " --set run.steps=2 --run-dir " +
                            (dir_ / "r").string() + " --set checkpoint.init_from=" + init.string();
  const std::string exe = MIXTRAIN_EXE;
  auto r =
      run_commands({exe + " " + train, "unshare -m sh -c \"mount --bind " +
                                           (dir_ / "init99.safetensors").string() + " " +
                                           init.string() + " && exec " + exe + " " + train + "\""});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "the ranks start from different places: rank 0 has")) << r.err;
  EXPECT_TRUE(has(r.err, "from weights and state with CRC-32 ")) << r.err;
  EXPECT_TRUE(has(r.err, "init_from")) << r.err;
  r = run_ranks(2, train);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Ranks whose data files differ under one path (each node its own copy, one stale) exit 2 at
// once, every rank, naming both checksums. Rank 1 sees another file at the path through a bind
// mount in a mount namespace of its own (skipped where unshare is not allowed).
TEST_F(DataParallelTest, RanksWithDifferentDataUnderOnePathExitTwoNamingBoth) {
  if (std::system("unshare -m true >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "unshare -m is not allowed here (it needs CAP_SYS_ADMIN)";
  const auto cfg = mlp_config("dp.toml", "[distributed]\ntype = \"mpi\"\n");
  // Another dataset of the same shape: the config's x.npy with its rows reversed.
  std::string x = slurp(dir_ / "x.npy");
  const std::size_t header = x.size() - 512 * 16 * sizeof(float);
  std::string body = x.substr(header);
  for (std::size_t r = 0; r < 256; ++r)
    std::swap_ranges(body.begin() + static_cast<std::ptrdiff_t>(r * 64),
                     body.begin() + static_cast<std::ptrdiff_t>(r * 64 + 64),
                     body.end() - static_cast<std::ptrdiff_t>((r + 1) * 64));
  const auto stale = dir_ / "stale-x.npy";
  std::ofstream(stale, std::ios::binary) << x.substr(0, header) << body;
  const std::string train =
      "train " + cfg.string() + " --set run.steps=2 --run-dir " + (dir_ / "r").string();
  const std::string exe = MIXTRAIN_EXE;
  auto r = run_commands({exe + " " + train, "unshare -m sh -c \"mount --bind " + stale.string() +
                                                " " + (dir_ / "x.npy").string() + " && exec " +
                                                exe + " " + train + "\""});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(
      has(r.err, "the ranks start from different places: rank 0 has 448 training rows (crc "))
      << r.err;
  EXPECT_TRUE(has(r.err, "; rank 1 has 448 training rows (crc ")) << r.err;
}

// A rank that dies: the launcher ends the others (they never hang) and names the rank; the last
// complete checkpoint stays loadable.
TEST_F(DataParallelTest, ARankThatDiesEndsTheRunAndTheLastCheckpointLoads) {
  const auto cfg =
      mlp_config("dp.toml", "[distributed]\ntype = \"mpi\"\n[checkpoint]\nevery = 5\nkeep = 50\n");
  const auto run_dir = dir_ / "r";
  // Steps enough that the job never ends by itself before the kill: this MLP runs 100,000 steps
  // in about 20 s.
  const std::string cmd = launcher() + "mpirun --oversubscribe --allow-run-as-root -np 2 " +
                          MIXTRAIN_EXE + " train " + cfg.string() +
                          " --set run.steps=1000000000 --set run.log_every=100000 --run-dir " +
                          run_dir.string() + " >" + (dir_ / "out.txt").string() + " 2>" +
                          (dir_ / "err.txt").string() + " & echo $! > " + (dir_ / "pid").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  // Whatever assertion ends the test, the job does not outlive it: mpirun stops its ranks on
  // SIGTERM. Not once the test has seen mpirun end (its pid could then be another process's).
  struct StopJob {
    pid_t pid;
    bool ended = false;
    ~StopJob() {
      if (pid > 0 && !ended) ::kill(pid, SIGTERM);
    }
  } stop_job{static_cast<pid_t>(std::stoi(slurp(dir_ / "pid")))};
  // The newest checkpoint's step, 0 before the first. Not one file's name: the job writes a
  // checkpoint every 5 steps and keeps 50, so step-10's file lives for about 50 ms, and a poll
  // that a busy machine delays misses it (it did, twice, beside other tests).
  const auto newest_step = [&] {
    std::int64_t newest = 0;
    std::error_code ec;
    for (fs::directory_iterator it(run_dir / "checkpoints", ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.starts_with("step-") && name.ends_with(".mxt"))
        newest = std::max<std::int64_t>(newest, std::stoll(name.substr(5, name.size() - 9)));
    }
    return newest;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (newest_step() < 10 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (newest_step() < 10) {
    FAIL() << "no checkpoint of step 10 or later 60 s after the launch; mpirun's stderr:\n"
           << slurp(dir_ / "err.txt") << "\nstdout:\n"
           << slurp(dir_ / "out.txt");
  }
  // The newest of the two ranks' processes (rank 1, usually): SIGKILL, as an OOM killer would.
  // ("[m]ixtrain": the pattern must not match the shell that runs pkill.)
  const std::string kill = "pkill -9 -n -f '[m]ixtrain train .*--run-dir " + run_dir.string() + "'";
  ASSERT_EQ(std::system(kill.c_str()), 0);
  const auto mpirun_pid = stop_job.pid;
  bool ended = false;
  for (int i = 0; i < 600 && !ended; ++i) {  // 60 s
    ended = ::kill(mpirun_pid, 0) != 0;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_job.ended = ended;
  ASSERT_TRUE(ended) << "mpirun still runs 60 s after a rank died";
  // mpirun names the rank that died ("process rank 1 ... exited on signal 9 (Killed)").
  const std::string err = slurp(dir_ / "err.txt");
  EXPECT_TRUE(has(err, "process rank") && has(err, "signal 9")) << err;
  // The newest complete checkpoint resumes in one process.
  std::vector<fs::path> ckpts;
  for (const auto& e : fs::directory_iterator(run_dir / "checkpoints"))
    if (e.path().extension() == ".mxt") ckpts.push_back(e.path());
  ASSERT_FALSE(ckpts.empty());
  std::sort(ckpts.begin(), ckpts.end());
  const auto single = mlp_config("single.toml", "");
  auto r = run("eval " + single.string() + " --checkpoint " + ckpts.back().string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace mixtrain::test
