// ImageInputFacet (backend_image_input.h): its out-of-line anchor, its op's name in messages, its
// row of the signature table and the default supports() that answers from it.
#include "mixtrain/sdk/backend_image_input.h"
#include "signature_classes.h"

namespace mixtrain::sdk {

ImageInputFacet::~ImageInputFacet() = default;

std::string_view op_name(ImageInputOp op) noexcept {
  switch (op) {
    case ImageInputOp::decode_images:
      return "decode_images";
  }
  return "?";
}

OpSignature op_signature(ImageInputOp op) noexcept {
  switch (op) {
    case ImageInputOp::decode_images:
      return {kF32Store};  // {table, y}
  }
  return {};
}

bool ImageInputFacet::supports(ImageInputOp op, std::span<const DType> dtypes) const {
  return signature_accepts(op, dtypes);
}

}  // namespace mixtrain::sdk
