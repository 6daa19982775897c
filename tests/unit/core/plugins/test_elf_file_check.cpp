// check_elf_file against a real plugin and copies of it that are truncated or edited in their ELF
// header or program headers: each bad copy is rejected with a reason naming what is wrong, before
// anything maps it (mapping a truncated library kills the process with SIGBUS).
#include <elf.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "mixtrain/core/plugins/registry.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/elf_file_check.h"

namespace fs = std::filesystem;
using mixtrain::sdk::check_elf_file;

namespace {

using Ehdr = std::conditional_t<sizeof(void*) == 8, Elf64_Ehdr, Elf32_Ehdr>;
using Phdr = std::conditional_t<sizeof(void*) == 8, Elf64_Phdr, Elf32_Phdr>;

std::vector<char> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class registry_ElfFileCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("mixtrain-elf-") + info->name() + "-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    real_ = read_all(MIXTRAIN_REAL_PLUGIN);
    ASSERT_GT(real_.size(), 100000u) << "the truncation sizes below need a larger plugin";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  Ehdr header() const {
    Ehdr h;
    std::memcpy(&h, real_.data(), sizeof h);
    return h;
  }
  Phdr program_header(std::size_t i) const {
    Phdr p;
    std::memcpy(&p, real_.data() + header().e_phoff + i * sizeof(Phdr), sizeof p);
    return p;
  }
  // The first program header of `type`; the real plugin has one of each type the tests edit.
  std::size_t index_of(std::uint32_t type) const {
    for (std::size_t i = 0; i < header().e_phnum; ++i)
      if (program_header(i).p_type == type) return i;
    ADD_FAILURE() << "no program header of type " << type;
    return 0;
  }
  // Where the last segment's file bytes end: a file one byte shorter is missing part of it.
  std::uint64_t end_of_segments() const {
    std::uint64_t end = 0;
    for (std::size_t i = 0; i < header().e_phnum; ++i) {
      const auto p = program_header(i);
      end = std::max<std::uint64_t>(end, p.p_offset + p.p_filesz);
    }
    return end;
  }

  fs::path write(const std::vector<char>& bytes, const std::string& name = "libmixtrain_x.so") {
    auto p = dir_ / name;
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  fs::path truncated(std::size_t size) {
    return write(std::vector<char>(real_.begin(), real_.begin() + static_cast<long>(size)));
  }
  fs::path with_header(const Ehdr& h) {
    auto bytes = real_;
    std::memcpy(bytes.data(), &h, sizeof h);
    return write(bytes);
  }
  fs::path with_program_header(std::size_t i, const Phdr& p) {
    auto bytes = real_;
    std::memcpy(bytes.data() + header().e_phoff + i * sizeof(Phdr), &p, sizeof p);
    return write(bytes);
  }

  // The reason check_elf_file gives for `path`; fails the test when it accepts the file.
  static std::string reason(const fs::path& path) {
    try {
      check_elf_file(path);
    } catch (const mixtrain::sdk::PluginError& e) {
      return e.what();
    }
    ADD_FAILURE() << path << " was accepted";
    return {};
  }

  fs::path dir_;
  std::vector<char> real_;
};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST_F(registry_ElfFileCheck, RealPluginsAreAccepted) {
  EXPECT_NO_THROW(check_elf_file(MIXTRAIN_REAL_PLUGIN));
  EXPECT_NO_THROW(
      check_elf_file(fs::path(MIXTRAIN_TEST_PLUGIN_DIR) / "good" / "libmixtrain_test_good.so"));
  // A copy is judged by its bytes, not its name or place.
  EXPECT_NO_THROW(check_elf_file(write(real_)));
}

TEST_F(registry_ElfFileCheck, TruncatedCopiesAreRejectedWithWhatIsMissing) {
  EXPECT_TRUE(contains(reason(truncated(0)), "the file is empty"));
  for (std::size_t size : {10, 63}) {
    auto r = reason(truncated(size));
    EXPECT_TRUE(contains(r, "the file is " + std::to_string(size) +
                                " bytes, shorter than an ELF header (" +
                                std::to_string(sizeof(Ehdr)) + " bytes)"))
        << r;
  }
  auto r = reason(truncated(sizeof(Ehdr)));
  EXPECT_TRUE(contains(r, "the program header table")) << r;
  EXPECT_TRUE(contains(r, "reaches past the end of the file")) << r;
  for (std::size_t size : {1000, 100000}) {
    r = reason(truncated(size));
    EXPECT_TRUE(contains(r, "(PT_LOAD) needs")) << r;
    EXPECT_TRUE(contains(r, "but the file has only " + std::to_string(size) + " bytes")) << r;
    EXPECT_TRUE(contains(r, "truncated")) << r;
  }
  const auto end = end_of_segments();
  ASSERT_LT(end, real_.size());
  r = reason(truncated(end - 1));
  EXPECT_TRUE(contains(r, "but the file has only " + std::to_string(end - 1) + " bytes")) << r;
  // Exactly up to the end of the last segment is whole: section headers are not mapped.
  EXPECT_NO_THROW(check_elf_file(truncated(end)));
}

TEST_F(registry_ElfFileCheck, WrongMagicIsNotAnElfFile) {
  auto bytes = real_;
  bytes[1] = 'X';
  EXPECT_TRUE(contains(reason(write(bytes)), "does not start with the ELF magic bytes"));
  auto r = reason(write(std::vector<char>{'h', 'e', 'l', 'l', 'o', '\n'}));
  EXPECT_TRUE(contains(r, "does not start with the ELF magic bytes")) << r;
}

TEST_F(registry_ElfFileCheck, WrongClassByteOrderOrVersionIsNamed) {
  auto h = header();
  h.e_ident[EI_CLASS] = sizeof(void*) == 8 ? ELFCLASS32 : ELFCLASS64;
  auto r = reason(with_header(h));
  EXPECT_TRUE(contains(r, "ELF class mismatch: the library is " +
                              std::string(sizeof(void*) == 8 ? "32-bit" : "64-bit")))
      << r;

  h = header();
  h.e_ident[EI_DATA] = h.e_ident[EI_DATA] == ELFDATA2LSB ? ELFDATA2MSB : ELFDATA2LSB;
  r = reason(with_header(h));
  EXPECT_TRUE(contains(r, "ELF byte order mismatch")) << r;

  h = header();
  h.e_ident[EI_VERSION] = 7;
  r = reason(with_header(h));
  EXPECT_TRUE(contains(r, "unknown ELF version 7")) << r;
}

TEST_F(registry_ElfFileCheck, WrongMachineOrFileTypeIsNamed) {
  auto h = header();
  h.e_machine = h.e_machine == EM_X86_64 ? EM_AARCH64 : EM_X86_64;
  auto r = reason(with_header(h));
  EXPECT_TRUE(contains(
      r, h.e_machine == EM_AARCH64 ? "built for AArch64, this host is x86-64" : "built for x86-64"))
      << r;

  h = header();
  h.e_type = ET_EXEC;
  r = reason(with_header(h));
  EXPECT_TRUE(contains(r, "not a shared library")) << r;
}

TEST_F(registry_ElfFileCheck, ProgramHeaderTableOutsideTheFileIsRejected) {
  auto h = header();
  h.e_phoff = real_.size() - 10;
  auto r = reason(with_header(h));
  EXPECT_TRUE(contains(r, "the program header table")) << r;
  EXPECT_TRUE(contains(r, "from offset " + std::to_string(real_.size() - 10))) << r;

  h = header();
  h.e_phoff = std::numeric_limits<decltype(h.e_phoff)>::max() - 8;  // would wrap when added
  r = reason(with_header(h));
  EXPECT_TRUE(contains(r, "reaches past the end of the file")) << r;

  h = header();
  h.e_phentsize = sizeof(Phdr) - 1;
  r = reason(with_header(h));
  EXPECT_TRUE(contains(r, "program header entries are " + std::to_string(sizeof(Phdr) - 1))) << r;

  h = header();
  h.e_phnum = 0;
  r = reason(with_header(h));
  EXPECT_TRUE(contains(r, "no program headers")) << r;
}

TEST_F(registry_ElfFileCheck, SegmentsPastTheEndAreRejected) {
  const auto load = index_of(PT_LOAD);
  auto p = program_header(load);
  p.p_offset = real_.size();
  auto r = reason(with_program_header(load, p));
  EXPECT_TRUE(contains(r, "segment " + std::to_string(load) + " (PT_LOAD) needs")) << r;

  p = program_header(load);
  p.p_offset = std::numeric_limits<decltype(p.p_offset)>::max();  // would wrap when added
  r = reason(with_program_header(load, p));
  EXPECT_TRUE(contains(r, "(PT_LOAD) needs")) << r;

  // Not only PT_LOAD: the loader reads the dynamic section through its own header too.
  const auto dynamic = index_of(PT_DYNAMIC);
  p = program_header(dynamic);
  p.p_filesz = real_.size();
  r = reason(with_program_header(dynamic, p));
  EXPECT_TRUE(contains(r, "segment " + std::to_string(dynamic) + " (PT_DYNAMIC) needs " +
                              std::to_string(real_.size()) + " bytes"))
      << r;
}

TEST_F(registry_ElfFileCheck, RegistryListsATruncatedLibraryAndLoadsTheOthers) {
  truncated(100000);
  mixtrain::core::PluginRegistry registry;
  registry.scan({dir_, fs::path(MIXTRAIN_TEST_PLUGIN_DIR) / "good"});
  ASSERT_EQ(registry.libraries().size(), 2u);
  const auto& bad = registry.libraries()[0];
  EXPECT_EQ(bad.path.filename(), "libmixtrain_x.so");
  EXPECT_FALSE(bad.loaded);
  EXPECT_TRUE(contains(bad.error, "cannot load the library: segment ")) << bad.error;
  EXPECT_TRUE(contains(bad.error, "but the file has only 100000 bytes")) << bad.error;
  EXPECT_TRUE(registry.libraries()[1].loaded) << registry.libraries()[1].error;
  EXPECT_NE(registry.find(mixtrain::sdk::ComponentKind::scaler, "test_constant"), nullptr);
}

}  // namespace
