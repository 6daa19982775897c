// Process and host memory figures; see process_memory.h.
#include "train/process_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace mixtrain::core {

std::size_t process_peak_rss_bytes() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<std::size_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

std::size_t process_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  std::size_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? resident * static_cast<std::size_t>(page) : 0;
}

std::size_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string name, unit;
  std::size_t kib = 0;
  while (in >> name >> kib >> unit)
    if (name == "MemAvailable:") return kib * 1024;
  return 0;
}

std::size_t process_memory_limit() {
  const std::size_t available = host_available_bytes();
  return available > 0 ? process_rss_bytes() + available : 0;
}

}  // namespace mixtrain::core
