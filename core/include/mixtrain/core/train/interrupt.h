// Ctrl-C for a long run: the first SIGINT, SIGTERM or SIGHUP (a closed terminal) asks the training
// loop to stop cleanly (the current step finishes, then a final checkpoint and summary.json are
// written); a second one ends the process at once.
//
// Contract
// - An InterruptGuard installs the handlers for its lifetime and restores the previous ones when
//   destroyed. One guard at a time per process.
// - The first signal sets the flag read by interrupt_requested() and prints one line to stderr
//   (async-signal-safe write), then restores the default disposition of the signals, so a
//   second one terminates the process by that signal, as a shell expects. SIGHUP is watched only
//   when it was not ignored (nohup keeps ignoring it), and is ignored after the first signal: a
//   hang-up arrives twice, and the clean stop it asked for must finish.
// - kInterruptedExitCode (130 = 128 + SIGINT) is the exit status of a run stopped cleanly.
#pragma once

namespace mixtrain::core {

inline constexpr int kInterruptedExitCode = 130;

class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};

// True once SIGINT, SIGTERM or a watched SIGHUP arrived under the current guard.
bool interrupt_requested();

}  // namespace mixtrain::core
