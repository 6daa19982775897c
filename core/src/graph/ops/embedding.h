// Token and learned position embeddings: table lookups by id, on the backend's embedding facet.
//
// Contract
// - embedding: input ids int32 [N, T] (the batch of a token data source; only the graph input
//   carries ids), output [N, T, C] = weight[ids] with weight [vocab, C] (FP32 master, no working
//   copy: the gather rounds once into the output's dtype). Backward scatter-adds dy into the
//   FP32 gradient deterministically; ids have no gradient. The weight may be the tie target of an
//   LM head (a linear with tie_weight = "<node>.weight", [vocab, C]): both users accumulate into
//   the one gradient.
// - position_embedding: x [N, T, C] → y = x + weight[t] with weight [positions, C], positions >= T
//   (GPT-2's wpe). Backward: dx = dy, and dweight[t] = Σ_n dy[n, t].
// - Decoding (graph/decoder.h): position_embedding's decode state is the position ids of one
//   sequence, 0 .. capacity - 1; a decode step's rows are positions [start, start + rows).
// - Both initialise N(0, init_std²) (PyTorch's nn.Embedding: 1; GPT-2 uses 0.02).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

class EmbeddingLayer final : public Layer {
 public:
  EmbeddingLayer(std::string name, std::int64_t tokens, std::int64_t vocab, std::int64_t dim,
                 double init_std);
  std::int64_t vocab() const { return vocab_; }
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  // x: ids int32 [N, T] seen as [rows = N·T] ids.
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void init_parameters(std::uint64_t seed) override;
  // The gather reads the FP32 table (forward).
  bool reads_parameter_masters() const override { return true; }

 private:
  std::int64_t vocab_;
  double init_std_;
};

class PositionEmbeddingLayer final : public Layer {
 public:
  PositionEmbeddingLayer(std::string name, std::int64_t tokens, std::int64_t positions,
                         std::int64_t dim, double init_std);
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;
  void init_parameters(std::uint64_t seed) override;
  std::unique_ptr<DecodeState> make_decode_state(std::int64_t capacity) const override;
  void decode_forward(std::span<const sdk::TensorView> xs, std::int64_t start, std::int64_t rows,
                      DecodeState* state) override;

 private:
  // y = x + weight[ids], ids int32 [rows].
  void add_positions(sdk::TensorView x, sdk::TensorView ids, std::int64_t rows);

  std::int64_t tokens_, positions_;
  double init_std_;
  Tensor position_ids_;  // int32 [max_rows]: row r is position r % tokens
  sdk::TensorView ids_for(std::int64_t rows) const;
};

}  // namespace mixtrain::core
