// The CUDA backend's grow-only scratch (cuda_scratch.h) on the device (skipped without one): a
// request the device cannot hold raises BackendError naming the buffer, its bytes and the fix its
// caller gave (flash attention's workspace names the batch and the options that shrink it), and
// leaves the scratch usable; and, on the host, a request past a byte count's range is refused.
#include <cstdint>
#include <limits>
#include <string>

#include "cuda_scratch.h"
#include "cuda_test_util.h"

namespace mixtrain::backend_cuda::testing {
namespace {

TEST_F(backend_cuda_vs_cpu, ScratchOutOfMemoryNamesTheBufferAndTheFix) {
  DeviceScratch scratch;
  constexpr std::size_t kTooMany = std::size_t{1} << 50;  // 1 PiB
  try {
    scratch.get(kTooMany, nullptr, "flash_backward", "cuDNN's flash-attention workspace (batch 8)",
                "reduce the batch size");
    FAIL() << "no error for 1 PiB of scratch";
  } catch (const sdk::BackendError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("backend_cuda.flash_backward"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(kTooMany) + " bytes of cuDNN's flash-attention workspace "
                                                   "(batch 8)"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("bytes free of"), std::string::npos) << what;
    EXPECT_EQ(e.hint(), "reduce the batch size");
  }
  EXPECT_EQ(scratch.capacity(), 0u);
  // Still usable, and the default words name scratch.
  EXPECT_NE(scratch.get(1024, nullptr, "test"), nullptr);
  EXPECT_GE(scratch.capacity(), 1024u);
  try {
    scratch.get(kTooMany, nullptr, "test");
    FAIL() << "no error for 1 PiB of scratch";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of scratch"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("reduce the batch size"), std::string::npos) << e.hint();
  }
  scratch.release(nullptr);
}

// Host checks (no device needed): a byte count whose rounding would wrap, or an element count whose
// bytes overflow, is refused before any CUDA call instead of allocating a few bytes.
TEST(cuda_scratch, ARequestPastTheRangeOfAByteCountIsRefusedNotWrapped) {
  DeviceScratch scratch;
  const std::size_t max = std::numeric_limits<std::size_t>::max();
  for (std::size_t bytes : {max, max - 200}) {
    try {
      scratch.get(bytes, nullptr, "softmax_cross_entropy", "the loss's row sums", "smaller chunks");
      FAIL() << "no error for " << bytes << " bytes";
    } catch (const sdk::BackendError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("backend_cuda.softmax_cross_entropy"), std::string::npos) << what;
      EXPECT_NE(what.find("the loss's row sums"), std::string::npos) << what;
      EXPECT_NE(what.find("overflowed"), std::string::npos) << what;
      EXPECT_EQ(e.hint(), "smaller chunks");
    }
  }
  EXPECT_THROW(scratch.as<float>(max / 4 + 1, nullptr, "test"), sdk::BackendError);
  EXPECT_THROW(scratch.as<std::uint64_t>(max / 2, nullptr, "test"), sdk::BackendError);
  EXPECT_EQ(scratch.capacity(), 0u);
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
