#include "safetensors_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "mixtrain/sdk/support/unique_fd.h"

namespace mixtrain::checkpoint_safetensors {
namespace {

namespace fs = std::filesystem;
using sdk::CheckpointError;
using ordered_json = nlohmann::ordered_json;

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

std::string os_error_text(int err) { return std::strerror(err); }


// ------------------------------------------------------------------------------------------------
// dtypes of the public format

struct StDType {
  const char* name;
  std::size_t size;
};

// Every dtype of the safetensors spec, so a valid file with, say, an I64 buffer is recognised as
// valid (and that tensor skipped) instead of being called damaged.
constexpr StDType kStDTypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},      {"F8_E4M3", 1},
                                 {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2},  {"F16", 2},
                                 {"BF16", 2}, {"I32", 4},  {"U32", 4},    {"F32", 4},
                                 {"F64", 8},  {"I64", 8},  {"U64", 8}};

const StDType* find_st_dtype(std::string_view name) {
  for (const auto& d : kStDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

const char* st_name(sdk::DType t) {
  switch (t) {
    case sdk::DType::bf16: return "BF16";
    case sdk::DType::fp16: return "F16";
    case sdk::DType::int32: return "I32";
    default: return "F32";
  }
}

// ------------------------------------------------------------------------------------------------
// Writing

struct Exported {
  std::string name;  // as written in the file
  const sdk::StreamedTensor* tensor;
  std::size_t index;  // the tensor's in the state, for the reader
  sdk::DType dtype;   // as written
  std::uint64_t numel;
  std::uint64_t begin, end;
};

std::optional<std::uint64_t> checked_byte_count(const std::vector<std::int64_t>& shape,
                                                std::uint64_t element_size) {
  std::uint64_t count = element_size;
  for (const auto d : shape) {
    if (d < 0) return std::nullopt;
    const auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && count > UINT64_MAX / u) return std::nullopt;
    count *= u;
  }
  return count;
}

bool is_float(sdk::DType t) { return t != sdk::DType::int32; }

// The n elements of `bytes` (of dtype `from`) in `to`, converted exactly (decode to fp32, encode
// with RNE); `bytes` itself when no conversion is needed (`converted` then stays empty).
std::span<const std::byte> converted_bytes(std::span<const std::byte> bytes, sdk::DType from,
                                           std::size_t n, sdk::DType to,
                                           std::vector<std::byte>& converted) {
  if (from == to || (from == sdk::DType::tf32 && to == sdk::DType::fp32)) return bytes;
  std::vector<float> f32(n);
  switch (from) {
    case sdk::DType::fp32:
    case sdk::DType::tf32:
      std::memcpy(f32.data(), bytes.data(), n * 4);
      break;
    case sdk::DType::fp16:
    case sdk::DType::bf16: {
      std::vector<std::uint16_t> src(n);
      std::memcpy(src.data(), bytes.data(), n * 2);
      sdk::convert(std::span<const std::uint16_t>(src), from, std::span<float>(f32));
      break;
    }
    case sdk::DType::fp8_e4m3:
    case sdk::DType::fp8_e5m2: {
      std::vector<std::uint8_t> src(n);
      std::memcpy(src.data(), bytes.data(), n);
      sdk::convert(std::span<const std::uint8_t>(src), from, std::span<float>(f32));
      break;
    }
    case sdk::DType::int32: break;  // not reached: int32 is never converted
  }
  converted.resize(n * sdk::dtype_size(to));
  if (to == sdk::DType::fp32) {
    std::memcpy(converted.data(), f32.data(), n * 4);
  } else {
    std::vector<std::uint16_t> dst(n);
    sdk::convert(std::span<const float>(f32), std::span<std::uint16_t>(dst), to);
    std::memcpy(converted.data(), dst.data(), n * 2);
  }
  return converted;
}

// ------------------------------------------------------------------------------------------------
// Reading

struct Entry {
  std::string name;
  const StDType* dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin, end;
};

class Reader {
 public:
  Reader(const fs::path& path, const sdk::Logger& logger) : path_(path), logger_(logger) {}

  sdk::TrainingState read() {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      fail(std::string("cannot open it: ") + os_error_text(err),
           err == ENOENT ? "check the path" : sdk::hint_for_os_error(err));
    }
    fd_.emplace(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail("cannot stat it: " + os_error_text(errno), "check the file");
    if (!S_ISREG(st.st_mode)) fail("it is not a regular file", "pass a .safetensors file");
    file_size_ = static_cast<std::uint64_t>(st.st_size);

    if (file_size_ < 8)
      fail("the file is " + std::to_string(file_size_) +
               " bytes long, shorter than the 8-byte header length",
           "the file is truncated or not a safetensors file; export it again");
    unsigned char len_bytes[8];
    read_at(len_bytes, 8, 0, "the header length");
    // Read as a length, a native checkpoint's magic is 5.6e18 bytes: name what the file is.
    if (std::memcmp(len_bytes, "MIXTRAIN", 8) == 0)
      fail(
          "it is a mixtrain native checkpoint (it starts with \"MIXTRAIN\"), not a safetensors "
          "file",
          "read it with the 'native' checkpoint format: checkpoint.format = \"native\" (train "
          "--resume --set checkpoint.format=native), or export --from native");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    if (n > file_size_ - 8)
      fail("the header length " + std::to_string(n) + " exceeds the " +
               std::to_string(file_size_ - 8) + " bytes after the length field",
           "the file is truncated or not a safetensors file; export it again");
    if (n > kMaxHeaderBytes)
      fail("the header length " + std::to_string(n) + " exceeds the limit of " +
               std::to_string(kMaxHeaderBytes) + " bytes",
           "this is not a safetensors file mixtrain can read");
    if (n < 2) fail("the header is " + std::to_string(n) + " bytes, too short for a JSON object",
                    "the file is damaged; export it again");
    std::string header(static_cast<std::size_t>(n), '\0');
    read_at(header.data(), header.size(), 8, "the header");
    buffer_start_ = 8 + n;
    buffer_size_ = file_size_ - buffer_start_;

    const auto entries = parse_header(header);
    sdk::TrainingState state;
    state.metadata = std::move(metadata_);
    for (const auto& e : entries) {
      if (auto t = load(e)) state.tensors.push_back(std::move(*t));
    }
    return state;
  }

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& hint) const {
    throw CheckpointError("safetensors file " + quoted(path_) + ": " + what, hint);
  }
  [[noreturn]] void fail_tensor(const std::string& name, const std::string& what) const {
    fail("tensor '" + name + "': " + what,
         "the file is damaged or was not written by a conforming safetensors writer; export it "
         "again");
  }

  void read_at(void* dst, std::size_t n, std::uint64_t offset, const std::string& what) const {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd_->get(), p, n, static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        fail("cannot read " + what + ": " + os_error_text(errno), "check the file");
      }
      if (r == 0) fail("the file ended while reading " + what, "the file is truncated; export it again");
      p += r;
      n -= static_cast<std::size_t>(r);
      offset += static_cast<std::uint64_t>(r);
    }
  }

  std::vector<Entry> parse_header(const std::string& header) {
    if (header.front() != '{')
      fail("the header does not start with '{'", "this is not a safetensors file");
    // nlohmann keeps the last of duplicate keys silently; the spec forbids duplicates, so every
    // object's keys are checked while parsing.
    std::vector<std::set<std::string>> keys;
    std::optional<std::string> duplicate;
    bool too_deep = false;
    auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      using E = nlohmann::json::parse_event_t;
      if (depth > 3) too_deep = true;
      if (event == E::object_start) keys.emplace_back();
      else if (event == E::object_end && !keys.empty()) keys.pop_back();
      else if (event == E::key && !keys.empty() && parsed.is_string()) {
        if (!keys.back().insert(parsed.get<std::string>()).second && !duplicate)
          duplicate = parsed.get<std::string>();
      }
      return !too_deep;
    };
    nlohmann::json j = nlohmann::json::parse(header, callback, /*allow_exceptions=*/false);
    if (too_deep || j.is_discarded() || !j.is_object())
      fail(too_deep ? "the header nests deeper than the format allows"
                    : "the header is not valid JSON",
           "the file is damaged or not a safetensors file; export it again");
    if (duplicate) fail("the header names '" + *duplicate + "' twice",
                        "the spec forbids duplicate names; the file is damaged");

    std::vector<Entry> entries;
    for (auto& [name, v] : j.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) fail("'__metadata__' is not an object", "the file is damaged");
        for (auto& [k, mv] : v.items()) {
          if (!mv.is_string())
            fail("metadata entry '" + k + "' is not a string",
                 "safetensors metadata maps strings to strings; fix the writer");
          metadata_[k] = mv.get<std::string>();
        }
        continue;
      }
      if (name.empty()) fail_tensor(name, "empty tensor name");
      if (!v.is_object()) fail_tensor(name, "the entry is not an object");
      if (!v.contains("dtype") || !v["dtype"].is_string())
        fail_tensor(name, "missing or non-string \"dtype\"");
      const auto dt_name = v["dtype"].get<std::string>();
      const StDType* dt = find_st_dtype(dt_name);
      if (dt == nullptr) fail_tensor(name, "unknown dtype \"" + dt_name + "\"");
      if (!v.contains("shape") || !v["shape"].is_array())
        fail_tensor(name, "missing or non-array \"shape\"");
      if (v["shape"].size() > 64) fail_tensor(name, "rank " + std::to_string(v["shape"].size()) + " is absurd");
      Entry e{name, dt, {}, 0, 0};
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned() ||
            d.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
          fail_tensor(name, "shape holds " + d.dump() + ", not a non-negative integer");
        e.shape.push_back(d.get<std::int64_t>());
      }
      if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
          v["data_offsets"].size() != 2 || !v["data_offsets"][0].is_number_unsigned() ||
          !v["data_offsets"][1].is_number_unsigned())
        fail_tensor(name, "\"data_offsets\" must be two non-negative integers [begin, end]");
      e.begin = v["data_offsets"][0].get<std::uint64_t>();
      e.end = v["data_offsets"][1].get<std::uint64_t>();
      if (e.begin > e.end)
        fail_tensor(name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                              "] end before they begin");
      if (e.end > buffer_size_)
        fail_tensor(name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                              "] reach past the " + std::to_string(buffer_size_) +
                              "-byte data buffer (the file is truncated?)");
      const auto bytes = checked_byte_count(e.shape, dt->size);
      if (!bytes || *bytes != e.end - e.begin)
        fail_tensor(name, "shape " + v["shape"].dump() + " of " + dt_name + " needs " +
                              (bytes ? std::to_string(*bytes) : std::string("an overflowing number of")) +
                              " bytes but data_offsets span " + std::to_string(e.end - e.begin));
      entries.push_back(std::move(e));
    }

    // The spec: the buffer is entirely indexed and has no holes — tensors, sorted by offset, tile
    // [0, buffer size) exactly. This also rules out overlaps (and polyglot files).
    std::vector<const Entry*> sorted;
    for (const auto& e : entries) sorted.push_back(&e);
    std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    std::uint64_t covered = 0;
    const Entry* previous = nullptr;
    for (const Entry* e : sorted) {
      if (e->begin < covered)
        fail_tensor(e->name, "its bytes [" + std::to_string(e->begin) + ", " + std::to_string(e->end) +
                                 ") overlap those of '" + previous->name + "'");
      if (e->begin > covered)
        fail_tensor(e->name, "a hole of " + std::to_string(e->begin - covered) +
                                 " unindexed bytes precedes it at offset " + std::to_string(covered));
      covered = e->end;
      previous = e;
    }
    if (covered != buffer_size_)
      fail(std::to_string(buffer_size_ - covered) + " bytes at the end of the data buffer belong "
               "to no tensor",
           "the spec requires the buffer to be entirely indexed; the file is damaged or padded");
    return entries;
  }

  std::optional<sdk::HostTensor> load(const Entry& e) const {
    const std::string dt = e.dtype->name;
    sdk::HostTensor t;
    t.name = e.name;
    t.shape = e.shape;
    const std::uint64_t n_bytes = e.end - e.begin;
    const auto n = static_cast<std::size_t>(n_bytes / e.dtype->size);
    const std::uint64_t offset = buffer_start_ + e.begin;
    const std::string what = "tensor '" + e.name + "'";
    if (dt == "F32" || dt == "I32") {
      t.dtype = dt == "F32" ? sdk::DType::fp32 : sdk::DType::int32;
      t.bytes.resize(static_cast<std::size_t>(n_bytes));
      read_at(t.bytes.data(), t.bytes.size(), offset, what);
      return t;
    }
    t.dtype = sdk::DType::fp32;
    std::vector<float> f32(n);
    if (dt == "F16" || dt == "BF16") {
      std::vector<std::uint16_t> src(n);
      read_at(src.data(), n * 2, offset, what);
      sdk::convert(std::span<const std::uint16_t>(src), dt == "F16" ? sdk::DType::fp16 : sdk::DType::bf16,
                   std::span<float>(f32));
    } else if (dt == "F8_E4M3" || dt == "F8_E5M2") {
      std::vector<std::uint8_t> src(n);
      read_at(src.data(), n, offset, what);
      sdk::convert(std::span<const std::uint8_t>(src),
                   dt == "F8_E4M3" ? sdk::DType::fp8_e4m3 : sdk::DType::fp8_e5m2,
                   std::span<float>(f32));
    } else if (dt == "F64") {
      // Read in bounded chunks so an F64 tensor never needs a second full-size buffer.
      constexpr std::size_t kChunk = 1 << 16;
      std::vector<double> chunk(std::min(n, kChunk));
      for (std::size_t i = 0; i < n; i += kChunk) {
        const std::size_t m = std::min(kChunk, n - i);
        read_at(chunk.data(), m * 8, offset + i * 8, what);
        for (std::size_t k = 0; k < m; ++k) f32[i + k] = static_cast<float>(chunk[k]);
      }
    } else {
      logger_.warn("safetensors file " + quoted(path_) + ": tensor '" + e.name + "' is " + dt +
                   ", which mixtrain does not load; it is skipped");
      return std::nullopt;
    }
    t.bytes.resize(n * 4);
    std::memcpy(t.bytes.data(), f32.data(), n * 4);
    return t;
  }

  const fs::path& path_;
  const sdk::Logger& logger_;
  std::optional<sdk::UniqueFd> fd_;
  std::uint64_t file_size_ = 0;
  std::uint64_t buffer_start_ = 0;
  std::uint64_t buffer_size_ = 0;
  std::map<std::string, std::string> metadata_;
};

}  // namespace

sdk::OptionSchema SafetensorsFormat::option_schema() {
  return {
      sdk::OptionSpec::string("dtype", "fp32",
                              "dtype the weights are written in (bf16/fp16: exact round-to-nearest-"
                              "even from the fp32 masters); reading accepts any float dtype")
          .one_of({"fp32", "bf16", "fp16"}),
      sdk::OptionSpec::boolean(
          "fsync", true,
          "fsync the file and its folder on write so a crash cannot lose a file that write() "
          "reported as done; turn off only for tests or scratch runs")};
}

SafetensorsFormat::SafetensorsFormat(const sdk::Options& options, const sdk::PluginContext& context)
    : dtype_(*sdk::parse_dtype(options.get_string("dtype"))),
      fsync_(options.get_bool("fsync")),
      logger_(context.logger) {}

void SafetensorsFormat::write(const fs::path& path, const sdk::TrainingState& state) const {
  std::vector<sdk::StreamedTensor> tensors;
  tensors.reserve(state.tensors.size());
  for (const auto& t : state.tensors) tensors.push_back({t.name, t.dtype, t.shape});
  write_exported(
      path, tensors, state.metadata,
      [&](std::size_t i, std::span<std::byte>) -> std::span<const std::byte> {
        return state.tensors[i].bytes;
      },
      /*streamed=*/false);
}

void SafetensorsFormat::write_streamed(const fs::path& path,
                                       const std::vector<sdk::StreamedTensor>& tensors,
                                       const std::map<std::string, std::string>& metadata,
                                       const sdk::StreamedTensorReader& read) const {
  write_exported(path, tensors, metadata, read, /*streamed=*/true);
}

void SafetensorsFormat::write_exported(const fs::path& path,
                                       const std::vector<sdk::StreamedTensor>& tensors,
                                       const std::map<std::string, std::string>& metadata,
                                       const sdk::StreamedTensorReader& read, bool streamed) const {
  if (path.filename().empty())
    throw CheckpointError("cannot write " + quoted(path) + ": the path has no file name",
                          "give a file path such as model.safetensors");
  auto invalid = [&](const std::string& what) {
    throw CheckpointError("cannot write safetensors file " + quoted(path) + ": " + what,
                          "the training state handed to the checkpoint format is inconsistent; "
                          "this is a bug in the component that produced it");
  };

  // Plan everything (names, dtypes, offsets, header) before the disk is touched. The tensors
  // left out (optimizer slots, EMA) are never read.
  std::vector<Exported> plan;
  std::set<std::string> names;
  std::uint64_t offset = 0;
  std::uint64_t largest = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    std::string name;
    if (t.name.rfind("param/", 0) == 0) name = t.name.substr(6);
    else if (t.name.rfind("buffer/", 0) == 0) name = t.name.substr(7);  // running statistics
    else if (t.name.find('/') == std::string::npos) name = t.name;
    else continue;  // optimizer slots and other non-weight state
    if (name.empty() || name == "__metadata__") invalid("tensor name '" + t.name + "' cannot be exported");
    if (!names.insert(name).second) invalid("two tensors are exported as '" + name + "'");
    const auto have = checked_byte_count(t.shape, sdk::dtype_size(t.dtype));
    if (!have) invalid("tensor '" + t.name + "' has a negative or overflowing shape");
    // A whole state's bytes are checked here, before the disk is touched; a streamed tensor's
    // as it is read.
    if (!streamed) {
      const auto held = read(i, {}).size();
      if (*have != held)
        invalid("tensor '" + t.name + "' holds " + std::to_string(held) +
                " bytes, which does not match its shape and dtype");
    }
    const sdk::DType out = is_float(t.dtype) ? dtype_ : sdk::DType::int32;
    const std::uint64_t size = *have / sdk::dtype_size(t.dtype) * sdk::dtype_size(out);
    plan.push_back({name, &t, i, out, *have / sdk::dtype_size(t.dtype), offset, offset + size});
    offset += size;
    largest = std::max(largest, *have);
  }

  std::string header;
  try {
    ordered_json h = ordered_json::object();
    if (!metadata.empty()) {
      ordered_json meta = ordered_json::object();
      for (const auto& [k, v] : metadata) meta[k] = v;
      // Weights only (maybe narrowed): a resume must refuse the file (checkpoint_format.h).
      if (metadata.count("mixtrain.state_version")) meta["mixtrain.weights_only"] = "1";
      h["__metadata__"] = std::move(meta);
    }
    for (const auto& p : plan)
      h[p.name] = {{"dtype", st_name(p.dtype)}, {"shape", p.tensor->shape},
                   {"data_offsets", {p.begin, p.end}}};
    header = h.dump();
  } catch (const nlohmann::json::exception& e) {
    invalid(std::string("the header cannot be encoded (") + e.what() + ")");
  }
  // Like the reference writer: pad with spaces so the buffer starts 8-byte aligned.
  header.append((8 - header.size() % 8) % 8, ' ');

  // One buffer for a streamed state's reads, left uninitialised (a reader that hands out bytes
  // it holds costs nothing here).
  const std::size_t buffer_size = streamed ? static_cast<std::size_t>(largest) : 0;
  const std::unique_ptr<std::byte[]> storage(new std::byte[buffer_size]);
  const std::span<std::byte> buffer(storage.get(), buffer_size);
  sdk::AtomicFileWriter out(path, fsync_, "safetensors file");
  unsigned char len_bytes[8];
  std::uint64_t n = header.size();
  for (auto& b : len_bytes) {
    b = static_cast<unsigned char>(n & 0xFF);
    n >>= 8;
  }
  out.write(len_bytes, 8);
  out.write(header.data(), header.size());
  std::vector<std::byte> converted;
  for (const auto& p : plan) {
    const auto held = static_cast<std::size_t>(p.numel * sdk::dtype_size(p.tensor->dtype));
    const auto bytes = read(p.index, buffer.first(streamed ? held : 0));
    if (bytes.size() != held)  // the temporary file goes with `out`; the target is untouched
      invalid("tensor '" + p.tensor->name + "' came with " + std::to_string(bytes.size()) +
              " bytes, which does not match its shape and dtype");
    const auto written = converted_bytes(bytes, p.tensor->dtype, static_cast<std::size_t>(p.numel),
                                         p.dtype, converted);
    out.write(written.data(), written.size());
  }
  if (auto warning = out.commit(); !warning.empty()) logger_.warn(warning);
  logger_.debug("wrote " + quoted(path) + ": " + std::to_string(plan.size()) + " tensors");
}

sdk::TrainingState SafetensorsFormat::read(const fs::path& path) const {
  return Reader(path, logger_).read();
}

}  // namespace mixtrain::checkpoint_safetensors
