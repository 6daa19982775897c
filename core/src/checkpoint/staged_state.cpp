#include "checkpoint/staged_state.h"

#include <cstring>
#include <stdexcept>

namespace mixtrain::core {

std::size_t staged_bytes(const sdk::StreamedTensor& t) {
  std::size_t bytes = sdk::dtype_size(t.dtype);
  for (const auto d : t.shape) bytes *= static_cast<std::size_t>(d);
  return bytes;
}

sdk::TrainingState materialise(const StagedState& state) {
  sdk::TrainingState out;
  out.metadata = state.metadata;
  out.tensors.reserve(state.tensors.size());
  for (const auto& t : state.tensors) {
    sdk::HostTensor h;
    h.name = t.info.name;
    h.dtype = t.info.dtype;
    h.shape = t.info.shape;
    h.bytes.resize(staged_bytes(t.info));
    const auto bytes = t.read(t.held ? std::span<std::byte>() : std::span<std::byte>(h.bytes));
    if (bytes.size() != h.bytes.size())
      throw std::logic_error("staged tensor '" + h.name + "' read " + std::to_string(bytes.size()) +
                             " bytes of " + std::to_string(h.bytes.size()));
    if (!bytes.empty() && bytes.data() != h.bytes.data())
      std::memcpy(h.bytes.data(), bytes.data(), bytes.size());
    out.tensors.push_back(std::move(h));
  }
  return out;
}

void write_staged(const sdk::CheckpointFormat& format, const std::filesystem::path& path,
                  const StagedState& state) {
  const auto* streamed = dynamic_cast<const sdk::StreamedWriteFacet*>(&format);
  if (streamed == nullptr) {
    format.write(path, materialise(state));
    return;
  }
  std::vector<sdk::StreamedTensor> tensors;
  tensors.reserve(state.tensors.size());
  for (const auto& t : state.tensors) tensors.push_back(t.info);
  streamed->write_streamed(
      path, tensors, state.metadata,
      [&](std::size_t i, std::span<std::byte> buffer) { return state.tensors.at(i).read(buffer); });
}

}  // namespace mixtrain::core
