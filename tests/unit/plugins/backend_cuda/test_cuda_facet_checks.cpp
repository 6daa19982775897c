// The residual (add and add_backward), attention, embedding and dropout facets' argument checks
// (the SDK's shared ones through checks(), and cuda_facet_checks.h's launch limits on top), run
// without a device: every CudaBackend facet method calls them before it enqueues anything,
// so these are the messages a bad call gets on a GPU machine. Each names "backend_cuda.<op>", the
// tensor and its dtype/shape. The views point at host bytes that are never read.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_access.h"
#include "cuda_facet_checks.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cuda {
namespace {

using sdk::DType;
using sdk::Shape;
using sdk::TensorView;

// Views into one host buffer at byte offsets: `at` apart never overlap for these sizes.
class Views {
 public:
  TensorView at(std::size_t offset, DType t, Shape s) { return {bytes_.data() + offset, t, s}; }

 private:
  std::vector<std::byte> bytes_ = std::vector<std::byte>(std::size_t{1} << 22);
};

// Runs f, which must throw BackendError whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no BackendError; expected one mentioning " << *parts.begin();
  } catch (const sdk::BackendError& e) {
    const std::string what = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' missing from: " << what;
  }
}

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(cuda_facet_checks, ResidualAdd) {
  Views v;
  const TensorView a = v.at(0, DType::bf16, Shape{4, 8}), b = v.at(kMiB, DType::fp32, Shape{32});
  const TensorView y = v.at(2 * kMiB, DType::fp16, Shape{4, 8});
  const TensorView two[] = {a, b};
  EXPECT_EQ(checks().residual_add(two, y), 32);
  const TensorView in_place[] = {a, y};
  EXPECT_EQ(checks().residual_add(in_place, y), 32);
  const TensorView one[] = {a};
  expect_error([&] { checks().residual_add(one, y); }, {"backend_cuda.add", "1 inputs"});
  const TensorView wrong_size[] = {a, v.at(kMiB, DType::fp32, Shape{31})};
  expect_error([&] { checks().residual_add(wrong_size, y); },
               {"backend_cuda.add", "x2", "fp32 [31]"});
  const TensorView int_input[] = {a, v.at(kMiB, DType::int32, Shape{32})};
  expect_error([&] { checks().residual_add(int_input, y); }, {"backend_cuda.add", "x2", "int32"});
  const TensorView partial[] = {a, v.at(2 * kMiB + 2, DType::fp16, Shape{32})};
  expect_error([&] { checks().residual_add(partial, y); }, {"backend_cuda.add", "overlap"});
}

TEST(cuda_facet_checks, ResidualAddBackward) {
  Views v;
  const TensorView dy = v.at(0, DType::bf16, Shape{4, 8}), y = v.at(kMiB, DType::fp32, Shape{32});
  const TensorView dx = v.at(2 * kMiB, DType::fp16, Shape{4, 8});
  const TensorView in_place[] = {dy, TensorView{}, dx};
  EXPECT_EQ(checks().residual_add_backward(dy, y, true, in_place), 32);
  const TensorView one[] = {dx};
  EXPECT_EQ(checks().residual_add_backward(dy, TensorView{}, false, one), 32);
  expect_error([&] { checks().residual_add_backward(dy, y, true, {}); },
               {"backend_cuda.add_backward", "no gradients"});
  const TensorView wrong_size[] = {dx, v.at(3 * kMiB, DType::fp32, Shape{31})};
  expect_error([&] { checks().residual_add_backward(dy, y, true, wrong_size); },
               {"backend_cuda.add_backward", "dx2", "fp32 [31]"});
  const TensorView int_grad[] = {v.at(3 * kMiB, DType::int32, Shape{32})};
  expect_error([&] { checks().residual_add_backward(dy, y, true, int_grad); },
               {"backend_cuda.add_backward", "dx1", "int32"});
  const TensorView onto_y[] = {v.at(kMiB + 8, DType::fp16, Shape{32})};
  expect_error([&] { checks().residual_add_backward(dy, y, true, onto_y); },
               {"backend_cuda.add_backward", "dx1 overlaps y"});
  const TensorView part_of_dy[] = {v.at(2, DType::bf16, Shape{32})};
  expect_error([&] { checks().residual_add_backward(dy, y, true, part_of_dy); },
               {"backend_cuda.add_backward", "dx1", "dy", "partly overlap"});
  const TensorView twice[] = {dx, TensorView{}, v.at(2 * kMiB + 16, DType::fp16, Shape{32})};
  expect_error([&] { checks().residual_add_backward(dy, y, true, twice); },
               {"backend_cuda.add_backward", "dx3 overlaps dx1"});
  expect_error(
      [&] { checks().residual_add_backward(dy, v.at(kMiB, DType::fp32, Shape{16}), true, one); },
      {"backend_cuda.add_backward", "y is fp32 [16]"});
}

TEST(cuda_facet_checks, HeadPermutes) {
  Views v;
  sdk::HeadLayout l{2, 3, 4, 5, 3, 0, 0};  // N, T, H, D, P
  const TensorView x = v.at(0, DType::bf16, Shape{2, 3, 3 * 4 * 5});
  const TensorView y = v.at(kMiB, DType::fp32, Shape{3 * 2 * 4 * 3 * 5});
  checks().head_permute("split_heads", x, l, y);
  sdk::HeadLayout cache = l;
  cache.head_tokens = 10;
  cache.head_offset = 7;
  const TensorView y_cache = v.at(kMiB, DType::fp32, Shape{3 * 2 * 4 * 10 * 5});
  checks().head_permute("split_heads", x, cache, y_cache);
  cache.head_offset = 8;
  expect_error([&] { checks().head_permute("split_heads", x, cache, y_cache); },
               {"backend_cuda.split_heads", "head_offset is outside [0, 7]"});
  expect_error([&] { checks().head_permute("merge_heads", x, l, y_cache); },
               {"backend_cuda.merge_heads", "y", "fp32 [1200]"});
  expect_error([&] { checks().head_permute("split_heads", v.at(0, DType::int32, x.shape), l, y); },
               {"backend_cuda.split_heads", "x", "int32"});
  sdk::HeadLayout no_heads = l;
  no_heads.heads = 0;
  expect_error([&] { checks().head_permute("split_heads", x, no_heads, y); },
               {"backend_cuda.split_heads", "no heads"});
  expect_error([&] { checks().head_permute("split_heads", x, l, v.at(8, DType::fp32, y.shape)); },
               {"backend_cuda.split_heads", "overlap"});
}

TEST(cuda_facet_checks, Softmax) {
  Views v;
  const sdk::SoftmaxShape s{2, 3, 5, true};
  const TensorView scores = v.at(0, DType::fp32, Shape{30}),
                   probs = v.at(kMiB, DType::fp32, Shape{30});
  EXPECT_EQ(check_softmax_forward(scores, s, probs), 30);
  EXPECT_EQ(check_softmax_forward(scores, s, scores), 30);  // in place
  expect_error([&] { check_softmax_forward(v.at(0, DType::bf16, Shape{30}), s, probs); },
               {"backend_cuda.softmax_forward", "scores", "bf16 [30]"});
  expect_error([&] { check_softmax_forward(scores, s, v.at(kMiB, DType::fp32, Shape{29})); },
               {"backend_cuda.softmax_forward", "probs", "fp32 [29]"});
  expect_error(
      [&] {
        check_softmax_forward(scores, {2, 6, 5, true}, probs);
      },
      {"backend_cuda.softmax_forward", "rows = 6 > cols = 5"});
  expect_error([&] { check_softmax_forward(scores, s, v.at(4, DType::fp32, Shape{30})); },
               {"backend_cuda.softmax_forward", "overlap"});
  const TensorView dp = v.at(2 * kMiB, DType::fp32, Shape{30});
  EXPECT_EQ(check_softmax_backward(probs, dp, s, dp), 30);
  expect_error([&] { check_softmax_backward(probs, dp, s, probs); },
               {"backend_cuda.softmax_backward", "dscores overlaps probs"});
  expect_error(
      [&] { check_softmax_backward(probs, v.at(2 * kMiB, DType::fp16, Shape{30}), s, dp); },
      {"backend_cuda.softmax_backward", "dprobs", "fp16"});
}

TEST(cuda_facet_checks, Embedding) {
  Views v;
  const TensorView ids = v.at(0, DType::int32, Shape{2, 3});
  const TensorView table = v.at(kMiB, DType::bf16, Shape{10, 4});
  const TensorView out = v.at(2 * kMiB, DType::fp32, Shape{2, 3, 4});
  const EmbeddingShape g = check_gather(ids, table, out);
  EXPECT_EQ(g.rows, 6);
  EXPECT_EQ(g.vocab, 10);
  EXPECT_EQ(g.width, 4);
  expect_error([&] { check_gather(v.at(0, DType::fp32, Shape{6}), table, out); },
               {"backend_cuda.gather", "ids", "fp32 [6]", "int32"});
  expect_error([&] { check_gather(ids, v.at(kMiB, DType::bf16, Shape{40}), out); },
               {"backend_cuda.gather", "table", "bf16 [40]", "[V, C]"});
  expect_error(
      [&] {
        check_gather(ids, table, v.at(2 * kMiB, DType::fp32, Shape{6, 5}));
      },
      {"backend_cuda.gather", "out", "fp32 [6, 5]", "[6, 4]"});
  expect_error(
      [&] {
        check_gather(ids, table, v.at(kMiB, DType::fp32, Shape{6, 4}));
      },
      {"backend_cuda.gather", "overlaps"});
  const TensorView dy = v.at(2 * kMiB, DType::fp16, Shape{6, 4});
  const TensorView dtable = v.at(3 * kMiB, DType::fp32, Shape{10, 4});
  EXPECT_EQ(check_scatter_add(ids, dy, dtable, 1.0f).rows, 6);
  expect_error([&] { check_scatter_add(ids, dy, dtable, 0.5f); },
               {"backend_cuda.scatter_add", "beta = 0.5"});
  expect_error(
      [&] {
        check_scatter_add(ids, dy, v.at(3 * kMiB, DType::bf16, Shape{10, 4}), 0.0f);
      },
      {"backend_cuda.scatter_add", "dtable", "bf16 [10, 4]"});
  expect_error(
      [&] {
        check_scatter_add(ids, v.at(2 * kMiB, DType::fp16, Shape{5, 4}), dtable, 0.0f);
      },
      {"backend_cuda.scatter_add", "dy", "fp16 [5, 4]"});
}

TEST(cuda_facet_checks, Dropout) {
  Views v;
  const TensorView x = v.at(0, DType::bf16, Shape{100}), y = v.at(kMiB, DType::fp32, Shape{10, 10});
  checks().dropout("dropout_forward", "x", x, "y", y, 0.1f);
  checks().dropout("dropout_forward", "x", x, "y", x, 0.0f);  // in place
  expect_error([&] { checks().dropout("dropout_forward", "x", x, "y", y, 1.0f); },
               {"backend_cuda.dropout_forward", "p = 1", "[0, 1)"});
  expect_error([&] { checks().dropout("dropout_forward", "x", x, "y", y, -0.5f); },
               {"backend_cuda.dropout_forward", "p = -0.5"});
  expect_error(
      [&] {
        checks().dropout("dropout_backward", "dy", x, "dx", v.at(kMiB, DType::fp32, Shape{99}),
                         0.1f);
      },
      {"backend_cuda.dropout_backward", "dx", "fp32 [99]"});
  expect_error(
      [&] {
        checks().dropout("dropout_forward", "x", x, "y", v.at(2, DType::bf16, Shape{100}), 0.1f);
      },
      {"backend_cuda.dropout_forward", "overlap"});
  expect_error(
      [&] {
        checks().dropout("dropout_forward", "x", v.at(0, DType::fp8_e4m3, Shape{100}), "y", y,
                         0.1f);
      },
      {"backend_cuda.dropout_forward", "x", "fp8_e4m3"});
}

}  // namespace
}  // namespace mixtrain::backend_cuda
