// The embedding facet of CpuBackend: gather in every table/out dtype pair with and without
// accumulation (one rounding), scatter_add summing each table row's rows in ascending order in
// fp32 (the same bits as a plain loop, for one thread and for two), and the argument errors.
#include <cstring>
#include <functional>
#include <string>

#include "backend_test_util.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu::testing {
namespace {

constexpr DType kFloats[] = {DType::fp32, DType::bf16, DType::fp16};

std::vector<float> ids_of(std::int64_t rows, std::int64_t vocab, std::uint32_t seed) {
  // Skewed: a third of the rows hit id 1 (a frequent token), the rest spread over the vocabulary.
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int64_t> any(0, vocab - 1);
  std::vector<float> ids(static_cast<std::size_t>(rows));
  for (auto& id : ids) id = static_cast<float>(rng() % 3 == 0 ? 1 : any(rng));
  return ids;
}

// dtable as the contract defines it: beta * old, then each row of dy added in ascending row
// order, in fp32.
std::vector<float> reference_scatter_add(const std::vector<float>& ids,
                                         const std::vector<float>& dy, std::vector<float> table,
                                         std::int64_t width, float beta) {
  if (beta == 0.0f) std::fill(table.begin(), table.end(), 0.0f);
  for (std::size_t r = 0; r < ids.size(); ++r) {
    const auto v = static_cast<std::size_t>(ids[r]);
    for (std::int64_t j = 0; j < width; ++j)
      table[v * static_cast<std::size_t>(width) + static_cast<std::size_t>(j)] +=
          dy[r * static_cast<std::size_t>(width) + static_cast<std::size_t>(j)];
  }
  return table;
}

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

TEST(backend_cpu_embedding, ScatterAddHasTheSameBitsOnOneAndTwoThreads) {
  // rows * width is far above the single-thread threshold and width spans two column blocks.
  const std::int64_t rows = 4096, vocab = 97, width = 300;
  const auto ids = ids_of(rows, vocab, 1);
  const auto dy_values = random_values(static_cast<std::size_t>(rows * width), 2, -1.0f, 1.0f);
  const auto start = random_values(static_cast<std::size_t>(vocab * width), 3);
  for (DType dy_t : kFloats) {
    const auto dy_stored = representable(dy_values, dy_t);
    std::vector<std::vector<std::uint32_t>> results;
    for (int threads : {1, 2}) {
      CpuBackend be(threads);
      ASSERT_EQ(be.threads(), threads);
      DeviceTensor id(be, DType::int32, Shape{rows}, ids);
      DeviceTensor dy(be, dy_t, Shape{rows, width}, dy_values);
      DeviceTensor table(be, DType::fp32, Shape{vocab, width}, start);
      sdk::facet<sdk::EmbeddingFacet>(be)->scatter_add(id, dy, table, 0.0f);
      const auto overwritten = table.get();
      EXPECT_EQ(bits(overwritten), bits(reference_scatter_add(ids, dy_stored, start, width, 0.0f)))
          << sdk::dtype_name(dy_t) << " beta 0, " << threads << " threads";
      sdk::facet<sdk::EmbeddingFacet>(be)->scatter_add(id, dy, table, 1.0f);
      const auto added = table.get();
      EXPECT_EQ(bits(added), bits(reference_scatter_add(ids, dy_stored, overwritten, width, 1.0f)))
          << sdk::dtype_name(dy_t) << " beta 1, " << threads << " threads";
      results.push_back(bits(added));
    }
    EXPECT_EQ(results[0], results[1]) << sdk::dtype_name(dy_t) << ": 1 vs 2 threads";
  }
}

TEST(backend_cpu_embedding, ScatterAddOverwritesRowsNoIdNamesOnlyWithBetaZero) {
  CpuBackend be(1);
  const std::int64_t vocab = 6, width = 3;
  const std::vector<float> ids = {4, 1, 4, 4};
  const auto dy_values = random_values(12, 4);
  const auto start = random_values(static_cast<std::size_t>(vocab * width), 5);
  DeviceTensor id(be, DType::int32, Shape{2, 2}, ids);  // [N, T] ids, [N, T, C] dy
  DeviceTensor dy(be, DType::fp32, Shape{2, 2, width}, dy_values);
  for (float beta : {0.0f, 1.0f}) {
    DeviceTensor table(be, DType::fp32, Shape{vocab, width}, start);
    sdk::facet<sdk::EmbeddingFacet>(be)->scatter_add(id, dy, table, beta);
    const auto got = table.get();
    for (std::int64_t v : {0, 2, 3, 5})
      for (std::int64_t j = 0; j < width; ++j) {
        const auto i = static_cast<std::size_t>(v * width + j);
        EXPECT_EQ(got[i], beta == 0.0f ? 0.0f : start[i]) << "row " << v;
      }
    EXPECT_EQ(bits(got), bits(reference_scatter_add(ids, dy_values, start, width, beta)));
  }
}

TEST(backend_cpu_embedding, GatherRoundsOnceInEveryDtypePair) {
  CpuBackend be(2);
  const std::int64_t vocab = 11, width = 7, rows = 9;
  const std::vector<float> ids = {3, 0, 10, 3, 7, 7, 1, 2, 10};
  const auto table_values = random_values(static_cast<std::size_t>(vocab * width), 6, -4, 4);
  const auto old_values = random_values(static_cast<std::size_t>(rows * width), 7, -4, 4);
  for (DType tt : kFloats)
    for (DType ot : kFloats)
      for (bool accumulate : {false, true}) {
        DeviceTensor id(be, DType::int32, Shape{rows}, ids);
        DeviceTensor table(be, tt, Shape{vocab, width}, table_values);
        DeviceTensor out(be, ot, Shape{rows, width}, old_values);
        sdk::facet<sdk::EmbeddingFacet>(be)->gather(id, table, out, accumulate);
        const auto got = out.get();
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t j = 0; j < width; ++j) {
            const auto i = static_cast<std::size_t>(r * width + j);
            const float t = stored_value(
                table_values[static_cast<std::size_t>(ids[static_cast<std::size_t>(r)]) *
                                 static_cast<std::size_t>(width) +
                             static_cast<std::size_t>(j)],
                tt);
            // The fp32 sum (or the value) rounded once into out's dtype.
            const float want =
                stored_value(accumulate ? stored_value(old_values[i], ot) + t : t, ot);
            ASSERT_EQ(got[i], want) << sdk::dtype_name(tt) << " -> " << sdk::dtype_name(ot)
                                    << (accumulate ? " accumulate" : "") << " row " << r;
          }
      }
}

void expect_backend_error(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no BackendError (expected one mentioning '" << needle << "')";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(backend_cpu_embedding, OutOfRangeIdsNameTheIdAndTheRowAndWriteNothing) {
  CpuBackend be(1);
  const std::int64_t vocab = 5, width = 4;
  DeviceTensor table(be, DType::fp32, Shape{vocab, width}, random_values(20, 8));
  DeviceTensor dy(be, DType::fp32, Shape{4, width}, random_values(16, 9));
  const auto out_before = random_values(16, 10);
  DeviceTensor out(be, DType::fp32, Shape{4, width}, out_before);
  const auto table_before = table.get();
  for (const auto& [bad, needle] :
       {std::pair{std::vector<float>{0, 3, 7, 2}, std::string("id 7 at row 2 is outside [0, 5)")},
        std::pair{std::vector<float>{-1, 0, 0, 0},
                  std::string("id -1 at row 0 is outside [0, 5)")}}) {
    DeviceTensor id(be, DType::int32, Shape{4}, bad);
    expect_backend_error(
        [&] { sdk::facet<sdk::EmbeddingFacet>(be)->gather(id, table, out, false); },
        "backend_cpu.gather: " + needle);
    expect_backend_error(
        [&] { sdk::facet<sdk::EmbeddingFacet>(be)->scatter_add(id, dy, table, 0.0f); },
        "backend_cpu.scatter_add: " + needle);
    EXPECT_EQ(out.get(), out_before);
    EXPECT_EQ(table.get(), table_before);
  }
}

TEST(backend_cpu_embedding, ShapeAndDtypeMismatchesAreErrors) {
  CpuBackend be(1);
  DeviceTensor id(be, DType::int32, Shape{4}, {0, 1, 2, 3});
  DeviceTensor id_f(be, DType::fp32, Shape{4}, {0, 1, 2, 3});
  DeviceTensor table(be, DType::fp32, Shape{5, 4});
  DeviceTensor table_bf16(be, DType::bf16, Shape{5, 4});
  DeviceTensor flat_table(be, DType::fp32, Shape{20});
  DeviceTensor dy(be, DType::fp32, Shape{4, 4});
  DeviceTensor dy_wide(be, DType::fp32, Shape{4, 5});
  DeviceTensor out_short(be, DType::fp32, Shape{3, 4});
  DeviceTensor out_int(be, DType::int32, Shape{4, 4});
  expect_backend_error([&] { sdk::facet<sdk::EmbeddingFacet>(be)->gather(id_f, table, dy, false); },
                       "ids is fp32");
  expect_backend_error(
      [&] { sdk::facet<sdk::EmbeddingFacet>(be)->gather(id, flat_table, dy, false); }, "[V, C]");
  expect_backend_error(
      [&] { sdk::facet<sdk::EmbeddingFacet>(be)->gather(id, table, out_short, false); },
      "out is fp32 [3, 4]");
  expect_backend_error(
      [&] { sdk::facet<sdk::EmbeddingFacet>(be)->gather(id, table, out_int, false); },
      "out is int32");
  TensorView into_table = table.view();  // the table's first four rows as out
  into_table.shape = Shape{4, 4};
  expect_backend_error(
      [&] { sdk::facet<sdk::EmbeddingFacet>(be)->gather(id, table, into_table, false); },
      "overlaps");
  expect_backend_error(
      [&] { sdk::facet<sdk::EmbeddingFacet>(be)->scatter_add(id, dy, table_bf16, 0.0f); },
      "must be fp32");
  expect_backend_error(
      [&] { sdk::facet<sdk::EmbeddingFacet>(be)->scatter_add(id, dy_wide, table, 0.0f); },
      "dy is fp32 [4, 5]");
  expect_backend_error(
      [&] { sdk::facet<sdk::EmbeddingFacet>(be)->scatter_add(id, dy, table, 0.5f); },
      "neither 0 nor 1");
}

TEST(backend_cpu_embedding, SupportsAnswersTheHeaderDtypes) {
  CpuBackend be(1);
  sdk::EmbeddingFacet& f = *sdk::facet<sdk::EmbeddingFacet>(be);
  for (DType a : kFloats) {
    for (DType b : kFloats)
      EXPECT_TRUE(f.supports(sdk::EmbeddingOp::gather, std::vector<DType>{a, b}));
    EXPECT_TRUE(f.supports(sdk::EmbeddingOp::scatter_add, std::vector<DType>{a}));
  }
  EXPECT_FALSE(
      f.supports(sdk::EmbeddingOp::gather, std::vector<DType>{DType::fp8_e4m3, DType::fp32}));
  EXPECT_FALSE(f.supports(sdk::EmbeddingOp::scatter_add, std::vector<DType>{DType::int32}));
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
