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
#include "cpu_amx_tile_product.h"
#include "cpu_bf16_rows.h"
#include "cpu_flash_element_kernels.h"
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

// Whether the bf16 products take AMX's own tiles (cpu_amx_tile_product.h) at head dimension d:
// where the process may run them and d is a multiple of 32. There they give oneDNN's bits; at a
// head dimension of 16 oneDNN's q·kᵀ summed some elements otherwise (11 of 1,200 lse values an ulp
// apart in the test that compares the two).
bool amx_tiles_for_head(std::int64_t d) {
  return d % 32 == 0 && amx_tiles_usable();
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
    seen_ = seen;
    if (!amx_) return;
    // Packed once for every query block of the task: kᵀ [d, seen] and v [seen, d].
    kt_.pack(d_, seen, k_.data(), true);
    vp_.pack(seen, d_, v_.data(), false);
  }
  void load_queries(std::int64_t first, std::int64_t stride, std::int64_t bq) {
    gather_bf16_rows(src_, first, stride, bq, d_, q_.data());
  }
  bool scores(std::int64_t bq, std::int64_t bk, std::int64_t j0, float, float* s) {
    if (amx_)
      amx_product(bq, d_, q_.data(), kt_, 0, j0, bk, s, amx_scratch_);
    else
      Bf16TileMatmul::run(bq, bk, d_, q_.data(), false, k_.data() + j0 * d_, true, s, scratch_);
    return true;
  }
  // softmax_step rounds P into this tile as it forms it.
  Bf16Bits* rounded() { return p_.data(); }
  bool accumulate(std::int64_t bq, std::int64_t bk, std::int64_t j0, const float*, float* o) {
    // The packed v's rows past j0 + bk must be zero up to a multiple of 32 (amx_product): they
    // are where the tile ends the keys or is 32-aligned (a KV cache's offset may leave neither).
    if (amx_ && (bk % 32 == 0 || j0 + bk == seen_)) {
      // Added into o a block at a time, while the block is in L1: the bits of the add below.
      amx_product(bq, bk, p_.data(), vp_, j0, 0, d_, o, amx_scratch_, AmxStore::add);
      return true;
    }
    Bf16TileMatmul::run(bq, d_, bk, p_.data(), false, v_.data() + j0 * d_, false, pv_.data(),
                        scratch_);
    flash_add_into(o, pv_.data(), bq * d_);
    return true;
  }

 private:
  const TensorView& src_;
  std::int64_t d_;
  std::vector<Bf16Bits> q_, k_, v_, p_;
  std::vector<float> pv_;
  Bf16TileScratch scratch_;
  // AMX's own tile products where the CPU has them (cpu_amx_tile_product.h): k and v packed once.
  bool amx_ = amx_tiles_for_head(d_);
  std::int64_t seen_ = 0;
  AmxPackedB kt_, vp_;
  AmxTileScratch amx_scratch_;
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
            flash_softmax_step(s.data(), bq, bk, offset + i0, j0, pre, m.data(), sum.data(),
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
    if (!amx_) return;
    // Packed once for every query tile below the key tile: kᵀ and vᵀ [d, bk], k [bk, d].
    kt_.pack(d_, bk, k_.data(), true);
    vt_.pack(d_, bk, v_.data(), true);
    kr_.pack(bk, d_, k_.data(), false);
  }
  // dO's rows i0.. of the head, decoded from the dense copy set_head() made into buf [bq, d].
  Rows dout_rows(std::int64_t i0, std::int64_t bq, float* buf) const {
    decode_bf16_rows(g_.data() + i0 * d_, d_, bq, d_, buf);
    return {buf, d_};
  }
  bool scores(std::int64_t i0, std::int64_t bq, std::int64_t bk, float, float* p) {
    if (amx_)
      amx_product(bq, d_, q_.data() + i0 * d_, kt_, 0, 0, bk, p, amx_scratch_);
    else
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
    flash_add_into(dv, product_.data(), bk * d_);
    return true;
  }
  bool dp(std::int64_t i0, std::int64_t bq, std::int64_t bk, float* dp) {
    if (amx_)
      amx_product(bq, d_, g_.data() + i0 * d_, vt_, 0, 0, bk, dp, amx_scratch_);
    else
      Bf16TileMatmul::run(bq, bk, d_, g_.data() + i0 * d_, false, v_.data(), true, dp, scratch_);
    return true;
  }
  bool dq_dk(std::int64_t i0, std::int64_t bq, std::int64_t bk, const float*, float* dq,
             float* dk) {
    if (amx_) {
      amx_product(bq, bk, rounded_.data(), kr_, 0, 0, d_, dq, amx_scratch_, AmxStore::add);
    } else {
      Bf16TileMatmul::run(bq, d_, bk, rounded_.data(), false, k_.data(), false, product_.data(),
                          scratch_);
      flash_add_into(dq, product_.data(), bq * d_);
    }
    Bf16TileMatmul::run(bk, d_, bq, rounded_.data(), true, q_.data() + i0 * d_, false,
                        product_.data(), scratch_);
    flash_add_into(dk, product_.data(), bk * d_);
    return true;
  }

 private:
  const TensorView &qkv_, &dout_;
  std::int64_t d_;
  std::vector<Bf16Bits> q_, g_, k_, v_, rounded_;
  std::vector<float> product_;
  Bf16TileScratch scratch_;
  // AMX's own tile products where the CPU has them (cpu_amx_tile_product.h), for the products
  // whose left operand is read as stored. pᵀ·dO and dsᵀ·q stay Bf16TileMatmul's: summed
  // transposed instead (dvᵀ = dOᵀ·p, q and dO turned once per head, p and ds packed per tile), the
  // backward ran 10.3 ms against 8.8-9.1 (bench/RESULTS.md, session 70).
  bool amx_ = amx_tiles_for_head(d_);
  AmxPackedB kt_, vt_, kr_;
  AmxTileScratch amx_scratch_;
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
            flash_probabilities(p.data(), bq, bk, i0, j0, pre, lse_head + i0, products.rounded());
            // dV += Pᵀ·dO; dP = dO·vᵀ; dS = P∘(dP − D)·scale in dp.
            if (!products.dv(i0, bq, bk, p.data(), dv.data())) return false;
            if (!products.dp(i0, bq, bk, dp.data())) return false;
            flash_score_gradient(dp.data(), p.data(), bq, bk, delta.data() + i0, scale,
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
