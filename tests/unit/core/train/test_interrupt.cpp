// InterruptGuard under an MPI launch: a rank whose stderr is a launcher's pipe that nobody reads
// any more (Open MPI's mpirun after Ctrl-C) blocks in write(2) once the pipe is full; the SIGTERM
// that mpirun sends later must still start the clean stop. Without a launch, the guard leaves the
// output's flags alone. A stop signal never interrupts the training thread: one that pointed its
// stack pointer into the heap, as oneDNN 2.x's JIT GEMM kernels do, would get a signal frame
// written there. Each case runs in a forked child (this executable has no other threads).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mixtrain/core/train/interrupt.h"

namespace mixtrain::core {
namespace {

// Waits up to `limit` for `pid`; its waitpid status, or nothing (then killed) when it is still
// running.
std::optional<int> wait_status(pid_t pid, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return std::nullopt;
}

// Its exit status, -2 when a signal ended it, or -1 (then killed) when it is still running.
int wait_for(pid_t pid, std::chrono::milliseconds limit) {
  const std::optional<int> status = wait_status(pid, limit);
  if (!status) return -1;
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : -2;
}

// A forked child whose stderr is the write end of a new pipe, as rank 0 of 2 under `mpi` (else
// with no launch in its environment), running `child` and then exiting with its status. The
// parent gets the child's pid and the pipe's read end in `read_end`; -1 when no pipe was made.
template <class Child>
pid_t spawn_with_stderr_on_a_pipe(bool mpi, int& read_end, Child child) {
  int p[2];
  if (::pipe(p) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(p[1], STDERR_FILENO);
    ::close(p[0]);
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK"})
      ::unsetenv(v);
    if (mpi) {
      ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
      ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    }
    ::_exit(child());
  }
  ::close(p[1]);
  read_end = p[0];
  return pid;
}

// A child with stderr on a pipe the parent never reads, under `mpi`'s environment, writing lines
// until the guard's flag is set; SIGTERM once the pipe is surely full. Returns the child's exit
// status: 0 when it stopped on the flag, 3 when stderr was made non-blocking, -1 when it hung.
int stop_a_writer_blocked_on_a_full_pipe(bool mpi, bool fill) {
  int read_end = -1;
  const pid_t pid = spawn_with_stderr_on_a_pipe(mpi, read_end, [fill] {
    const InterruptGuard guard("");
    const std::string line(1023, 'x');
    while (!interrupt_requested())
      if (fill) [[maybe_unused]]
        auto n = ::write(STDERR_FILENO, line.data(), line.size());
    const bool unblocked = (::fcntl(STDERR_FILENO, F_GETFL) & O_NONBLOCK) != 0;
    return unblocked ? 3 : 0;
  });
  if (pid < 0) return -3;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // 64 KiB fill in microseconds
  ::kill(pid, SIGTERM);
  const int status = wait_for(pid, std::chrono::seconds(10));
  ::close(read_end);
  return status;
}

// What a training run's first stop signal prints (the guard's default message), under a launch of
// two ranks or none. Read from the child's stderr, a pipe.
std::string first_stop_message(bool mpi) {
  int read_end = -1;
  const pid_t pid = spawn_with_stderr_on_a_pipe(mpi, read_end, [] {
    const InterruptGuard guard;
    while (!interrupt_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return 0;
  });
  if (pid < 0) return "(no pipe)";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(pid, SIGTERM);
  const int status = wait_for(pid, std::chrono::seconds(10));
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(read_end, buffer, sizeof buffer)) > 0;)
    text.append(buffer, static_cast<std::size_t>(n));
  ::close(read_end);
  return status == 0 ? text : "(the child ended with " + std::to_string(status) + ")";
}

// F16 of session 84's tester: a rank whose peer failed got mpirun's SIGTERM and promised a
// checkpoint it could not write. Under several ranks the message says when there is none.
TEST(InterruptGuard, UnderSeveralRanksTheStopMessageDoesNotPromiseACheckpoint) {
  const std::string alone = first_stop_message(/*mpi=*/false);
  EXPECT_NE(alone.find("finishing this step, then writing a checkpoint"), std::string::npos)
      << alone;
  EXPECT_EQ(alone.find("if a rank failed"), std::string::npos) << alone;
  const std::string ranks = first_stop_message(/*mpi=*/true);
  EXPECT_NE(ranks.find("finishing this step on every rank"), std::string::npos) << ranks;
  EXPECT_NE(ranks.find("if a rank failed, there is no checkpoint to write"), std::string::npos)
      << ranks;
}

TEST(InterruptGuard, UnderAnMpiLaunchAStopUnblocksAWriteToAFullPipe) {
  EXPECT_EQ(stop_a_writer_blocked_on_a_full_pipe(/*mpi=*/true, /*fill=*/true), 3)
      << "-1: the child stayed blocked in write(2) after SIGTERM";
}

TEST(InterruptGuard, WithoutALaunchTheOutputsFlagsStayAsTheyWere) {
  EXPECT_EQ(stop_a_writer_blocked_on_a_full_pipe(/*mpi=*/false, /*fill=*/false), 0);
}

#if defined(__x86_64__)
// A child whose guard's thread spins with its stack pointer inside a heap buffer full of a known
// pattern, as oneDNN's JIT f32 GEMM runs, until a thread of its own sees the stop asked; then
// checks the pattern. A SIGTERM to the process while it spins must leave the buffer untouched.
// Returns 0 when it did, 4 when a signal frame was written into it, -1 when the stop never came.
int stop_while_the_stack_pointer_is_in_the_heap() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const InterruptGuard guard("");
    std::atomic<int> seen{0};
    std::thread poller([&] {
      while (!interrupt_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      seen.store(1);
    });
    constexpr std::uint64_t kPattern = 0x5a5a'a5a5'5a5a'a5a5;
    std::vector<std::uint64_t> heap(64 * 1024 / 8, kPattern);
    void* top = heap.data() + heap.size();
    const int* flag = reinterpret_cast<const int*>(&seen);
    static_assert(sizeof(std::atomic<int>) == sizeof(int));
    asm volatile(
        "mov %%rsp, %%r12\n\t"
        "mov %[top], %%rsp\n\t"
        "1: pause\n\t"
        "cmpl $0, (%[flag])\n\t"
        "je 1b\n\t"
        "mov %%r12, %%rsp\n\t"
        :
        : [top] "r"(top), [flag] "r"(flag)
        : "r12", "memory", "cc");
    poller.join();
    for (const std::uint64_t word : heap)
      if (word != kPattern) ::_exit(4);
    ::_exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // spinning by then
  ::kill(pid, SIGTERM);
  return wait_for(pid, std::chrono::seconds(10));
}

TEST(InterruptGuard, AStopNeverWritesASignalFrameAtTheTrainingThreadsStackPointer) {
  EXPECT_EQ(stop_while_the_stack_pointer_is_in_the_heap(), 0)
      << "4: the signal was handled on the spinning thread, its frame written into the heap "
         "buffer its stack pointer held; -1: the stop never reached the flag";
}
#endif

// Without a guard a stop signal ends the process by that signal, as its default action does;
// under one, a second SIGINT does.
TEST(InterruptGuard, WithoutAGuardOrOnASecondSignalTheProcessEndsByIt) {
  for (const bool guarded : {false, true}) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      take_stop_signals_on_a_watcher();
      if (guarded) {
        const InterruptGuard guard("");
        for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::kill(pid, SIGINT);
    if (guarded) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ::kill(pid, SIGINT);
    }
    const std::optional<int> status = wait_status(pid, std::chrono::seconds(10));
    ASSERT_TRUE(status.has_value())
        << (guarded ? "a second SIGINT" : "SIGINT without a guard") << " left the process running";
    EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGINT)
        << (guarded ? "a second SIGINT" : "SIGINT without a guard") << ": status " << *status;
  }
}

}  // namespace
}  // namespace mixtrain::core
