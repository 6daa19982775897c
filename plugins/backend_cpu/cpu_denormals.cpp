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

// Sets the two bits to `bits` (of kFlushBits) on the calling thread and the team.
void set_on_team(int threads, unsigned bits) {
  const auto apply = [bits] { _mm_setcsr((_mm_getcsr() & ~kFlushBits) | bits); };
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
  previous_ = _mm_getcsr() & kFlushBits;
  set_on_team(threads_, kFlushBits);
#else
  throw std::logic_error("DenormalFlush: no FTZ/DAZ control on this architecture");
#endif
}

DenormalFlush::~DenormalFlush() {
#ifdef MIXTRAIN_HAS_MXCSR
  set_on_team(threads_, previous_);
#endif
}

}  // namespace mixtrain::backend_cpu
