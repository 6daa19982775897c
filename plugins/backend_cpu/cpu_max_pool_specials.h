// Max pooling's NaN and -inf windows by PyTorch's rule, which oneDNN's max pooling does not follow.
//
// oneDNN starts a window's running maximum at the lowest finite float and replaces it only by a
// greater element, so it drops NaNs (a window of NaNs gives -3.4e38, a window holding a NaN its
// largest other element) and gives -3.4e38 for a window of -inf. PyTorch's max_pool2d (and the
// SDK's contract, backend_convolution.h) gives NaN for a window holding a NaN and -inf for a
// window whose in-image elements are all -inf. A NaN dropped there would hide a broken forward
// pass from the loss and from the loss scaler's non-finite test.
//
// Contract
// - holds_nan_or_negative_infinity(x): whether any element of x (fp32, bf16 or fp16 storage) is a
//   NaN or -inf; one read of x, on the OpenMP team when worth it. A false answer (the usual one) is
//   the only cost pooling pays for the rule.
// - restore_max_pool_specials(g, x, y): y [N, OH, OW, C] in x's storage dtype: every output whose
//   window holds a NaN becomes NaN, and every output whose window is all -inf becomes -inf; the
//   other outputs are left as they are. Decodes x and y whole into fp32 scratch (only run when
//   the scan found something).
#pragma once

#include "mixtrain/sdk/backend_convolution.h"

namespace mixtrain::backend_cpu {

bool holds_nan_or_negative_infinity(const sdk::TensorView& x);
void restore_max_pool_specials(const sdk::Pool2dGeometry& g, const sdk::TensorView& x,
                               const sdk::TensorView& y);

}  // namespace mixtrain::backend_cpu
