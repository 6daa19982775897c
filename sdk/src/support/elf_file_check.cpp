#include "mixtrain/sdk/support/elf_file_check.h"

#include <elf.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace mixtrain::sdk {

namespace {

// Only the host's own class is accepted, so only its header layout is ever read.
constexpr bool kHost64 = sizeof(void*) == 8;
using Ehdr = std::conditional_t<kHost64, Elf64_Ehdr, Elf32_Ehdr>;
using Phdr = std::conditional_t<kHost64, Elf64_Phdr, Elf32_Phdr>;
constexpr unsigned char kHostClass = kHost64 ? ELFCLASS64 : ELFCLASS32;
constexpr unsigned char kHostData =
    std::endian::native == std::endian::little ? ELFDATA2LSB : ELFDATA2MSB;

#if defined(__x86_64__)
constexpr unsigned kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr unsigned kHostMachine = EM_AARCH64;
#elif defined(__i386__)
constexpr unsigned kHostMachine = EM_386;
#elif defined(__arm__)
constexpr unsigned kHostMachine = EM_ARM;
#elif defined(__riscv)
constexpr unsigned kHostMachine = EM_RISCV;
#elif defined(__powerpc64__)
constexpr unsigned kHostMachine = EM_PPC64;
#elif defined(__s390x__)
constexpr unsigned kHostMachine = EM_S390;
#else
#error "elf_file_check.cpp: add this architecture's ELF machine (EM_*) constant"
#endif

std::string machine_name(unsigned m) {
  switch (m) {
    case EM_X86_64:
      return "x86-64";
    case EM_AARCH64:
      return "AArch64";
    case EM_386:
      return "x86 (32-bit)";
    case EM_ARM:
      return "ARM (32-bit)";
    case EM_RISCV:
      return "RISC-V";
    case EM_PPC64:
      return "PowerPC 64";
    case EM_S390:
      return "s390";
    default:
      return "ELF machine " + std::to_string(m);
  }
}

std::string segment_name(std::uint32_t type) {
  switch (type) {
    case PT_LOAD:
      return "PT_LOAD";
    case PT_DYNAMIC:
      return "PT_DYNAMIC";
    case PT_INTERP:
      return "PT_INTERP";
    case PT_NOTE:
      return "PT_NOTE";
    case PT_PHDR:
      return "PT_PHDR";
    case PT_TLS:
      return "PT_TLS";
    case PT_GNU_EH_FRAME:
      return "PT_GNU_EH_FRAME";
    case PT_GNU_RELRO:
      return "PT_GNU_RELRO";
    default:
      return "type " + std::to_string(type);
  }
}

[[noreturn]] void fail(const std::string& what) {
  throw sdk::PluginError(what);
}

// [offset, offset + length) lies inside a file of `size` bytes; written so nothing overflows.
bool inside(std::uint64_t offset, std::uint64_t length, std::uint64_t size) {
  return offset <= size && length <= size - offset;
}

const char* kTruncated = ": truncated (a copy still in progress?) or corrupt";

}  // namespace

void check_elf_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open the file for reading");
  // The size is read once: a file that grows afterwards (a copy in progress) is judged by this
  // size, and headers that can no longer be read are reported below.
  in.seekg(0, std::ios::end);
  const auto end = in.tellg();
  if (end < 0) fail("cannot read the file's size");
  const auto size = static_cast<std::uint64_t>(end);
  in.seekg(0);

  if (size == 0) fail("the file is empty (a copy still in progress?)");
  unsigned char ident[EI_NIDENT] = {};
  const auto ident_bytes = std::min<std::uint64_t>(size, EI_NIDENT);
  if (!in.read(reinterpret_cast<char*>(ident), static_cast<std::streamsize>(ident_bytes)))
    fail("cannot read the ELF header");
  if (ident_bytes < SELFMAG || std::memcmp(ident, ELFMAG, SELFMAG) != 0)
    fail("not an ELF shared library: the file does not start with the ELF magic bytes");
  if (size < sizeof(Ehdr))
    fail("the file is " + std::to_string(size) + " bytes, shorter than an ELF header (" +
         std::to_string(sizeof(Ehdr)) + " bytes)" + kTruncated);
  if (ident[EI_CLASS] != kHostClass)
    fail(std::string("ELF class mismatch: the library is ") +
         (ident[EI_CLASS] == ELFCLASS32   ? "32-bit"
          : ident[EI_CLASS] == ELFCLASS64 ? "64-bit"
                                          : "of unknown class " + std::to_string(ident[EI_CLASS])) +
         ", this mixtrain is " + (kHost64 ? "64-bit" : "32-bit"));
  if (ident[EI_DATA] != kHostData)
    fail(std::string("ELF byte order mismatch: the library is ") +
         (ident[EI_DATA] == ELFDATA2LSB ? "little-endian"
          : ident[EI_DATA] == ELFDATA2MSB
              ? "big-endian"
              : "of unknown byte order " + std::to_string(ident[EI_DATA])) +
         ", this host is " + (kHostData == ELFDATA2LSB ? "little-endian" : "big-endian"));
  if (ident[EI_VERSION] != EV_CURRENT)
    fail("unknown ELF version " + std::to_string(ident[EI_VERSION]) + kTruncated);

  Ehdr eh{};
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(&eh), sizeof eh)) fail("cannot read the ELF header");
  if (eh.e_type != ET_DYN)
    fail("not a shared library: ELF file type " + std::to_string(eh.e_type) + " (expected ET_DYN)");
  if (eh.e_machine != kHostMachine)
    fail("built for " + machine_name(eh.e_machine) + ", this host is " +
         machine_name(kHostMachine));
  if (eh.e_phnum == 0) fail("the ELF header lists no program headers" + std::string(kTruncated));
  if (eh.e_phentsize != sizeof(Phdr))
    fail("program header entries are " + std::to_string(eh.e_phentsize) + " bytes, expected " +
         std::to_string(sizeof(Phdr)) + kTruncated);
  const std::uint64_t table = std::uint64_t{eh.e_phnum} * sizeof(Phdr);
  if (!inside(eh.e_phoff, table, size))
    fail("the program header table (" + std::to_string(table) + " bytes from offset " +
         std::to_string(eh.e_phoff) + ") reaches past the end of the file (" +
         std::to_string(size) + " bytes)" + kTruncated);

  std::vector<Phdr> ph(eh.e_phnum);
  in.seekg(static_cast<std::streamoff>(eh.e_phoff));
  if (!in.read(reinterpret_cast<char*>(ph.data()), static_cast<std::streamsize>(table)))
    fail("cannot read the program headers (the file shrank while it was read?)");
  for (std::size_t i = 0; i < ph.size(); ++i) {
    const auto& p = ph[i];
    if (p.p_type == PT_NULL) continue;
    // The loader maps a loadable segment's first page even when it takes no bytes of the file.
    if (p.p_filesz == 0 && p.p_type == PT_LOAD && p.p_offset > size)
      fail("segment " + std::to_string(i) + " (" + segment_name(p.p_type) + ") starts at offset " +
           std::to_string(p.p_offset) + " but the file has only " + std::to_string(size) +
           " bytes" + kTruncated);
    if (p.p_filesz == 0) continue;
    if (!inside(p.p_offset, p.p_filesz, size))
      fail("segment " + std::to_string(i) + " (" + segment_name(p.p_type) + ") needs " +
           std::to_string(p.p_filesz) + " bytes from offset " + std::to_string(p.p_offset) +
           " but the file has only " + std::to_string(size) + " bytes" + kTruncated);
  }
}

}  // namespace mixtrain::sdk
