// The SDK helpers the backends and checkpoint formats share: each is now the only definition, so
// its contract is checked here once rather than through each plugin.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <tuple>
#include <unordered_map>

#include "mixtrain/sdk/backend_argument_checks.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/gemm_plan_key.h"
#include "mixtrain/sdk/unique_fd.h"

namespace sdk = mixtrain::sdk;

namespace {

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

}  // namespace
