// Host-side number formats and random numbers for building test and bench inputs. Written from the
// format definitions (bf16 = upper half of an IEEE fp32; e4m3 = 1 sign, 4 exponent bits with bias 7,
// 3 mantissa bits, subnormals, 0x7F/0xFF NaN, no infinities), independent of the kernels.
#pragma once

#include <cstdint>

namespace swa_decode::testing {

inline constexpr uint16_t kBf16PoisonBits = 0xFFFF;  // a bf16 NaN: pre-fills outputs that must be written
inline constexpr uint8_t kE4m3NaN = 0x7F;            // e4m3 NaN: fills cache rows that must not be read
inline constexpr double kE4m3Max = 448.0;
inline constexpr uint8_t kUe8m0NaN = 0xFF;           // UE8M0 NaN (OCP): fills unread kModel1 scale rows

// The one float -> bf16 conversion of the test and bench inputs (testing/batch.h and
// testing/host_problem.h alike). src/reference/ keeps its own (reference::float_to_bf16) by
// design: the reference shares only docs/semantics.md with the rest, so a mistake here cannot hide
// the same mistake there.
uint16_t float_to_bf16_bits(float value);  // round to nearest even; NaN stays NaN
float round_to_bf16(float value);

double e4m3_to_double(uint8_t code);
// Nearest finite e4m3 code (ties to even mantissa), saturating to +-448: never returns 0x7F/0xFF.
uint8_t double_to_e4m3(double value);

// SplitMix64: tiny, fast, and good enough to scatter blocks and draw test data; seeded explicitly
// so every failure reproduces from the seed printed with it.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }  // [0, 1)
  // Uniform integer in [lo, hi] (inclusive); hi - lo is small here, so modulo bias is irrelevant.
  int64_t uniform_int(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next_u64() % static_cast<uint64_t>(hi - lo + 1));
  }
  double normal();  // N(0, 1), Box-Muller

 private:
  uint64_t state_;
};

// Fast N(0,1)-ish draws for hundreds of millions of values: a 16-bit uniform picks one of 65536
// quantiles of the normal distribution (inverse CDF at (u + 0.5) / 65536, |z| <= 4.3). One 64-bit
// draw gives four values.
const float* normal_quantile_table();            // [65536] floats
const uint16_t* normal_bf16_table();             // [65536] bf16 bits of the same quantiles
// [65536] e4m3 codes of 128 * z (clipped to +-448): a cache row whose values spread like a normal
// with amax near 448, the shape an amax / 448 per-token quantizer produces.
const uint8_t* normal_e4m3_table();

}  // namespace swa_decode::testing
