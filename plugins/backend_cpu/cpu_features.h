// Run-time description of the host CPU, for capabilities().
//
// Contract: nothing is assumed at compile time. ISA features come from cpuid, gated by what the
// OS enables in XCR0 (xgetbv); AMX is reported only when cpuid says so *and* the kernel lists the
// amx_* flags in /proc/cpuinfo. Names follow /proc/cpuinfo spelling ("avx512_bf16", "amx_bf16").
// Never throws: unreadable files give "unknown" / 0.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mixtrain::backend_cpu {

struct CpuInfo {
  std::string model_name;          // /proc/cpuinfo "model name"
  std::string vendor;              // CPUID's vendor string: "GenuineIntel", "AuthenticAMD", ...
  std::size_t memory_bytes = 0;    // MemTotal
  std::vector<std::string> features;
  bool has(const std::string& feature) const;
};

CpuInfo detect_cpu();
std::size_t available_memory_bytes();  // MemAvailable, 0 when unknown

}  // namespace mixtrain::backend_cpu
