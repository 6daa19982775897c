// Fuzzes the CIFAR-10 binary batch reader (core::load_cifar10) and what is done with what it
// accepts: a held-out split, per-channel statistics and normalisation, and the augmentation of a
// batch. Input: one batch file (3073-byte records). Byte 0 of the input, when present, also picks
// the crop padding (b % 6) and the flip (b & 8) of the augmentation. sdk::UserError (DataError)
// is an expected rejection; an accepted dataset that breaks its contract is a finding (abort).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_support.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto file =
      mixtrain::fuzz::scratch_file("data_batch_1.bin", mixtrain::fuzz::as_view(data, size));
  try {
    const std::vector<std::filesystem::path> files = {file};
    auto all = mixtrain::core::load_cifar10(files);
    if (all.rows * 3073 != static_cast<std::int64_t>(size) || !all.is_image()) std::abort();
    for (float v : all.x)
      if (!(v >= 0.0f && v <= 1.0f)) std::abort();
    const double eval_fraction = all.rows > 1 ? 0.5 : 0.0;
    auto [train, eval] = mixtrain::core::split_holdout(std::move(all), eval_fraction, 1);
    const auto stats = mixtrain::core::channel_statistics(train);
    for (double s : stats.std)
      if (!(s >= 0.0) || !std::isfinite(s)) std::abort();
    mixtrain::core::AugmentSpec spec;
    spec.crop_padding = size > 0 ? data[0] % 6 : 0;
    spec.horizontal_flip = size > 0 && (data[0] & 8) != 0;
    const std::vector<float> fill = {0.0f, 0.0f, 0.0f};
    std::vector<float> batch(train.x);
    mixtrain::core::augment_batch(spec, train.sample_shape, fill, batch.data(), train.rows, 3, 1);
    for (float v : batch)
      if (!(v >= 0.0f && v <= 1.0f)) std::abort();
  } catch (const mixtrain::sdk::UserError&) {
  }
  return 0;
}
