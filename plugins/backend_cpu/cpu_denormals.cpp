#include "cpu_denormals.h"

#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define MIXTRAIN_HAS_MXCSR 1
#endif

namespace mixtrain::backend_cpu {

namespace {

#ifdef MIXTRAIN_HAS_MXCSR
constexpr unsigned kFlushBits = 0x8040u;  // FTZ (bit 15) and DAZ (bit 6)

void set_on_team(int threads, bool on) {
  const auto apply = [on] {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(on ? (csr | kFlushBits) : (csr & ~kFlushBits));
  };
  apply();  // the calling thread, whose state new OpenMP threads copy
#pragma omp parallel num_threads(threads)
  apply();
}
#endif

}  // namespace

bool DenormalFlush::supported() noexcept {
#ifdef MIXTRAIN_HAS_MXCSR
  return true;
#else
  return false;
#endif
}

DenormalFlush::DenormalFlush(int threads) : threads_(threads) {
#ifdef MIXTRAIN_HAS_MXCSR
  already_set_ = (_mm_getcsr() & kFlushBits) == kFlushBits;
  set_on_team(threads_, true);
#else
  throw std::logic_error("DenormalFlush: no FTZ/DAZ control on this architecture");
#endif
}

DenormalFlush::~DenormalFlush() {
#ifdef MIXTRAIN_HAS_MXCSR
  if (!already_set_) set_on_team(threads_, false);
#endif
}

}  // namespace mixtrain::backend_cpu
