// The terminal's live status line: the training progress line, redrawn in place with '\r'.
//
// Contract
// - One process-wide line on stderr, safe to use from several threads.
// - show() replaces the line's text and draws it; finish() ends it with a newline (the text stays
//   on screen) and forgets it.
// - around_output(f) erases the line, runs f (which writes to stderr: the log sink), then redraws
//   the line, so a log line never lands on the progress text. With no line shown it only runs f.
// - Only a caller that knows stderr is a terminal calls show(); piped output never gets '\r'.
#pragma once

#include <functional>
#include <mutex>
#include <string>

namespace mixtrain::core {

class LiveLine {
 public:
  static LiveLine& instance();

  void show(std::string text);
  void finish();
  void around_output(const std::function<void()>& write);

 private:
  LiveLine() = default;
  std::mutex mutex_;
  std::string text_;  // empty: no line shown
};

}  // namespace mixtrain::core
