#include "mixtrain/core/train/interrupt.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <thread>

#include "distributed/launch.h"

namespace mixtrain::core {

namespace {

// Why the stop signals are taken by a watcher thread (sigwait), blocked in every other thread,
// rather than by a handler on whichever thread the kernel picks: a handler's frame is pushed at
// the interrupted thread's stack pointer, and oneDNN 2.x's JIT f32 GEMM kernels point rsp into a
// heap buffer while they run (uxlfoundation/oneDNN#4845, fixed in 3.11.1; Debian 12 ships 2.6).
// A Ctrl-C landing there wrote the frame into the heap: glibc aborted ("corrupted size vs.
// prev_size") a step later, and the run lost its checkpoint (bench/RESULTS.md, session 80).

std::atomic<int> g_requested{0};  // the first stop signal's number under the current guard
std::atomic<bool> g_guarded{false};
std::atomic<bool> g_stopped{false};  // a stop was asked under some guard (SIGHUP stays ignored)
static_assert(std::atomic<int>::is_always_lock_free);
// What the first signal prints: the guard's owner says what a clean stop does.
constexpr char kTrainingMessage[] =
    "\ninterrupted: finishing this step, then writing a checkpoint and summary.json "
    "(press Ctrl-C again to quit at once)\n";
// The same under a launch of several ranks: a rank cannot tell a Ctrl-C, which every rank gets,
// from the SIGTERM mpirun sends when another rank failed, and after that no checkpoint can be
// written (its optimizer gather, or the step's reductions, need the lost rank).
constexpr char kRanksTrainingMessage[] =
    "\ninterrupted: finishing this step on every rank, then writing a checkpoint and summary.json "
    "(press Ctrl-C again to quit at once); if a rank failed, there is no checkpoint to write and "
    "the run keeps its newest one\n";
std::atomic<const char*> g_message{kTrainingMessage};
// Under an MPI launch (the contract): stdout and stderr, each when it is a launcher's pipe,
// socket or terminal (Open MPI gives a rank a pty of its own for stdout), never this process's
// controlling terminal, which a shell may share. Decided when the guard is made.
std::atomic<bool> g_unblock[2] = {false, false};
// The guard's thread, woken by kWakeSignal after its output was made non-blocking: a write(2)
// it is blocked in on a full pipe then returns.
std::atomic<pthread_t> g_guard_thread{};
const int kWakeSignal = SIGRTMIN;
std::atomic<bool> g_wake{false};  // its handler is installed, on a signal stack

bool launcher_output(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) return true;
  if (!S_ISCHR(st.st_mode) || ::isatty(fd) == 0) return false;
  const int tty = ::open("/dev/tty", O_RDONLY | O_NOCTTY | O_CLOEXEC);
  if (tty < 0) return true;  // no controlling terminal: this one is nobody's session's
  struct stat controlling {};
  const bool same = ::fstat(tty, &controlling) == 0 && controlling.st_rdev == st.st_rdev;
  ::close(tty);
  return !same;
}

// The stop signals this process takes: SIGINT, SIGTERM, and SIGHUP unless it was ignored at
// start (nohup), in which case it stays ignored.
struct StopSet {
  sigset_t set;
  bool hup = false;
};

StopSet stop_set() {
  StopSet s;
  sigemptyset(&s.set);
  sigaddset(&s.set, SIGINT);
  sigaddset(&s.set, SIGTERM);
  struct sigaction hup {};
  sigaction(SIGHUP, nullptr, &hup);
  s.hup = hup.sa_handler != SIG_IGN;
  if (s.hup) sigaddset(&s.set, SIGHUP);
  return s;
}

// Ends the process by `signal` as its default action does (a shell then reports it so): the
// watcher alone may take it, so it unblocks it for itself and raises it.
[[noreturn]] void die_by(int signal) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(signal, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signal);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  ::raise(signal);
  ::_exit(128 + signal);  // not reached: the default action of a stop signal ends the process
}

void watch(StopSet stops) {
  for (;;) {
    int signal = 0;
    if (sigwait(&stops.set, &signal) != 0) continue;
    // A hang-up comes twice (the shell forwards one, the kernel sends one when the session leader
    // exits): the second must not end the checkpoint the first one asked for, nor the exit after.
    if (signal == SIGHUP && g_stopped.load()) continue;
    int none = 0;
    if (!g_guarded.load() || !g_requested.compare_exchange_strong(none, signal)) die_by(signal);
    g_stopped.store(true);
    bool woke = false;
    for (const int fd : {STDOUT_FILENO, STDERR_FILENO})
      if (g_unblock[fd - STDOUT_FILENO].load()) {
        const int flags = ::fcntl(fd, F_GETFL);
        if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
        woke = true;
      }
    if (woke && g_wake.load()) pthread_kill(g_guard_thread.load(), kWakeSignal);
    const char* msg = g_message.load();
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, std::strlen(msg));
  }
}

// The wake-up's handler does nothing: its delivery ends a blocked write(2), which SA_RESTART
// restarts, non-blocking now. It runs on an alternate stack of its own (SA_ONSTACK), so its frame
// never lands where the thread's stack pointer was (the oneDNN kernels above).
extern "C" void on_wake(int) {}

// A signal stack for the calling thread, large enough for a frame with AMX's tile state (about
// 11 KiB on Sapphire Rapids): four times the kernel's minimum, at least 64 KiB. Kept for the
// process's life (one training thread at a time). False when none could be had.
bool give_this_thread_a_signal_stack() {
  static std::mutex mutex;
  static void* stack = nullptr;
  static std::size_t size = 0;
  const std::lock_guard lock(mutex);
  if (stack == nullptr) {
    size = std::max<std::size_t>(
        64 * 1024, 4 * static_cast<std::size_t>(std::max(0L, sysconf(_SC_MINSIGSTKSZ))));
    stack = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stack == MAP_FAILED) {
      stack = nullptr;
      return false;
    }
  }
  stack_t ss{};
  ss.ss_sp = stack;
  ss.ss_size = size;
  return sigaltstack(&ss, nullptr) == 0;
}

// The watcher's thread, for the safety net below.
std::atomic<pthread_t> g_watcher_thread{};

// A thread started before the watcher does not block the stop signals, so one may still land on
// it: passed on to the watcher, which takes it as its own (pthread_kill is async-signal-safe).
// The command line takes the signals before it starts any thread, so there this never runs.
extern "C" void forward_to_watcher(int signal) {
  const int saved_errno = errno;
  pthread_kill(g_watcher_thread.load(), signal);
  errno = saved_errno;
}

// The watcher of this process (a fork's child starts its own: the parent's did not follow).
std::atomic<pid_t> g_watcher_pid{0};

}  // namespace

void take_stop_signals_on_a_watcher() {
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  if (g_watcher_pid.load() == ::getpid()) return;
  const StopSet stops = stop_set();
  // Blocked here first: every thread this one starts from now on inherits the mask.
  pthread_sigmask(SIG_BLOCK, &stops.set, nullptr);
  std::thread watcher(watch, stops);
  g_watcher_thread.store(watcher.native_handle());
  watcher.detach();
  struct sigaction forward {};
  forward.sa_handler = forward_to_watcher;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  for (const int signal : {SIGINT, SIGTERM}) sigaction(signal, &forward, nullptr);
  if (stops.hup) sigaction(SIGHUP, &forward, nullptr);
  g_watcher_pid.store(::getpid());
}

InterruptGuard::InterruptGuard(const char* message) {
  take_stop_signals_on_a_watcher();
  g_requested.store(0);
  const MpiLaunch launch = detect_mpi_launch();
  const bool launched = launch.detected;
  g_message.store(message != nullptr      ? message
                  : launch.world_size > 1 ? kRanksTrainingMessage
                                          : kTrainingMessage);
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO})
    g_unblock[fd - STDOUT_FILENO].store(launched && launcher_output(fd));
  if ((g_unblock[0].load() || g_unblock[1].load()) && give_this_thread_a_signal_stack()) {
    struct sigaction wake {};
    wake.sa_handler = on_wake;
    sigemptyset(&wake.sa_mask);
    wake.sa_flags = SA_RESTART | SA_ONSTACK;
    g_wake.store(sigaction(kWakeSignal, &wake, nullptr) == 0);
  }
  g_guard_thread.store(pthread_self());
  g_guarded.store(true);
}

InterruptGuard::~InterruptGuard() {
  g_guarded.store(false);
}

bool interrupt_requested() {
  return g_requested.load() != 0;
}

int interrupted_exit_code() {
  const int signal = g_requested.load();
  return 128 + (signal != 0 ? signal : SIGINT);
}

}  // namespace mixtrain::core
