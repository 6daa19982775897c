#include "cpu_flash_attention.h"

#include <omp.h>

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "cpu_access.h"
#include "cpu_bf16_rows.h"
#include "cpu_exp.h"
#include "cpu_isa.h"
#include "cpu_lane_reductions.h"
#include "cpu_tile_matmul.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

// Rows of an fp32 matrix: `ld` elements from one row to the next.
struct Rows {
  const float* p;
  std::int64_t ld;
};

// `count` rows of `d` elements of v, the first at element `first` and `stride` apart, as FP32:
// the tensor itself when it is fp32 storage, else decoded exactly into buf [count, d].
Rows fp32_rows(const TensorView& v, std::int64_t first, std::int64_t stride, std::int64_t count,
               std::int64_t d, float* buf) {
  if (is_fp32_storage(v.dtype)) return {v.as<const float>() + first, stride};
  if (v.dtype == sdk::DType::bf16)
    decode_bf16_rows(v.as<const Bf16Bits>() + first, stride, count, d, buf);
  else
    for (std::int64_t r = 0; r < count; ++r) decode_into(v, first + r * stride, d, buf + r * d);
  return {buf, d};
}

// The floats fp32_rows needs in `buf` for `count` rows of `d` of v: none when v is read in place.
std::size_t decode_floats(const TensorView& v, std::int64_t count, std::int64_t d) {
  return is_fp32_storage(v.dtype) ? 0 : static_cast<std::size_t>(count * d);
}

// v's rows (`count` of `d`, the first at `first`, `stride` apart) = src [count, d] rounded once.
void store_rows(const TensorView& v, std::int64_t first, std::int64_t stride, std::int64_t count,
                std::int64_t d, const float* src) {
  if (v.dtype == sdk::DType::bf16) {
    encode_bf16_rows(src, count, d, v.as<Bf16Bits>() + first, stride);
    return;
  }
  for (std::int64_t r = 0; r < count; ++r) commit_chunk(v, first + r * stride, d, src + r * d);
}

// C = alpha·op(A)·op(B) + beta·C, row-major, on the calling thread (the caller's team is over
// tasks; each task's products are sequential, so their sums do not depend on the team's size).
// Returns false when oneDNN refused the call.
bool sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc) {
  return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) ==
         dnnl_success;
}

// The first exception a task raised (or a refused sgemm), rethrown after the parallel region.
class TaskErrors {
 public:
  template <class F>
  void run(F&& f) {
    try {
      if (!f())
        fail_once(std::make_exception_ptr(
            sdk::BackendError("backend_cpu.flash attention: oneDNN's sgemm refused a tile product",
                              "report this: the tile shapes are valid by construction")));
    } catch (...) {
      fail_once(std::current_exception());
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void fail_once(std::exception_ptr e) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::move(e);
  }
  std::mutex mutex_;
  std::exception_ptr error_;
};

// Element offsets: qkv [N, T, 3, H, D], out / dout [N, T, H, D], lse [N, H, T].
struct Index {
  std::int64_t t, h, d;
  std::int64_t qkv(std::int64_t n, std::int64_t tok, std::int64_t part, std::int64_t head) const {
    return (((n * t + tok) * 3 + part) * h + head) * d;
  }
  std::int64_t qkv_stride() const { return 3 * h * d; }
  std::int64_t out(std::int64_t n, std::int64_t tok, std::int64_t head) const {
    return ((n * t + tok) * h + head) * d;
  }
  std::int64_t out_stride() const { return h * d; }
  std::int64_t lse(std::int64_t n, std::int64_t head) const { return (n * h + head) * t; }
};

// Keys row i sees in the key tile starting at j0 (bk keys). None when the tile starts past i: in
// a decode step the query block is shifted by its start, so its first rows may precede the last
// key tile (queries 50..76 against the tile at 64); a row that sees none keeps its running sums.
[[gnu::always_inline]] inline std::int64_t visible(std::int64_t i, std::int64_t j0,
                                                   std::int64_t bk) {
  return std::max<std::int64_t>(0, std::min(bk, i - j0 + 1));
}

// Lambdas in the per-ISA kernels must be inlined to be compiled for their ISA (cpu_isa.h).
#define MIXTRAIN_FLASH_INLINE __attribute__((always_inline))

// The element work between the tile products, compiled per ISA (cpu_isa.h): the exponentials are
// most of it, and the build's baseline (SSE2) runs them 4 to a register where AVX2 runs 8.

// The online softmax's step for one score tile: s [bq, bk] holds scale·q·kᵀ for query rows first,
// first + 1, ... against keys j0.. (causal: row i sees keys <= i). Each row's running max m and
// sum are updated, its o [bq, d] accumulator rescaled to the new max, and s overwritten with the
// unnormalised probabilities (0 past the diagonal), ready for o += s·v.
// `pre` is a factor the scores still lack (the bf16 products leave the scale out): applied first,
// one rounding, as sgemm's alpha would have; 1 skips it. With `rounded` (the bf16 products'
// [bq, bk] tile), each row's probabilities are also rounded into it while the row is in cache;
// the sum adds them unrounded.
[[gnu::always_inline]] inline void softmax_step(float* s, std::int64_t bq, std::int64_t bk,
                                                std::int64_t first, std::int64_t j0, float pre,
                                                float* m, float* sum, float* o, std::int64_t d,
                                                Bf16Bits* rounded) {
  for (std::int64_t r = 0; r < bq; ++r) {
    float* row = s + r * bk;
    Bf16Bits* row16 = rounded != nullptr ? rounded + r * bk : nullptr;
    const std::int64_t seen = visible(first + r, j0, bk);
    // The max and the sum in fixed lanes (cpu_lane_reductions.h): an `omp simd` reduction ended
    // each row in a chain of 16 dependent scalar maxes, then adds.
    const float top =
        pre != 1.0f
            ? lane_max(m[r], seen,
                       [&](std::int64_t j) MIXTRAIN_FLASH_INLINE {
                         const float v = row[j] * pre;
                         row[j] = v;
                         return v;
                       })
            : lane_max(m[r], seen, [&](std::int64_t j) MIXTRAIN_FLASH_INLINE { return row[j]; });
    if (top == -std::numeric_limits<float>::infinity()) {
      // Every score so far is −inf (an infinite key): nothing to add, and m − top would be NaN,
      // which a later finite tile could not undo. The exact softmax gives these keys weight 0.
      if (row16 != nullptr)
        std::fill(row16, row16 + bk, Bf16Bits{0});
      else
        std::fill(row, row + bk, 0.0f);
      continue;
    }
    // Rescale what earlier tiles summed to the new running max (exp(−inf) = 0 at first).
    const float shrink = exp_shifted(m[r] - top);
    const float add =
        lane_sum<float, kReductionLanes>(seen, [&](std::int64_t j) MIXTRAIN_FLASH_INLINE {
          row[j] = exp_shifted(row[j] - top);
          return row[j];
        });
    if (row16 != nullptr) {
      // While the row is in L1 (rounding inside the sum's lanes ran the forward 1.3x slower).
#pragma omp simd
      for (std::int64_t j = 0; j < seen; ++j) row16[j] = bf16_from_float(row[j]);
      for (std::int64_t j = seen; j < bk; ++j) row16[j] = 0;
    } else {
      for (std::int64_t j = seen; j < bk; ++j) row[j] = 0.0f;
    }
    sum[r] = sum[r] * shrink + add;
    m[r] = top;
    if (shrink != 1.0f) {
      float* orow = o + r * d;
#pragma omp simd
      for (std::int64_t c = 0; c < d; ++c) orow[c] *= shrink;
    }
  }
}

// The backward's probabilities: p [bq, bk] = exp(scale·q·kᵀ − lse) in place for query rows
// first.. against keys j0.. (lse [bq] those rows' log-sum-exp), exact 0 past the diagonal; `pre`
// as in softmax_step. With `rounded`, each probability also goes there rounded to bf16, in the
// same pass (the bf16 products' Pᵀ·dO reads that tile).
[[gnu::always_inline]] inline void probabilities(float* p, std::int64_t bq, std::int64_t bk,
                                                 std::int64_t first, std::int64_t j0, float pre,
                                                 const float* lse, Bf16Bits* rounded) {
  for (std::int64_t r = 0; r < bq; ++r) {
    float* row = p + r * bk;
    const std::int64_t seen = visible(first + r, j0, bk);
    const float shift = lse[r];
    if (pre != 1.0f) {
#pragma omp simd
      for (std::int64_t j = 0; j < seen; ++j) row[j] *= pre;
    }
    if (rounded != nullptr) {
      Bf16Bits* row16 = rounded + r * bk;
#pragma omp simd
      for (std::int64_t j = 0; j < seen; ++j) {
        row[j] = exp_shifted(row[j] - shift);
        row16[j] = bf16_from_float(row[j]);
      }
      for (std::int64_t j = seen; j < bk; ++j) row16[j] = 0;
    } else {
#pragma omp simd
      for (std::int64_t j = 0; j < seen; ++j) row[j] = exp_shifted(row[j] - shift);
    }
    for (std::int64_t j = seen; j < bk; ++j) row[j] = 0.0f;
  }
}

// The scores' gradient: ds [bq, bk] = p∘(dP − D)·scale in place over dP, D [bq] the rows' Σ dO·O;
// with `rounded`, written there rounded to bf16 instead (the bf16 products read only that).
[[gnu::always_inline]] inline void score_gradient(float* ds, const float* p, std::int64_t bq,
                                                  std::int64_t bk, const float* delta, float scale,
                                                  Bf16Bits* rounded) {
  for (std::int64_t r = 0; r < bq; ++r) {
    const float di = delta[r];
    float* dsr = ds + r * bk;
    const float* pr = p + r * bk;
    if (rounded != nullptr) {
      Bf16Bits* row16 = rounded + r * bk;
#pragma omp simd
      for (std::int64_t j = 0; j < bk; ++j)
        row16[j] = bf16_from_float(pr[j] * (dsr[j] - di) * scale);
    } else {
#pragma omp simd
      for (std::int64_t j = 0; j < bk; ++j) dsr[j] = pr[j] * (dsr[j] - di) * scale;
    }
  }
}

// dst [n] += src [n]: a bf16 product's tile added into its FP32 accumulator.
[[gnu::always_inline]] inline void add_into(float* dst, const float* src, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

MIXTRAIN_ISA_VARIANTS(softmax_step)
MIXTRAIN_ISA_VARIANTS(probabilities)
MIXTRAIN_ISA_VARIANTS(score_gradient)
MIXTRAIN_ISA_VARIANTS(add_into)

}  // namespace

namespace {

// Where q's, k's and v's rows lie for the forward routine below: row `tok` of part p (0 q, 1 k,
// 2 v) of sequence n and head h starts at element at(p, n, h, tok) of the source tensor.
struct QkvRows {
  std::int64_t part, seq, head, tok;
  std::int64_t at(std::int64_t p, std::int64_t n, std::int64_t h, std::int64_t t) const {
    return p * part + n * seq + h * head + t * tok;
  }
};

// `count` rows of `d` bf16 elements of v, the first at element `first` and `stride` apart, copied
// into dst [count, d] (dense, as Bf16TileMatmul takes them).
void gather_bf16_rows(const TensorView& v, std::int64_t first, std::int64_t stride,
                      std::int64_t count, std::int64_t d, Bf16Bits* dst) {
  const Bf16Bits* src = v.as<const Bf16Bits>() + first;
  for (std::int64_t r = 0; r < count; ++r) std::copy_n(src + r * stride, d, dst + r * d);
}

// The tile products, two ways (FlashProducts, cpu_flash_attention.h). Each object is one thread's
// operands and scratch; the loops below call it the same way for both.
//
// Fp32 products: 16-bit operands decoded exactly into FP32 (fp32 ones read in place), products by
// oneDNN's sgemm with the scale in alpha.
class Fp32ForwardProducts {
 public:
  Fp32ForwardProducts(const TensorView& src, std::int64_t keys, std::int64_t d)
      : src_(src),
        d_(d),
        qbuf_(static_cast<std::size_t>(kFlashBlock * d)),
        kbuf_(decode_floats(src, keys, d)),
        vbuf_(kbuf_.size()) {}
  // What softmax_step still multiplies the scores by.
  static float pending_scale(float) { return 1.0f; }
  // The element kernels' bf16 tile of P (or dS), or none: FP32 products read the fp32 tiles.
  static Bf16Bits* rounded() { return nullptr; }
  void load_keys(const QkvRows& at, std::int64_t n, std::int64_t h, std::int64_t seen) {
    k_ = fp32_rows(src_, at.at(1, n, h, 0), at.tok, seen, d_, kbuf_.data());
    v_ = fp32_rows(src_, at.at(2, n, h, 0), at.tok, seen, d_, vbuf_.data());
  }
  void load_queries(std::int64_t first, std::int64_t stride, std::int64_t bq) {
    q_ = fp32_rows(src_, first, stride, bq, d_, qbuf_.data());
  }
  // s [bq, bk] = scale·q·kᵀ against keys j0..
  bool scores(std::int64_t bq, std::int64_t bk, std::int64_t j0, float scale, float* s) {
    return sgemm(false, true, bq, bk, d_, scale, q_.p, q_.ld, k_.p + j0 * k_.ld, k_.ld, 0.0f, s,
                 bk);
  }
  // o [bq, d] += p [bq, bk]·v (keys j0..).
  bool accumulate(std::int64_t bq, std::int64_t bk, std::int64_t j0, const float* p, float* o) {
    return sgemm(false, false, bq, d_, bk, 1.0f, p, bk, v_.p + j0 * v_.ld, v_.ld, 1.0f, o, d_);
  }

 private:
  const TensorView& src_;
  std::int64_t d_;
  std::vector<float> qbuf_, kbuf_, vbuf_;
  Rows q_{}, k_{}, v_{};
};

// Bf16 products: bf16 q, k and v copied into dense tiles, products by Bf16TileMatmul; the scores
// come unscaled (softmax_step scales them) and P is rounded to bf16 before P·v.
class Bf16ForwardProducts {
 public:
  Bf16ForwardProducts(const TensorView& src, std::int64_t keys, std::int64_t d)
      : src_(src),
        d_(d),
        q_(static_cast<std::size_t>(kFlashBlock * d)),
        k_(static_cast<std::size_t>(keys * d)),
        v_(k_.size()),
        p_(static_cast<std::size_t>(kFlashBlock * kFlashBlock)),
        pv_(static_cast<std::size_t>(kFlashBlock * d)) {}
  static float pending_scale(float scale) { return scale; }
  void load_keys(const QkvRows& at, std::int64_t n, std::int64_t h, std::int64_t seen) {
    gather_bf16_rows(src_, at.at(1, n, h, 0), at.tok, seen, d_, k_.data());
    gather_bf16_rows(src_, at.at(2, n, h, 0), at.tok, seen, d_, v_.data());
  }
  void load_queries(std::int64_t first, std::int64_t stride, std::int64_t bq) {
    gather_bf16_rows(src_, first, stride, bq, d_, q_.data());
  }
  bool scores(std::int64_t bq, std::int64_t bk, std::int64_t j0, float, float* s) {
    Bf16TileMatmul::run(bq, bk, d_, q_.data(), false, k_.data() + j0 * d_, true, s, scratch_);
    return true;
  }
  // softmax_step rounds P into this tile as it forms it.
  Bf16Bits* rounded() { return p_.data(); }
  bool accumulate(std::int64_t bq, std::int64_t bk, std::int64_t j0, const float*, float* o) {
    Bf16TileMatmul::run(bq, d_, bk, p_.data(), false, v_.data() + j0 * d_, false, pv_.data(),
                        scratch_);
    add_into_best(o, pv_.data(), bq * d_);
    return true;
  }

 private:
  const TensorView& src_;
  std::int64_t d_;
  std::vector<Bf16Bits> q_, k_, v_, p_;
  std::vector<float> pv_;
  Bf16TileScratch scratch_;
};

// Query blocks per forward task: whole heads (each head's k and v decoded once) unless that leaves
// fewer than 4 tasks a thread, for dynamic scheduling to balance the causal triangle's unequal
// blocks.
std::int64_t blocks_per_task(std::int64_t heads_total, std::int64_t blocks) {
  const std::int64_t want = 4 * static_cast<std::int64_t>(omp_get_max_threads());
  const std::int64_t groups =
      std::clamp<std::int64_t>((want + heads_total - 1) / heads_total, 1, blocks);
  return (blocks + groups - 1) / groups;
}

// The causal forward both flash ops run: for each sequence n < batch and head h, queries i <
// rows, stored at q row `offset + i`, see keys j <= offset + i (offset 0: training's square
// attention; offset = start: a decode step over a cache). out [batch, rows, H, D] token-major;
// lse [batch, H, rows] when given. A task is a run of query blocks of one head; its k and v rows
// are loaded once, up to the last key its blocks see.
template <class Products>
void causal_forward(const TensorView& src, const QkvRows& at, std::int64_t batch,
                    std::int64_t heads, std::int64_t d, std::int64_t rows, std::int64_t offset,
                    float scale, const TensorView& out, float* lse_all) {
  const std::int64_t bh = batch * heads;
  if (bh == 0 || rows == 0) return;
  const std::int64_t blocks = (rows + kFlashBlock - 1) / kFlashBlock;
  const std::int64_t per_task = blocks_per_task(bh, blocks);
  const std::int64_t groups = (blocks + per_task - 1) / per_task, tasks = bh * groups;
  const std::int64_t tile = kFlashBlock * std::max(kFlashBlock, d);
  const std::int64_t keys = offset + rows;  // the last query's
  const std::int64_t out_stride = heads * d;
  const float pre = Products::pending_scale(scale);
  TaskErrors errors;
#pragma omp parallel if (tasks > 1 && parallel_worth(bh * rows * keys * d / 2))
  {
    omp_set_num_threads(1);  // the tile products run on this thread (see sgemm above)
    Products products(src, keys, d);
    std::vector<float> s(tile), o(tile);
    std::vector<float> m(kFlashBlock), sum(kFlashBlock);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      errors.run([&] {
        const std::int64_t nh = task / groups, n = nh / heads, h = nh % heads;
        const std::int64_t b0 = (task % groups) * per_task, b1 = std::min(blocks, b0 + per_task);
        // Queries [b0, b1) blocks up to `end`; keys 0 .. the last one the last query sees.
        const std::int64_t end = std::min(rows, b1 * kFlashBlock), seen = offset + end;
        products.load_keys(at, n, h, seen);
        for (std::int64_t i0 = b0 * kFlashBlock; i0 < end; i0 += kFlashBlock) {
          const std::int64_t bq = std::min(kFlashBlock, rows - i0);
          products.load_queries(at.at(0, n, h, offset + i0), at.tok, bq);
          std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
          std::fill(sum.begin(), sum.end(), 0.0f);
          std::fill(o.begin(), o.begin() + bq * d, 0.0f);
          // Key tiles from 0 up to the one holding key offset + i0 + bq − 1; none lies above the
          // diagonal.
          for (std::int64_t j0 = 0; j0 < offset + i0 + bq; j0 += kFlashBlock) {
            const std::int64_t bk = std::min(kFlashBlock, offset + i0 + bq - j0);
            if (!products.scores(bq, bk, j0, scale, s.data())) return false;
            softmax_step_best(s.data(), bq, bk, offset + i0, j0, pre, m.data(), sum.data(),
                              o.data(), d, products.rounded());
            if (!products.accumulate(bq, bk, j0, s.data(), o.data())) return false;
          }
          for (std::int64_t r = 0; r < bq; ++r) {
            const float total = sum[static_cast<std::size_t>(r)];
            for (std::int64_t c = 0; c < d; ++c) o[static_cast<std::size_t>(r * d + c)] /= total;
            if (lse_all != nullptr)
              lse_all[(n * heads + h) * rows + i0 + r] =
                  m[static_cast<std::size_t>(r)] + std::log(total);
          }
          store_rows(out, ((n * rows + i0) * heads + h) * d, out_stride, bq, d, o.data());
        }
        return true;
      });
    }
  }
  errors.rethrow();
}

// The forward with the products asked for, where the source's dtype allows them.
void causal_forward(FlashProducts products, const TensorView& src, const QkvRows& at,
                    std::int64_t batch, std::int64_t heads, std::int64_t d, std::int64_t rows,
                    std::int64_t offset, float scale, const TensorView& out, float* lse_all) {
  if (products == FlashProducts::bf16 && src.dtype == sdk::DType::bf16)
    causal_forward<Bf16ForwardProducts>(src, at, batch, heads, d, rows, offset, scale, out,
                                        lse_all);
  else
    causal_forward<Fp32ForwardProducts>(src, at, batch, heads, d, rows, offset, scale, out,
                                        lse_all);
}

// The backward's products for one (sequence, head) at a time, as the forward's: set_head() takes
// its q and dO, set_keys() a key tile's k and v, then per query tile at or below it: scores() p =
// scale·q·kᵀ (pending_scale() still to apply), dv() dv += pᵀ·dO, dp() dp = dO·vᵀ, and dq_dk()
// dq += ds·k, dk += dsᵀ·q.
class Fp32BackwardProducts {
 public:
  Fp32BackwardProducts(const TensorView& qkv, const TensorView& dout, std::int64_t t_len,
                       std::int64_t d)
      : qkv_(qkv),
        dout_(dout),
        d_(d),
        // 16-bit q and dO rows are decoded once per head (every key tile reads them all), k and
        // v once per key tile.
        qbuf_(decode_floats(qkv, t_len, d)),
        gbuf_(decode_floats(dout, t_len, d)),
        kbuf_(static_cast<std::size_t>(kFlashBlock * d)),
        vbuf_(kbuf_.size()) {}
  static float pending_scale(float) { return 1.0f; }
  // The element kernels' bf16 tile of P (or dS), or none: FP32 products read the fp32 tiles.
  static Bf16Bits* rounded() { return nullptr; }
  void set_head(const Index& ix, std::int64_t n, std::int64_t h) {
    q_ = fp32_rows(qkv_, ix.qkv(n, 0, 0, h), ix.qkv_stride(), ix.t, d_, qbuf_.data());
    g_ = fp32_rows(dout_, ix.out(n, 0, h), ix.out_stride(), ix.t, d_, gbuf_.data());
  }
  void set_keys(const Index& ix, std::int64_t n, std::int64_t h, std::int64_t j0, std::int64_t bk) {
    k_ = fp32_rows(qkv_, ix.qkv(n, j0, 1, h), ix.qkv_stride(), bk, d_, kbuf_.data());
    v_ = fp32_rows(qkv_, ix.qkv(n, j0, 2, h), ix.qkv_stride(), bk, d_, vbuf_.data());
  }
  // dO's rows i0.. of the head as FP32 (D_i's), from what set_head() took; `buf` unused.
  Rows dout_rows(std::int64_t i0, std::int64_t, float*) const { return {g_.p + i0 * g_.ld, g_.ld}; }
  bool scores(std::int64_t i0, std::int64_t bq, std::int64_t bk, float scale, float* p) {
    return sgemm(false, true, bq, bk, d_, scale, q_.p + i0 * q_.ld, q_.ld, k_.p, k_.ld, 0.0f, p,
                 bk);
  }
  bool dv(std::int64_t i0, std::int64_t bq, std::int64_t bk, const float* p, float* dv) {
    return sgemm(true, false, bk, d_, bq, 1.0f, p, bk, g_.p + i0 * g_.ld, g_.ld, 1.0f, dv, d_);
  }
  bool dp(std::int64_t i0, std::int64_t bq, std::int64_t bk, float* dp) {
    return sgemm(false, true, bq, bk, d_, 1.0f, g_.p + i0 * g_.ld, g_.ld, v_.p, v_.ld, 0.0f, dp,
                 bk);
  }
  bool dq_dk(std::int64_t i0, std::int64_t bq, std::int64_t bk, const float* ds, float* dq,
             float* dk) {
    return sgemm(false, false, bq, d_, bk, 1.0f, ds, bk, k_.p, k_.ld, 1.0f, dq, d_) &&
           sgemm(true, false, bk, d_, bq, 1.0f, ds, bk, q_.p + i0 * q_.ld, q_.ld, 1.0f, dk, d_);
  }

 private:
  const TensorView &qkv_, &dout_;
  std::int64_t d_;
  std::vector<float> qbuf_, gbuf_, kbuf_, vbuf_;
  Rows q_{}, g_{}, k_{}, v_{};
};

// Bf16 products: q and dO copied per head and k and v per key tile into dense bf16 tiles; p and
// ds rounded to bf16 before their products, as the GPU's flash attention does.
class Bf16BackwardProducts {
 public:
  Bf16BackwardProducts(const TensorView& qkv, const TensorView& dout, std::int64_t t_len,
                       std::int64_t d)
      : qkv_(qkv),
        dout_(dout),
        d_(d),
        q_(static_cast<std::size_t>(t_len * d)),
        g_(q_.size()),
        k_(static_cast<std::size_t>(kFlashBlock * d)),
        v_(k_.size()),
        rounded_(static_cast<std::size_t>(kFlashBlock * kFlashBlock)),
        product_(static_cast<std::size_t>(kFlashBlock * d)) {}
  static float pending_scale(float scale) { return scale; }
  void set_head(const Index& ix, std::int64_t n, std::int64_t h) {
    gather_bf16_rows(qkv_, ix.qkv(n, 0, 0, h), ix.qkv_stride(), ix.t, d_, q_.data());
    gather_bf16_rows(dout_, ix.out(n, 0, h), ix.out_stride(), ix.t, d_, g_.data());
  }
  void set_keys(const Index& ix, std::int64_t n, std::int64_t h, std::int64_t j0, std::int64_t bk) {
    gather_bf16_rows(qkv_, ix.qkv(n, j0, 1, h), ix.qkv_stride(), bk, d_, k_.data());
    gather_bf16_rows(qkv_, ix.qkv(n, j0, 2, h), ix.qkv_stride(), bk, d_, v_.data());
  }
  // dO's rows i0.. of the head, decoded from the dense copy set_head() made into buf [bq, d].
  Rows dout_rows(std::int64_t i0, std::int64_t bq, float* buf) const {
    decode_bf16_rows(g_.data() + i0 * d_, d_, bq, d_, buf);
    return {buf, d_};
  }
  bool scores(std::int64_t i0, std::int64_t bq, std::int64_t bk, float, float* p) {
    Bf16TileMatmul::run(bq, bk, d_, q_.data() + i0 * d_, false, k_.data(), true, p, scratch_);
    return true;
  }
  // probabilities rounds P into this tile, then score_gradient dS, each as it forms them: dv
  // reads P's before score_gradient writes dS's.
  Bf16Bits* rounded() { return rounded_.data(); }
  bool dv(std::int64_t i0, std::int64_t bq, std::int64_t bk, const float*, float* dv) {
    // pᵀ [bk, bq] is p's rounded rows read transposed.
    Bf16TileMatmul::run(bk, d_, bq, rounded_.data(), true, g_.data() + i0 * d_, false,
                        product_.data(), scratch_);
    add_into_best(dv, product_.data(), bk * d_);
    return true;
  }
  bool dp(std::int64_t i0, std::int64_t bq, std::int64_t bk, float* dp) {
    Bf16TileMatmul::run(bq, bk, d_, g_.data() + i0 * d_, false, v_.data(), true, dp, scratch_);
    return true;
  }
  bool dq_dk(std::int64_t i0, std::int64_t bq, std::int64_t bk, const float*, float* dq,
             float* dk) {
    Bf16TileMatmul::run(bq, d_, bk, rounded_.data(), false, k_.data(), false, product_.data(),
                        scratch_);
    add_into_best(dq, product_.data(), bq * d_);
    Bf16TileMatmul::run(bk, d_, bq, rounded_.data(), true, q_.data() + i0 * d_, false,
                        product_.data(), scratch_);
    add_into_best(dk, product_.data(), bk * d_);
    return true;
  }

 private:
  const TensorView &qkv_, &dout_;
  std::int64_t d_;
  std::vector<Bf16Bits> q_, g_, k_, v_, rounded_;
  std::vector<float> product_;
  Bf16TileScratch scratch_;
};

template <class Products>
void causal_backward(const TensorView& qkv, const TensorView& out, const TensorView& dout,
                     const TensorView& lse, const sdk::HeadLayout& l, float scale,
                     const TensorView& dqkv) {
  const std::int64_t t_len = l.tokens, d = l.head_dim, bh = l.batch * l.heads;
  if (bh == 0 || t_len == 0) return;
  const Index ix{t_len, l.heads, d};
  const std::int64_t tile = kFlashBlock * std::max(kFlashBlock, d);
  const float* lse_all = lse.as<const float>();
  const float pre = Products::pending_scale(scale);
  TaskErrors errors;
  // One (sequence, head) per task: every sum into dq, dk and dv of that head runs in one fixed
  // order on one thread, so the bits do not depend on the thread count.
#pragma omp parallel if (bh > 1 && parallel_worth(bh * t_len * t_len * d))
  {
    omp_set_num_threads(1);  // the tile products run on this thread (see sgemm above)
    Products products(qkv, dout, t_len, d);
    std::vector<float> obuf(tile), gbuf(tile);
    std::vector<float> p(tile), dp(tile), dk(tile), dv(tile);
    std::vector<float> dq, delta;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t nh = 0; nh < bh; ++nh) {
      errors.run([&] {
        const std::int64_t n = nh / l.heads, h = nh % l.heads;
        const float* lse_head = lse_all + ix.lse(n, h);
        products.set_head(ix, n, h);
        // D_i = Σ_c dO_ic·O_ic (O as flash_forward rounded it), in double.
        delta.assign(static_cast<std::size_t>(t_len), 0.0f);
        for (std::int64_t i0 = 0; i0 < t_len; i0 += kFlashBlock) {
          const std::int64_t bq = std::min(kFlashBlock, t_len - i0);
          const Rows o = fp32_rows(out, ix.out(n, i0, h), ix.out_stride(), bq, d, obuf.data());
          const Rows g = products.dout_rows(i0, bq, gbuf.data());
          for (std::int64_t r = 0; r < bq; ++r) {
            double dot = 0.0;
            for (std::int64_t c = 0; c < d; ++c)
              dot += static_cast<double>(o.p[r * o.ld + c]) * g.p[r * g.ld + c];
            delta[static_cast<std::size_t>(i0 + r)] = static_cast<float>(dot);
          }
        }
        dq.assign(static_cast<std::size_t>(t_len * d), 0.0f);
        for (std::int64_t j0 = 0; j0 < t_len; j0 += kFlashBlock) {
          const std::int64_t bk = std::min(kFlashBlock, t_len - j0);
          products.set_keys(ix, n, h, j0, bk);
          std::fill(dk.begin(), dk.begin() + bk * d, 0.0f);
          std::fill(dv.begin(), dv.begin() + bk * d, 0.0f);
          // Query tiles at or below the diagonal: the tiles above it see none of these keys.
          for (std::int64_t i0 = j0; i0 < t_len; i0 += kFlashBlock) {
            const std::int64_t bq = std::min(kFlashBlock, t_len - i0);
            // P = exp(scale·q·kᵀ − lse), exact 0 above the diagonal.
            if (!products.scores(i0, bq, bk, scale, p.data())) return false;
            probabilities_best(p.data(), bq, bk, i0, j0, pre, lse_head + i0, products.rounded());
            // dV += Pᵀ·dO; dP = dO·vᵀ; dS = P∘(dP − D)·scale in dp.
            if (!products.dv(i0, bq, bk, p.data(), dv.data())) return false;
            if (!products.dp(i0, bq, bk, dp.data())) return false;
            score_gradient_best(dp.data(), p.data(), bq, bk, delta.data() + i0, scale,
                                products.rounded());
            // dQ += dS·k; dK += dSᵀ·q.
            if (!products.dq_dk(i0, bq, bk, dp.data(), dq.data() + i0 * d, dk.data())) return false;
          }
          store_rows(dqkv, ix.qkv(n, j0, 1, h), ix.qkv_stride(), bk, d, dk.data());
          store_rows(dqkv, ix.qkv(n, j0, 2, h), ix.qkv_stride(), bk, d, dv.data());
        }
        store_rows(dqkv, ix.qkv(n, 0, 0, h), ix.qkv_stride(), t_len, d, dq.data());
        return true;
      });
    }
  }
  errors.rethrow();
}

}  // namespace

void flash_attention_forward(const TensorView& qkv, const sdk::HeadLayout& l, float scale,
                             const TensorView& out, const TensorView& lse, FlashProducts products) {
  // qkv [N, T, 3, H, D]: token-major, the parts interleaved per token.
  const std::int64_t hd = l.heads * l.head_dim;
  const QkvRows at{hd, l.tokens * 3 * hd, l.head_dim, 3 * hd};
  causal_forward(products, qkv, at, l.batch, l.heads, l.head_dim, l.tokens, 0, scale, out,
                 lse.as<float>());
}

void flash_attention_decode(const TensorView& cache, const sdk::HeadLayout& l, float scale,
                            const TensorView& out) {
  // cache [3, 1, H, T', D]: head-major, a part after another.
  const std::int64_t cap = l.capacity(), d = l.head_dim;
  const QkvRows at{l.heads * cap * d, 0, cap * d, d};
  // FP32 products always: the facet's flash_decode keeps its probabilities in FP32.
  causal_forward(FlashProducts::fp32, cache, at, 1, l.heads, d, l.tokens, l.head_offset, scale, out,
                 nullptr);
}

void flash_attention_backward(const TensorView& qkv, const TensorView& out, const TensorView& dout,
                              const TensorView& lse, const sdk::HeadLayout& l, float scale,
                              const TensorView& dqkv, FlashProducts products) {
  if (products == FlashProducts::bf16 && qkv.dtype == sdk::DType::bf16 &&
      dout.dtype == sdk::DType::bf16)
    causal_backward<Bf16BackwardProducts>(qkv, out, dout, lse, l, scale, dqkv);
  else
    causal_backward<Fp32BackwardProducts>(qkv, out, dout, lse, l, scale, dqkv);
}

}  // namespace mixtrain::backend_cpu
