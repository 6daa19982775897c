// ImageInputFacet: a batch of byte images sent to the device as bytes and decoded there, so an
// image batch crosses the host-device link at one byte a pixel instead of four.
//
// Contract
// - A backend offers it as find_facet("image_input") (nullptr: none). It is optional: a host that
//   finds none, or whose supports() answer is no, decodes the bytes itself and uploads the floats
//   with copy_from_host, with the same values.
// - supports(decode_images, {table, y}) answers for the decode table's dtype (fp32) and the
//   output's (fp32, bf16 or fp16), without running anything.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class ImageInputOp {
  decode_images,  // {table, y}
};
MIXTRAIN_SDK_API std::string_view op_name(ImageInputOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(ImageInputOp op) noexcept;

// `rows` images of `channels` planes of `plane` pixels each, one byte a pixel, channels-first:
// pixel p of channel c of image r is byte (r·channels + c)·plane + p.
struct ByteImages {
  const std::uint8_t* pixels = nullptr;  // host memory, read as decode_images says
  std::int64_t rows = 0, channels = 0, plane = 0;
};

class MIXTRAIN_SDK_API ImageInputFacet : public Facet {
 public:
  using Op = ImageInputOp;
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "image_input";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(ImageInputOp op, std::span<const DType> dtypes) const;

  // y[r, c, p] = table[c, images.pixels[r, c, p]], rounded once into y's dtype (round to nearest
  // even). table: fp32 [channels, 256] in this backend's memory, what each byte of each channel
  // stands for (the normalisation folded in); y: [rows, channels·plane] in this backend's memory.
  // The bytes are read from host memory before the call returns, so the caller may refill its
  // buffer at once (unless they lie in a HostBuffer: backend_host_memory.h); the decoded y is
  // ordered before the backend's later ops, as copy_from_host's upload is. Raises BackendError for
  // a table or y that does not fit `images`, or a null pixels pointer with rows > 0.
  virtual void decode_images(const ByteImages& images, TensorView table, TensorView y) = 0;

 protected:
  ~ImageInputFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
