// The PyPI peers of the interop tests: a venv made by `cmake/setup-debian.sh --tests` that sees
// Debian's torch and numpy and adds tensorboard, transformers 4.30.2, ml_dtypes 0.5.1 and peft
// 0.4.0. Its path is the setup script's: $MIXTRAIN_PEERS_VENV, else
// $XDG_CACHE_HOME/mixtrain/peers, else ~/.cache/mixtrain/peers. Tests that need a peer fall back
// to an offline check (or skip) when it is missing and say so (peers_missing_message).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace mixtrain::test {

inline std::filesystem::path peers_venv() {
  if (const char* v = std::getenv("MIXTRAIN_PEERS_VENV"); v && *v) return v;
  if (const char* c = std::getenv("XDG_CACHE_HOME"); c && *c)
    return std::filesystem::path(c) / "mixtrain" / "peers";
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home ? home : "/nonexistent") / ".cache" / "mixtrain" / "peers";
}

inline std::string peers_python() {
  return (peers_venv() / "bin" / "python").string();
}

// Whether the peers' python imports every module of `modules` ("tensorboard", "transformers,
// torch"). Not cached: each caller asks once.
inline bool peers_import(const std::string& modules) {
  const auto py = peers_python();
  if (!std::filesystem::exists(py)) return false;
  return std::system((py + " -c 'import " + modules + "' >/dev/null 2>&1").c_str()) == 0;
}

inline std::string peers_missing_message(const std::string& modules, const std::string& what) {
  return peers_python() + " cannot import " + modules +
         " (bash cmake/setup-debian.sh --tests installs them from PyPI); " + what;
}

}  // namespace mixtrain::test
