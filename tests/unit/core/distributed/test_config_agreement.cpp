// What the start-up config check names when ranks disagree (distributed/config_agreement.h), and
// the MPI launch read from the environment (distributed/launch.h).
#include <gtest/gtest.h>

#include <string>

#include "distributed/launch.h"
#include "mixtrain/core/distributed/config_agreement.h"
#include "scoped_env.h"

namespace mixtrain::core {
namespace {

using test::ScopedEnv;

TEST(ConfigAgreement, EqualConfigsHaveNoDifference) {
  EXPECT_EQ(first_config_difference("[run]\nseed = 1\n", "[run]\nseed = 1\n"), "");
}

TEST(ConfigAgreement, NamesTheFirstDifferingKeyWithItsTable) {
  const std::string a = "[run]\nname = \"x\"\nseed = 1\n\n[data]\nbatch_size = 64\n";
  const std::string b = "[run]\nname = \"x\"\nseed = 1\n\n[data]\nbatch_size = 32\n";
  EXPECT_EQ(first_config_difference(a, b), "data.batch_size: `64` against `32`");
}

TEST(ConfigAgreement, NamesSubTables) {
  const std::string a = "[scaler.dynamic]\ngrowth_interval = 20\n";
  const std::string b = "[scaler.dynamic]\ngrowth_interval = 2000\n";
  EXPECT_EQ(first_config_difference(a, b), "scaler.dynamic.growth_interval: `20` against `2000`");
}

TEST(ConfigAgreement, ALineWithoutACommonKeyIsNamedByItsNumber) {
  const std::string a = "[run]\nseed = 1\n";
  const std::string b = "[run]\nsteps = 1\n";
  EXPECT_EQ(first_config_difference(a, b), "line 2: `seed = 1` against `steps = 1`");
  EXPECT_EQ(first_config_difference("[run]\n", "[run]\nseed = 1\n"),
            "line 2: `(nothing)` against `seed = 1`");
}

TEST(ConfigAgreement, CommentsAndBlankLinesAreNoDifference) {
  // The resolved config's first line names the file it came from: a relative and an absolute
  // path to one file, or a copy, are the same config.
  const std::string a =
      "# mixtrain resolved config: every effective value. Source: mlp.toml\n[run]\nseed = 1\n";
  const std::string b =
      "# mixtrain resolved config: every effective value. Source: /home/u/mlp.toml\n\n[run]\n"
      "seed = 1\n";
  EXPECT_EQ(first_config_difference(a, b), "");
  // ... and a difference after them is still found, named by its line in rank 0's text.
  EXPECT_EQ(first_config_difference(a + "steps = 2\n", b + "x = 2\n"),
            "line 4: `steps = 2` against `x = 2`");
}

TEST(ConfigAgreement, NamesTheEntryOfAnArrayOfTables) {
  const std::string a =
      "[[model.layers]]\ntype = \"linear\"\nout = 16\n[[model.layers]]\ntype = \"relu\"\n"
      "[[model.layers]]\ntype = \"linear\"\nout = 3\n";
  std::string b = a;
  b.replace(b.rfind("out = 3"), 7, "out = 4");
  EXPECT_EQ(first_config_difference(a, b), "model.layers[2].out: `3` against `4`");
}

TEST(MpiLaunch, ReadsOpenMpisVariables) {
  ScopedEnv size("OMPI_COMM_WORLD_SIZE", "4"), rank("OMPI_COMM_WORLD_RANK", "3");
  const auto l = detect_mpi_launch();
  EXPECT_TRUE(l.detected);
  EXPECT_EQ(l.world_size, 4);
  EXPECT_EQ(l.rank, 3);
}

TEST(MpiLaunch, ReadsPmiVariables) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("OMPI_COMM_WORLD_RANK", nullptr);
  ScopedEnv size("PMI_SIZE", "2"), rank("PMI_RANK", "1");
  const auto l = detect_mpi_launch();
  EXPECT_TRUE(l.detected);
  EXPECT_EQ(l.world_size, 2);
  EXPECT_EQ(l.rank, 1);
}

TEST(MpiLaunch, IgnoresMissingOrMalformedValues) {
  ScopedEnv pa("PMI_SIZE", nullptr), pb("PMI_RANK", nullptr);
  {
    ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("OMPI_COMM_WORLD_RANK", nullptr);
    EXPECT_FALSE(detect_mpi_launch().detected);
  }
  for (const auto& [size, rank] :
       {std::pair{"2x", "0"}, std::pair{"0", "0"}, std::pair{"2", "2"}, std::pair{"2", "-1"}}) {
    ScopedEnv a("OMPI_COMM_WORLD_SIZE", size), b("OMPI_COMM_WORLD_RANK", rank);
    EXPECT_FALSE(detect_mpi_launch().detected) << size << " " << rank;
  }
}

// Ctrl-C under Open MPI 4's mpirun: a warning unless the ranks get kStopGraceSeconds or more
// before SIGKILL; nothing for one rank, Open MPI 5 (PRRTE, no ORTE variables) or a PMI launcher
// (whose stop is not Open MPI's).
TEST(MpiLaunch, WarnsWhenOpenMpiWouldKillTheRanksBeforeTheirCheckpoint) {
  ScopedEnv pa("PMI_SIZE", nullptr), pb("PMI_RANK", nullptr);
  ScopedEnv size("OMPI_COMM_WORLD_SIZE", "2"), rank("OMPI_COMM_WORLD_RANK", "0");
  {
    ScopedEnv prrte("OMPI_MCA_orte_hnp_uri", nullptr);
    ScopedEnv grace("OMPI_MCA_odls_base_sigkill_timeout", nullptr);
    EXPECT_TRUE(detect_mpi_launch().open_mpi);
    EXPECT_EQ(stop_grace_warning(detect_mpi_launch()), "");
  }
  ScopedEnv orte("OMPI_MCA_orte_hnp_uri", "4242.0;tcp://10.0.0.1:5000");
  {
    ScopedEnv grace("OMPI_MCA_odls_base_sigkill_timeout", nullptr);
    const auto w = stop_grace_warning(detect_mpi_launch());
    EXPECT_NE(w.find("SIGTERM 1 s after Ctrl-C and SIGKILL 1 s after that"), std::string::npos)
        << w;
    EXPECT_NE(w.find("--mca odls_base_sigkill_timeout 30"), std::string::npos) << w;
    EXPECT_NE(w.find("pkill -INT"), std::string::npos) << w;
  }
  {
    ScopedEnv grace("OMPI_MCA_odls_base_sigkill_timeout", "5");
    EXPECT_NE(stop_grace_warning(detect_mpi_launch()).find("SIGTERM 5 s after Ctrl-C"),
              std::string::npos);
  }
  {
    ScopedEnv grace("OMPI_MCA_odls_base_sigkill_timeout", "120");
    EXPECT_EQ(stop_grace_warning(detect_mpi_launch()), "");
  }
  {
    ScopedEnv one("OMPI_COMM_WORLD_SIZE", "1");
    EXPECT_EQ(stop_grace_warning(detect_mpi_launch()), "");
  }
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("OMPI_COMM_WORLD_RANK", nullptr);
  ScopedEnv psize("PMI_SIZE", "2"), prank("PMI_RANK", "0");
  EXPECT_EQ(stop_grace_warning(detect_mpi_launch()), "");
}

}  // namespace
}  // namespace mixtrain::core
