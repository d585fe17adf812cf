#include "testing/host_numerics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "src/reference/reference.h"

namespace swa_decode::testing {

uint16_t float_to_bf16_bits(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if (std::isnan(value)) return static_cast<uint16_t>((word >> 16) | 0x0040u);  // keep it a NaN
  const uint32_t lsb = (word >> 16) & 1u;
  word += 0x7FFFu + lsb;  // round to nearest, ties to even
  return static_cast<uint16_t>(word >> 16);
}

float round_to_bf16(float value) { return reference::bf16_to_float(float_to_bf16_bits(value)); }

double e4m3_to_double(uint8_t code) {
  const bool negative = (code & 0x80u) != 0;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return negative ? -magnitude : magnitude;
}

namespace {

constexpr int kQuantiles = 65536;  // one per 16-bit uniform

// Magnitudes of the 127 finite non-negative codes 0x00..0x7E, increasing with the code.
const std::array<double, 127>& e4m3_magnitudes() {
  static const std::array<double, 127> table = [] {
    std::array<double, 127> t{};
    for (int code = 0; code < 127; ++code) t[code] = e4m3_to_double(static_cast<uint8_t>(code));
    return t;
  }();
  return table;
}

// Inverse of the standard normal CDF by bisection on erfc: slow, exact, and run once per table.
double normal_quantile(double p) {
  double lo = -12.0, hi = 12.0;
  for (int iter = 0; iter < 80; ++iter) {
    const double mid = 0.5 * (lo + hi);
    if (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p) lo = mid; else hi = mid;
  }
  return 0.5 * (lo + hi);
}

}  // namespace

uint8_t double_to_e4m3(double value) {
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const double magnitude = std::min(std::fabs(value), kE4m3Max);
  const auto& mags = e4m3_magnitudes();
  const auto upper = std::lower_bound(mags.begin(), mags.end(), magnitude);
  int code = static_cast<int>(upper - mags.begin());
  if (code > 0 && (code == 127 || magnitude - mags[code - 1] < mags[code] - magnitude ||
                   (magnitude - mags[code - 1] == mags[code] - magnitude && ((code - 1) & 1) == 0))) {
    code -= 1;
  }
  return static_cast<uint8_t>(sign | code);
}

double Rng::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

const float* normal_quantile_table() {
  static const std::vector<float> table = [] {
    std::vector<float> z(kQuantiles);
    for (int u = 0; u < kQuantiles; ++u) z[u] = static_cast<float>(normal_quantile((u + 0.5) / kQuantiles));
    return z;
  }();
  return table.data();
}

namespace {

// Every quantile of normal_quantile_table() through `convert`.
template <typename Value, typename Convert>
std::vector<Value> map_quantiles(Convert convert) {
  const float* z = normal_quantile_table();
  std::vector<Value> table(kQuantiles);
  for (int u = 0; u < kQuantiles; ++u) table[u] = convert(z[u]);
  return table;
}

}  // namespace

const uint16_t* normal_bf16_table() {
  static const std::vector<uint16_t> table = map_quantiles<uint16_t>(float_to_bf16_bits);
  return table.data();
}

const uint8_t* normal_e4m3_table() {
  static const std::vector<uint8_t> table = map_quantiles<uint8_t>([](float z) { return double_to_e4m3(128.0 * z); });
  return table.data();
}

}  // namespace swa_decode::testing
