#include "native_checkpoint_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "mixtrain/sdk/support/unique_fd.h"

#include <nlohmann/json.hpp>

#include "native_file_layout.h"

namespace mixtrain::checkpoint_native {
namespace {

namespace fs = std::filesystem;
using sdk::CheckpointError;

constexpr const char* kDamagedHint =
    "the file is damaged (truncated or corrupted, e.g. by a full disk or an interrupted copy); "
    "restore it from a backup or resume from an earlier checkpoint";

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

std::string os_error_text(int err) { return std::generic_category().message(err); }


// CRC-32 of each buffer, spread over threads in fixed-size chunks joined with crc32_combine: one
// core hashes ~1 GB/s, which would otherwise dominate writing a multi-GB state to a fast disk.
std::uint32_t crc32_of(const std::byte* data, std::size_t size) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  crc = crc32_z(crc, reinterpret_cast<const Bytef*>(data), size);
  return static_cast<std::uint32_t>(crc);
}

std::vector<std::uint32_t> crc32_of_each(const std::vector<std::span<const std::byte>>& buffers) {
  constexpr std::size_t kChunk = std::size_t{16} << 20;
  struct Chunk {
    std::size_t buffer;
    std::size_t begin;
    std::size_t size;
    std::uint32_t crc;
  };
  std::vector<Chunk> chunks;
  std::size_t total = 0;
  for (std::size_t b = 0; b < buffers.size(); ++b) {
    total += buffers[b].size();
    std::size_t begin = 0;
    do {
      const std::size_t size = std::min(kChunk, buffers[b].size() - begin);
      chunks.push_back({b, begin, size, 0});
      begin += size;
    } while (begin < buffers[b].size());
  }
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < chunks.size();) {
      auto& c = chunks[i];
      c.crc = crc32_of(buffers[c.buffer].data() + c.begin, c.size);
    }
  };
  const std::size_t threads = std::min<std::size_t>(
      {std::max(1u, std::thread::hardware_concurrency()), 8, total / kChunk + 1});
  {
    std::vector<std::jthread> pool;
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
  }
  std::vector<std::uint32_t> result(buffers.size(), 0);
  for (const auto& c : chunks)
    result[c.buffer] = c.begin == 0 ? c.crc
                                    : static_cast<std::uint32_t>(crc32_combine(
                                          result[c.buffer], c.crc, static_cast<z_off_t>(c.size)));
  return result;
}

// Caps one syscall well below Linux's 0x7ffff000 per-call limit; partial transfers are looped.
constexpr std::size_t kMaxIoChunk = std::size_t{1} << 30;

// 0 on success, else errno.
int pread_all(int fd, std::byte* data, std::size_t size, std::uint64_t offset) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, data, std::min(size, kMaxIoChunk), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return -1;
    data += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return 0;
}

// ------------------------------------------------------------------------------------------------
// Writing

struct PlannedTensor {
  const sdk::StreamedTensor* tensor;
  std::uint64_t offset;  // from the data section start
  std::uint64_t length;  // shape × dtype size
  std::uint32_t crc32;
};

[[noreturn]] void fail_invalid_state(const fs::path& path, const std::string& what) {
  throw CheckpointError("cannot write checkpoint " + quoted(path) + ": " + what,
                        "the training state handed to the checkpoint format is inconsistent; "
                        "this is a bug in the component that produced it");
}

// Bytes a tensor of this shape and dtype must hold, or nullopt when negative / overflowing.
std::optional<std::uint64_t> expected_byte_count(const std::vector<std::int64_t>& shape,
                                                 sdk::DType dtype) {
  std::uint64_t count = sdk::dtype_size(dtype);
  for (const auto d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(count, static_cast<std::uint64_t>(d), &count)) return std::nullopt;
  }
  if (count > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return std::nullopt;
  return count;
}

// Each tensor's place in the data section, its name, rank and size checked; checksums not yet.
std::vector<PlannedTensor> plan_tensors(const fs::path& path,
                                        const std::vector<sdk::StreamedTensor>& tensors,
                                        std::uint64_t& data_length) {
  std::vector<PlannedTensor> plan;
  plan.reserve(tensors.size());
  std::unordered_set<std::string_view> names;
  std::uint64_t cursor = 0;
  for (const auto& t : tensors) {
    if (t.name.empty()) fail_invalid_state(path, "a tensor has an empty name");
    if (!names.insert(t.name).second)
      fail_invalid_state(path, "two tensors are named '" + t.name + "'");
    if (t.shape.size() > static_cast<std::size_t>(sdk::Shape::kMaxRank))
      fail_invalid_state(path, "tensor '" + t.name + "' has rank " +
                                   std::to_string(t.shape.size()) + "; the maximum is " +
                                   std::to_string(sdk::Shape::kMaxRank));
    const auto length = expected_byte_count(t.shape, t.dtype);
    if (!length)
      fail_invalid_state(path, "tensor '" + t.name + "' has a negative or overflowing shape");
    const std::uint64_t offset = align_up(cursor);
    plan.push_back({&t, offset, *length, 0});
    cursor = offset + *length;
  }
  data_length = cursor;
  return plan;
}

std::string encode_header(const fs::path& path, const std::map<std::string, std::string>& metadata,
                          const std::vector<PlannedTensor>& plan, std::uint64_t data_length) {
  // ordered_json keeps the documented field order, which makes `head -c` dumps readable.
  nlohmann::ordered_json header;
  header["metadata"] = nlohmann::ordered_json::object();
  for (const auto& [key, value] : metadata) header["metadata"][key] = value;
  auto table = nlohmann::ordered_json::array();
  for (const auto& p : plan) {
    table.push_back({{"name", p.tensor->name},
                     {"dtype", std::string(sdk::dtype_name(p.tensor->dtype))},
                     {"shape", p.tensor->shape},
                     {"offset", p.offset},
                     {"length", p.length},
                     {"crc32", p.crc32}});
  }
  header["tensors"] = std::move(table);
  header["data_length"] = data_length;
  try {
    return header.dump();
  } catch (const nlohmann::json::exception& e) {
    // dump() refuses invalid UTF-8, which is the only way a string map can fail to encode.
    throw CheckpointError("cannot write checkpoint " + quoted(path) +
                              ": a metadata key/value or tensor name is not valid UTF-8 (" +
                              e.what() + ")",
                          "metadata values must be UTF-8 text; encode binary data (e.g. base64) "
                          "before storing it");
  }
}

// A tensor's bytes from the reader, checked to be as long as the plan says.
std::span<const std::byte> read_planned(const fs::path& path, const sdk::StreamedTensorReader& read,
                                        std::size_t index, const PlannedTensor& p,
                                        std::span<std::byte> buffer) {
  // A whole state's write passes no buffer: its reader hands out the bytes the state holds.
  const auto length = static_cast<std::size_t>(p.length);
  const auto bytes = read(index, buffer.size() >= length ? buffer.first(length) : buffer.first(0));
  if (bytes.size() != p.length)
    fail_invalid_state(path, "tensor '" + p.tensor->name + "' came with " +
                                 std::to_string(bytes.size()) + " bytes but its shape and dtype (" +
                                 std::string(sdk::dtype_name(p.tensor->dtype)) + ") need " +
                                 std::to_string(p.length));
  return bytes;
}

// ------------------------------------------------------------------------------------------------
// Reading

struct TensorRecord {
  std::size_t index = 0;
  std::string name;
  sdk::DType dtype = sdk::DType::fp32;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  std::uint32_t crc32 = 0;
  unsigned fields_seen = 0;  // bit per TensorField
};

enum TensorField : unsigned {
  kName = 1u << 0,
  kDType = 1u << 1,
  kShape = 1u << 2,
  kOffset = 1u << 3,
  kLength = 1u << 4,
  kCrc = 1u << 5,
  kAllFields = (1u << 6) - 1,
};

struct ParsedHeader {
  std::map<std::string, std::string> metadata;
  // deque: entries never move, and growth never needs one allocation proportional to the count.
  std::deque<TensorRecord> tensors;
  std::uint64_t data_length = 0;
};

// Thrown inside the SAX handler; read() adds the file name and a hint.
struct HeaderDefect {
  std::string what;
};

std::string describe(const TensorRecord& t) {
  std::string s = "tensor #" + std::to_string(t.index);
  if (!t.name.empty()) s += " ('" + t.name + "')";
  return s;
}

std::optional<sdk::DType> dtype_from_name(std::string_view name) {
  // Only the canonical spellings the writer produces; aliases would make two files for one state.
  for (const auto d : sdk::kAllDTypes)
    if (sdk::dtype_name(d) == name) return d;
  return std::nullopt;
}

// Streams the header into ParsedHeader with the schema checked as it goes. A DOM would cost many
// times the header's size on hostile input (e.g. megabytes of "[0,0,0,...]"); this handler keeps
// only what the format defines and skips unknown fields without storing them.
class HeaderParser {
 public:
  using json = nlohmann::json;
  explicit HeaderParser(ParsedHeader& out) : out_(out) {}

  bool null() { return skip_depth_ > 0 || accept_unknown(slot(), "null"); }
  bool boolean(bool) { return skip_depth_ > 0 || accept_unknown(slot(), "a boolean"); }
  bool binary(json::binary_t&) { return skip_depth_ > 0 || accept_unknown(slot(), "binary data"); }
  bool number_float(json::number_float_t, const json::string_t& text) {
    if (skip_depth_ > 0) return true;
    const Slot s = slot();
    if (is_integer_slot(s)) defect(where(s) + " must be a non-negative integer, not " + text);
    return accept_unknown(s, "a number");
  }
  bool number_integer(json::number_integer_t v) {
    // nlohmann reports non-negative integers through number_unsigned, so v < 0 here.
    if (skip_depth_ > 0) return true;
    const Slot s = slot();
    if (s == Slot::Dim) defect("dimension " + std::to_string(v) + " of " + where(s) +
                               " is negative");
    if (is_integer_slot(s)) defect(where(s) + " must not be negative (got " +
                                   std::to_string(v) + ")");
    return accept_unknown(s, "a number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (skip_depth_ > 0) return true;
    const Slot s = slot();
    switch (s) {
      case Slot::DataLength: out_.data_length = v; return true;
      case Slot::Offset: current().offset = v; return true;
      case Slot::Length: current().length = v; return true;
      case Slot::Crc:
        if (v > 0xFFFFFFFFu) defect(where(s) + " does not fit in 32 bits");
        current().crc32 = static_cast<std::uint32_t>(v);
        return true;
      case Slot::Dim:
        if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
          defect("a dimension of " + where(s) + " overflows a 64-bit signed integer");
        if (current().shape.size() >= static_cast<std::size_t>(sdk::Shape::kMaxRank))
          defect(where(s) + " has more than " + std::to_string(sdk::Shape::kMaxRank) +
                 " dimensions");
        current().shape.push_back(static_cast<std::int64_t>(v));
        return true;
      default: return accept_unknown(s, "a number");
    }
  }
  bool string(json::string_t& v) {
    if (skip_depth_ > 0) return true;
    const Slot s = slot();
    switch (s) {
      case Slot::MetadataValue:
        if (!out_.metadata.emplace(key_, std::move(v)).second)
          defect("metadata key '" + key_ + "' appears twice");
        return true;
      case Slot::Name:
        if (v.empty()) defect(where(s) + " is empty");
        current().name = std::move(v);
        return true;
      case Slot::DType: {
        const auto d = dtype_from_name(v);
        if (!d) defect(where(s) + " is '" + v + "', not a known dtype (" + known_dtypes() + ")");
        current().dtype = *d;
        return true;
      }
      default: return accept_unknown(s, "a string");
    }
  }
  bool start_object(std::size_t) {
    if (skip_depth_ > 0) {
      ++skip_depth_;
      return true;
    }
    const Slot s = slot();
    switch (s) {
      case Slot::Root: stack_.push_back(Ctx::Root); return true;
      case Slot::Metadata: stack_.push_back(Ctx::Metadata); return true;
      case Slot::TensorEntry: {
        const std::size_t index = out_.tensors.size();
        out_.tensors.emplace_back().index = index;
        stack_.push_back(Ctx::Tensor);
        return true;
      }
      case Slot::Ignore: skip_depth_ = 1; return true;
      default: defect(where(s) + " must be " + expected(s) + ", not an object");
    }
  }
  bool start_array(std::size_t) {
    if (skip_depth_ > 0) {
      ++skip_depth_;
      return true;
    }
    const Slot s = slot();
    switch (s) {
      case Slot::Tensors: stack_.push_back(Ctx::Tensors); return true;
      case Slot::Shape: stack_.push_back(Ctx::Shape); return true;
      case Slot::Ignore: skip_depth_ = 1; return true;
      default: defect(where(s) + " must be " + expected(s) + ", not an array");
    }
  }
  bool key(json::string_t& k) {
    if (skip_depth_ > 0) return true;
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    if (skip_depth_ > 0) {
      --skip_depth_;
      return true;
    }
    if (stack_.back() == Ctx::Tensor) {
      const auto& t = current();
      static constexpr std::pair<unsigned, const char*> kRequired[] = {
          {kName, "name"}, {kDType, "dtype"},   {kShape, "shape"},
          {kOffset, "offset"}, {kLength, "length"}, {kCrc, "crc32"}};
      for (const auto& [bit, field] : kRequired)
        if ((t.fields_seen & bit) == 0)
          defect(describe(t) + " in the tensor table lacks the field '" + field + "'");
    } else if (stack_.back() == Ctx::Root) {
      for (const char* field : {"metadata", "tensors", "data_length"})
        if (!root_fields_seen_.contains(field))
          defect("the header lacks the field '" + std::string(field) + "'");
    }
    stack_.pop_back();
    return true;
  }
  bool end_array() {
    if (skip_depth_ > 0) {
      --skip_depth_;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    defect("the header is not valid JSON (byte " + std::to_string(position) + "): " + e.what());
  }

 private:
  enum class Ctx { Document, Root, Metadata, Tensors, Tensor, Shape };
  enum class Slot {
    Root, Metadata, MetadataValue, Tensors, DataLength, TensorEntry,
    Name, DType, Shape, Offset, Length, Crc, Dim, Ignore
  };

  [[noreturn]] static void defect(std::string what) { throw HeaderDefect{std::move(what)}; }

  TensorRecord& current() { return out_.tensors.back(); }

  // Which part of the format the value starting now fills; also rejects duplicate fields.
  Slot slot() {
    switch (stack_.back()) {
      case Ctx::Document: return Slot::Root;
      case Ctx::Root: {
        Slot s = Slot::Ignore;
        if (key_ == "metadata") s = Slot::Metadata;
        else if (key_ == "tensors") s = Slot::Tensors;
        else if (key_ == "data_length") s = Slot::DataLength;
        if (s != Slot::Ignore && !root_fields_seen_.insert(key_).second)
          defect("the header field '" + key_ + "' appears twice");
        return s;
      }
      case Ctx::Metadata: return Slot::MetadataValue;
      case Ctx::Tensors: return Slot::TensorEntry;
      case Ctx::Shape: return Slot::Dim;
      case Ctx::Tensor: {
        static constexpr std::pair<const char*, std::pair<Slot, unsigned>> kFields[] = {
            {"name", {Slot::Name, kName}},       {"dtype", {Slot::DType, kDType}},
            {"shape", {Slot::Shape, kShape}},    {"offset", {Slot::Offset, kOffset}},
            {"length", {Slot::Length, kLength}}, {"crc32", {Slot::Crc, kCrc}}};
        for (const auto& [field, slot_and_bit] : kFields) {
          if (key_ != field) continue;
          auto& t = current();
          if ((t.fields_seen & slot_and_bit.second) != 0)
            defect("the field '" + key_ + "' of " + describe(t) + " appears twice");
          t.fields_seen |= slot_and_bit.second;
          return slot_and_bit.first;
        }
        return Slot::Ignore;
      }
    }
    return Slot::Ignore;
  }

  static bool is_integer_slot(Slot s) {
    return s == Slot::DataLength || s == Slot::Offset || s == Slot::Length || s == Slot::Crc ||
           s == Slot::Dim;
  }

  // A value of an unexpected kind: fine for an unknown field (skipped), a defect elsewhere.
  bool accept_unknown(Slot s, const char* kind) {
    if (s == Slot::Ignore) return true;
    defect(where(s) + " must be " + expected(s) + ", not " + kind);
  }

  std::string where(Slot s) {
    switch (s) {
      case Slot::Root: return "the header";
      case Slot::Metadata: return "the header field 'metadata'";
      case Slot::MetadataValue: return "the metadata value of '" + key_ + "'";
      case Slot::Tensors: return "the header field 'tensors'";
      case Slot::DataLength: return "the header field 'data_length'";
      case Slot::TensorEntry: return "entry #" + std::to_string(out_.tensors.size()) +
                                     " of the tensor table";
      case Slot::Dim: return "the shape of " + describe(current());
      case Slot::Ignore: return "an unknown field";
      default: return "the field '" + key_ + "' of " + describe(current());
    }
  }

  static std::string expected(Slot s) {
    switch (s) {
      case Slot::Root: return "a JSON object";
      case Slot::Metadata: return "an object of strings";
      case Slot::MetadataValue: return "a string";
      case Slot::Tensors: return "an array";
      case Slot::TensorEntry: return "an object";
      case Slot::Name:
      case Slot::DType: return "a string";
      case Slot::Shape: return "an array of non-negative integers";
      default: return "a non-negative integer";
    }
  }

  static std::string known_dtypes() {
    std::string s;
    for (const auto d : sdk::kAllDTypes) s += (s.empty() ? "" : ", ") + std::string(sdk::dtype_name(d));
    return s;
  }

  ParsedHeader& out_;
  std::vector<Ctx> stack_{Ctx::Document};
  std::string key_;
  std::size_t skip_depth_ = 0;
  std::unordered_set<std::string> root_fields_seen_;
};

class CheckpointReader {
 public:
  explicit CheckpointReader(const fs::path& path) : path_(path) {}

  // Every tensor, or those `wanted` names (format_partial_read.h); the structure is checked whole
  // either way.
  sdk::TrainingState read(const std::function<bool(std::string_view)>& wanted = {}) {
    open_file();
    const Preamble preamble = read_preamble();
    ParsedHeader header = read_header(preamble);
    const std::uint64_t data_start = data_section_offset(preamble.header_length);
    check_data_extent(header, data_start);
    validate_tensor_table(header);
    if (wanted)
      std::erase_if(header.tensors, [&](const TensorRecord& t) { return !wanted(t.name); });
    return read_tensors(std::move(header), data_start);
  }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& hint = kDamagedHint) const {
    throw CheckpointError("checkpoint " + quoted(path_) + ": " + what, hint);
  }

  void open_file() {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT || err == ENOTDIR)
        fail("the file does not exist",
             "check the path (and [checkpoint] dir / --resume); list the run folder to see which "
             "checkpoints were written");
      fail("cannot open the file: " + os_error_text(err), sdk::hint_for_os_error(err));
    }
    fd_.emplace(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      fail("cannot stat the file: " + os_error_text(err), sdk::hint_for_os_error(err));
    }
    if (S_ISDIR(st.st_mode))
      fail("this is a directory, not a checkpoint file",
           "give the path of a .mxt file inside the directory");
    if (!S_ISREG(st.st_mode))
      fail("this is not a regular file", "give the path of a .mxt checkpoint file");
    file_size_ = static_cast<std::uint64_t>(st.st_size);
#ifdef POSIX_FADV_SEQUENTIAL
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  }

  void read_exact(std::byte* out, std::size_t size, std::uint64_t offset, const std::string& part) {
    const int err = pread_all(fd_->get(), out, size, offset);
    if (err == -1) fail("the file ended while reading " + part + " (was it truncated while open?)");
    if (err != 0) fail("cannot read " + part + ": " + os_error_text(err), sdk::hint_for_os_error(err));
  }

  Preamble read_preamble() {
    if (file_size_ < kPreambleSize)
      fail("the file is " + std::to_string(file_size_) + " bytes, shorter than the " +
               std::to_string(kPreambleSize) + "-byte preamble of a native checkpoint",
           "the file is truncated or is not a mixtrain native checkpoint; restore it from a "
           "backup or resume from an earlier checkpoint");
    std::array<std::byte, kPreambleSize> bytes{};
    read_exact(bytes.data(), bytes.size(), 0, "the preamble");
    const Preamble p = decode_preamble(bytes.data());
    if (p.magic != kMagic) {
      // A safetensors file starts with a u64 length and then '{'.
      const bool looks_like_safetensors = bytes[8] == std::byte{'{'};
      fail("not a mixtrain native checkpoint (the file does not start with \"MIXTRAIN\")",
           looks_like_safetensors
               ? "this looks like a safetensors file, which the safetensors format reads: "
                 "a file is read by the format its extension names, so name it *.safetensors "
                 "(for init_from, --checkpoint or eval)"
               : "give a .mxt file written by mixtrain's native checkpoint format");
    }
    if (p.format_version == 0 || p.format_version > kFormatVersion)
      fail("format version " + std::to_string(p.format_version) +
               (p.format_version == 0 ? " is invalid" : " is newer than the supported version") +
               " (this build reads version " + std::to_string(kFormatVersion) + ")",
           p.format_version == 0 ? std::string(kDamagedHint)
                                 : "upgrade mixtrain (and its checkpoint_native plugin) to a "
                                   "release that reads format version " +
                                       std::to_string(p.format_version));
    if ((p.flags & ~kKnownFlags) != 0)
      fail("unknown format flags 0x" + to_hex(p.flags & ~kKnownFlags) + " are set",
           "the file was written by a newer mixtrain or is damaged; upgrade mixtrain or restore "
           "the file");
    if (p.header_length == 0 || p.header_length > file_size_ - kPreambleSize)
      fail("the header length " + std::to_string(p.header_length) + " does not fit in the " +
           std::to_string(file_size_) + "-byte file");
    return p;
  }

  ParsedHeader read_header(const Preamble& p) {
    // Bounded by the file size (checked in read_preamble).
    std::string text(static_cast<std::size_t>(p.header_length), '\0');
    read_exact(reinterpret_cast<std::byte*>(text.data()), text.size(), kPreambleSize, "the header");
    const std::uint32_t crc = crc32_of(reinterpret_cast<const std::byte*>(text.data()), text.size());
    if (crc != p.header_crc32)
      fail("header checksum mismatch (stored 0x" + to_hex(p.header_crc32) + ", computed 0x" +
           to_hex(crc) + ")");
    ParsedHeader header;
    HeaderParser parser(header);
    try {
      nlohmann::json::sax_parse(text.begin(), text.end(), &parser);
    } catch (const HeaderDefect& d) {
      fail("malformed header: " + d.what);
    }
    return header;
  }

  void check_data_extent(const ParsedHeader& header, std::uint64_t data_start) const {
    // data_start <= file_size_ + 63 here, so this arithmetic cannot overflow.
    if (file_size_ < data_start || header.data_length > file_size_ - data_start)
      fail("the file is truncated: the header describes " +
           std::to_string(data_start) + " + " + std::to_string(header.data_length) +
           " bytes but the file has " + std::to_string(file_size_));
    const std::uint64_t available = file_size_ - data_start;
    if (header.data_length < available)
      fail("the file has " + std::to_string(available - header.data_length) +
           " unexpected bytes after the tensor data");
  }

  void validate_tensor_table(const ParsedHeader& header) const {
    std::unordered_set<std::string_view> names;
    std::vector<const TensorRecord*> by_offset;
    by_offset.reserve(header.tensors.size());
    for (const auto& t : header.tensors) {
      if (!names.insert(t.name).second)
        fail("the tensor name '" + t.name + "' appears twice in the tensor table");
      const auto expected = expected_byte_count(t.shape, t.dtype);
      if (!expected)
        fail("the shape of " + describe(t) + " overflows (" + shape_text(t.shape) + ")");
      if (*expected != t.length)
        fail(describe(t) + " has shape " + shape_text(t.shape) + " and dtype " +
             std::string(sdk::dtype_name(t.dtype)) + ", which need " + std::to_string(*expected) +
             " bytes, but its byte length is " + std::to_string(t.length));
      if (t.offset % kDataAlignment != 0)
        fail("the offset " + std::to_string(t.offset) + " of " + describe(t) +
             " is not a multiple of " + std::to_string(kDataAlignment));
      if (t.offset > header.data_length || t.length > header.data_length - t.offset)
        fail(describe(t) + " spans bytes [" + std::to_string(t.offset) + ", offset + " +
             std::to_string(t.length) + ") outside the " + std::to_string(header.data_length) +
             "-byte data section");
      by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorRecord* a, const TensorRecord* b) { return a->offset < b->offset; });
    const TensorRecord* previous = nullptr;
    for (const auto* t : by_offset) {
      if (t->length == 0) continue;  // empty ranges cannot overlap anything
      if (previous != nullptr && previous->offset + previous->length > t->offset)
        fail("the data of " + describe(*previous) + " and " + describe(*t) + " overlap");
      previous = t;
    }
  }

  sdk::TrainingState read_tensors(ParsedHeader header, std::uint64_t data_start) {
    sdk::TrainingState state;
    state.metadata = std::move(header.metadata);
    state.tensors.reserve(header.tensors.size());
    for (auto& record : header.tensors) {
      sdk::HostTensor t;
      t.name = record.name;
      t.dtype = record.dtype;
      t.shape = std::move(record.shape);
      // Validated: the ranges lie inside the file and do not overlap, so all buffers together
      // are no larger than the file.
      t.bytes.resize(static_cast<std::size_t>(record.length));
      read_exact(t.bytes.data(), t.bytes.size(), data_start + record.offset,
                 "the data of tensor '" + t.name + "'");
      state.tensors.push_back(std::move(t));
    }
    std::vector<std::span<const std::byte>> buffers;
    buffers.reserve(state.tensors.size());
    for (const auto& t : state.tensors) buffers.emplace_back(t.bytes);
    const auto crcs = crc32_of_each(buffers);
    for (std::size_t i = 0; i < crcs.size(); ++i)
      if (crcs[i] != header.tensors[i].crc32)
        fail("checksum mismatch in the data of tensor '" + state.tensors[i].name +
             "' (stored 0x" + to_hex(header.tensors[i].crc32) + ", computed 0x" +
             to_hex(crcs[i]) + ")");
    return state;
  }

  static std::string to_hex(std::uint32_t v) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string s(8, '0');
    for (int i = 7; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = kDigits[v & 0xF];
    return s;
  }

  static std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }

  const fs::path& path_;
  std::optional<sdk::UniqueFd> fd_;
  std::uint64_t file_size_ = 0;
};

}  // namespace

sdk::OptionSchema NativeCheckpointFormat::option_schema() {
  return {sdk::OptionSpec::boolean(
      "fsync", true,
      "fsync the file and its folder on write so a crash or power loss cannot lose a checkpoint "
      "that write() reported as done; turn off only for tests or scratch runs")};
}

NativeCheckpointFormat::NativeCheckpointFormat(const sdk::Options& options,
                                               const sdk::PluginContext& context)
    : fsync_(options.get_bool("fsync")), logger_(context.logger) {}

namespace {

void check_target(const fs::path& path) {
  if (path.filename().empty())
    throw CheckpointError("cannot write checkpoint " + quoted(path) + ": the path has no file name",
                          "give a file path such as <dir>/step-100.mxt");
}

// The file of a checksummed plan: preamble, header, then each tensor read (again), in order.
void write_planned(const fs::path& path, bool fsync, const sdk::Logger& logger,
                   const std::map<std::string, std::string>& metadata,
                   const std::vector<PlannedTensor>& plan, std::uint64_t data_length,
                   const sdk::StreamedTensorReader& read, std::span<std::byte> buffer) {
  const auto started = std::chrono::steady_clock::now();
  const std::string header = encode_header(path, metadata, plan, data_length);
  Preamble preamble;
  preamble.header_length = header.size();
  preamble.header_crc32 = crc32_of(reinterpret_cast<const std::byte*>(header.data()), header.size());

  sdk::AtomicFileWriter out(path, fsync, "checkpoint");
  const auto preamble_bytes = encode_preamble(preamble);
  out.write(preamble_bytes.data(), preamble_bytes.size());
  out.write(header.data(), header.size());
  const std::uint64_t data_start = data_section_offset(header.size());
  out.write_zeros(static_cast<std::size_t>(data_start - out.written()));
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const auto& p = plan[i];
    const auto bytes = read_planned(path, read, i, p, buffer);
    out.write_zeros(static_cast<std::size_t>(data_start + p.offset - out.written()));
    out.write(bytes.data(), bytes.size());
  }
  if (auto warning = out.commit(); !warning.empty()) logger.warn(warning);

  if (logger.enabled(sdk::LogLevel::debug)) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    logger.debug("wrote " + quoted(path) + ": " + std::to_string(plan.size()) + " tensors, " +
                 std::to_string(out.written()) + " bytes in " + std::to_string(seconds) + " s");
  }
}

}  // namespace

void NativeCheckpointFormat::write(const fs::path& path, const sdk::TrainingState& state) const {
  check_target(path);
  // Everything that can be wrong with the state fails here, before the disk is touched.
  std::vector<sdk::StreamedTensor> tensors;
  tensors.reserve(state.tensors.size());
  for (const auto& t : state.tensors) tensors.push_back({t.name, t.dtype, t.shape});
  std::uint64_t data_length = 0;
  auto plan = plan_tensors(path, tensors, data_length);
  std::vector<std::span<const std::byte>> buffers;
  buffers.reserve(plan.size());
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const auto& t = state.tensors[i];
    if (t.bytes.size() != plan[i].length)
      fail_invalid_state(path, "tensor '" + t.name + "' holds " + std::to_string(t.bytes.size()) +
                                   " bytes but its shape and dtype (" +
                                   std::string(sdk::dtype_name(t.dtype)) + ") need " +
                                   std::to_string(plan[i].length));
    buffers.emplace_back(t.bytes);
  }
  // Every tensor is in memory: their checksums in one parallel pass over all of them.
  const auto crcs = crc32_of_each(buffers);
  for (std::size_t i = 0; i < plan.size(); ++i) plan[i].crc32 = crcs[i];
  write_planned(path, fsync_, logger_, state.metadata, plan, data_length,
                [&](std::size_t i, std::span<std::byte>) { return buffers[i]; }, {});
}

void NativeCheckpointFormat::write_streamed(const fs::path& path,
                                            const std::vector<sdk::StreamedTensor>& tensors,
                                            const std::map<std::string, std::string>& metadata,
                                            const sdk::StreamedTensorReader& read) const {
  check_target(path);
  std::uint64_t data_length = 0;
  auto plan = plan_tensors(path, tensors, data_length);
  std::uint64_t largest = 0;
  for (const auto& p : plan) largest = std::max(largest, p.length);
  // One buffer for every read, the largest tensor long; left uninitialised, so a reader that
  // hands out bytes it holds costs no memory here.
  const std::unique_ptr<std::byte[]> storage(new std::byte[static_cast<std::size_t>(largest)]);
  const std::span<std::byte> buffer(storage.get(), static_cast<std::size_t>(largest));
  // The header holds every checksum and comes first: a pass to checksum, before the disk is
  // touched, then the write reads each tensor again.
  for (std::size_t i = 0; i < plan.size(); ++i)
    plan[i].crc32 = crc32_of_each({read_planned(path, read, i, plan[i], buffer)}).front();
  write_planned(path, fsync_, logger_, metadata, plan, data_length, read, buffer);
}

sdk::TrainingState NativeCheckpointFormat::read(const fs::path& path) const {
  return CheckpointReader(path).read();
}

sdk::TrainingState NativeCheckpointFormat::read_only(
    const fs::path& path, const std::function<bool(std::string_view)>& wanted) const {
  return CheckpointReader(path).read(wanted);
}

}  // namespace mixtrain::checkpoint_native
