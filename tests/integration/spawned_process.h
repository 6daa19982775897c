// A `mixtrain` process started in the background, for tests that signal it while it trains
// (Ctrl-C is SIGINT): stdout and stderr go to files, stdin is /dev/null, and the arguments are
// split at spaces (no quoting). The destructor kills and reaps a process still running.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace mixtrain::test {

inline std::vector<std::string> split_words(const std::string& args) {
  std::vector<std::string> out;
  std::istringstream in(args);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// In a forked child: becomes `mixtrain ARGS` (split at spaces), or exits 127 when it cannot.
[[noreturn]] inline void exec_mixtrain(const std::string& args) {
  auto words = split_words(args);
  std::vector<char*> argv;
  std::string exe = MIXTRAIN_EXE;
  argv.push_back(exe.data());
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  ::execv(exe.c_str(), argv.data());
  ::_exit(127);
}

class Spawned {
 public:
  // `cwd`: the folder it runs in (empty: the test's).
  Spawned(const std::string& args, const std::filesystem::path& out,
          const std::filesystem::path& err, const std::filesystem::path& cwd = {}) {
    pid_ = ::fork();
    if (pid_ == 0) {
      if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(127);
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int in = ::open("/dev/null", O_RDONLY);
      if (o < 0 || e < 0 || in < 0) ::_exit(127);
      ::dup2(in, 0);
      ::dup2(o, 1);
      ::dup2(e, 2);
      exec_mixtrain(args);
    }
  }
  ~Spawned() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }
  // The wait status, or nullopt when the process still runs after `limit` (it is then killed).
  std::optional<int> wait(std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// Polls until `ready` holds or `limit` passes.
template <class F>
bool eventually(F ready, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ready();
}

}  // namespace mixtrain::test
