// The Tensor Core alignment lint (precision/tensor_core_lint.h): under a 16-bit plan it names a
// GEMM dimension that is not a multiple of 8, and says what the backend does about it when the
// backend declares it pads such rows itself (sdk/support/backend_features.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/precision/tensor_core_lint.h"
#include "mixtrain/sdk/support/backend_features.h"
#include "tiny_gpt.h"

namespace mixtrain::core {
namespace {

// The CPU backend, declaring that its 16-bit GEMMs realign unaligned rows (as the CUDA backend does
// with backend.cuda.gemm_realign = true).
class RealigningBackend final : public test_support::ForwardingBackend {
 public:
  sdk::BackendCapabilities capabilities() const override {
    auto caps = in_->capabilities();
    caps.features.emplace_back(sdk::kFeatureGemmRealignsRows);
    return caps;
  }
};

std::vector<std::string> lint(const std::shared_ptr<sdk::DeviceBackend>& backend,
                              sdk::DType gemm_input) {
  // n_embd 8: every GEMM dimension a multiple of 8 but the vocabulary's, 11.
  Model m(backend, test_support::tiny_gpt_spec(1, 2, 8, 11), 4, 11,
          InputSpec{sdk::DType::int32, 4, {}, {}});
  sdk::OpPrecision p;
  p.gemm_input = gemm_input;
  for (auto& l : m.layers()) l->set_precision(p);
  return tensor_core_warnings(m);
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& w : v) s += w + "\n";
  return s;
}

TEST(TensorCoreLint, NamesTheOddVocabularyAndWhatTheBackendDoesAboutIt) {
  const auto plain = lint(test_support::cpu(), sdk::DType::bf16);
  ASSERT_EQ(plain.size(), 1u) << joined(plain);
  EXPECT_NE(plain[0].find("GEMM dimension 11 is not a multiple of 8"), std::string::npos)
      << plain[0];
  EXPECT_EQ(plain[0].find("padded scratch"), std::string::npos) << plain[0];

  const auto realigned = lint(std::make_shared<RealigningBackend>(), sdk::DType::bf16);
  ASSERT_EQ(realigned.size(), 1u) << joined(realigned);
  EXPECT_NE(realigned[0].find("GEMM dimension 11 is not a multiple of 8"), std::string::npos)
      << realigned[0];
  EXPECT_NE(realigned[0].find("copies operands whose rows this leaves unaligned into padded "
                              "scratch"),
            std::string::npos)
      << realigned[0];
  // FP8 GEMMs are not realigned (an unaligned one is decoded to bf16): their dimensions stay a
  // cost, whatever the backend declares.
  const auto fp8 = lint(std::make_shared<RealigningBackend>(), sdk::DType::fp8_e4m3);
  ASSERT_FALSE(fp8.empty());
  for (const auto& w : fp8) EXPECT_EQ(w.find("padded scratch"), std::string::npos) << w;
  // FP32 GEMMs take no 16-bit Tensor Core path: nothing to say, realigning or not.
  EXPECT_TRUE(lint(std::make_shared<RealigningBackend>(), sdk::DType::fp32).empty());
}

// The CPU backend, declaring that its GEMMs want rows 16 bytes apart (as the CUDA backend does).
class AlignedRowsBackend final : public test_support::ForwardingBackend {
 public:
  sdk::BackendCapabilities capabilities() const override {
    auto caps = in_->capabilities();
    caps.features.emplace_back(sdk::kFeatureGemmWantsAlignedRows);
    return caps;
  }
};

// The chunked loss padding the vocabulary's 11 classes to 64 (model.loss_pad_classes unset on
// such a backend) leaves the LM head's GEMMs nothing to warn about; with the padding off the
// warning is back.
TEST(TensorCoreLint, SaysNothingOfAVocabularyTheChunkedLossPads) {
  const auto warnings = [](std::optional<std::int64_t> pad) {
    ModelSpec spec = test_support::tiny_gpt_spec(1, 2, 8, 11);
    spec.loss_chunk_rows = 2;
    spec.loss_pad_classes = pad;
    Model m(std::make_shared<AlignedRowsBackend>(), spec, 4, 11,
            InputSpec{sdk::DType::int32, 4, {}, {}});
    sdk::OpPrecision p;
    p.gemm_input = sdk::DType::bf16;
    for (auto& l : m.layers()) l->set_precision(p);
    m.allocate(2);
    return tensor_core_warnings(m);
  };
  const auto padded = warnings({});
  EXPECT_TRUE(padded.empty()) << joined(padded);
  const auto unpadded = warnings(0);
  ASSERT_EQ(unpadded.size(), 1u) << joined(unpadded);
  EXPECT_NE(unpadded[0].find("GEMM dimension 11 is not a multiple of 8"), std::string::npos)
      << unpadded[0];
}

}  // namespace
}  // namespace mixtrain::core
