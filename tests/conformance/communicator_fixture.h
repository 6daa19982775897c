// What the communicator suite's files share (not installed): each registered communicator made
// once per process and bound to its backend, the fixture that hands it to a test, and buffers of
// that backend's memory filled and read as bytes.
//
// Contract
// - made_communicator() makes the entry's communicator on first use (a backend from the kit's
//   training config with the entry's overrides, then make() and bind()), remembers a factory's
//   failure as text, and keeps both until the program's last test ends; short-timeout ones the
//   same, on first use. They are released in the reverse order of their making.
// - CommunicatorConformance::SetUp() fails the test when the communicator could not be made or sees
// a
//   world of one rank. Tests call collectives only through EXPECT_* paths that every rank takes.
// - link_communicator_training(): add_communicator() calls it, so that a program linking the kit
//   as a static library keeps the training tests' file (communicator_training_conformance.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "conformance_fixture.h"
#include "mixtrain/conformance/communicator_conformance.h"
#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::conformance::internal {

void link_communicator_training();

struct MadeCommunicator {
  std::shared_ptr<sdk::DeviceBackend> backend;
  std::shared_ptr<sdk::Communicator> comm;
  std::string error;  // why it could not be made; "" when it was
};
MadeCommunicator& made_communicator(const CommunicatorUnderTest& c);
// The entry's short_timeout communicator, bound to the same backend (comm null and error "" when
// the entry gives none).
MadeCommunicator& made_short_timeout_communicator(const CommunicatorUnderTest& c);

// `elements` of `dtype` in the backend's memory (a DeviceTensor, conformance_fixture.h), filled
// and read from the host.
class CommBuffer {
 public:
  CommBuffer(sdk::DeviceBackend& b, sdk::DType dtype, std::int64_t elements)
      : b_(&b), tensor_(b, dtype, sdk::Shape{elements}) {}
  const sdk::TensorView& view() const { return tensor_.view(); }
  void write(const std::vector<std::byte>& bytes);
  void write_floats(const std::vector<float>& values);  // an fp32 buffer
  std::vector<std::byte> read() const;
  std::vector<float> read_floats() const;  // an fp32 buffer

 private:
  sdk::DeviceBackend* b_;
  DeviceTensor tensor_;
};

// `count` bytes that depend only on `seed`.
std::vector<std::byte> seeded_bytes(std::size_t count, std::uint32_t seed);

class CommunicatorConformance : public ::testing::TestWithParam<CommunicatorUnderTest> {
 protected:
  void SetUp() override;
  sdk::Communicator& comm() { return *made_->comm; }
  sdk::DeviceBackend& backend() { return *made_->backend; }
  int rank() const { return rank_; }
  int world() const { return world_; }

 private:
  MadeCommunicator* made_ = nullptr;
  int rank_ = 0, world_ = 1;
};

}  // namespace mixtrain::conformance::internal
