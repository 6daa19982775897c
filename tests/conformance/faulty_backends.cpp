// The faulty backends of faulty_backends.h: the inner backend behind a wrapper that forwards every
// op and every facet but gemm.
#include "faulty_backends.h"

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>

#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::conformance::faults {
namespace {

using sdk::DType;
using sdk::TensorView;

enum class Fault { square_transposes, short_k };

// The inner backend's gemm facet with one fault in gemm(); every other op forwarded, since
// supports() is (backend_gemm.h: a facet that forwards supports() forwards the calls too).
class FaultyGemm final : public sdk::GemmFacet {
 public:
  FaultyGemm(sdk::DeviceBackend& backend, sdk::GemmFacet& inner, Fault fault)
      : backend_(backend), in_(inner), fault_(fault) {}

  bool supports(sdk::GemmOp op, std::span<const DType> dtypes) const override {
    return in_.supports(op, dtypes);
  }
  void gemm(const sdk::GemmArgs& args) override {
    if (fault_ == Fault::square_transposes) {
      sdk::GemmArgs g = args;
      auto square = [](const TensorView& v) { return v.shape.rows() == v.shape.cols(); };
      if (square(g.a.view)) g.a.transpose = false;
      if (square(g.b.view)) g.b.transpose = false;
      in_.gemm(g);
      return;
    }
    const TensorView& a = args.a.view;
    const std::int64_t rows = a.shape.rows(), cols = a.shape.cols();
    const std::int64_t k = args.a.transpose ? rows : cols;
    if (k <= 64) {
      in_.gemm(args);
      return;
    }
    // A with its last reduction index zeroed (all-zero bits are +0 in every GEMM input format):
    // op(A)'s column k-1, stored as A's last column, or its last row when A is transposed.
    std::vector<std::byte> bytes(a.bytes());
    backend_.copy_to_host(bytes.data(), a);
    const std::size_t size = sdk::dtype_size(a.dtype);
    auto zero = [&](std::int64_t r, std::int64_t c) {
      std::memset(bytes.data() + static_cast<std::size_t>(r * cols + c) * size, 0, size);
    };
    if (args.a.transpose)
      for (std::int64_t c = 0; c < cols; ++c) zero(k - 1, c);
    else
      for (std::int64_t r = 0; r < rows; ++r) zero(r, k - 1);
    struct Freed {
      sdk::DeviceBackend& b;
      void* p;
      ~Freed() { b.deallocate(p); }
    } shorter{backend_, backend_.allocate(bytes.size())};
    sdk::GemmArgs g = args;
    g.a.view.data = shorter.p;
    backend_.copy_from_host(g.a.view, bytes.data());
    in_.gemm(g);
  }
  void gemm_strided_batched(const sdk::GemmBatchedArgs& args) override {
    in_.gemm_strided_batched(args);
  }
  void gemm_grouped(std::span<const sdk::GemmArgs> group) override { in_.gemm_grouped(group); }
  void quantize_block_scaled(const sdk::BlockQuantizeArgs& args) override {
    in_.quantize_block_scaled(args);
  }
  void gemm_block_scaled(const sdk::BlockScaledGemmArgs& args) override {
    in_.gemm_block_scaled(args);
  }
  std::string block_layout_refusal(const sdk::BlockScaledLayout& layout) const override {
    return in_.block_layout_refusal(layout);
  }
  bool quantizes_transposed() const override { return in_.quantizes_transposed(); }
  void gemm_gradient(const sdk::GemmGradientArgs& args) override { in_.gemm_gradient(args); }
  void cast_transpose(const sdk::CastTransposeArgs& args) override { in_.cast_transpose(args); }
  void cast_transpose_gradient(const sdk::CastTransposeGradientArgs& args) override {
    in_.cast_transpose_gradient(args);
  }

 private:
  sdk::DeviceBackend& backend_;
  sdk::GemmFacet& in_;
  Fault fault_;
};

// A gemm facet of the next major, as a backend built against a newer SDK would offer: its name
// is the one the kit asks for, and nothing of it may be called through this SDK's GemmFacet.
class OtherMajorGemm final : public sdk::Facet {
 public:
  std::string_view name() const override { return sdk::GemmFacet::kName; }
  sdk::FacetVersion version() const override {
    return {static_cast<std::uint16_t>(sdk::GemmFacet::kVersion.major + 1), 0};
  }
};

// The inner backend with its gemm facet answered by `gemm` (which it owns).
class SwappedGemmBackend final : public sdk::DeviceBackend {
 public:
  explicit SwappedGemmBackend(std::shared_ptr<sdk::DeviceBackend> inner) : in_(std::move(inner)) {}

  void make_faulty(Fault fault) {
    faulty_ = std::make_unique<FaultyGemm>(*in_, *sdk::facet<sdk::GemmFacet>(*in_), fault);
  }
  void make_other_major() { other_major_ = std::make_unique<OtherMajorGemm>(); }

  sdk::BackendCapabilities capabilities() const override { return in_->capabilities(); }
  void* allocate(std::size_t bytes) override { return in_->allocate(bytes); }
  void deallocate(void* p) noexcept override { in_->deallocate(p); }
  sdk::MemoryStats memory_stats() const override { return in_->memory_stats(); }
  void copy_from_host(TensorView d, const void* s) override { in_->copy_from_host(d, s); }
  void copy_to_host(void* d, TensorView s) override { in_->copy_to_host(d, s); }
  void copy(TensorView d, TensorView s) override { in_->copy(d, s); }
  void synchronize() override { in_->synchronize(); }
  void cast(TensorView s, TensorView d, const sdk::CastArgs& a) override { in_->cast(s, d, a); }
  void fill(TensorView x, float v) override { in_->fill(x, v); }
  sdk::Facet* find_facet(std::string_view name) override {
    if (name == sdk::GemmFacet::kName) {
      if (faulty_) return static_cast<sdk::GemmFacet*>(faulty_.get());
      if (other_major_) return other_major_.get();
    }
    return in_->find_facet(name);
  }

 private:
  std::shared_ptr<sdk::DeviceBackend> in_;
  std::unique_ptr<FaultyGemm> faulty_;
  std::unique_ptr<OtherMajorGemm> other_major_;
};

}  // namespace

std::vector<std::pair<std::string, BackendFactory>> faulty_backends(BackendFactory inner) {
  auto faulty = [inner](Fault fault) -> BackendFactory {
    return [inner, fault] {
      auto b = std::make_shared<SwappedGemmBackend>(inner());
      b->make_faulty(fault);
      return b;
    };
  };
  return {{"faulty_gemm_square_transposes", faulty(Fault::square_transposes)},
          {"faulty_gemm_short_k", faulty(Fault::short_k)},
          {"faulty_gemm_other_major", [inner] {
             auto b = std::make_shared<SwappedGemmBackend>(inner());
             b->make_other_major();
             return b;
           }}};
}

}  // namespace mixtrain::conformance::faults
