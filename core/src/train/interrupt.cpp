#include "mixtrain/core/train/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace mixtrain::core {

namespace {

// Lock-free atomic rather than volatile sig_atomic_t: the signal may be delivered to an OpenMP
// or CUDA thread while the training thread reads the flag.
std::atomic<int> g_requested{0};
static_assert(std::atomic<int>::is_always_lock_free);
struct sigaction g_previous_int {
}, g_previous_term{};

extern "C" void on_interrupt(int) {
  const int saved_errno = errno;  // the interrupted code may be about to read it
  g_requested.store(1);
  // The next SIGINT or SIGTERM meets the default disposition and ends the process.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGINT, &dfl, nullptr);
  sigaction(SIGTERM, &dfl, nullptr);
  static const char msg[] =
      "\ninterrupted: finishing this step, then writing a checkpoint and summary.json "
      "(press Ctrl-C again to quit at once)\n";
  // Nothing useful to do when stderr is gone.
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  errno = saved_errno;
}

}  // namespace

InterruptGuard::InterruptGuard() {
  g_requested.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, &g_previous_int);
  sigaction(SIGTERM, &sa, &g_previous_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
}

bool interrupt_requested() {
  return g_requested.load() != 0;
}

}  // namespace mixtrain::core
