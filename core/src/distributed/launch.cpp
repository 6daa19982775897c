#include "distributed/launch.h"

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace mixtrain::core {

namespace {

std::optional<int> env_int(const char* name, int at_least) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  const std::string_view text(v);
  int out = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc() || end != text.data() + text.size() || out < at_least) return std::nullopt;
  return out;
}

}  // namespace

MpiLaunch detect_mpi_launch() {
  MpiLaunch l;
  for (const auto& [size, rank] : {std::pair{"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
                                   std::pair{"PMI_SIZE", "PMI_RANK"}}) {
    const auto n = env_int(size, 1);
    const auto r = env_int(rank, 0);
    if (n && r && *r < *n) {
      l.detected = true;
      l.world_size = *n;
      l.rank = *r;
      return l;
    }
  }
  return l;
}

std::string mpirun_line(int ranks, const std::string& command) {
  return "mpirun -np " + std::to_string(ranks) + " " + command;
}

}  // namespace mixtrain::core
