// SafetensorsFormat: the `safetensors` checkpoint format (.safetensors) — model weights in the
// public layout of https://github.com/huggingface/safetensors, for the wider ecosystem.
//
// File layout (all integers little-endian):
//   u64 N | N bytes of UTF-8 JSON header, padded with spaces so N % 8 == 0 | byte buffer
//   header = {"__metadata__": {str: str}, "<name>": {"dtype": "F32"|"BF16"|"F16",
//             "shape": [...], "data_offsets": [begin, end]}, ...}
//   offsets are relative to the byte buffer; tensors are contiguous, C order, and cover the
//   buffer exactly (no holes, no overlaps).
//
// Contract
// - write() exports the model's state only: a tensor named "param/<x>" or "buffer/<x>" (a
//   non-trainable buffer, beside the parameters as in PyTorch's state_dict) is written as "<x>";
//   a name without a '/' namespace is written as is; every other tensor ("optimizer/...",
//   "ema/...") is left out — it is not ecosystem data. Floating-point tensors are written in the
//   `dtype` option (fp32 → bf16 / fp16 by exact round-to-nearest-even, sdk/float_formats.h); int32
//   tensors stay I32. Metadata is written verbatim as the "__metadata__" string map. The write is
//   atomic: a temp file in the target's folder, fsync (option `fsync`), rename, fsync of the
//   folder. An inconsistent state (byte count not matching shape × dtype, two tensors with the same
//   exported name, non-UTF-8 text) is rejected before the disk is touched.
// - write_streamed() (sdk/format_streamed_write.h) writes the file write() writes, reading only
//   the tensors it exports, each once, as it writes it: host memory for one tensor.
// - read() trusts nothing. It checks the header length (≤ file size − 8 and ≤ 100 MB), that the
//   header is a JSON object without duplicate keys, each entry's dtype, shape and offsets (in the
//   buffer, length = numel × dtype size, no overlaps, no holes — as the spec requires), and the
//   metadata (strings only). Any defect raises sdk::CheckpointError naming the file and the
//   tensor, with a hint. It never reads out of bounds; what it allocates is proportional to what
//   the file really holds (at most 4× the file's size, for F8 → fp32).
// - read() returns floating-point tensors as fp32 HostTensors (F32/F64/BF16/F16/F8_E4M3/F8_E5M2
//   are converted exactly, F64 by rounding to nearest), I32 as int32, and leaves other integer
//   and boolean tensors out with a warning. Names are returned as stored (no "param/" prefix).
// - The object is immutable after construction; write() and read() may run concurrently.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "mixtrain/sdk/checkpoint_format.h"
#include "mixtrain/sdk/dtype.h"
#include "mixtrain/sdk/format_streamed_write.h"
#include "mixtrain/sdk/options.h"
#include "mixtrain/sdk/plugin.h"

namespace mixtrain::checkpoint_safetensors {

// Largest header read() accepts; the reference implementation uses the same bound.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

class SafetensorsFormat final : public sdk::CheckpointFormat, public sdk::StreamedWriteFacet {
 public:
  static sdk::OptionSchema option_schema();

  SafetensorsFormat(const sdk::Options& options, const sdk::PluginContext& context);

  std::string file_extension() const override { return ".safetensors"; }
  void write(const std::filesystem::path& path, const sdk::TrainingState& state) const override;
  sdk::TrainingState read(const std::filesystem::path& path) const override;
  void write_streamed(const std::filesystem::path& path,
                      const std::vector<sdk::StreamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const sdk::StreamedTensorReader& read) const override;

  sdk::DType dtype() const { return dtype_; }

 private:
  // write() and write_streamed(): `streamed` says whether read fills the buffer it is given
  // (the tensors exported are read once each, in the file's order) or hands out what it holds.
  void write_exported(const std::filesystem::path& path,
                      const std::vector<sdk::StreamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const sdk::StreamedTensorReader& read, bool streamed) const;

  sdk::DType dtype_;
  bool fsync_;
  sdk::Logger logger_;
};

}  // namespace mixtrain::checkpoint_safetensors
