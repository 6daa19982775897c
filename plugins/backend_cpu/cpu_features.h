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
  std::string model_name;        // /proc/cpuinfo "model name"
  std::string vendor;            // CPUID's vendor string: "GenuineIntel", "AuthenticAMD", ...
  std::size_t memory_bytes = 0;  // MemTotal
  std::vector<std::string> features;
  bool has(const std::string& feature) const;
};

CpuInfo detect_cpu();

// Whether oneDNN's bf16 kernels (GEMM and convolution) are the `automatic` choice over exact
// emulation (decode to fp32 + the fp32 kernel) on this CPU: with AMX-BF16, or AVX512-BF16 on an
// AMD CPU. It depends on the vendor, by measurement (bench/RESULTS.md): on Intel AVX512-BF16
// without AMX (Sapphire Rapids with AMX hidden by the VM) oneDNN 2.6's brg:avx512_core_bf16 matmul
// ran ~0.6x the fp32 matmul and ~0.8x emulation on the wide-MLP shapes; on AMD Zen 4 the wide
// GPT's bf16 step took 582 ms with it against 973 ms emulated (issue 14). Without AVX512-BF16
// oneDNN emulates the bf16 dot products on AVX-512 FMAs, which buys nothing over decoding.
bool onednn_bf16_preferred(const CpuInfo& cpu);
std::size_t available_memory_bytes();  // MemAvailable, 0 when unknown

// Whether this process may run AMX-BF16 tile instructions: the CPU has AMX-BF16 (detect_cpu) and
// the kernel granted the tile data state (arch_prctl), asked once; and no AmxTilesRefused lives.
// Compiled without AMX or AVX-512, so any CPU may call it.
bool amx_tiles_usable();

// While one lives, amx_tiles_usable() is false: tests run the paths beside the tile products'.
class AmxTilesRefused {
 public:
  AmxTilesRefused();
  ~AmxTilesRefused();
  AmxTilesRefused(const AmxTilesRefused&) = delete;
  AmxTilesRefused& operator=(const AmxTilesRefused&) = delete;
};

}  // namespace mixtrain::backend_cpu
