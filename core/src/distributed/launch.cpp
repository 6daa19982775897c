#include "distributed/launch.h"

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string>
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
      l.open_mpi = std::string_view(size).starts_with("OMPI_");
      // Open MPI 5 launches through PRRTE, which sets no ORTE variables.
      l.orte = l.open_mpi && std::getenv("OMPI_MCA_orte_hnp_uri") != nullptr;
      l.world_size = *n;
      l.rank = *r;
      return l;
    }
  }
  return l;
}

std::string stop_grace_warning(const MpiLaunch& launch) {
  if (!launch.orte || launch.world_size < 2) return {};
  const auto grace = env_int("OMPI_MCA_odls_base_sigkill_timeout", 0);
  if (grace && *grace >= kStopGraceSeconds) return {};
  const std::string t = std::to_string(grace.value_or(1));
  const std::string g = std::to_string(kStopGraceSeconds);
  return "Ctrl-C would lose this run: Open MPI's mpirun sends the ranks SIGTERM " + t +
         " s after Ctrl-C and SIGKILL " + t +
         " s after that (odls_base_sigkill_timeout), before the step and its checkpoint can "
         "finish. Launch with `mpirun --mca odls_base_sigkill_timeout " +
         g + " ...` (or export OMPI_MCA_odls_base_sigkill_timeout=" + g +
         "): the ranks then start their clean stop " + g + " s after Ctrl-C and have " + g +
         " s for it; or stop them at once with SIGINT to the ranks themselves (pkill -INT -f "
         "'mixtrain train'), which every rank follows after the same step";
}

std::string mpirun_line(int ranks, const std::string& command) {
  return "mpirun -np " + std::to_string(ranks) + " " + command;
}

}  // namespace mixtrain::core
