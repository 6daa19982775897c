// Shape and HostTensor element counts: sizes come from configs and files, so a product that does
// not fit in 64 bits must be a UserError, never a wrapped (undefined) count.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/tensor_view.h"

namespace sdk = mixtrain::sdk;

namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

TEST(sdk_Shape, NumelCountsExactly) {
  EXPECT_EQ((sdk::Shape{}).numel(), 1);
  EXPECT_EQ((sdk::Shape{3, 0, 7}).numel(), 0);
  EXPECT_EQ((sdk::Shape{kMax}).numel(), kMax);
  EXPECT_EQ((sdk::Shape{std::int64_t{1} << 31, std::int64_t{1} << 31}).numel(),
            std::int64_t{1} << 62);
  EXPECT_EQ((sdk::Shape{2, 3, 5}).rows(), 6);
}

TEST(sdk_Shape, OverflowingCountsThrowUserError) {
  try {
    (void)sdk::Shape{kMax, 128}.numel();
    FAIL() << "no error";
  } catch (const sdk::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("[9223372036854775807, 128]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)(sdk::Shape{std::int64_t{1} << 32, std::int64_t{1} << 32}.numel()),
               sdk::UserError);
  EXPECT_THROW((void)(sdk::Shape{kMax, 2, 1}.rows()), sdk::UserError);
  // 2^62 fp32 elements count fine but need 2^64 bytes.
  sdk::TensorView v{nullptr, sdk::DType::fp32,
                    sdk::Shape{std::int64_t{1} << 31, std::int64_t{1} << 31}};
  EXPECT_THROW((void)v.bytes(), sdk::UserError);
  v.shape = sdk::Shape{std::int64_t{1} << 30, 4};
  EXPECT_EQ(v.bytes(), std::size_t{1} << 34);
  sdk::HostTensor h;
  h.shape = {kMax / 2, 3};
  EXPECT_THROW((void)h.numel(), sdk::UserError);
  h.shape = {kMax / 2, 2};
  EXPECT_EQ(h.numel(), kMax - 1);
}

}  // namespace
