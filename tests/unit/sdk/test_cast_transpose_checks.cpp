// The FP8 cast_transpose family's argument checks (BackendArgumentChecks::cast_transpose_shape and
// cast_transpose_gradient_shape), shared by every backend: the views' data is never read. The
// conformance cases run them through a backend that offers the ops (CUDA); these run them on any
// host. Good arguments return [rows, cols]; each bad one raises BackendError naming what is wrong.
#include <gtest/gtest.h>

#include <string>

#include "backend_error_text.h"
#include "fake_device_memory.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/backend_argument_checks.h"

namespace {

using mixtrain::test::backend_error_of;

namespace sdk = mixtrain::sdk;
using sdk::DType;
using sdk::Shape;
using sdk::TensorView;

// Fake device memory (never dereferenced), one region per tensor, 4 KiB apart.
void* at(int region) {
  return mixtrain::test::fake_device_address(4096 * static_cast<std::size_t>(region));
}

const sdk::BackendArgumentChecks kChecks("backend_test");

// dy [6, 10] bf16 in region 0, its pre-activation in 1, the transposed codes in 2, the sums in 3,
// the amax in 4.
sdk::CastTransposeGradientArgs good() {
  sdk::CastTransposeGradientArgs a;
  a.cast.src = {at(0), DType::bf16, Shape{6, 10}};
  a.cast.out_transposed = {at(2), DType::fp8_e5m2, Shape{10, 6}};
  a.cast.cast.amax = {at(4), DType::fp32, Shape{1}};
  a.has_activation_grad = true;
  a.pre_activation = {at(1), DType::bf16, Shape{6, 10}};
  a.column_sums = {at(3), DType::fp32, Shape{10}};
  return a;
}

TEST(sdk_CastTransposeChecks, GoodArgumentsGiveRowsAndCols) {
  const auto rc = kChecks.cast_transpose_gradient_shape(good());
  EXPECT_EQ(rc.rows, 6);
  EXPECT_EQ(rc.cols, 10);
  const auto rc_cast = kChecks.cast_transpose_shape(good().cast);
  EXPECT_EQ(rc_cast.rows, 6);
  EXPECT_EQ(rc_cast.cols, 10);
}

// The amax is folded in (an atomic max) while other threads still read the source: an amax
// inside src or the pre-activation would make the codes depend on timing.
TEST(sdk_CastTransposeChecks, AnAmaxInsideWhatTheCastReadsIsRefused) {
  auto in_src = good().cast;
  in_src.cast.amax = {static_cast<unsigned char*>(at(0)) + 8, DType::fp32, Shape{1}};
  EXPECT_NE(backend_error_of([&] {
              kChecks.cast_transpose_shape(in_src);
            }).find("backend_test.cast_transpose: amax overlaps src"),
            std::string::npos);

  auto in_z = good();
  in_z.cast.cast.amax = {at(1), DType::fp32, Shape{1}};
  EXPECT_NE(backend_error_of([&] {
              kChecks.cast_transpose_gradient_shape(in_z);
            }).find("amax overlaps pre_activation"),
            std::string::npos);

  // Without an activation gradient there is no pre-activation to overlap.
  auto no_z = good();
  no_z.has_activation_grad = false;
  no_z.pre_activation = {};
  EXPECT_NO_THROW(kChecks.cast_transpose_gradient_shape(no_z));
}

TEST(sdk_CastTransposeChecks, OverlapsAmongOutputsAndInputsAreRefused) {
  auto sums_in_z = good();
  sums_in_z.column_sums = {at(1), DType::fp32, Shape{10}};
  EXPECT_NE(backend_error_of([&] {
              kChecks.cast_transpose_gradient_shape(sums_in_z);
            }).find("column_sums overlaps pre_activation"),
            std::string::npos);
  auto out_on_src = good();
  out_on_src.cast.out_transposed = {at(0), DType::fp8_e5m2, Shape{10, 6}};
  EXPECT_NE(backend_error_of([&] {
              kChecks.cast_transpose_gradient_shape(out_on_src);
            }).find("out_transposed overlaps src"),
            std::string::npos);
}

}  // namespace
