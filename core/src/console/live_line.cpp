#include "mixtrain/core/console/live_line.h"

#include <cstdio>

namespace mixtrain::core {

namespace {

// "\r\033[K": back to column 0, erase to the end of the line.
void draw(const std::string& text) {
  std::fprintf(stderr, "\r\033[K%s", text.c_str());
  std::fflush(stderr);
}

void erase() {
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
}

}  // namespace

LiveLine& LiveLine::instance() {
  static LiveLine* line = new LiveLine();  // never destroyed: logging may go on until exit
  return *line;
}

void LiveLine::show(std::string text) {
  std::lock_guard lock(mutex_);
  text_ = std::move(text);
  draw(text_);
}

void LiveLine::finish() {
  std::lock_guard lock(mutex_);
  if (text_.empty()) return;
  std::fputc('\n', stderr);
  std::fflush(stderr);
  text_.clear();
}

void LiveLine::around_output(const std::function<void()>& write) {
  std::lock_guard lock(mutex_);
  if (text_.empty()) {
    write();
    return;
  }
  erase();
  write();
  draw(text_);
}

}  // namespace mixtrain::core
