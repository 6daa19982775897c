// The nccl communicator. The rules (nccl_rules.h: dtype and op mapping, size checks, device
// choice, description) and the option schema run everywhere, bit for bit against nccl.h's enums;
// so does "no device → BackendError" (it initialises MPI as a singleton). The collectives run on
// one GPU with world size 1 (NCCL refuses two ranks on one GPU) and skip without a device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend_error_text.h"
#include "cuda_backend.h"
#include "forwarding_backend.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "nccl_communicator.h"
#include "nccl_options.h"
#include "nccl_rules.h"
#include "plugin_test_support.h"

namespace mixtrain::communicator_nccl {
namespace {

using mixtrain::test::backend_error_of;

using sdk::DType;
using sdk::TensorView;

std::string no_device_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
  }
  if (count == 0) return "cudaGetDeviceCount reports 0 devices";
  return {};
}

TensorView view(void* data, DType dtype, std::int64_t n) {
  return {data, dtype, {n}};
}

// --- host-only: the rules --------------------------------------------------------------------

TEST(nccl_rules, ReducedDtypesMapToNcclTypesBitForBit) {
  EXPECT_EQ(reduce_type(DType::fp32, "all_reduce"), ncclFloat32);
  EXPECT_EQ(reduce_type(DType::tf32, "all_reduce"), ncclFloat32);  // stored as fp32
  EXPECT_EQ(reduce_type(DType::bf16, "all_reduce"), ncclBfloat16);
  EXPECT_EQ(reduce_type(DType::fp16, "all_reduce"), ncclFloat16);
  EXPECT_EQ(static_cast<int>(reduce_type(DType::fp32, "x")), 7);
  EXPECT_EQ(static_cast<int>(reduce_type(DType::fp16, "x")), 6);
  EXPECT_EQ(static_cast<int>(reduce_type(DType::bf16, "x")), 9);
}

TEST(nccl_rules, ReductionsOfOtherDtypesNameTheDtypeAndWhatIsSupported) {
  for (DType t : {DType::fp8_e4m3, DType::fp8_e5m2, DType::int32}) {
    const std::string what = backend_error_of([&] { reduce_type(t, "reduce_scatter"); });
    EXPECT_NE(what.find("nccl.reduce_scatter"), std::string::npos) << what;
    EXPECT_NE(what.find(std::string(sdk::dtype_name(t))), std::string::npos) << what;
    EXPECT_NE(what.find("fp32, tf32, bf16 and fp16"), std::string::npos) << what;
  }
}

TEST(nccl_rules, MovedDtypesKeepTheirElementSize) {
  const auto nccl_size = [](ncclDataType_t t) -> std::size_t {
    switch (t) {
      case ncclInt8:
      case ncclUint8:
        return 1;
      case ncclFloat16:
      case ncclBfloat16:
        return 2;
      case ncclInt32:
      case ncclUint32:
      case ncclFloat32:
        return 4;
      default:
        return 8;
    }
  };
  for (DType t : sdk::kAllDTypes)
    EXPECT_EQ(nccl_size(move_type(t)), sdk::dtype_size(t)) << sdk::dtype_name(t);
  EXPECT_EQ(move_type(DType::fp32), ncclFloat32);
  EXPECT_EQ(move_type(DType::bf16), ncclBfloat16);
  EXPECT_EQ(move_type(DType::fp16), ncclFloat16);
  EXPECT_EQ(move_type(DType::fp8_e4m3), ncclUint8);
  EXPECT_EQ(move_type(DType::fp8_e5m2), ncclUint8);
  EXPECT_EQ(move_type(DType::int32), ncclInt32);
}

TEST(nccl_rules, OpsMapToNcclOpsBitForBit) {
  EXPECT_EQ(nccl_op(sdk::ReduceOp::sum), ncclSum);
  EXPECT_EQ(nccl_op(sdk::ReduceOp::avg), ncclAvg);
  EXPECT_EQ(nccl_op(sdk::ReduceOp::max), ncclMax);
  EXPECT_EQ(static_cast<int>(nccl_op(sdk::ReduceOp::sum)), 0);
  EXPECT_EQ(static_cast<int>(nccl_op(sdk::ReduceOp::max)), 2);
  EXPECT_EQ(static_cast<int>(nccl_op(sdk::ReduceOp::avg)), 4);
}

TEST(nccl_rules, SizeChecksFollowTheContract) {
  float a[24] = {}, b[24] = {};
  EXPECT_EQ(check_all_reduce(view(a, DType::fp32, 24)), 24u);
  EXPECT_EQ(check_reduce_scatter(view(a, DType::bf16, 24), view(b, DType::bf16, 6), 4), 6u);
  EXPECT_EQ(check_all_gather(view(a, DType::fp8_e4m3, 6), view(b, DType::fp8_e4m3, 24), 4), 6u);
  EXPECT_EQ(check_broadcast(view(a, DType::int32, 24), 3, 4), 24u);
  // Empty tensors are allowed without data (NCCL does nothing for a count of 0).
  EXPECT_EQ(check_all_reduce(view(nullptr, DType::fp32, 0)), 0u);

  std::string what = backend_error_of(
      [&] { check_reduce_scatter(view(a, DType::fp32, 23), view(b, DType::fp32, 6), 4); });
  EXPECT_NE(what.find("nccl.reduce_scatter"), std::string::npos) << what;
  EXPECT_NE(what.find("send (fp32, 23 elements)"), std::string::npos) << what;
  EXPECT_NE(what.find("recv (fp32, 6 elements)"), std::string::npos) << what;
  EXPECT_NE(what.find("24 elements"), std::string::npos) << what;
  what = backend_error_of(
      [&] { check_reduce_scatter(view(a, DType::fp32, 24), view(b, DType::bf16, 6), 4); });
  EXPECT_NE(what.find("send (fp32, 24 elements)"), std::string::npos) << what;
  EXPECT_NE(what.find("recv (bf16, 6 elements)"), std::string::npos) << what;

  what = backend_error_of(
      [&] { check_all_gather(view(a, DType::fp16, 6), view(b, DType::fp16, 20), 4); });
  EXPECT_NE(what.find("nccl.all_gather"), std::string::npos) << what;
  EXPECT_NE(what.find("recv (fp16, 20 elements)"), std::string::npos) << what;
  EXPECT_NE(what.find("send (fp16, 6 elements)"), std::string::npos) << what;
  what = backend_error_of(
      [&] { check_all_gather(view(a, DType::fp16, 6), view(b, DType::fp32, 24), 4); });
  EXPECT_NE(what.find("nccl.all_gather"), std::string::npos) << what;

  what = backend_error_of([&] { check_broadcast(view(a, DType::fp32, 4), 4, 4); });
  EXPECT_NE(what.find("nccl.broadcast: root 4"), std::string::npos) << what;
  EXPECT_NE(what.find("ranks 0..3"), std::string::npos) << what;
  what = backend_error_of([&] { check_broadcast(view(a, DType::fp32, 4), -1, 4); });
  EXPECT_NE(what.find("root -1"), std::string::npos) << what;

  what = backend_error_of([&] { check_all_reduce(view(nullptr, DType::fp32, 8)); });
  EXPECT_NE(what.find("nccl.all_reduce: data (fp32, 8 elements) has no data pointer"),
            std::string::npos)
      << what;
}

TEST(nccl_rules, LocalRankComesFromOpenMpisVariable) {
  EXPECT_EQ(parse_local_rank("0"), 0);
  EXPECT_EQ(parse_local_rank("3"), 3);
  EXPECT_EQ(parse_local_rank("12"), 12);
  EXPECT_EQ(parse_local_rank(nullptr), std::nullopt);
  EXPECT_EQ(parse_local_rank(""), std::nullopt);
  EXPECT_EQ(parse_local_rank("-1"), std::nullopt);
  EXPECT_EQ(parse_local_rank("1x"), std::nullopt);
  EXPECT_EQ(parse_local_rank("x"), std::nullopt);
}

TEST(nccl_rules, DeviceIsLocalRankModuloDeviceCount) {
  EXPECT_EQ(choose_device(0, 1), 0);
  EXPECT_EQ(choose_device(3, 8), 3);
  EXPECT_EQ(choose_device(3, 2), 1);
  EXPECT_EQ(choose_device(8, 8), 0);
  std::string what = backend_error_of([] { choose_device(0, 0); });
  EXPECT_NE(what.find("the nccl communicator needs a CUDA device; none is visible "
                      "(cudaGetDeviceCount reports 0 devices)"),
            std::string::npos)
      << what;
  what = backend_error_of([] { choose_device(1, 0, "cudaErrorNoDevice: no CUDA-capable device"); });
  EXPECT_NE(what.find("none is visible (cudaErrorNoDevice: no CUDA-capable device)"),
            std::string::npos)
      << what;
}

TEST(nccl_rules, DescriptionNamesVersionRanksAndDevice) {
  EXPECT_EQ(nccl_version_text(22809), "2.28.9");
  EXPECT_EQ(nccl_version_text(21803), "2.18.3");
  EXPECT_EQ(nccl_version_text(2708), "2.7.8");  // before 2.9: major·1000 + minor·100 + patch
  EXPECT_EQ(describe(22809, 2, 1, "NVIDIA H100 80GB HBM3"),
            "NCCL 2.28.9, 2 ranks, device 1 (NVIDIA H100 80GB HBM3)");
  EXPECT_EQ(describe(22809, 1, 0, "NVIDIA H200"), "NCCL 2.28.9, 1 rank, device 0 (NVIDIA H200)");
}

TEST(nccl_rules, OptionSchemaIsTimeoutAboveZeroDefault300) {
  const auto schema = nccl_option_schema();
  ASSERT_EQ(schema.size(), 1u);
  EXPECT_EQ(schema[0].name, "timeout_s");
  EXPECT_EQ(schema[0].type, sdk::OptionType::number);
  EXPECT_EQ(std::get<double>(schema[0].default_value), 300.0);
  ASSERT_TRUE(schema[0].min.has_value());
  EXPECT_EQ(*schema[0].min, 0.0);
  EXPECT_TRUE(schema[0].min_exclusive);
  EXPECT_THROW(sdk::Options::resolve("distributed", schema, {{"timeout_s", 0.0, {}}}, {}),
               sdk::ConfigError);
  EXPECT_EQ(sdk::Options::resolve("distributed", schema, {}, {}).get_double("timeout_s"), 300.0);
}

TEST(nccl_rules, ReadmeTableMatchesTheSchema) {
  const std::string readme =
      std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/plugins/communicator_nccl/README.md";
  std::vector<std::string> expected;
  for (const auto& spec : nccl_option_schema()) expected.push_back(test::readme_row(spec));
  EXPECT_EQ(test::readme_rows(readme, "nccl"), expected) << "update the table in " << readme;
}

// --- the communicator without a device -------------------------------------------------------

TEST(nccl_communicator, WithoutADeviceConstructionIsBackendError) {
  if (no_device_reason().empty()) GTEST_SKIP() << "a CUDA device is visible: nothing to refuse";
  const std::string what = backend_error_of([] { NcclCommunicator comm(5.0, sdk::Logger{}); });
  EXPECT_NE(what.find("the nccl communicator needs a CUDA device; none is visible ("),
            std::string::npos)
      << what;
}

// --- one rank on a GPU -----------------------------------------------------------------------

// One communicator per process (MPI initialises once), shared by the GPU tests, with the real
// CUDA backend it is bound to.
class nccl_one_rank : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!no_device_reason().empty()) return;
    try {
      backend_ = std::make_shared<backend_cuda::CudaBackend>(0);
      comm_ = std::make_unique<NcclCommunicator>(60.0, sdk::Logger{});
      comm_->bind(*backend_);
    } catch (const std::exception& e) {
      setup_error_ = e.what();
      comm_.reset();
    }
  }
  static void TearDownTestSuite() {
    comm_.reset();  // before the backend whose stream it waits on
    backend_.reset();
  }
  void SetUp() override {
    if (const std::string reason = no_device_reason(); !reason.empty())
      GTEST_SKIP() << "no CUDA device: " << reason;
    ASSERT_TRUE(setup_error_.empty()) << "setting up one rank failed: " << setup_error_;
    ASSERT_NE(comm_, nullptr);
    if (comm_->world_size() != 1) GTEST_SKIP() << "runs as a single rank (no mpirun)";
  }

  // A device tensor of `values` in `dtype` (fp32, bf16 or fp16).
  TensorView upload(const std::vector<float>& values, DType dtype) {
    const auto n = static_cast<std::int64_t>(values.size());
    TensorView t{backend_->allocate(values.size() * sdk::dtype_size(dtype)), dtype, {n}};
    owned_.push_back(t.data);
    std::vector<std::uint8_t> bytes(values.size() * sdk::dtype_size(dtype));
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::fp32) {
        std::memcpy(bytes.data() + 4 * i, &values[i], 4);
      } else {
        const std::uint16_t b =
            dtype == DType::bf16 ? sdk::encode_bf16(values[i]) : sdk::encode_fp16(values[i]);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
      }
    }
    backend_->copy_from_host(t, bytes.data());
    return t;
  }
  std::vector<float> download(TensorView t) {
    std::vector<std::uint8_t> bytes(t.bytes());
    backend_->copy_to_host(bytes.data(), t);
    std::vector<float> out(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (t.dtype == DType::fp32) {
        std::memcpy(&out[i], bytes.data() + 4 * i, 4);
      } else {
        std::uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        out[i] = t.dtype == DType::bf16 ? sdk::decode_bf16(b) : sdk::decode_fp16(b);
      }
    }
    return out;
  }
  void TearDown() override {
    for (void* p : owned_) backend_->deallocate(p);
  }

  static std::shared_ptr<backend_cuda::CudaBackend> backend_;
  static std::unique_ptr<NcclCommunicator> comm_;
  static std::string setup_error_;
  std::vector<void*> owned_;
};
std::shared_ptr<backend_cuda::CudaBackend> nccl_one_rank::backend_;
std::unique_ptr<NcclCommunicator> nccl_one_rank::comm_;
std::string nccl_one_rank::setup_error_;

const std::vector<float> kValues = {1.0f, -2.5f, 3.25f, 0.0f, 1024.0f, -0.125f, 7.0f, 65504.0f};

TEST_F(nccl_one_rank, DescribesItself) {
  EXPECT_EQ(comm_->rank(), 0);
  const std::string d = comm_->description();
  EXPECT_EQ(d.rfind("NCCL 2.", 0), 0u) << d;
  EXPECT_NE(d.find(", 1 rank, device 0 ("), std::string::npos) << d;
}

TEST_F(nccl_one_rank, AllReduceSumAvgMaxKeepOneRanksValues) {
  for (DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
    for (sdk::ReduceOp op : {sdk::ReduceOp::sum, sdk::ReduceOp::avg, sdk::ReduceOp::max}) {
      TensorView t = upload(kValues, dtype);
      auto handle = comm_->start_all_reduce(t, op);
      handle->wait();
      const auto expected = download(upload(kValues, dtype));  // the values as stored in dtype
      EXPECT_EQ(download(t), expected) << sdk::dtype_name(dtype) << " " << sdk::reduce_op_name(op);
      EXPECT_TRUE(handle->test());  // copy_to_host synchronised the backend, which waited on it
    }
  }
}

TEST_F(nccl_one_rank, ReduceScatterAllGatherAndBroadcast) {
  TensorView send = upload(kValues, DType::fp32);
  TensorView recv = upload(std::vector<float>(kValues.size(), -1.0f), DType::fp32);
  comm_->reduce_scatter(send, recv, sdk::ReduceOp::sum);
  EXPECT_EQ(download(recv), kValues);

  TensorView gathered = upload(std::vector<float>(kValues.size(), -1.0f), DType::bf16);
  comm_->all_gather(upload(kValues, DType::bf16), gathered);
  EXPECT_EQ(download(gathered), download(upload(kValues, DType::bf16)));

  TensorView data = upload(kValues, DType::fp32);
  comm_->broadcast(data, 0);
  EXPECT_EQ(download(data), kValues);
}

TEST_F(nccl_one_rank, CollectivesAreOrderedWithTheBackendsStream) {
  // No synchronisation between the backend's fill and the gather: the communication stream must
  // wait for the fill (the ready event), and the backend's next fill must wait for the gather.
  constexpr std::int64_t n = 1 << 20;
  TensorView src{backend_->allocate(n * 4), DType::fp32, {n}};
  TensorView dst{backend_->allocate(n * 4), DType::fp32, {n}};
  owned_.push_back(src.data);
  owned_.push_back(dst.data);
  backend_->fill(dst, 0.0f);
  backend_->fill(src, 3.0f);
  auto handle = comm_->start_all_gather(src, dst);
  handle->wait();
  backend_->fill(src, 5.0f);  // after the gather read src
  const auto out = download(dst);
  std::size_t wrong = 0;
  for (float v : out) wrong += v != 3.0f;
  EXPECT_EQ(wrong, 0u);
  comm_->progress();
}

TEST_F(nccl_one_rank, ContractViolationsAreBackendErrors) {
  TensorView send = upload(kValues, DType::fp32);
  TensorView recv = upload({0.0f, 0.0f}, DType::fp32);
  const std::string what =
      backend_error_of([&] { comm_->reduce_scatter(send, recv, sdk::ReduceOp::sum); });
  EXPECT_NE(what.find("nccl.reduce_scatter"), std::string::npos) << what;
  TensorView bytes{backend_->allocate(8), DType::fp8_e4m3, {8}};
  owned_.push_back(bytes.data);
  EXPECT_THROW(comm_->all_reduce(bytes, sdk::ReduceOp::sum), sdk::BackendError);
  EXPECT_THROW(comm_->broadcast(send, 1), sdk::BackendError);
  // A backend without the native_stream facet (the CUDA backend with it hidden).
  struct Hidden : test::ForwardingBackend {
    using ForwardingBackend::ForwardingBackend;
    sdk::Facet* find_facet(std::string_view name) override {
      return name == sdk::NativeStreamFacet::kName ? nullptr : in_->find_facet(name);
    }
  } hidden(backend_);
  const std::string refused = backend_error_of([&] { comm_->bind(hidden); });
  EXPECT_NE(refused.find("needs the CUDA backend; backend 'cuda'"), std::string::npos) << refused;
  // Still usable after the refusals.
  comm_->all_reduce(send, sdk::ReduceOp::sum);
  EXPECT_EQ(download(send), kValues);
}

TEST_F(nccl_one_rank, HostCollectives) {
  comm_->barrier();
  std::vector<double> values = {1.5, -2.0, 1e300};
  comm_->all_reduce_host(values, sdk::ReduceOp::sum);
  EXPECT_EQ(values, (std::vector<double>{1.5, -2.0, 1e300}));
  comm_->all_reduce_host(values, sdk::ReduceOp::avg);
  EXPECT_EQ(values, (std::vector<double>{1.5, -2.0, 1e300}));
  comm_->all_reduce_host(values, sdk::ReduceOp::max);
  EXPECT_EQ(values, (std::vector<double>{1.5, -2.0, 1e300}));
  std::vector<std::byte> bytes = {std::byte{1}, std::byte{2}, std::byte{3}};
  comm_->broadcast_host(bytes, 0);
  EXPECT_EQ(bytes.size(), 3u);
  EXPECT_EQ(bytes[2], std::byte{3});
  EXPECT_THROW(comm_->broadcast_host(bytes, 1), sdk::BackendError);
}

}  // namespace
}  // namespace mixtrain::communicator_nccl
