// CudaBackend: construction errors (with and without a device), README options table,
// capabilities, memory statistics and the caching allocator, copies, and every cast pair against
// the CPU reference (bit-exact: both follow sdk/float_formats.h).
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/sdk/error.h"
#include "plugin_test_support.h"

namespace mixtrain::backend_cuda::testing {
namespace {

// Runs with or without a GPU: the error always carries CUDA's own error name.
TEST(backend_cuda, ConstructionErrorNamesTheCudaError) {
  const std::string reason = no_device_reason();
  int count = 0;
  if (reason.empty()) {
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  }
  // Without a device any index fails; with one, an index past the last one does.
  const int index = reason.empty() ? count : 0;
  try {
    CudaBackend backend(index);
    FAIL() << "CudaBackend(" << index << ") did not throw";
  } catch (const sdk::BackendError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("backend_cuda"), std::string::npos) << what;
    if (reason.empty()) {
      EXPECT_NE(what.find("cudaErrorInvalidDevice"), std::string::npos) << what;
    } else {
      // The exact CUDA error name (cudaErrorNoDevice, cudaErrorInsufficientDriver, ...).
      EXPECT_NE(what.find(reason.substr(0, reason.find(':'))), std::string::npos) << what;
      EXPECT_NE(what.find("no usable CUDA device"), std::string::npos) << what;
    }
    EXPECT_FALSE(e.hint().empty());
  }
  EXPECT_THROW(CudaBackend(-1), sdk::BackendError);
}

TEST(backend_cuda, ReadmeOptionTableMatchesSchema) {
  const std::string readme = std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/plugins/backend_cuda/README.md";
  std::vector<std::string> expected;
  for (const auto& spec : CudaBackend::option_schema()) expected.push_back(test::readme_row(spec));
  EXPECT_EQ(test::readme_rows(readme, "cuda"), expected) << "update the table in " << readme;
}

// Host only: the out-of-memory text names every number a user needs to see why it failed.
// What the plugin logs at creation when an option trades reproducibility for speed: the defaults
// name nothing; each such option is named with its value.
TEST(backend_cuda, OptionsThatCostReproducibilityAreNamed) {
  CudaOptions o;
  EXPECT_EQ(irreproducible_options(o), "");
  o.gemm_autotune = 1;  // 1: off, as 0
  o.conv_autotune = 1;
  o.gemm_realign = true;
  o.fp8_fast_accumulation = true;  // less exact, but the same bits every run
  EXPECT_EQ(irreproducible_options(o), "");
  o.gemm_autotune = 8;
  o.deterministic_convolutions = false;
  EXPECT_EQ(irreproducible_options(o), "gemm_autotune = 8, deterministic_convolutions = false");
  o.conv_autotune = 4;
  o.deterministic_attention = false;
  EXPECT_EQ(irreproducible_options(o),
            "gemm_autotune = 8, conv_autotune = 4, deterministic_attention = false, "
            "deterministic_convolutions = false");
}

// With `device` unset, a rank an MPI launcher started takes its local rank's GPU: the first of
// the launchers' variables that holds a non-negative integer.
TEST(backend_cuda, TheLocalRankComesFromTheLaunchersEnvironment) {
  const char* names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                         "LOCAL_RANK"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) saved.emplace_back(n, v);
    unsetenv(n);
  }
  EXPECT_FALSE(local_rank_from_environment().has_value());
  setenv("LOCAL_RANK", "3", 1);
  ASSERT_TRUE(local_rank_from_environment().has_value());
  EXPECT_EQ(local_rank_from_environment()->rank, 3);
  EXPECT_STREQ(local_rank_from_environment()->variable, "LOCAL_RANK");
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);  // Open MPI's first
  EXPECT_EQ(local_rank_from_environment()->rank, 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x1", 1);  // not a number: the next one
  EXPECT_EQ(local_rank_from_environment()->rank, 3);
  setenv("LOCAL_RANK", "-2", 1);
  EXPECT_FALSE(local_rank_from_environment().has_value());
  for (const char* n : names) unsetenv(n);
  for (const auto& [n, v] : saved) setenv(n.c_str(), v.c_str(), 1);
}

TEST(backend_cuda, OutOfMemoryTextNamesTheRequestTheBackendAndTheDevice) {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  const std::string text = CachingAllocator::out_of_memory_text(
      300 * MiB + 5, CachingAllocator::size_class(300 * MiB + 5), 70000 * MiB, 72000 * MiB,
      1500 * MiB, 120 * MiB, 81559 * MiB);
  EXPECT_NE(text.find("out of device memory"), std::string::npos) << text;
  EXPECT_NE(text.find("asked for " + std::to_string(300 * MiB + 5) + " bytes (300.0 MiB)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("a block of " + std::to_string(302 * MiB) + " bytes"), std::string::npos)
      << text;
  EXPECT_NE(text.find("(70000.0 MiB) allocated by this backend"), std::string::npos) << text;
  EXPECT_NE(text.find("(72000.0 MiB) reserved from the driver"), std::string::npos) << text;
  EXPECT_NE(text.find("(1500.0 MiB) of cached free blocks released"), std::string::npos) << text;
  EXPECT_NE(
      text.find("(120.0 MiB) free of " + std::to_string(81559 * MiB) + " bytes (81559.0 MiB)"),
      std::string::npos)
      << text;
}

TEST_F(backend_cuda_vs_cpu, Capabilities) {
  const auto caps = gpu().capabilities();
  EXPECT_EQ(caps.kind, "cuda");
  EXPECT_FALSE(caps.device_name.empty());
  EXPECT_GT(caps.memory_bytes, 0u);
  for (DType t : {DType::fp32, DType::tf32, DType::bf16, DType::fp16})
    EXPECT_TRUE(caps.supports(t)) << sdk::dtype_name(t);
  // FP8 is declared only where it runs on FP8 Tensor Cores (sm_89+), never emulated on a GPU.
  for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2})
    EXPECT_EQ(caps.supports(t), gpu().sm_version() >= 89) << sdk::dtype_name(t);
  EXPECT_TRUE(caps.native(DType::fp32));
  EXPECT_TRUE(caps.native(DType::fp16));
  if (gpu().sm_version() >= 80) {
    EXPECT_TRUE(caps.native(DType::bf16));
    EXPECT_TRUE(caps.native(DType::tf32));
  }
  EXPECT_EQ(caps.native(DType::fp8_e4m3), gpu().sm_version() >= 89);
  bool has_sm = false;
  for (const auto& f : caps.features) has_sm |= f == "sm_" + std::to_string(gpu().sm_version());
  EXPECT_TRUE(has_sm);
}

TEST_F(backend_cuda_vs_cpu, MemoryStatisticsAndCachingAllocator) {
  const auto before = gpu().memory_stats();
  void* a = gpu().allocate(1000);
  void* b = gpu().allocate(3 << 20);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 64, 0u);
  auto s = gpu().memory_stats();
  EXPECT_EQ(s.current_bytes, before.current_bytes + 1000 + (3u << 20));
  EXPECT_EQ(s.allocations, before.allocations + 2);
  EXPECT_GE(s.peak_bytes, s.current_bytes);
  gpu().deallocate(b);
  s = gpu().memory_stats();
  EXPECT_EQ(s.current_bytes, before.current_bytes + 1000);
  EXPECT_GE(s.peak_bytes, before.current_bytes + 1000 + (3u << 20));
  // Same size class: the cached block comes back.
  void* c = gpu().allocate((3 << 20) - 100);
  EXPECT_EQ(c, b);
  gpu().deallocate(c);
  gpu().deallocate(a);
  gpu().deallocate(nullptr);
  int not_ours = 0;
  gpu().deallocate(&not_ours);  // ignored
  EXPECT_EQ(gpu().memory_stats().current_bytes, before.current_bytes);
}

TEST_F(backend_cuda_vs_cpu, OutOfMemorySaysWhatWasAskedAndWhatIsFree) {
  // 128 TiB: below the allocator's sanity limit, so cudaMalloc itself runs out.
  const std::size_t too_much = std::size_t{1} << 47;
  try {
    gpu().allocate(too_much);
    FAIL() << "128 TiB allocation succeeded";
  } catch (const sdk::BackendError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("out of device memory"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(too_much)), std::string::npos) << what;
    EXPECT_NE(what.find("free of"), std::string::npos) << what;
  }
  // 4 PiB: a negative size converted to size_t, say; refused before cudaMalloc, with the number.
  try {
    gpu().allocate(std::size_t{1} << 52);
    FAIL() << "4 PiB allocation succeeded";
  } catch (const sdk::BackendError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(std::size_t{1} << 52)), std::string::npos) << what;
    EXPECT_NE(what.find("more than any device holds"), std::string::npos) << what;
  }
  // The backend still works afterwards.
  Tensor t(gpu(), DType::fp32, {4}, {1, 2, 3, 4});
  EXPECT_EQ(t.get(), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(backend_cuda_vs_cpu, CopiesRoundTrip) {
  const auto v = random_values(1000, 1);
  Tensor a(gpu(), DType::fp32, {10, 100}, v);
  Tensor b(gpu(), DType::fp32, {10, 100});
  gpu().copy(b, a);
  EXPECT_EQ(b.get(), v);
  Tensor c(gpu(), DType::tf32, {1000});
  gpu().copy(c, a);  // fp32 and tf32 share storage
  EXPECT_EQ(c.get(), v);
  Tensor h(gpu(), DType::bf16, {1000});
  EXPECT_THROW(gpu().copy(h, a), sdk::BackendError);
  gpu().synchronize();
}

// copy_from_host reads the host buffer before it returns (the caller reuses it at once, as the
// trainer does with its batch buffer) while the device copies run later, through rotating pinned
// slots; sizes grow past the slots' first capacity, and one copy takes the pageable path.
TEST_F(backend_cuda_vs_cpu, CopyFromHostReadsTheSourceBeforeReturning) {
  std::vector<std::unique_ptr<Tensor>> dst;
  std::vector<std::vector<float>> want;
  std::vector<float> buffer;
  const std::int64_t sizes[] = {1, 1000, 70000, 3, 1 << 20, 17, 5000, 1 << 16};
  for (int round = 0; round < 3; ++round)
    for (std::int64_t n : sizes) {
      buffer = random_values(static_cast<std::size_t>(n), static_cast<std::uint32_t>(n + round));
      dst.push_back(std::make_unique<Tensor>(gpu(), DType::fp32, Shape{n}));
      gpu().copy_from_host(dst.back()->view(), buffer.data());
      want.push_back(buffer);
      std::fill(buffer.begin(), buffer.end(), -1.0f);  // must not reach the device
    }
  const std::int64_t big = (std::int64_t{64} << 20) / 4 + 16;  // above the staging limit
  std::vector<float> large(static_cast<std::size_t>(big), 0.5f);
  Tensor large_dst(gpu(), DType::fp32, {big});
  gpu().copy_from_host(large_dst.view(), large.data());
  std::fill(large.begin(), large.end(), -1.0f);
  for (std::size_t i = 0; i < dst.size(); ++i) EXPECT_EQ(dst[i]->get(), want[i]) << "copy " << i;
  const auto back = large_dst.get();
  EXPECT_EQ(std::count(back.begin(), back.end(), 0.5f), big);
}

// Values that exercise rounding, subnormals of every target, overflow and specials.
std::vector<float> cast_inputs() {
  std::vector<float> v = random_values(2000, 7, -2.0f, 2.0f);
  const auto big = random_values(500, 8, -70000.0f, 70000.0f);
  v.insert(v.end(), big.begin(), big.end());
  for (float x : {0.0f, -0.0f, 1e-45f, -1e-40f, 1e-8f, 3e-5f, 6e-8f, 1.5e-3f, 448.0f, 449.0f,
                  464.0f, 465.0f, 480.0f, 57344.0f, 61439.0f, 61440.0f, 65504.0f, 65519.0f,
                  65520.0f, 3.0e38f, 3.4e38f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()})
    v.push_back(x);
  return v;
}

TEST_F(backend_cuda_vs_cpu, EveryCastPairMatchesTheCpuBitForBit) {
  const DType types[] = {DType::fp32, DType::tf32, DType::bf16, DType::fp16, DType::fp8_e4m3,
                         DType::fp8_e5m2};
  const auto values = cast_inputs();
  const auto n = static_cast<std::int64_t>(values.size());
  for (DType from : types)
    for (DType to : types)
      for (float scale : {1.0f, 0.37f, 64.0f})
        for (bool saturate : {false, true}) {
          const std::string what = std::string(sdk::dtype_name(from)) + " -> " +
                                   std::string(sdk::dtype_name(to)) + " scale " +
                                   std::to_string(scale) + (saturate ? " saturate" : "");
          Tensor gs(gpu(), from, {n}, values), gd(gpu(), to, {n}), ga(gpu(), DType::fp32, {1}, {0.5f});
          Tensor cs(cpu(), from, {n}, values), cd(cpu(), to, {n}), ca(cpu(), DType::fp32, {1}, {0.5f});
          sdk::CastArgs args;
          args.scale = scale;
          args.saturate = saturate;
          args.amax = ga;
          gpu().cast(gs, gd, args);
          args.amax = ca;
          cpu().cast(cs, cd, args);
          expect_same_values(gd.get(), cd.get(), what);
          expect_same_values(ga.get(), ca.get(), what + " amax");
        }
}

TEST_F(backend_cuda_vs_cpu, CastAmaxIsAMaximumOverCallsAndSeesNaN) {
  Tensor src(gpu(), DType::fp32, {5}, {1.0f, -7.5f, 2.0f, 0.0f, -0.0f});
  Tensor dst(gpu(), DType::fp8_e4m3, {5});
  Tensor amax(gpu(), DType::fp32, {1}, {3.0f});
  sdk::CastArgs args;
  args.amax = amax;
  gpu().cast(src, dst, args);
  EXPECT_EQ(amax.get()[0], 7.5f);
  amax.set({100.0f});
  gpu().cast(src, dst, args);
  EXPECT_EQ(amax.get()[0], 100.0f);
  src.set({1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f, 0.0f, 0.0f});
  gpu().cast(src, dst, args);
  EXPECT_TRUE(std::isnan(amax.get()[0]));
}

// Large tensors cross many blocks of the grid-stride kernels.
TEST_F(backend_cuda_vs_cpu, LargeCastWithAmax) {
  const std::int64_t n = 3'000'001;
  const auto values = random_values(static_cast<std::size_t>(n), 11, -300.0f, 300.0f);
  Tensor gs(gpu(), DType::fp32, {n}, values), gd(gpu(), DType::fp8_e4m3, {n}),
      ga(gpu(), DType::fp32, {1});
  Tensor cs(cpu(), DType::fp32, {n}, values), cd(cpu(), DType::fp8_e4m3, {n}),
      ca(cpu(), DType::fp32, {1});
  sdk::CastArgs args;
  args.scale = 1.5f;
  args.saturate = true;
  args.amax = ga;
  gpu().cast(gs, gd, args);
  args.amax = ca;
  cpu().cast(cs, cd, args);
  EXPECT_EQ(gd.raw(), cd.raw());
  EXPECT_EQ(ga.get(), ca.get());
}

TEST_F(backend_cuda_vs_cpu, CastRejectsInt32) {
  Tensor a(gpu(), DType::int32, {4}), b(gpu(), DType::fp32, {4});
  EXPECT_THROW(gpu().cast(a, b), sdk::BackendError);
  Tensor c(gpu(), DType::fp32, {5});
  EXPECT_THROW(gpu().cast(b, c), sdk::BackendError);
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
