// The process's and the host's memory as Linux reports it, for what `train` records and what
// `check` warns about (a CPU backend's tensors live in the process's resident set).
//
// Contract: each call reads the kernel's figures at that moment (getrusage, /proc); 0 where the
// kernel does not say (no /proc mounted, another OS). Never throws.
#pragma once

#include <cstddef>

namespace mixtrain::core {

// The process's resident high-water mark since it started (getrusage's ru_maxrss).
std::size_t process_peak_rss_bytes();

// The process's resident set now (/proc/self/statm).
std::size_t process_rss_bytes();

// What the host can still give without swapping (/proc/meminfo's MemAvailable).
std::size_t host_available_bytes();

// What this process could grow to from now: its resident set plus the host's available memory
// (0 when the kernel does not say what is available).
std::size_t process_memory_limit();

}  // namespace mixtrain::core
