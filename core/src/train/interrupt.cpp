#include "mixtrain/core/train/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "distributed/launch.h"

namespace mixtrain::core {

namespace {

// Lock-free atomic rather than volatile sig_atomic_t: the signal may be delivered to an OpenMP
// or CUDA thread while the training thread reads the flag.
std::atomic<int> g_requested{0};
static_assert(std::atomic<int>::is_always_lock_free);
struct sigaction g_previous_int {
}, g_previous_term{}, g_previous_hup{};
bool g_watch_hup = false;
// Under an MPI launch (the contract): stdout and stderr, each when it is a launcher's pipe,
// socket or terminal (Open MPI gives a rank a pty of its own for stdout), never this process's
// controlling terminal, which a shell may share. Decided when the guard is made, not in the
// handler, where opening /dev/tty is not safe.
bool g_unblock[2] = {false, false};

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
// What the first signal prints: the guard's owner says what a clean stop does.
constexpr char kTrainingMessage[] =
    "\ninterrupted: finishing this step, then writing a checkpoint and summary.json "
    "(press Ctrl-C again to quit at once)\n";
std::atomic<const char*> g_message{kTrainingMessage};

extern "C" void on_interrupt(int signal) {
  const int saved_errno = errno;  // the interrupted code may be about to read it
  int none = 0;
  g_requested.compare_exchange_strong(none, signal);  // the first signal's number
  // The next SIGINT or SIGTERM meets the default disposition and ends the process.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGINT, &dfl, nullptr);
  sigaction(SIGTERM, &dfl, nullptr);
  // A hang-up comes twice (the shell forwards one, the kernel sends one when the session leader
  // exits): the second must not end the checkpoint the first one asked for.
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  if (g_watch_hup) sigaction(SIGHUP, &ign, nullptr);
  // fcntl is async-signal-safe. A write blocked on a full pipe restarts (SA_RESTART) and,
  // non-blocking now, returns at once.
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO})
    if (g_unblock[fd - STDOUT_FILENO]) {
      const int flags = ::fcntl(fd, F_GETFL);
      if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    }
  const char* msg = g_message.load();
  // Nothing useful to do when stderr is gone.
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, std::strlen(msg));
  errno = saved_errno;
}

}  // namespace

InterruptGuard::InterruptGuard(const char* message) {
  g_requested.store(0);
  g_message.store(message != nullptr ? message : kTrainingMessage);
  const bool launched = detect_mpi_launch().detected;
  for (const int fd : {STDOUT_FILENO, STDERR_FILENO})
    g_unblock[fd - STDOUT_FILENO] = launched && launcher_output(fd);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, &g_previous_int);
  sigaction(SIGTERM, &sa, &g_previous_term);
  // A closed terminal (an ssh session that dropped) sends SIGHUP: stop as for Ctrl-C, with a
  // checkpoint, rather than die mid-step. Under nohup SIGHUP is ignored, and stays so.
  sigaction(SIGHUP, nullptr, &g_previous_hup);
  g_watch_hup = g_previous_hup.sa_handler != SIG_IGN;
  if (g_watch_hup) sigaction(SIGHUP, &sa, nullptr);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
  // After a stop, a hang-up's second SIGHUP may still come while the process finishes and exits:
  // it stays ignored, or it would kill the clean stop at its last moment.
  if (g_watch_hup && g_requested.load() == 0) sigaction(SIGHUP, &g_previous_hup, nullptr);
}

bool interrupt_requested() {
  return g_requested.load() != 0;
}

int interrupted_exit_code() {
  const int signal = g_requested.load();
  return 128 + (signal != 0 ? signal : SIGINT);
}

}  // namespace mixtrain::core
