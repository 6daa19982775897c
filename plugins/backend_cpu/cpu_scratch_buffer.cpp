#include "cpu_scratch_buffer.h"

#include <cstdlib>
#include <string>

#include "cpu_access.h"

namespace mixtrain::backend_cpu {

void ScratchBuffer::Free::operator()(void* p) const noexcept {
  std::free(p);
}

void* ScratchBuffer::get(std::size_t bytes) {
  if (bytes > capacity_) {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr)
      fail("scratch", "cannot allocate " + std::to_string(rounded) + " bytes of scratch",
           "use a smaller batch or free host memory");
    data_.reset(p);
    capacity_ = rounded;
  }
  return data_.get();
}

}  // namespace mixtrain::backend_cpu
