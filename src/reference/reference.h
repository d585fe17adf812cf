// The CPU reference: docs/semantics.md computed literally, in float64, with plain loops (no online
// softmax, no tiling). It shares nothing with the GPU kernels but that document, so a bug in the
// shared window rule or in a kernel's numerics cannot hide in both. It is also the library's
// Backend::kCpu execution path.
//
// Every function that takes a DecodeArgs reads it as a description of HOST pointers (args.backend
// and args.stream are ignored) and assumes it passed swa_decode::validate_args (src/api/validate.h);
// decode() checks that first, direct callers (tests, the bench) should too.
#pragma once

#include <cstdint>
#include <vector>

#include "swa_decode/swa_decode.h"

namespace swa_decode::reference {

// Value of one OCP e4m3 ("fn") code: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits;
// exponent 0 is subnormal (m/8 * 2^-6); 0x7F and 0xFF are NaN; no infinities; max 0x7E = 448.
double decode_e4m3(uint8_t code);

// Value of one OCP UE8M0 code (kModel1's scales): 2^(code - 127), 2^-127 for 0 up to 2^127 for
// 254; 0xFF is NaN.
double decode_ue8m0(uint8_t code);

// bf16 bits -> value (exact: bf16 is the upper half of a binary32).
float bf16_to_float(uint16_t bits);

// Value -> bf16 bits, rounded to nearest even once, directly from the double (no double rounding
// through float). Overflow gives +-inf, NaN gives a quiet NaN (0x7FC0 with the sign kept).
uint16_t double_to_bf16(double value);
inline uint16_t float_to_bf16(float value) { return double_to_bf16(static_cast<double>(value)); }

// The exact result before any output rounding.
struct Result {
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  std::vector<double> out;  // [T, H, D] contiguous: out[(t * H + h) * D + d]
  std::vector<double> lse;  // [T, H] contiguous, natural log without the sink; -inf for empty tokens
  double out_at(int64_t t, int64_t h, int64_t d) const { return out[(t * num_heads + h) * head_dim + d]; }
  double lse_at(int64_t t, int64_t h) const { return lse[t * num_heads + h]; }
};

// Computes out and lse in float64, one softmax over the window's valid entries and, when
// args.extra.kv_cache is set, the extra source's ("The extra source"). Reads args.out / args.lse
// not at all and writes nothing there.
Result compute(const DecodeArgs& args);

// Computes in float64 and writes args.out (bf16, rounded once) and args.lse (fp32) if non-null.
// Returns ok: the arguments are assumed valid (see above).
Status run(const DecodeArgs& args);

}  // namespace swa_decode::reference
