// What the environment says about an MPI launch (docs/architecture.md, "Data parallel"), read
// before any MPI call so that a plain `mixtrain train` never initialises MPI. Internal to the
// core.
//
// Contract: detect_mpi_launch() reads the variables Open MPI's mpirun (OMPI_COMM_WORLD_SIZE,
// OMPI_COMM_WORLD_RANK) or a PMI launcher (PMI_SIZE, PMI_RANK; MPICH's Hydra, Slurm's srun) sets
// in every rank's environment; a value that is not a positive integer counts as absent.
#pragma once

#include <string>

namespace mixtrain::core {

struct MpiLaunch {
  bool detected = false;
  int world_size = 1;
  int rank = 0;
};

MpiLaunch detect_mpi_launch();

// The command that launches `argv` on `ranks` ranks, for messages.
std::string mpirun_line(int ranks, const std::string& command);

}  // namespace mixtrain::core
