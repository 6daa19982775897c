// Ctrl-C for a long run: the first SIGINT, SIGTERM or SIGHUP (a closed terminal) asks the training
// loop to stop cleanly (the current step finishes, then a final checkpoint and summary.json are
// written); a second one ends the process at once.
//
// Contract
// - An InterruptGuard installs the handlers for its lifetime and restores the previous ones when
//   destroyed. One guard at a time per process.
// - The first signal sets the flag read by interrupt_requested() and prints one line to stderr
//   (async-signal-safe write: the guard's `message`, a static string; training's by default),
//   then restores the default disposition of the signals, so a
//   second one terminates the process by that signal, as a shell expects. SIGHUP is watched only
//   when it was not ignored (nohup keeps ignoring it), and is ignored after the first signal: a
//   hang-up arrives twice, and the clean stop it asked for must finish (SIGHUP then stays ignored
//   after the guard too, while the process exits).
// - Under an MPI launch (distributed/launch.h), the first signal also makes stdout and stderr
//   non-blocking where they are the launcher's pipes, sockets or terminals (Open MPI gives a rank
//   a pty of its own), never this process's controlling terminal, which a shell may share:
//   Open MPI's mpirun stops reading the ranks' output at Ctrl-C and sends SIGTERM only seconds
//   later, by which time a rank that logs has filled the pipe and blocks in write(2), where the
//   clean stop would never start. From then on a console line that does not fit is dropped (the
//   run folder's records keep every step).
// - interrupted_exit_code() is the exit status of a run stopped cleanly: 128 + the number of the
//   signal that asked (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), as a shell reports a
//   process that signal ended, so schedulers read the cause; summary.json's "interrupted" tells
//   the clean stop from a second signal's kill, which a shell reports with the same number.
#pragma once

namespace mixtrain::core {

class InterruptGuard {
 public:
  // `message` (null: training's) must outlive the guard: a string literal.
  explicit InterruptGuard(const char* message = nullptr);
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};

// True once SIGINT, SIGTERM or a watched SIGHUP arrived under the current guard.
bool interrupt_requested();
// 128 + the first signal's number; 130 (SIGINT's) when none arrived.
int interrupted_exit_code();

}  // namespace mixtrain::core
