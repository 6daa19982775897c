// The SDK helpers the backends and checkpoint formats share: each is now the only definition, so
// its contract is checked here once rather than through each plugin.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend_error_text.h"
#include "mixtrain/sdk/backend_attention.h"
#include "mixtrain/sdk/backend_batch_norm.h"
#include "mixtrain/sdk/backend_convolution.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"
#include "mixtrain/sdk/support/gemm_plan_key.h"
#include "mixtrain/sdk/support/unique_fd.h"

namespace sdk = mixtrain::sdk;

namespace {

using mixtrain::test::backend_error_of;

bool fd_open(int fd) {
  return ::fcntl(fd, F_GETFD) != -1 || errno != EBADF;
}

TEST(sdk_UniqueFd, ClosesWhatItOwns) {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  {
    std::optional<sdk::UniqueFd> owner;
    owner.emplace(fd);
    EXPECT_EQ(owner->get(), fd);
    EXPECT_TRUE(fd_open(fd));
  }
  EXPECT_FALSE(fd_open(fd));
  const sdk::UniqueFd nothing(-1);  // a failed open(2): owns nothing, closes nothing
  EXPECT_EQ(nothing.get(), -1);
}

struct TestKey : sdk::GemmPlanKey {
  int dtype = 0;
  bool bias = false;
  bool operator==(const TestKey&) const = default;
  auto fields() const { return std::tie(dtype, bias); }
};

TEST(sdk_GemmPlanKey, EqualKeysShareAPlanAndEveryFieldSeparatesThem) {
  const TestKey base{{64, 32, 16, true, false}, 3, true};
  const sdk::GemmPlanKeyHash hash;
  EXPECT_EQ(hash(base), hash(TestKey(base)));
  std::unordered_map<TestKey, int, sdk::GemmPlanKeyHash> plans;
  plans[base] = 0;
  auto vary = [&](auto change) {
    TestKey k = base;
    change(k);
    EXPECT_FALSE(k == base);
    plans.emplace(k, static_cast<int>(plans.size()));
  };
  vary([](TestKey& k) { k.m = 65; });
  vary([](TestKey& k) { k.n = 33; });
  vary([](TestKey& k) { k.k = 17; });
  vary([](TestKey& k) { k.trans_a = false; });
  vary([](TestKey& k) { k.trans_b = true; });
  vary([](TestKey& k) { k.dtype = 4; });
  vary([](TestKey& k) { k.bias = false; });
  EXPECT_EQ(plans.size(), 8u);
  EXPECT_EQ(plans.at(base), 0);
}

TEST(sdk_BackendArgumentChecks, StorageDtypes) {
  using sdk::DType;
  EXPECT_TRUE(sdk::is_fp32_storage(DType::fp32));
  EXPECT_TRUE(sdk::is_fp32_storage(DType::tf32));
  EXPECT_FALSE(sdk::is_fp32_storage(DType::bf16));
  for (DType t : {DType::fp32, DType::tf32, DType::bf16, DType::fp16})
    EXPECT_TRUE(sdk::is_storage_float(t)) << sdk::dtype_name(t);
  for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2, DType::int32})
    EXPECT_FALSE(sdk::is_storage_float(t)) << sdk::dtype_name(t);
}

TEST(sdk_BackendArgumentChecks, OverlapsIsAboutBytes) {
  float buf[16] = {};
  const auto view = [&](std::int64_t at, std::int64_t n, sdk::DType t = sdk::DType::fp32) {
    return sdk::TensorView{buf + at, t, sdk::Shape{n}};
  };
  EXPECT_TRUE(sdk::overlaps(view(0, 8), view(4, 8)));
  EXPECT_TRUE(sdk::overlaps(view(4, 8), view(0, 8)));
  EXPECT_TRUE(sdk::overlaps(view(0, 8), view(0, 8)));
  EXPECT_FALSE(sdk::overlaps(view(0, 8), view(8, 8)));                    // adjacent
  EXPECT_FALSE(sdk::overlaps(view(0, 8, sdk::DType::bf16), view(4, 4)));  // 16 bytes: buf[0, 4)
  EXPECT_FALSE(sdk::overlaps(view(0, 0), view(0, 8)));                    // no bytes
  EXPECT_FALSE(
      sdk::overlaps(sdk::TensorView{nullptr, sdk::DType::fp32, sdk::Shape{8}}, view(0, 8)));
}

TEST(sdk_BackendArgumentChecks, CastArgs) {
  const sdk::BackendArgumentChecks checks("backend_test");
  float src[4] = {}, amax[2] = {};
  std::uint8_t fp8[4] = {};
  const sdk::TensorView s{src, sdk::DType::fp32, sdk::Shape{4}};
  sdk::CastArgs args;
  EXPECT_NO_THROW(
      checks.cast_args(s, sdk::TensorView{fp8, sdk::DType::fp8_e4m3, sdk::Shape{4}}, args));
  try {
    checks.cast_args(s, sdk::TensorView{src, sdk::DType::int32, sdk::Shape{4}}, args);
    FAIL() << "no error";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("backend_test.cast: cannot cast fp32 [4] to int32 [4]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(checks.cast_args(s, sdk::TensorView{fp8, sdk::DType::fp8_e5m2, sdk::Shape{3}}, args),
               sdk::BackendError);
  args.amax = sdk::TensorView{amax, sdk::DType::fp32, sdk::Shape{2}};
  EXPECT_THROW(checks.cast_args(s, sdk::TensorView{fp8, sdk::DType::fp8_e5m2, sdk::Shape{4}}, args),
               sdk::BackendError);
}

// The facets' and layers' shared checks: the backend's name and the op start every message, the
// layout and geometry are spelled out, and in-place aliasing is told from partial overlap.
TEST(sdk_BackendArgumentChecks, FacetAndLayerChecksNameBackendOpAndLayout) {
  using sdk::DType;
  using sdk::Shape;
  const sdk::BackendArgumentChecks checks("backend_test");
  std::vector<float> buf(4096);
  const auto at = [&](std::size_t offset, DType t, Shape s) {
    return sdk::TensorView{buf.data() + offset, t, s};
  };

  sdk::HeadLayout l{2, 3, 4, 5, 3, 0, 0};
  l.head_tokens = 2;
  std::string e = backend_error_of([&] {
    checks.head_permute("split_heads", at(0, DType::fp32, Shape{360}), l,
                        at(1024, DType::fp32, Shape{240}));
  });
  EXPECT_NE(e.find("backend_test.split_heads: layout {batch 2, tokens 3, parts 3, heads 4, "
                   "head_dim 5, head_tokens 2, head_offset 0}: head_tokens is below tokens"),
            std::string::npos)
      << e;

  const sdk::TensorView x = at(0, DType::bf16, Shape{8});
  EXPECT_NO_THROW(checks.dropout("dropout_forward", "x", x, "y", x, 0.5f));  // in place
  e = backend_error_of(
      [&] { checks.dropout("dropout_forward", "x", x, "y", at(2, DType::bf16, Shape{8}), 0.5f); });
  EXPECT_NE(e.find("backend_test.dropout_forward: x bf16 [8] and y bf16 [8] partly overlap"),
            std::string::npos)
      << e;

  sdk::Conv2dForwardArgs c;
  c.geometry.batch = 1;
  c.geometry.in_channels = 2;
  c.geometry.height = c.geometry.width = 2;
  c.geometry.out_channels = 2;
  c.geometry.kernel_h = c.geometry.kernel_w = 3;
  e = backend_error_of([&] { checks.conv2d_forward(c); });
  EXPECT_NE(e.find("backend_test.conv2d_forward: the kernel 3x3 (dilation 1x1) does not fit in "
                   "the 2x2 image padded by 0x0"),
            std::string::npos)
      << e;

  const sdk::BatchNormShape bn{4, 2, 1e-5f, true};
  const sdk::TensorView act = at(0, DType::fp32, Shape{4, 2});
  const sdk::TensorView stat = at(64, DType::fp32, Shape{2}), stat2 = at(72, DType::fp32, Shape{2});
  e = backend_error_of([&] {
    checks.batchnorm_backward(act, at(8, DType::fp32, Shape{4, 2}), {}, {}, stat, stat2, bn,
                              at(128, DType::fp32, Shape{1}), 16, act, {}, {});
  });
  EXPECT_NE(e.find("backend_test.batchnorm_backward: workspace is fp32 [1] (4 bytes) but 16 bytes "
                   "are needed"),
            std::string::npos)
      << e;
  EXPECT_TRUE(checks.batchnorm_backward(act, at(8, DType::fp32, Shape{4, 2}), {}, {}, stat, stat2,
                                        bn, at(128, DType::fp32, Shape{4}), 16, act, {}, {}));
  e = backend_error_of([&] {
    checks.batchnorm_backward(at(8, DType::fp32, Shape{4, 2}), act, {}, {}, stat, stat2, bn,
                              at(128, DType::fp32, Shape{4}), 16, at(4, DType::fp32, Shape{4, 2}),
                              {}, {});
  });
  EXPECT_NE(e.find("partly overlap"), std::string::npos) << e;

  // Layer norm: y in place of x, dx in place of dy or of x; never part of one.
  const sdk::TensorView rows = at(0, DType::fp32, Shape{4, 8}), moved = at(4, DType::fp32, {4, 8});
  const sdk::TensorView mean = at(512, DType::fp32, Shape{4}), rstd = at(520, DType::fp32, {4});
  const sdk::TensorView other = at(1024, DType::fp32, Shape{4, 8});
  EXPECT_NO_THROW(checks.layernorm_forward_shape(rows, {}, {}, rows, mean, rstd));
  e = backend_error_of([&] { checks.layernorm_forward_shape(rows, {}, {}, moved, mean, rstd); });
  EXPECT_NE(e.find("backend_test.layernorm_forward: y fp32 [4, 8] and x fp32 [4, 8] partly "
                   "overlap"),
            std::string::npos)
      << e;
  EXPECT_NO_THROW(checks.layernorm_backward_shape(other, rows, {}, mean, rstd, other, {}, {}));
  EXPECT_NO_THROW(checks.layernorm_backward_shape(other, rows, {}, mean, rstd, rows, {}, {}));
  for (const sdk::TensorView& dy : {rows, other}) {
    const sdk::TensorView x = dy.data == rows.data ? other : rows;
    e = backend_error_of(
        [&] { checks.layernorm_backward_shape(dy, x, {}, mean, rstd, moved, {}, {}); });
    EXPECT_NE(e.find("backend_test.layernorm_backward: dx fp32 [4, 8] and "), std::string::npos)
        << e;
    EXPECT_NE(e.find("partly overlap"), std::string::npos) << e;
  }

  // Cross-entropy: dlogits over logits in place, never partly, nor over the labels or the loss.
  const sdk::TensorView labels{buf.data() + 2048, DType::int32, Shape{4}};
  const sdk::TensorView loss = at(2056, DType::fp32, Shape{1});
  EXPECT_NO_THROW(checks.softmax_cross_entropy_shape(rows, labels, 0.0f, loss, {}, rows));
  EXPECT_NO_THROW(checks.softmax_cross_entropy_shape(rows, labels, 0.0f, loss, {}, other));
  e = backend_error_of(
      [&] { checks.softmax_cross_entropy_shape(rows, labels, 0.0f, loss, {}, moved); });
  EXPECT_NE(e.find("backend_test.softmax_cross_entropy: dlogits fp32 [4, 8] and logits fp32 [4, "
                   "8] partly overlap"),
            std::string::npos)
      << e;
  const sdk::TensorView over_labels = at(2040, DType::fp32, Shape{4, 8});
  e = backend_error_of(
      [&] { checks.softmax_cross_entropy_shape(rows, labels, 0.0f, loss, {}, over_labels); });
  EXPECT_NE(e.find("dlogits overlaps labels"), std::string::npos) << e;

  // Activation and axpy: in place, or apart; never partly, nor in place across dtypes.
  const sdk::TensorView half = {buf.data(), DType::bf16, Shape{4, 8}};
  EXPECT_NO_THROW(checks.activation_args(rows, rows));
  EXPECT_NO_THROW(checks.activation_grad_args(other, rows, rows));
  EXPECT_NO_THROW(checks.activation_grad_args(rows, other, rows));
  EXPECT_NO_THROW(checks.axpy_args(rows, other));
  e = backend_error_of([&] { checks.activation_args(rows, moved); });
  EXPECT_NE(e.find("backend_test.activation_forward: y fp32 [4, 8] and x fp32 [4, 8] partly "
                   "overlap"),
            std::string::npos)
      << e;
  e = backend_error_of([&] { checks.activation_grad_args(other, rows, half); });
  EXPECT_NE(e.find("backend_test.activation_backward: dx bf16 [4, 8] and dy fp32 [4, 8] partly "
                   "overlap"),
            std::string::npos)
      << e;
  e = backend_error_of([&] { checks.axpy_args(moved, rows); });
  EXPECT_NE(e.find("backend_test.axpy: y fp32 [4, 8] and x fp32 [4, 8] partly overlap"),
            std::string::npos)
      << e;

  // Copy: onto itself (nothing to do) or between disjoint tensors; a device copy engine leaves a
  // partial overlap undefined.
  EXPECT_NO_THROW(checks.copy_args(rows, rows));
  EXPECT_NO_THROW(checks.copy_args(rows, other));
  e = backend_error_of([&] { checks.copy_args(moved, rows); });
  EXPECT_NE(e.find("backend_test.copy: dst fp32 [4, 8] and src fp32 [4, 8] partly overlap"),
            std::string::npos)
      << e;

  // Cast: in place between dtypes of one size (fp32 and its tf32 view), never a narrowing one;
  // the amax apart from both.
  EXPECT_NO_THROW(checks.cast_args(rows, {rows.data, DType::tf32, rows.shape}, {}));
  e = backend_error_of([&] { checks.cast_args(rows, half, {}); });
  EXPECT_NE(e.find("backend_test.cast: dst bf16 [4, 8] and src fp32 [4, 8] partly overlap"),
            std::string::npos)
      << e;
  sdk::CastArgs inside;
  inside.amax = at(31, DType::fp32, Shape{1});
  e = backend_error_of([&] { checks.cast_args(rows, other, inside); });
  EXPECT_NE(e.find("amax overlaps src"), std::string::npos) << e;

  // The gradient status is read 8 bytes at a time.
  std::vector<std::int32_t> words(6);
  const auto status_at = [&](std::size_t word) {
    return sdk::TensorView{words.data() + word, DType::int32, Shape{4}};
  };
  const std::size_t even = reinterpret_cast<std::uintptr_t>(words.data()) % 8 == 0 ? 0 : 1;
  EXPECT_NO_THROW(checks.gradient_status("queue_unscale_check", status_at(even)));
  e = backend_error_of([&] { checks.gradient_status("queue_unscale_check", status_at(even + 1)); });
  EXPECT_NE(e.find("is not 8-byte aligned"), std::string::npos) << e;

  // foreach: every self tensor apart from the others; other[i] self[i] itself or apart from it.
  const sdk::TensorView a = at(0, DType::fp32, Shape{8}), b = at(8, DType::fp32, Shape{8});
  const sdk::TensorView t3 = at(16, DType::fp32, Shape{8}), into_a = at(4, DType::fp32, Shape{8});
  EXPECT_NO_THROW(
      checks.foreach_lists("foreach_add", std::vector{t3, a, b}, {std::vector{t3, a, b}}));
  e = backend_error_of([&] { checks.foreach_lists("foreach_mul_scalar", std::vector{a, b, a}); });
  EXPECT_NE(e.find("backend_test.foreach_mul_scalar: self[0] fp32 [8] and self[2] fp32 [8] "
                   "overlap"),
            std::string::npos)
      << e;
  e = backend_error_of([&] { checks.foreach_lists("foreach_mul_scalar", std::vector{into_a, a}); });
  EXPECT_NE(e.find("overlap"), std::string::npos) << e;
  e = backend_error_of([&] {
    checks.foreach_lists("foreach_add", std::vector{a, t3}, {std::vector{into_a, t3}});
  });
  EXPECT_NE(e.find("list 1[0] fp32 [8] and self[0] fp32 [8] partly overlap"), std::string::npos)
      << e;
  // other[i] over another index's self: swapped lists, and one reaching into a later self.
  e = backend_error_of([&] {
    checks.foreach_lists("foreach_add", std::vector{a, b}, {std::vector{b, a}});
  });
  EXPECT_NE(e.find("list 1[0] fp32 [8] overlaps self[1] fp32 [8]: the update writes self[1] while "
                   "it reads list 1[0]"),
            std::string::npos)
      << e;
  e = backend_error_of([&] {
    checks.foreach_lists("foreach_add", std::vector{a, b, t3},
                         {std::vector{a, b, t3}, std::vector{a, t3, t3}});
  });
  EXPECT_NE(e.find("list 2[1] fp32 [8] overlaps self[2]"), std::string::npos) << e;
  const sdk::TensorView across = at(12, DType::fp32, Shape{8});  // b's second half, t3's first
  e = backend_error_of([&] {
    checks.foreach_lists("foreach_add", std::vector{a, b, t3}, {std::vector{across, b, t3}});
  });
  EXPECT_NE(e.find("list 1[0] fp32 [8] overlaps self[2]"), std::string::npos) << e;
}

}  // namespace
