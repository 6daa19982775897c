// Token streams from files: llm.c token files (uint16 GPT-2 tokens behind a 1024-byte header) and
// byte-level text (every byte is a token of a 256-word vocabulary).
//
// Sizes are checked against the file before anything is allocated, and tokens are read in
// pieces, so memory holds the int32 stream and one piece, never a second copy of the file.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "data/file_support.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;
using namespace data_files;

// llm.c dev/data/data_common.py: 256 int32 of header, of which three are used.
constexpr std::uint64_t kHeaderInts = 256;
constexpr std::uint64_t kHeaderBytes = kHeaderInts * 4;
constexpr std::int64_t kTokenMagic = 20240520;
constexpr std::int64_t kTokenVersion = 1;  // uint16 tokens (GPT-2); version 2 is uint32 (Llama 3)
constexpr std::uint64_t kPieceBytes = std::uint64_t{1} << 20;

const char* const kWriteHint =
    "write it with llm.c's dev/data scripts (fineweb.py, tinyshakespeare.py) or "
    "samples/data_tools/make_token_file.py; plain text files take data.source = \"text\"";

std::int64_t header_int(const std::vector<unsigned char>& header, std::size_t index) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(load_le(&header[index * 4], 4)));
}

}  // namespace

std::vector<std::int32_t> load_token_file(const fs::path& file, std::int32_t vocab_size) {
  if (vocab_size < 1)
    fail(file, "vocab_size must be >= 1, found " + std::to_string(vocab_size),
         "set data.vocab_size (GPT-2 token files: 50257)");
  FileReader in(file);
  std::vector<unsigned char> header(kHeaderBytes);
  // The magic first: a text file given here should say so, not that it is short.
  if (in.size() >= 4) {
    in.read(header.data(), 4, "the magic number");
    const std::int64_t magic = header_int(header, 0);
    if (magic != kTokenMagic)
      fail(file,
           "not an llm.c token file: the int32 at byte offset 0 is " + std::to_string(magic) +
               ", expected the magic number " + std::to_string(kTokenMagic),
           kWriteHint);
  }
  if (in.size() < kHeaderBytes)
    fail(file,
         "truncated: " + std::to_string(in.size()) + " bytes, shorter than the " +
             std::to_string(kHeaderBytes) + "-byte header of an llm.c token file",
         "the file is incomplete; write it again");
  in.read(header.data() + 4, kHeaderBytes - 4, "the header");
  const std::int64_t version = header_int(header, 1);
  if (version != kTokenVersion)
    fail(file,
         "the version at byte offset 4 is " + std::to_string(version) + ", expected " +
             std::to_string(kTokenVersion) + " (uint16 tokens)",
         version == 2 ? "version 2 holds uint32 tokens (Llama 3), which are not read yet; "
                        "write a version 1 (GPT-2) file"
                      : kWriteHint);
  const std::int64_t count = header_int(header, 2);
  if (count < 0)
    fail(file, "the token count at byte offset 8 is negative (" + std::to_string(count) + ")",
         "the header is damaged; write the file again");
  const auto data_bytes = static_cast<std::uint64_t>(count) * 2;
  if (data_bytes > in.remaining())
    fail(file,
         "truncated: the header declares " + std::to_string(count) + " tokens (" +
             std::to_string(data_bytes) + " bytes from byte offset " +
             std::to_string(kHeaderBytes) + "), the file holds " + std::to_string(in.remaining()) +
             " bytes after the header",
         "the file is incomplete; write or download it again");
  if (data_bytes < in.remaining())
    fail(file,
         "has " + std::to_string(in.remaining() - data_bytes) + " unexpected bytes after the " +
             std::to_string(count) +
             " tokens the header declares (the data should end at byte offset " +
             std::to_string(kHeaderBytes + data_bytes) + ")",
         "the header's token count does not describe the data; write the file again");

  // Room for one token more: `predict` appends a placeholder target after a stream that ends
  // with a whole window, which would otherwise copy the stream (2x its memory at the peak).
  std::vector<std::int32_t> tokens;
  tokens.reserve(static_cast<std::size_t>(count) + 1);
  tokens.resize(static_cast<std::size_t>(count));
  std::vector<unsigned char> piece(static_cast<std::size_t>(std::min(kPieceBytes, data_bytes)));
  for (std::uint64_t done = 0; done < data_bytes;) {
    const std::uint64_t n = std::min<std::uint64_t>(piece.size(), data_bytes - done);
    in.read(piece.data(), n, "the tokens");
    const std::size_t first = static_cast<std::size_t>(done / 2);
    for (std::size_t k = 0; k < n / 2; ++k) {
      const auto token = static_cast<std::int32_t>(piece[2 * k] | (piece[2 * k + 1] << 8));
      if (token >= vocab_size) {
        const std::size_t index = first + k;
        fail(file,
             "token " + std::to_string(token) + " at index " + std::to_string(index) +
                 " (byte offset " + std::to_string(kHeaderBytes + 2 * index) +
                 ") is not below vocab_size = " + std::to_string(vocab_size),
             "set data.vocab_size to the tokenizer's vocabulary (GPT-2: 50257), or check that "
             "the file was written with that tokenizer");
      }
      tokens[first + k] = token;
    }
    done += n;
  }
  return tokens;
}

std::vector<std::int32_t> load_text_tokens(std::span<const fs::path> files) {
  if (files.empty())
    throw sdk::DataError("text data: no files given",
                         "set data.path to a text file or a list of them");
  std::uint64_t total = 0;  // one allocation for the whole stream, sized by the files
  for (const auto& file : files) {
    FileReader in(file);
    if (in.size() == 0)
      fail(file, "is empty, expected text (every byte is one token)",
           "give a non-empty text file, or drop it from data.path");
    total += in.size();
    // Every byte is a token, so any file would "load": refuse the two binary formats a user is
    // likely to pass by mistake, whose headers no text starts with.
    const auto head = in.read_bytes(std::min<std::uint64_t>(6, in.size()), "the first bytes");
    if (head.size() == 6 && std::memcmp(head.data(), "\x93NUMPY", 6) == 0)
      fail(file, "is a NumPy .npy file, not text",
           "for rows of numbers set data.source = \"npy\"; text data is a plain text file");
    if (head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x1f &&
        static_cast<unsigned char>(head[1]) == 0x8b)
      fail(file, "is gzip-compressed, not text (its bytes would train as tokens)",
           "decompress it first: gunzip -k " + file.string());
    if (head.size() >= 4 && static_cast<std::int64_t>(load_le(head.data(), 4)) == kTokenMagic)
      fail(file, "is an llm.c token file (magic 20240520), not text",
           "set data.source = \"tokens\" for token files; text data is a plain text file");
  }
  std::vector<std::int32_t> tokens;
  tokens.reserve(static_cast<std::size_t>(total) + 1);  // + 1: as load_token_file's
  for (const auto& file : files) {
    FileReader in(file);
    std::vector<unsigned char> piece(static_cast<std::size_t>(std::min(kPieceBytes, in.size())));
    while (in.remaining() > 0) {
      const std::uint64_t n = std::min<std::uint64_t>(piece.size(), in.remaining());
      in.read(piece.data(), n, "the text");
      tokens.insert(tokens.end(), piece.begin(), piece.begin() + static_cast<std::ptrdiff_t>(n));
    }
  }
  return tokens;
}

}  // namespace mixtrain::core
