// decode_images' argument checks (BackendArgumentChecks::decode_images), shared by every backend:
// the views' data is never read. Every bad argument raises BackendError
// "backend_test.decode_images: ..." naming it; good ones return the pixel count.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "backend_error_text.h"
#include "fake_device_memory.h"
#include "mixtrain/sdk/backend_image_input.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"

namespace {

using mixtrain::test::backend_error_of;
using mixtrain::test::message_mismatch;

namespace sdk = mixtrain::sdk;
using sdk::DType;
using sdk::Shape;
using sdk::TensorView;

// Distinct fake device addresses (never dereferenced): the table's 4 KiB, then y well after it.
void* table_data() {
  return mixtrain::test::fake_device_address(0);
}
void* y_data() {
  return mixtrain::test::fake_device_address(1 << 16);
}

const std::uint8_t kPixels[1] = {0};

const sdk::BackendArgumentChecks kChecks("backend_test");

std::int64_t check_decode_images(const sdk::ByteImages& images, const TensorView& table,
                                 const TensorView& y) {
  return kChecks.decode_images(images, table, y);
}

sdk::ByteImages images(std::int64_t rows, std::int64_t channels, std::int64_t plane) {
  return {kPixels, rows, channels, plane};
}

TensorView table_of(std::int64_t channels, DType dtype = DType::fp32) {
  return {table_data(), dtype, Shape{channels, 256}};
}

TensorView y_of(Shape shape, DType dtype = DType::bf16) {
  return {y_data(), dtype, shape};
}

// The message is decode_images' and mentions every one of `parts`.
void expect_error(const std::string& message, std::initializer_list<const char*> parts) {
  EXPECT_EQ(message_mismatch(message, "backend_test.decode_images: ", parts), "");
}

TEST(DecodeImagesChecks, SizesOfAGoodBatch) {
  EXPECT_EQ(check_decode_images(images(4, 3, 50), table_of(3), y_of({4, 150})), 600);
}

TEST(DecodeImagesChecks, YMayHaveAnyShapeOfItsElementCountAndAnyStorageDtype) {
  for (DType t : {DType::fp32, DType::tf32, DType::bf16, DType::fp16}) {
    EXPECT_EQ(check_decode_images(images(2, 3, 20), table_of(3), y_of({2, 60}, t)), 120)
        << sdk::dtype_name(t);
    EXPECT_EQ(check_decode_images(images(2, 3, 20), table_of(3), y_of({2, 3, 4, 5}, t)), 120)
        << sdk::dtype_name(t);
  }
  // A tf32 view of the table is fp32 storage.
  EXPECT_EQ(check_decode_images(images(1, 1, 4), table_of(1, DType::tf32), y_of({1, 4})), 4);
}

TEST(DecodeImagesChecks, EmptyBatchesNeedNoPixels) {
  // rows = 0: null pixels and a y without data are fine, nothing to do.
  const TensorView no_y{nullptr, DType::fp32, Shape{0, 150}};
  EXPECT_EQ(check_decode_images({nullptr, 0, 3, 50}, table_of(3), no_y), 0);
  // An empty plane or no channels: no bytes either (pixels given, as rows > 0 requires).
  EXPECT_EQ(check_decode_images(images(5, 3, 0), table_of(3), y_of({5, 0})), 0);
  const TensorView no_table{nullptr, DType::fp32, Shape{0, 256}};
  EXPECT_EQ(check_decode_images(images(5, 0, 7), no_table, y_of({5, 0})), 0);
}

TEST(DecodeImagesChecks, NegativeSizesAreNamed) {
  expect_error(
      backend_error_of([] { check_decode_images(images(-1, 3, 4), table_of(3), y_of({0})); }),
      {"images.rows = -1", "negative"});
  expect_error(
      backend_error_of([] { check_decode_images(images(1, -3, 4), table_of(3), y_of({0})); }),
      {"images.channels = -3"});
  expect_error(
      backend_error_of([] { check_decode_images(images(1, 3, -4), table_of(3), y_of({0})); }),
      {"images.plane = -4"});
}

TEST(DecodeImagesChecks, ABatchBeyondInt64IsRefused) {
  const std::int64_t big = std::int64_t{1} << 40;
  expect_error(
      backend_error_of([&] { check_decode_images(images(big, 3, big), table_of(3), y_of({1})); }),
      {"64 bits"});
}

TEST(DecodeImagesChecks, TheTableMustBeFp32ChannelsBy256) {
  const auto bad_table = [](TensorView table) {
    return backend_error_of([&] { check_decode_images(images(2, 3, 10), table, y_of({2, 30})); });
  };
  expect_error(bad_table(table_of(3, DType::bf16)), {"table is bf16 [3, 256]", "fp32 [3, 256]"});
  expect_error(bad_table(table_of(3, DType::fp16)), {"table is fp16"});
  expect_error(bad_table({table_data(), DType::fp32, Shape{3, 255}}), {"table is fp32 [3, 255]"});
  expect_error(bad_table({table_data(), DType::fp32, Shape{256, 3}}), {"table is fp32 [256, 3]"});
  expect_error(bad_table({table_data(), DType::fp32, Shape{768}}), {"table is fp32 [768]"});
  expect_error(bad_table(table_of(4)), {"table is fp32 [4, 256]", "fp32 [3, 256]"});
  expect_error(bad_table({table_data(), DType::fp32, Shape{1, 3, 256}}), {"[1, 3, 256]"});
  expect_error(bad_table({nullptr, DType::fp32, Shape{3, 256}}), {"table is empty"});
}

TEST(DecodeImagesChecks, YMustBeAStorageFloatOfEveryPixel) {
  const auto bad_y = [](TensorView y) {
    return backend_error_of([&] { check_decode_images(images(2, 3, 10), table_of(3), y); });
  };
  expect_error(bad_y(y_of({2, 30}, DType::int32)), {"y is int32 [2, 30]", "fp32, bf16 or fp16"});
  expect_error(bad_y(y_of({2, 30}, DType::fp8_e4m3)), {"y is fp8_e4m3"});
  expect_error(bad_y(y_of({2, 31})), {"y is bf16 [2, 31]", "= 60 pixels"});
  expect_error(bad_y(y_of({3, 30})), {"90 elements", "= 60 pixels"});
  expect_error(bad_y({nullptr, DType::fp32, Shape{2, 30}}), {"y is empty"});
  // y over the table: the kernel would read values it already wrote.
  expect_error(bad_y({table_data(), DType::fp32, Shape{2, 30}}), {"y overlaps table"});
}

TEST(DecodeImagesChecks, NullPixelsWithRowsAreRefused) {
  expect_error(backend_error_of([] {
                 check_decode_images({nullptr, 2, 3, 10}, table_of(3), y_of({2, 30}));
               }),
               {"images.pixels is null", "rows = 2"});
  // Also when the rows hold no pixels: the contract asks for pixels whenever rows > 0.
  expect_error(backend_error_of([] {
                 check_decode_images({nullptr, 2, 3, 0}, table_of(3), y_of({2, 0}));
               }),
               {"images.pixels is null"});
}

TEST(DecodeImagesChecks, MessagesCarryAHint) {
  try {
    check_decode_images(images(2, 3, 10), table_of(3, DType::bf16), y_of({2, 30}));
    FAIL() << "no error";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(e.hint().find("[channels, 256]"), std::string::npos) << e.hint();
  }
}

}  // namespace
