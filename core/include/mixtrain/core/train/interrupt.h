// Ctrl-C for a long run: the first SIGINT, SIGTERM or SIGHUP (a closed terminal) asks the training
// loop to stop cleanly (the current step finishes, then a final checkpoint and summary.json are
// written); a second one ends the process at once.
//
// Contract
// - take_stop_signals_on_a_watcher() blocks SIGINT, SIGTERM and SIGHUP (unless SIGHUP was ignored
//   at start: nohup keeps it so) in the calling thread, so in every thread it starts afterwards,
//   and starts a watcher thread that takes them with sigwait(). No other thread is interrupted by
//   them: a handler's frame is pushed at the interrupted thread's stack pointer, which oneDNN 2.x's
//   JIT f32 GEMM points into the heap while it runs (uxlfoundation/oneDNN#4845), so a Ctrl-C
//   there corrupted the heap (bench/RESULTS.md, session 80). Call it before any thread starts (the
//   command line does, first thing); a thread started earlier that still receives one passes it
//   to the watcher. Idempotent; a forked child starts its own watcher. A child process started
//   by exec would inherit the blocked mask.
// - An InterruptGuard makes the stop signals a request for its lifetime (it takes them on the
//   watcher first, if nothing did). One guard at a time per process. Without a guard a stop signal
//   ends the process by that signal, as its default action does.
// - The first signal under a guard sets the flag read by interrupt_requested() and prints one line
//   to stderr (the guard's `message`, a static string; training's by default); a second SIGINT
//   or SIGTERM ends the process at once by that signal, as a shell expects. A second SIGHUP is
//   ignored, from then on for the process's life: a hang-up arrives twice, and the clean stop it
//   asked for, and the exit after it, must finish.
// - Under an MPI launch (distributed/launch.h), the first signal also makes stdout and stderr
//   non-blocking where they are the launcher's pipes, sockets or terminals (Open MPI gives a rank
//   a pty of its own), never this process's controlling terminal, which a shell may share:
//   Open MPI's mpirun stops reading the ranks' output at Ctrl-C and sends SIGTERM only seconds
//   later, by which time a rank that logs has filled the pipe and blocks in write(2), where the
//   clean stop would never start. The guard's thread is then woken by a signal of its own
//   (SIGRTMIN, handled on an alternate signal stack, so its frame never lands at the stack
//   pointer), which ends that write. From then on a console line that does not fit is dropped
//   (the run folder's records keep every step).
// - interrupted_exit_code() is the exit status of a run stopped cleanly: 128 + the number of the
//   signal that asked (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), as a shell reports a
//   process that signal ended, so schedulers read the cause; summary.json's "interrupted" tells
//   the clean stop from a second signal's kill, which a shell reports with the same number.
#pragma once

namespace mixtrain::core {

void take_stop_signals_on_a_watcher();

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
