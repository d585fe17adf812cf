// Checks a decode's outputs (GPU or CPU backend) against the float64 reference
// (src/reference/reference.h) and for poison: every output element must have been written, no
// byte outside the [T, H, D] / [T, H] views may have been, and nothing may be NaN.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/reference/reference.h"
#include "testing/batch.h"
#include "testing/device_batch.h"

namespace swa_decode::testing {

// Error bounds for the kernel against the float64 reference, per element.
//
// Derivation (bf16 keeps 8 significant bits: one rounding costs at most 2^-9 relative):
//  - out is stored as bf16:                                   <= 2^-9 |ref|
//  - the softmax weights w_j (with inv_scale_j folded in) are rounded to bf16 for the P.V matmul:
//    |sum_j dw_j k_jd| <= 2^-9 sum_j w_j |k_jd| <= 2^-9 kmax_t   (sum_j w_j <= 1)
//  - the scores: q and the e4m3 codes are exact in bf16 and accumulate in fp32 over D = 512 terms
//    (~1e-5 absolute here). A kernel that instead rounds a pre-scaled q or a dequantized k to bf16
//    moves each s_j by ~2^-9 |s_j| with random sign; with |s_j| of a few units (these batches:
//    k std 1..5) that perturbs w_j by ~1% relative, i.e. ~2^-7 kmax_t.
// Bound: |out - ref| <= 2^-8 |ref| + 2^-6 kmax_t (kmax_t = largest |k| over token t's valid
// entries): 2x the bf16 output rounding plus 2x the larger weight term. The aggregate bar is
// issue 2's rel-L2 <= 1e-2 (the seed's fallback measures 3.2e-3, a bf16 bmm 5.5e-3). A token with
// no valid entry has kmax_t = 0, so its out must be exactly 0, and its lse exactly -inf.
struct Tolerance {
  double out_rel = 0x1.0p-8;        // times |ref|
  double out_kmax = 0x1.0p-6;       // times kmax_t
  double out_rel_l2 = 1e-2;
  double lse_rel = 1e-3;            // |lse - ref| <= lse_rel * max(1, |ref|)
};

struct CheckReport {
  int64_t tokens_total = 0;
  int64_t tokens_compared = 0;
  double max_abs_err = 0.0;       // out, over compared tokens
  double rel_l2 = 0.0;            // out, ||gpu - ref|| / ||ref|| over compared tokens
  double max_err_over_tol = 0.0;  // out, worst |err| / per-element tolerance (<= 1 passes)
  double lse_max_err = 0.0;       // max |lse - ref| / max(1, |ref|) over finite refs
  int64_t out_nan = 0;            // NaN out elements over ALL tokens (0xFFFF = never written)
  int64_t out_unwritten = 0;      // of those, still the 0xFFFF poison pattern
  int64_t out_gap_writes = 0;     // elements between strided rows that changed
  int64_t out_violations = 0;     // elements past their tolerance
  int64_t lse_nan = 0;            // over ALL tokens
  int64_t lse_gap_writes = 0;
  int64_t lse_violations = 0;     // incl. -inf expected but finite seen, or the other way round
  bool ok = false;
  std::string failures;           // the first few failing elements, one per line

  std::string summary() const;    // one line with every number above
};

// The float64 reference for some tokens of a batch, computed once and compared with as many
// outputs as there are kernels to check.
struct ReferenceOutputs {
  std::vector<int64_t> tokens;  // the batch's tokens, in the order of `result`
  reference::Result result;     // [tokens.size(), H, D] and [tokens.size(), H]
};

// Runs the reference for `tokens` (all of them when empty) on compact copies (select_tokens), so it
// also works for batches whose pools would not fit on the host; `threads` > 1 splits the tokens
// over that many threads (a C128A token at a 1M context and H = 128 is ~1 GMAC, ~1-2 s on one core).
ReferenceOutputs compute_reference(const HostBatch& batch, std::vector<int64_t> tokens = {}, int threads = 1);

// Compares `outputs` with `reference` on its tokens and scans all tokens for NaN, unwritten
// elements and writes into the stride gaps. The (token, head) pairs of options.nan_q_heads (a q
// row of NaN: their result is unspecified) are neither compared nor scanned for NaN; every other
// head of those tokens is.
CheckReport check_against(const HostBatch& batch, const Outputs& outputs, const ReferenceOutputs& reference,
                          const Tolerance& tolerance = {});

// compute_reference, then check_against.
CheckReport check_outputs(const HostBatch& batch, const Outputs& outputs, std::vector<int64_t> tokens = {},
                          const Tolerance& tolerance = {}, int threads = 1);

// Up to `count` distinct token ids of [0, num_tokens), sorted, drawn with `seed`.
std::vector<int64_t> sample_tokens(int64_t num_tokens, int64_t count, uint64_t seed);

// Multiply-adds the float64 reference spends on `tokens`: q.k and p.v over their valid entries
// (2 * |J_t| * H * D a token). It runs ~0.5-1 GMAC/s per core (plain double loops).
int64_t reference_macs(const HostBatch& batch, const std::vector<int64_t>& tokens);

// The tokens a check compares when the reference may spend `max_macs` multiply-adds: every empty
// token (they cost nothing and carry the out = 0, lse = -inf rule), then, in an order drawn with
// `seed`, up to `max_tokens` others whose cost still fits (the first of them whatever it costs);
// sorted.
std::vector<int64_t> budgeted_tokens(const HostBatch& batch, int64_t max_macs, int64_t max_tokens, uint64_t seed);

}  // namespace swa_decode::testing
