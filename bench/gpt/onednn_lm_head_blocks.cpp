// A standalone measurement aid (not in the CMake build): GPT-2 small's LM head GEMMs as the chunked
// loss runs them on the CPU (core's chunked_loss.h), a block of rows at a time, against the block
// size. Per block of b of the batch's 1024 rows, bf16 operands, oneDNN's matmul:
//   forward  logits [b, V] = x [b, C]·Wᵀ          (W [V, C] as stored, a bf16 destination)
//   dgrad    dx [b, C] = dl [b, V]·W                (a bf16 destination)
//   wgrad    dW [V, C] (+)= dlᵀ [V, b]·x [b, C]     (FP32, the first block overwriting, the
//                                                     others adding through a sum post-op)
// with V = 50257 and C = 768. model_spec.h's kLossChunkRowsFewRows comes from it (RESULTS.md,
// session 68). Build and run:
//   g++ -O2 -std=c++20 -I bench/cnn bench/gpt/onednn_lm_head_blocks.cpp -ldnnl -o /tmp/lm_head
//   OMP_NUM_THREADS=2 /tmp/lm_head [block ...]     (blocks dividing 1024; default 256 512 1024)
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "onednn_aid.h"

using namespace onednn_aid;

int main(int argc, char** argv) {
  const long kClasses = 50257, kWidth = 768, kRows = 1024;
  std::vector<long> blocks;
  for (int i = 1; i < argc; ++i) blocks.push_back(std::atol(argv[i]));
  if (blocks.empty()) blocks = {256, 512, 1024};
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  memory dl({{kRows, kClasses}, dt::bf16, tag::ab}, eng),
      logits({{kRows, kClasses}, dt::bf16, tag::ab}, eng);
  memory x({{kRows, kWidth}, dt::bf16, tag::ab}, eng),
      dx({{kRows, kWidth}, dt::bf16, tag::ab}, eng);
  memory w({{kClasses, kWidth}, dt::bf16, tag::ab}, eng),
      dw({{kClasses, kWidth}, dt::f32, tag::ab}, eng);
  fill_bf16(dl);
  fill_bf16(x);
  fill_bf16(w);
  std::printf(
      "rows per block   forward    dgrad    wgrad    total  (ms for the batch's %ld rows)\n",
      kRows);
  for (const long b : blocks) {
    if (b <= 0 || kRows % b != 0) {
      std::fprintf(stderr, "block %ld: must divide %ld\n", b, kRows);
      return 2;
    }
    // A block's rows of a row-major [kRows, cols] buffer.
    auto rows_at = [&](memory& m, const memory::desc& md, long first, long cols) {
      return memory(md, eng, static_cast<char*>(m.get_data_handle()) + first * cols * 2);
    };
    const memory::desc x_md({b, kWidth}, dt::bf16, tag::ab),
        wt_md({kWidth, kClasses}, dt::bf16, tag::ba);
    const memory::desc logits_md({b, kClasses}, dt::bf16, tag::ab);
    dnnl::matmul forward(dnnl::matmul::primitive_desc({x_md, wt_md, logits_md}, eng));
    const double t_forward = best_ms([&] {
      for (long r = 0; r < kRows; r += b)
        forward.execute(s, {{DNNL_ARG_SRC, rows_at(x, x_md, r, kWidth)},
                            {DNNL_ARG_WEIGHTS, w},
                            {DNNL_ARG_DST, rows_at(logits, logits_md, r, kClasses)}});
      s.wait();
    });
    const memory::desc w_md({kClasses, kWidth}, dt::bf16, tag::ab);
    dnnl::matmul dgrad(dnnl::matmul::primitive_desc({logits_md, w_md, x_md}, eng));
    const double t_dgrad = best_ms([&] {
      for (long r = 0; r < kRows; r += b)
        dgrad.execute(s, {{DNNL_ARG_SRC, rows_at(dl, logits_md, r, kClasses)},
                          {DNNL_ARG_WEIGHTS, w},
                          {DNNL_ARG_DST, rows_at(dx, x_md, r, kWidth)}});
      s.wait();
    });
    // dlᵀ of one block: [V, b] with the block's rows kClasses apart (column-major).
    const memory::desc dlt_md({kClasses, b}, dt::bf16, {1, kClasses});
    const memory::desc dw_md({kClasses, kWidth}, dt::f32, tag::ab);
    dnnl::primitive_attr adds;
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    adds.set_post_ops(sum);
    dnnl::matmul first(dnnl::matmul::primitive_desc({dlt_md, x_md, dw_md}, eng));
    dnnl::matmul later(dnnl::matmul::primitive_desc({dlt_md, x_md, dw_md}, adds, eng));
    const double t_wgrad = best_ms([&] {
      for (long r = 0; r < kRows; r += b) {
        memory dlt(dlt_md, eng, static_cast<char*>(dl.get_data_handle()) + r * kClasses * 2);
        (r == 0 ? first : later)
            .execute(s, {{DNNL_ARG_SRC, dlt},
                         {DNNL_ARG_WEIGHTS, rows_at(x, x_md, r, kWidth)},
                         {DNNL_ARG_DST, dw}});
      }
      s.wait();
    });
    std::printf("%14ld %9.2f %8.2f %8.2f %8.2f\n", b, t_forward, t_dgrad, t_wgrad,
                t_forward + t_dgrad + t_wgrad);
  }
  return 0;
}
