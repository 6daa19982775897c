// The kernel trace's tally (cuda_kernel_tally.h), host only: CUPTI's records summed per kernel
// name, C++ names demangled and merged, most device time first, emptied by take().
#include <gtest/gtest.h>

#include <string>

#include "cuda_kernel_tally.h"

namespace mixtrain::backend_cuda {
namespace {

TEST(cuda_kernel_tally, SumsRunsPerNameMostTimeFirst) {
  KernelTally t;
  t.add("sm90_xmma_wgrad_implicit_gemm", 3000);
  t.add("gemv", 500);
  t.add("sm90_xmma_wgrad_implicit_gemm", 4000);
  t.add("fill", 2000);
  const sdk::KernelTrace trace = t.take(7);
  ASSERT_EQ(trace.kernels.size(), 3u);
  EXPECT_EQ(trace.kernels[0].name, "sm90_xmma_wgrad_implicit_gemm");
  EXPECT_EQ(trace.kernels[0].calls, 2);
  EXPECT_DOUBLE_EQ(trace.kernels[0].device_seconds, 7e-6);
  EXPECT_EQ(trace.kernels[1].name, "fill");
  EXPECT_EQ(trace.kernels[2].name, "gemv");
  EXPECT_EQ(trace.kernels[2].calls, 1);
  EXPECT_EQ(trace.dropped, 7);
  // take() empties it.
  EXPECT_TRUE(t.take(0).kernels.empty());
}

TEST(cuda_kernel_tally, DemanglesCppNamesAndMergesThoseThatReadAlike) {
  EXPECT_EQ(demangled("_Z4fillPff"), "fill(float*, float)");
  EXPECT_EQ(demangled("_ZN8mixtrain6kernelEv"), "mixtrain::kernel()");
  EXPECT_EQ(demangled("sm90_xmma_fprop"), "sm90_xmma_fprop");  // not a C++ symbol
  EXPECT_EQ(demangled("_Znot a symbol"), "_Znot a symbol");    // fails to demangle: as given
  EXPECT_EQ(demangled(""), "");
  KernelTally t;
  t.add("_Z4fillPff", 10);
  t.add("_Z4fillPff", 10);
  t.add("_Z4fillPff", 10);
  const sdk::KernelTrace trace = t.take(0);
  ASSERT_EQ(trace.kernels.size(), 1u);
  EXPECT_EQ(trace.kernels[0].name, "fill(float*, float)");
  EXPECT_EQ(trace.kernels[0].calls, 3);
}

}  // namespace
}  // namespace mixtrain::backend_cuda
