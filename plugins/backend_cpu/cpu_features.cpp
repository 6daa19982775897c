#include "cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace mixtrain::backend_cpu {

namespace {

struct Regs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf) {
  Regs r;
  if (__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx) == 0) return {};
  return r;
}

std::uint64_t xcr0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned reg, int b) {
  return ((reg >> b) & 1u) != 0;
}

std::string cpuinfo_field(const std::string& name) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      return value;
    }
  }
  return {};
}

std::size_t meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  std::size_t kib = 0;
  std::string unit;
  while (in >> name >> kib >> unit)
    if (name == key + ":") return kib * 1024;
  return 0;
}

}  // namespace

bool CpuInfo::has(const std::string& feature) const {
  return std::find(features.begin(), features.end(), feature) != features.end();
}

std::size_t available_memory_bytes() {
  return meminfo_bytes("MemAvailable");
}

CpuInfo detect_cpu() {
  CpuInfo info;
  info.model_name = cpuinfo_field("model name");
  if (info.model_name.empty()) info.model_name = "unknown x86-64 CPU";
  info.memory_bytes = meminfo_bytes("MemTotal");

  const Regs l0 = cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor, &l0.ebx, 4);
  std::memcpy(vendor + 4, &l0.edx, 4);
  std::memcpy(vendor + 8, &l0.ecx, 4);
  info.vendor = vendor;

  const Regs l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.ecx, 27);
  const std::uint64_t xcr = osxsave ? xcr0() : 0;
  const bool os_avx = (xcr & 0x6u) == 0x6u;                 // XMM + YMM state
  const bool os_avx512 = os_avx && (xcr & 0xE0u) == 0xE0u;  // opmask + ZMM state
  const bool os_amx = (xcr & 0x60000u) == 0x60000u;         // XTILECFG + XTILEDATA
  const Regs l7 = cpuid(7, 0);
  const Regs l7s1 = cpuid(7, 1);

  auto add = [&info](bool present, const char* name) {
    if (present) info.features.emplace_back(name);
  };
  add(bit(l1.edx, 26), "sse2");
  add(bit(l1.ecx, 19), "sse4_1");
  add(os_avx && bit(l1.ecx, 28), "avx");
  add(os_avx && bit(l1.ecx, 12), "fma");
  add(os_avx && bit(l1.ecx, 29), "f16c");
  add(os_avx && bit(l7.ebx, 5), "avx2");
  add(os_avx && bit(l7s1.eax, 4), "avx_vnni");
  add(os_avx512 && bit(l7.ebx, 16), "avx512f");
  add(os_avx512 && bit(l7.ebx, 17), "avx512dq");
  add(os_avx512 && bit(l7.ebx, 30), "avx512bw");
  add(os_avx512 && bit(l7.ebx, 31), "avx512vl");
  add(os_avx512 && bit(l7.ecx, 11), "avx512_vnni");
  add(os_avx512 && bit(l7s1.eax, 5), "avx512_bf16");
  add(os_avx512 && bit(l7.edx, 23), "avx512_fp16");

  // AMX needs the CPU, the XCR0 tile state and a kernel that exposes it (flags in cpuinfo).
  std::set<std::string> kernel_flags;
  {
    std::istringstream flags(cpuinfo_field("flags"));
    std::string f;
    while (flags >> f) kernel_flags.insert(f);
  }
  add(os_amx && bit(l7.edx, 24) && kernel_flags.count("amx_tile") != 0, "amx_tile");
  add(os_amx && bit(l7.edx, 22) && kernel_flags.count("amx_bf16") != 0, "amx_bf16");
  add(os_amx && bit(l7.edx, 25) && kernel_flags.count("amx_int8") != 0, "amx_int8");
  return info;
}

namespace {
std::atomic<int> amx_refusals{0};
}  // namespace

bool amx_tiles_usable() {
  // Linux's request for the AMX tile data state (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA,
  // asm/prctl.h): a process asks before its first tile instruction, or that instruction faults.
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtileData = 18;
  static const bool granted = detect_cpu().has("amx_bf16") &&
                              syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
  return granted && amx_refusals.load(std::memory_order_relaxed) == 0;
}

AmxTilesRefused::AmxTilesRefused() {
  amx_refusals.fetch_add(1, std::memory_order_relaxed);
}
AmxTilesRefused::~AmxTilesRefused() {
  amx_refusals.fetch_sub(1, std::memory_order_relaxed);
}

bool onednn_bf16_preferred(const CpuInfo& cpu) {
  return cpu.has("amx_bf16") || (cpu.has("avx512_bf16") && cpu.vendor == "AuthenticAMD");
}

}  // namespace mixtrain::backend_cpu
