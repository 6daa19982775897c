// A peer that stops calling collectives, run by ctest as `mpirun -np 2 mpi_stalled_peer PROGRESS
// WHEN`: rank 1 starts MPI and then sleeps; rank 0 starts an all-reduce with a 3 s timeout and
// drops its handle. Dropping it must end every rank with one line naming the collective
// (mpi_communicator.h: MPI cannot cancel a collective that still writes the buffers), never
// hang (the test's TIMEOUT fails a hang) and never return ("NOT REACHED" fails the test).
//   PROGRESS: "thread" or "test" (the communicator's option).
//   WHEN: "after-wait" (the wait times out first, as in training) or "unwaited" (unwinding drops
//         a handle nobody waited on).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cpu_backend.h"
#include "mixtrain/sdk/error.h"
#include "mpi_communicator.h"

using namespace mixtrain;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: mpi_stalled_peer thread|test after-wait|unwaited\n");
    return 2;
  }
  const std::string progress = argv[1], when = argv[2];
  // MPI started here, outside the communicator's start-up watchdog: how long two ranks take to
  // start on a busy machine is not what the test measures. The collective's deadline then is
  // the communicator's timeout_s alone.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  backend_cpu::CpuBackend backend(1);
  communicators::MpiCommunicator comm(
      sdk::Options::resolve("distributed.mpi", communicators::MpiCommunicator::option_schema(),
                            {{"timeout_s", 3.0, {}}, {"progress", progress, {}}}, {}, {}),
      sdk::PluginContext{});
  comm.bind(backend);
  if (comm.world_size() != 2) {
    std::fprintf(stderr, "run under mpirun -np 2\n");
    return 2;
  }
  if (comm.rank() == 1) {
    // The stalled peer: alive, in MPI, and never joining. mpirun ends it once rank 0 aborts.
    std::this_thread::sleep_for(std::chrono::minutes(10));
    return 0;
  }
  std::vector<float> values(1024, 1.0f);
  const sdk::TensorView view{values.data(), sdk::DType::fp32, sdk::Shape{1024}};
  {
    auto handle = comm.start_all_reduce(view, sdk::ReduceOp::sum);
    if (when == "after-wait") {
      try {
        handle->wait();
        std::printf("NOT REACHED: the wait completed without rank 1\n");
      } catch (const sdk::CommunicationError& e) {
        std::printf("the wait timed out as it should: %s\n", e.what());
      }
      std::fflush(stdout);
    }
  }  // the handle is destroyed here, its collective still running
  std::printf("NOT REACHED: dropping the handle returned while MPI still held its buffer\n");
  return 0;
}
