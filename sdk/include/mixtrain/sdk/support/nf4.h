// NF4, QLoRA's 4-bit NormalFloat weight format (Dettmers et al. 2023, "QLoRA: Efficient Finetuning
// of Quantized LLMs", section 3), and its host reference quantize / dequantize: exact to the rules
// below, written for clarity, not speed. Backend kernels (sdk/backend_quantized_weight.h) decode
// bit for bit as nf4_dequantize does.
//
// Layout. A tensor of n elements is read flat, row-major. Blocks are `block` consecutive elements
// from element 0 (QLoRA and bitsandbytes use 64); a trailing partial block holds the elements
// that are there, and is quantized as that block zero-padded would be (its absmax is the absmax
// of what is there), so no size is refused and nothing is read past the end. Per block one fp32
// absmax; per element one 4-bit code, two per byte with element 2i in the HIGH nibble and 2i + 1
// in the low one (bitsandbytes' order); an odd n leaves the last low nibble 0.
//
// Quantize, per block, in fp32 arithmetic (each step one IEEE operation, round to nearest even),
// as bitsandbytes' kQuantizeBlockwise computes it:
//   absmax = max |x| over the block;  r = 1 / absmax;  v = x · r  (so |v| <= 1)
//   code   = the index k of the code book value kNf4Codebook[k] nearest to v; a v exactly halfway
//            between two values takes the lower index (bitsandbytes' decision tree compares
//            v > midpoint). The midpoints here are exact (computed in double from the fp32 code
//            values); bitsandbytes' CUDA tree compares with them rounded to fp32, which can only
//            differ for a v equal to such a rounded midpoint.
//   A block of zeros has absmax 0 and stores code 7 (the value 0) for every element
//   (bitsandbytes' kernel computes 0 · ∞ = NaN there and stores code 0, which decodes to −0).
// Dequantize: element = kNf4Codebook[code] · absmax, one fp32 product (rounded to nearest even),
// then rounded once into the output's dtype.
// Errors: std::invalid_argument for a non-finite input (naming its index: an infinity or NaN has
// no NF4 code), a block < 1, or buffers whose sizes do not fit n and block.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mixtrain::sdk {

// QLoRA's and bitsandbytes' block size.
inline constexpr std::int64_t kNf4BlockSize = 64;

// The NF4 code book: the quantiles of N(0, 1) normalised to [-1, 1], with an exact 0 (QLoRA,
// eq. 4), as the fp32 constants bitsandbytes lists (functional.py, get_4bit_type("nf4")).
inline constexpr float kNf4Codebook[16] = {-1.0f,
                                           -0.6961928009986877f,
                                           -0.5250730514526367f,
                                           -0.39491748809814453f,
                                           -0.28444138169288635f,
                                           -0.18477343022823334f,
                                           -0.09105003625154495f,
                                           0.0f,
                                           0.07958029955625534f,
                                           0.16093020141124725f,
                                           0.24611230194568634f,
                                           0.33791524171829224f,
                                           0.44070982933044434f,
                                           0.5626170039176941f,
                                           0.7229568362236023f,
                                           1.0f};

// The code nearest to v (a normalised value), ties to the lower index; v must not be NaN.
std::uint8_t nf4_code(float v);

// Bytes of packed codes and count of blocks for n elements.
constexpr std::int64_t nf4_code_bytes(std::int64_t n) {
  return (n + 1) / 2;
}
constexpr std::int64_t nf4_block_count(std::int64_t n, std::int64_t block) {
  return (n + block - 1) / block;
}

struct Nf4Tensor {
  std::int64_t numel = 0, block = kNf4BlockSize;
  std::vector<std::uint8_t> codes;  // nf4_code_bytes(numel), packed as above
  std::vector<float> absmax;        // nf4_block_count(numel, block)
};

Nf4Tensor nf4_quantize(std::span<const float> x, std::int64_t block = kNf4BlockSize);
// The code of element i of packed storage.
inline std::uint8_t nf4_code_at(std::span<const std::uint8_t> codes, std::int64_t i) {
  const std::uint8_t byte = codes[static_cast<std::size_t>(i / 2)];
  return i % 2 == 0 ? static_cast<std::uint8_t>(byte >> 4) : static_cast<std::uint8_t>(byte & 15);
}
// Element i's value in fp32: kNf4Codebook[code] · absmax of its block.
inline float nf4_value(std::span<const std::uint8_t> codes, std::span<const float> absmax,
                       std::int64_t block, std::int64_t i) {
  return kNf4Codebook[nf4_code_at(codes, i)] * absmax[static_cast<std::size_t>(i / block)];
}
// numel fp32 values; checks that codes and absmax fit numel and block first.
std::vector<float> nf4_dequantize(const Nf4Tensor& t);
// Throws std::invalid_argument unless codes and absmax hold what numel and block need.
void nf4_check_sizes(std::int64_t numel, std::int64_t block, std::size_t code_bytes,
                     std::size_t absmax_count);

}  // namespace mixtrain::sdk
