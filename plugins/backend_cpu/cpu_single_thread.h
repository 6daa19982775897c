// SingleThreadScope: this thread's OpenMP team size set to 1 for a scope, and restored after.
//
// Contract
// - oneDNN plans a primitive for the team size it reads at creation and starts a team of that
//   size when the primitive runs outside a parallel region: creating one in this scope makes it a
//   one-thread primitive (the small GEMMs, flash attention's tile products).
// - `active` false does nothing; nor does a team size already 1. Not copyable.
#pragma once

#include <omp.h>

namespace mixtrain::backend_cpu {

class SingleThreadScope {
 public:
  explicit SingleThreadScope(bool active = true) : saved_(active ? omp_get_max_threads() : 0) {
    if (saved_ > 1) omp_set_num_threads(1);
  }
  ~SingleThreadScope() {
    if (saved_ > 1) omp_set_num_threads(saved_);
  }
  SingleThreadScope(const SingleThreadScope&) = delete;
  SingleThreadScope& operator=(const SingleThreadScope&) = delete;

 private:
  int saved_;
};

}  // namespace mixtrain::backend_cpu
