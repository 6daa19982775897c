// Descriptor of libmixtrain_mpi: the Open MPI communicator of data-parallel runs on host memory.
#include "mixtrain/sdk/plugin.h"

#include "mpi_communicator.h"

namespace {

std::vector<mixtrain::sdk::ComponentInfo> mpi_components() {
  using namespace mixtrain;
  return {{sdk::ComponentKind::communicator, "mpi",
           "Open MPI collectives on host memory (the CPU backend); launch with mpirun",
           communicators::MpiCommunicator::option_schema(),
           &sdk::make_component<communicators::MpiCommunicator>}};
}

}  // namespace

MIXTRAIN_PLUGIN("mpi", "0.1.0", mpi_components)
