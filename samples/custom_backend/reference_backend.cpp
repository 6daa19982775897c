// ReferenceBackend: see reference_backend.h.
#include "reference_backend.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace reference {

namespace sdk = mixtrain::sdk;

namespace {

void require_fp32(std::string_view op, const sdk::TensorView& t, std::string_view what) {
  if (!t.empty() && t.dtype != sdk::DType::fp32)
    throw sdk::BackendError("reference." + std::string(op) + ": " + std::string(what) + " is " +
                                std::string(sdk::dtype_name(t.dtype)) + ", this backend runs fp32",
                            "use backend.type = \"cpu\" for other dtypes");
}

// Element (r, c) of op(X) for X stored [rows, cols] row-major.
float at(const sdk::GemmOperand& x, std::int64_t r, std::int64_t c) {
  const auto* p = x.view.as<const float>();
  const std::int64_t cols = x.view.shape.cols();
  return x.transpose ? p[c * cols + r] : p[r * cols + c];
}

}  // namespace

bool ReferenceGemm::supports(sdk::GemmOp op, std::span<const sdk::DType> dtypes) const {
  for (sdk::DType t : dtypes)
    if (t != sdk::DType::fp32) return false;
  return sdk::GemmFacet::supports(op, dtypes);
}

void ReferenceGemm::gemm(const sdk::GemmArgs& g) {
  require_fp32("gemm", g.a.view, "A");
  require_fp32("gemm", g.b.view, "B");
  require_fp32("gemm", g.c, "C");
  // A is op(A) [m, k], B is op(B) [k, n], C is [m, n].
  const std::int64_t m = g.c.shape.rows(), n = g.c.shape.cols();
  const std::int64_t k = g.a.transpose ? g.a.view.shape.rows() : g.a.view.shape.cols();
  auto* c = g.c.as<float>();
  const float* bias = g.bias.empty() ? nullptr : g.bias.as<const float>();
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float z = 0.0f;
      for (std::int64_t p = 0; p < k; ++p) z += at(g.a, i, p) * at(g.b, p, j);
      z = g.alpha * z + (g.beta != 0.0f ? g.beta * c[i * n + j] : 0.0f);
      if (bias != nullptr) z += bias[j];
      if (g.has_activation) {
        const float pre = z;
        if (g.activation == sdk::Activation::relu)
          z = z < 0.0f ? 0.0f : z;  // a NaN stays NaN (sdk/backend_gemm.h)
        else  // gelu, tanh approximation
          z = 0.5f * z * (1.0f + std::tanh(0.7978845608f * (z + 0.044715f * z * z * z)));
        if (!g.pre_activation.empty()) g.pre_activation.as<float>()[i * n + j] = pre;
      }
      c[i * n + j] = z;
    }
}

void ReferenceGemm::gemm_strided_batched(const sdk::GemmBatchedArgs& g) {
  for (std::int64_t i = 0; i < g.batch; ++i) {
    sdk::GemmArgs one = g.gemm;
    one.a.view.data = g.gemm.a.view.as<float>() + i * g.stride_a;
    one.b.view.data = g.gemm.b.view.as<float>() + i * g.stride_b;
    one.c.data = g.gemm.c.as<float>() + i * g.stride_c;
    gemm(one);
  }
}

ReferenceBackend::ReferenceBackend(const sdk::Options&, const sdk::PluginContext&) {}

sdk::BackendCapabilities ReferenceBackend::capabilities() const {
  sdk::BackendCapabilities c;
  c.kind = "reference";
  c.device_name = "host (reference loops)";
  c.gemm_inputs = {{sdk::DType::fp32, false, "a plain triple loop"}};
  return c;
}

void* ReferenceBackend::allocate(std::size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (p == nullptr)
    throw sdk::BackendError("reference: cannot allocate " + std::to_string(bytes) + " bytes");
  stats_.current_bytes += bytes;
  stats_.allocations += 1;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  std::memcpy(p, &bytes, sizeof bytes);  // the size, for deallocate's statistics
  return static_cast<std::byte*>(p) + 64;
}

void ReferenceBackend::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  void* base = static_cast<std::byte*>(ptr) - 64;
  std::size_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  stats_.current_bytes -= bytes;
  stats_.allocations -= 1;
  std::free(base);
}

void ReferenceBackend::copy_from_host(sdk::TensorView dst, const void* src) {
  std::memcpy(dst.data, src, dst.bytes());
}
void ReferenceBackend::copy_to_host(void* dst, sdk::TensorView src) {
  std::memcpy(dst, src.data, src.bytes());
}
void ReferenceBackend::copy(sdk::TensorView dst, sdk::TensorView src) {
  // The contract (sdk/device_backend.h): one tensor, or two disjoint ones.
  const auto d = reinterpret_cast<std::uintptr_t>(dst.data);
  const auto s = reinterpret_cast<std::uintptr_t>(src.data);
  if (d != s && d < s + src.bytes() && s < d + dst.bytes())
    throw sdk::BackendError("reference.copy: dst and src partly overlap",
                            "copy between disjoint tensors (or a tensor onto itself)");
  if (d != s) std::memcpy(dst.data, src.data, src.bytes());
}

void ReferenceBackend::cast(sdk::TensorView src, sdk::TensorView dst, const sdk::CastArgs& args) {
  require_fp32("cast", src, "src");
  require_fp32("cast", dst, "dst");
  const auto* s = src.as<const float>();
  auto* d = dst.as<float>();
  for (std::int64_t i = 0; i < src.numel(); ++i) d[i] = s[i] * args.scale;
}

void ReferenceBackend::fill(sdk::TensorView x, float value) {
  require_fp32("fill", x, "x");
  auto* p = x.as<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) p[i] = value;
}

// Facets are objects the backend owns, found by name once when the host plans.
sdk::Facet* ReferenceBackend::find_facet(std::string_view name) {
  return name == sdk::GemmFacet::kName ? &gemm_ : nullptr;
}

}  // namespace reference

namespace {

std::vector<mixtrain::sdk::ComponentInfo> components() {
  return {{mixtrain::sdk::ComponentKind::backend,
           "reference",
           "sample backend: host memory, fp32, a triple-loop GEMM facet",
           {},
           &mixtrain::sdk::make_component<reference::ReferenceBackend>}};
}

}  // namespace

MIXTRAIN_PLUGIN("reference_backend", "1.0.0", components)
