// What the environment says about an MPI launch (docs/architecture.md, "Data parallel"), read
// before any MPI call so that a plain `mixtrain train` never initialises MPI. Internal to the
// core.
//
// Contract: detect_mpi_launch() reads the variables Open MPI's mpirun (OMPI_COMM_WORLD_SIZE,
// OMPI_COMM_WORLD_RANK) or a PMI launcher (PMI_SIZE, PMI_RANK; MPICH's Hydra, Slurm's srun) sets
// in every rank's environment; a value that is not a positive integer counts as absent.
// stop_grace_warning(): under Open MPI up to 4 (its ORTE runtime, seen by OMPI_MCA_orte_hnp_uri),
// Ctrl-C reaches mpirun, which sends every rank SIGCONT at once, SIGTERM odls_base_sigkill_timeout
// seconds later (default 1) and SIGKILL as many seconds after that (measured with Open MPI 4.1):
// one second is too short for the step in progress and the checkpoint to finish. The
// warning to give (empty when the launch is not ORTE's with more than one rank, or allows
// kStopGraceSeconds or more), read from OMPI_MCA_odls_base_sigkill_timeout, which mpirun passes to
// every rank. Open MPI 5's PRRTE has other knobs, unmeasured here: it gets no warning rather than
// advice that may be wrong.
#pragma once

#include <string>

namespace mixtrain::core {

struct MpiLaunch {
  bool detected = false;
  bool open_mpi = false;  // mpirun of Open MPI, rather than a PMI launcher
  bool orte = false;      // Open MPI's runtime up to version 4 (ORTE), not 5's PRRTE
  int world_size = 1;
  int rank = 0;
};

MpiLaunch detect_mpi_launch();

inline constexpr int kStopGraceSeconds = 30;
std::string stop_grace_warning(const MpiLaunch& launch);

// The command that launches `argv` on `ranks` ranks, for messages.
std::string mpirun_line(int ranks, const std::string& command);

}  // namespace mixtrain::core
