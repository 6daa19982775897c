// Open MPI's all-reduce of one wide-MLP gradient (25.2 M fp32 values, ~96 MiB) between the ranks
// of this machine, four ways: the blocking collective (the `tuned` component, which the mpi
// communicator's thread uses), the non-blocking one (`libnbc`, which progress = "test" uses),
// and reduce-scatter + all-gather (ZeRO-1's pair) both ways; a memcpy of the same bytes for scale.
// Each is timed over 5 calls after one warm-up, between barriers; rank 0 prints milliseconds.
//
//   mpirun --oversubscribe --allow-run-as-root -np 2 build/bin/bench_allreduce_algorithms
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int count = 25'165'824 / world * world;  // the wide MLP's parameters, whole shards
  std::vector<float> grads(static_cast<std::size_t>(count), 1.0f);
  std::vector<float> shard(static_cast<std::size_t>(count / world)), gathered(grads.size());
  auto time = [&](const char* name, auto&& run) {
    run();
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) run();
    MPI_Barrier(MPI_COMM_WORLD);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count() / 5;
    if (rank == 0) std::printf("| %s | %.1f |\n", name, ms);
  };
  if (rank == 0)
    std::printf("all-reduce of %d fp32 values (%.0f MiB), %d ranks\n\n| how | ms |\n|---|---|\n",
                count, count * 4.0 / (1 << 20), world);
  time("MPI_Allreduce (blocking: tuned)", [&] {
    MPI_Allreduce(MPI_IN_PLACE, grads.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
  time("MPI_Iallreduce + MPI_Wait (non-blocking: libnbc)", [&] {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, grads.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  });
  time("MPI_Reduce_scatter_block + MPI_Allgather (blocking)", [&] {
    MPI_Reduce_scatter_block(grads.data(), shard.data(), count / world, MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD);
    MPI_Allgather(shard.data(), count / world, MPI_FLOAT, gathered.data(), count / world, MPI_FLOAT,
                  MPI_COMM_WORLD);
  });
  time("MPI_Ireduce_scatter_block + MPI_Iallgather (non-blocking)", [&] {
    MPI_Request r;
    MPI_Ireduce_scatter_block(grads.data(), shard.data(), count / world, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD, &r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
    MPI_Iallgather(shard.data(), count / world, MPI_FLOAT, gathered.data(), count / world,
                   MPI_FLOAT, MPI_COMM_WORLD, &r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  });
  time("memcpy of the same bytes (for scale)",
       [&] { std::copy(grads.begin(), grads.end(), gathered.begin()); });
  MPI_Finalize();
}
