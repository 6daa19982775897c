// CudaImageInput: the CUDA backend's ImageInputFacet (sdk/backend_image_input.h), whole in one
// file: a batch of byte images crosses the host-device link at one byte a pixel (a quarter of
// fp32's bytes) and is decoded on the device, y[r, c, p] = table[c, pixels[r, c, p]] rounded once
// into y's dtype (cuda_image_decode.h: bit for bit the host's round to nearest even).
//
// How a call runs, and why
// - The arguments are checked first (BackendArgumentChecks::decode_images): nothing is enqueued for
// a bad one.
// - The bytes go through the context's pinned staging slots on a copy stream of the context's own
//   into one of two device byte slots (cuda_byte_upload.h): the caller may refill its buffer when
//   the call returns (bytes in a host_memory buffer skip the slot and are read in place, in the
//   copy stream's order), the host does not wait for the device, and the copy of the next batch
//   runs while this batch's decode and the step's kernels still use the other slot. Events order
//   it: the copy into a slot waits for the last decode that read the slot; the decode waits for its
//   copy. The decoded y is then ordered before every later op, which all run on the one stream.
// - The slots are the context's grow-only buffers, counted in memory_stats() (account_buffers).
// - While a step graph is recording, a call with bytes to upload raises BackendError as
//   copy_from_host does: a recorded upload would read a staging slot at every replay, long after
//   the host reused it (the trainer then runs the step op by op).
#include "cuda_access.h"
#include "cuda_byte_upload.h"
#include "cuda_context.h"
#include "cuda_image_decode.h"
#include "mixtrain/sdk/backend_image_input.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

namespace {

class CudaImageInput final : public sdk::ImageInputFacet {
 public:
  explicit CudaImageInput(CudaContext& context) : context_(context) {}

  void decode_images(const sdk::ByteImages& images, sdk::TensorView table,
                     sdk::TensorView y) override {
    context_.activate();
    constexpr const char* op = "decode_images";
    const std::int64_t count = checks().decode_images(images, table, y);
    if (count == 0) return;  // nothing to upload or decode (y has no elements)
    const auto bytes = static_cast<std::size_t>(count);
    context_.staging.require_not_recording(op);
    ByteUpload& upload = context_.byte_upload(op);
    const std::uint8_t* pixels =
        upload.upload(images.pixels, bytes, context_.staging, context_.stream, op);
    context_.account_buffers();
    const cudaError_t launched = kernels::decode_images(
        pixels, table.as<const float>(), y.data, elem_of(y.dtype), images.rows * images.channels,
        images.channels, images.plane, context_.stream);
    // Recorded whatever the launch did: the slot's next copy must not overtake a decode that runs.
    upload.consumed(context_.stream, op);
    check_cuda(launched, op, "kernel launch");
  }

 private:
  CudaContext& context_;
};

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::ImageInputFacet, CudaImageInput>
    kCudaImageInputRegistration;

}  // namespace

}  // namespace mixtrain::backend_cuda
