// data.pin_memory through a training run: a backend wrapper offers a host_memory facet whose
// buffers remember a digest of what each upload read from them, and checks at the host's
// wait_until_read (and at the next upload, and at destruction) that nothing changed the bytes in
// between. On a GPU an upload reads such a buffer after the call returns, so a host that wrote it
// before waiting would send another batch's bytes; here that shows as a changed digest. The run
// with the facet must upload from its buffers, never write one before its wait, and give the
// metrics of the run without it, with the loader thread and without, float and byte images.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "forwarding_backend.h"
#include "metrics_records.h"
#include "mixtrain/core/train/trainer.h"
#include "mixtrain/sdk/backend_host_memory.h"
#include "mixtrain/sdk/backend_image_input.h"
#include "mixtrain/sdk/error.h"
#include "quickstart_components.h"

namespace mixtrain {
namespace {

struct Ledger {
  std::atomic<int> allocations{0}, in_place{0}, waits{0}, written_before_read{0};
};

// A host_memory buffer that keeps the digest of the bytes its last upload read.
class CheckedBuffer final : public sdk::HostBuffer {
 public:
  CheckedBuffer(std::size_t bytes, Ledger& ledger)
      : memory_(new (std::align_val_t{64}) std::byte[bytes]), bytes_(bytes), ledger_(ledger) {}
  ~CheckedBuffer() override {
    check();
    ::operator delete[](memory_, std::align_val_t{64});
  }
  std::byte* data() noexcept override { return memory_; }
  std::size_t size() const noexcept override { return bytes_; }
  void wait_until_read() override {
    check();
    ++ledger_.waits;
  }

  bool holds(const void* src, std::size_t bytes) const {
    const auto* p = static_cast<const std::byte*>(src);
    return p >= memory_ && p + bytes <= memory_ + bytes_;
  }
  void note_upload(const void* src, std::size_t bytes) {
    check();  // an upload after an unwaited write would also have read changed bytes
    read_ = {static_cast<const char*>(src), bytes};
    digest_ = std::hash<std::string_view>{}(read_);
    pending_ = true;
    ++ledger_.in_place;
  }

 private:
  void check() {
    if (pending_ && std::hash<std::string_view>{}(read_) != digest_) ++ledger_.written_before_read;
    pending_ = false;
  }

  std::byte* memory_;
  std::size_t bytes_;
  Ledger& ledger_;
  std::string_view read_;
  std::size_t digest_ = 0;
  bool pending_ = false;
};

class CheckedHostMemory final : public sdk::HostMemoryFacet {
 public:
  explicit CheckedHostMemory(Ledger& ledger) : ledger_(ledger) {}
  std::unique_ptr<sdk::HostBuffer> allocate_host(std::size_t bytes) override {
    ++ledger_.allocations;
    if (refuse) throw sdk::BackendError("cudaHostAlloc of " + std::to_string(bytes) + " failed");
    auto buffer = std::make_unique<CheckedBuffer>(bytes, ledger_);
    std::lock_guard lock(mutex_);
    live_.push_back(buffer.get());
    return buffer;
  }
  // The buffer holding [src, src + bytes), or nullptr. Buffers are never freed before the run ends
  // here (the trainer sizes them once), so the list only grows.
  CheckedBuffer* find(const void* src, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    for (CheckedBuffer* b : live_)
      if (b->holds(src, bytes)) return b;
    return nullptr;
  }
  bool refuse = false;

 private:
  Ledger& ledger_;
  std::mutex mutex_;
  std::vector<CheckedBuffer*> live_;
};

class CheckedImageInput final : public sdk::ImageInputFacet {
 public:
  CheckedImageInput(sdk::ImageInputFacet* inner, CheckedHostMemory& memory)
      : inner_(inner), memory_(memory) {}
  bool supports(sdk::ImageInputOp op, std::span<const sdk::DType> d) const override {
    return inner_->supports(op, d);
  }
  void decode_images(const sdk::ByteImages& images, sdk::TensorView table,
                     sdk::TensorView y) override {
    const auto bytes = static_cast<std::size_t>(images.rows * images.channels * images.plane);
    if (CheckedBuffer* b = memory_.find(images.pixels, bytes)) b->note_upload(images.pixels, bytes);
    inner_->decode_images(images, table, y);
  }

 private:
  sdk::ImageInputFacet* inner_;
  CheckedHostMemory& memory_;
};

class PinnedBackend final : public test::ForwardingBackend {
 public:
  explicit PinnedBackend(std::shared_ptr<sdk::DeviceBackend> inner)
      : ForwardingBackend(std::move(inner)),
        memory(ledger),
        images_(sdk::facet<sdk::ImageInputFacet>(*in_), memory) {}
  void copy_from_host(sdk::TensorView d, const void* src) override {
    if (CheckedBuffer* b = memory.find(src, d.bytes())) b->note_upload(src, d.bytes());
    in_->copy_from_host(d, src);
  }
  sdk::Facet* find_facet(std::string_view name) override {
    if (name == sdk::HostMemoryFacet::kName) return &memory;
    if (name == sdk::ImageInputFacet::kName) return &images_;
    return in_->find_facet(name);
  }
  Ledger ledger;
  CheckedHostMemory memory;

 private:
  CheckedImageInput images_;
};

struct Trained {
  std::vector<nlohmann::json> records;
  std::shared_ptr<PinnedBackend> backend;
};

Trained train(std::vector<std::string> sets, bool refuse = false) {
  std::vector<std::string> all = {"run.steps=8", "run.log_every=1", "run.eval_every=4",
                                  "checkpoint.every=0"};
  all.insert(all.end(), sets.begin(), sets.end());
  auto [e, c] = test::quickstart_components(all);
  Trained run;
  run.backend = std::make_shared<PinnedBackend>(c.backend);
  run.backend->memory.refuse = refuse;
  c.backend = run.backend;
  core::TrainOptions opt;
  opt.run_dir = std::filesystem::temp_directory_path() /
                ("mixtrain-pinned-batches-" + std::to_string(::getpid()));
  std::filesystem::remove_all(opt.run_dir);
  core::Trainer(e, std::move(c), opt).run();
  run.records = test::unmeasured_records(opt.run_dir / "metrics.jsonl");
  std::filesystem::remove_all(opt.run_dir);
  return run;
}

const std::vector<std::string> kByteImages = {
    "data.synthetic.kind=images", "data.synthetic.channels=3",  "data.synthetic.height=8",
    "data.synthetic.width=8",     "data.synthetic.max_shift=1", "data.pixels=uint8"};

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

TEST(PinnedBatches, BatchesTravelFromTheBuffersWhichAreNeverWrittenBeforeTheirUploadsRead) {
  // Two micro-batches a step (run.accumulate = 2) upload twice from the buffers in one step.
  const std::vector<std::vector<std::string>> modes = {
      {"data.prefetch=true"}, {"data.prefetch=false"}, {"data.prefetch=true", "run.accumulate=2"}};
  for (const auto& data : {std::vector<std::string>{}, kByteImages}) {
    for (const auto& mode : modes) {
      std::string what = data.empty() ? "float features" : "byte images";
      for (const auto& m : mode) what += ", " + m;
      const Trained pinned = train(with(data, mode));
      const Trained plain = train(with(with(data, mode), {"data.pin_memory=false"}));
      const Ledger& l = pinned.backend->ledger;
      // The step's batch and the loader's spare: each array of both, sized once.
      EXPECT_EQ(l.allocations, mode[0] == "data.prefetch=true" ? 4 : 2) << what;
      EXPECT_GE(l.in_place, 2 * 8) << what << ": every step's batch and labels, in place";
      EXPECT_GT(l.waits, 0) << what;
      EXPECT_EQ(l.written_before_read, 0)
          << what << ": a buffer was written before its upload read it";
      EXPECT_EQ(plain.backend->ledger.allocations, 0) << what << ": data.pin_memory = false";
      EXPECT_EQ(plain.backend->ledger.in_place, 0) << what;
      ASSERT_FALSE(pinned.records.empty()) << what;
      EXPECT_EQ(pinned.records, plain.records) << what;
    }
  }
}

TEST(PinnedBatches, ABackendThatRefusesIsAskedOnceAndTheRunIsTheSame) {
  const Trained refused = train(kByteImages, /*refuse=*/true);
  const Trained plain = train(with(kByteImages, {"data.pin_memory=false"}));
  EXPECT_EQ(refused.backend->ledger.allocations, 1);
  EXPECT_EQ(refused.backend->ledger.in_place, 0);
  EXPECT_EQ(refused.records, plain.records);
}

}  // namespace
}  // namespace mixtrain
