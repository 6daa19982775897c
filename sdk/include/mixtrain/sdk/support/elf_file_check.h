// Whether a file is a whole ELF shared library for this host, checked before it is handed to
// dlopen: the loader maps segments straight from the file, and touching a mapped page past the end
// of a truncated file (a half-copied plugin) kills the process with SIGBUS instead of failing.
//
// Contract
// - check_elf_file() reads the file's size once, then its ELF header and program headers, and
//   throws sdk::PluginError whose message says what is wrong (without the path, which the caller
//   names): an empty or short file, no ELF magic, another class (32/64-bit), byte order, ELF
//   version, file type (not a shared library) or machine than this host's, a program header table
//   outside the file, or a segment whose file bytes [p_offset, p_offset + p_filesz) reach past the
//   end of the file. It returns normally otherwise; it says nothing about symbols or the plugin
//   ABI.
// - It only reads headers; it never maps or runs the file. The file can still change between this
//   check and dlopen (a copy in progress): that race is accepted, the check catches the common
//   case of a file that is already short when it is scanned.
// - In the SDK so that a plugin that loads a library of its own (backend_cuda's runtime library)
//   checks it the same way the registry checks plugins.
#pragma once

#include <filesystem>

namespace mixtrain::sdk {

void check_elf_file(const std::filesystem::path& path);

}  // namespace mixtrain::sdk
