// HostMemoryFacet: host memory that a backend's uploads read in place — page-locked on CUDA — so a
// host that prepares its batches there (on a loader thread) sends them without a copy into the
// backend's own staging memory on the step's thread. PyTorch's DataLoader(pin_memory=True) is the
// same idea.
//
// Contract
// - allocate_host(bytes) returns a HostBuffer of at least `bytes` bytes (64-byte aligned, contents
//   unspecified), or throws BackendError naming the buffer and the fix when the memory cannot be
//   had (page-locked memory is limited by the OS); a host then uses ordinary memory, which every
//   upload accepts.
// - Uploads from a buffer: copy_from_host and decode_images (backend_image_input.h) whose source
//   lies inside one HostBuffer of this backend may read it after they return, in the order of the
//   backend's other work, instead of before. The host calls wait_until_read() before it writes
//   the buffer again. Every other upload keeps its rule: the source is read before the call
//   returns.
// - HostBuffer::wait_until_read() returns once every upload queued so far from the buffer has read
//   it, or throws BackendError when the device failed meanwhile. Destruction waits the same way
//   first (quietly), then frees the memory.
// - Threading: allocate_host and every HostBuffer method may be called from any host thread,
//   alongside the backend's one caller thread (a loader thread writes buffers while the step's
//   thread uploads others). One buffer is used by one thread at a time.
// - Lifetime: every HostBuffer is destroyed before the backend that made it.
// - Optional: a backend whose uploads gain nothing from it (the CPU's copy is a memcpy either way)
//   offers no such facet (find_facet answers nullptr).
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a minor
//   step only appends methods). HostBuffer is part of this facet's declarations: a method added to
//   it is a major step (a host would call it on a buffer an older backend made).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstddef>
#include <memory>
#include <string_view>

#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

// One block of host memory from allocate_host; owned by the host, freed by its destructor.
class MIXTRAIN_SDK_API HostBuffer {
 public:
  virtual ~HostBuffer();
  HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  virtual std::byte* data() noexcept = 0;
  virtual std::size_t size() const noexcept = 0;
  // Blocks until the uploads queued from this buffer have read it: it may then be written.
  virtual void wait_until_read() = 0;
};

class MIXTRAIN_SDK_API HostMemoryFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "host_memory";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual std::unique_ptr<HostBuffer> allocate_host(std::size_t bytes) = 0;

 protected:
  ~HostMemoryFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
