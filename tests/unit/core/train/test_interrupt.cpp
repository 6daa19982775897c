// InterruptGuard under an MPI launch: a rank whose stderr is a launcher's pipe that nobody reads
// any more (Open MPI's mpirun after Ctrl-C) blocks in write(2) once the pipe is full; the SIGTERM
// that mpirun sends later must still start the clean stop. Without a launch, the guard leaves the
// output's flags alone. Each case runs in a forked child (this executable has no other threads).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "mixtrain/core/train/interrupt.h"

namespace mixtrain::core {
namespace {

// Waits up to `limit` for `pid`; its exit status, or -1 (then killed) when it is still running.
int wait_for(pid_t pid, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

// A child with stderr on a pipe the parent never reads, under `mpi`'s environment, writing lines
// until the guard's flag is set; SIGTERM once the pipe is surely full. Returns the child's exit
// status: 0 when it stopped on the flag, 3 when stderr was made non-blocking, -1 when it hung.
int stop_a_writer_blocked_on_a_full_pipe(bool mpi, bool fill) {
  int p[2];
  if (::pipe(p) != 0) return -3;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(p[1], STDERR_FILENO);
    ::close(p[0]);
    if (mpi) {
      ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
      ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    }
    const InterruptGuard guard("");
    const std::string line(1023, 'x');
    while (!interrupt_requested())
      if (fill) [[maybe_unused]]
        auto n = ::write(STDERR_FILENO, line.data(), line.size());
    const bool unblocked = (::fcntl(STDERR_FILENO, F_GETFL) & O_NONBLOCK) != 0;
    ::_exit(unblocked ? 3 : 0);
  }
  ::close(p[1]);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // 64 KiB fill in microseconds
  ::kill(pid, SIGTERM);
  const int status = wait_for(pid, std::chrono::seconds(10));
  ::close(p[0]);
  return status;
}

TEST(InterruptGuard, UnderAnMpiLaunchAStopUnblocksAWriteToAFullPipe) {
  EXPECT_EQ(stop_a_writer_blocked_on_a_full_pipe(/*mpi=*/true, /*fill=*/true), 3)
      << "-1: the child stayed blocked in write(2) after SIGTERM";
}

TEST(InterruptGuard, WithoutALaunchTheOutputsFlagsStayAsTheyWere) {
  EXPECT_EQ(stop_a_writer_blocked_on_a_full_pipe(/*mpi=*/false, /*fill=*/false), 0);
}

}  // namespace
}  // namespace mixtrain::core
