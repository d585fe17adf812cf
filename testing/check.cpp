#include "testing/check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "src/api/validate.h"
#include "src/reference/reference.h"
#include "testing/host_numerics.h"
#include "testing/parallel_for.h"

namespace swa_decode::testing {
namespace {

constexpr int kMaxReportedFailures = 8;

void note_failure(CheckReport& report, int64_t& reported, const std::string& line) {
  if (reported++ < kMaxReportedFailures) report.failures += line + "\n";
}

// Per (token, head): whether its q row is NaN (options.nan_q_heads), so that its result is not judged.
std::vector<bool> unjudged_heads(const HostBatch& b) {
  std::vector<bool> unjudged(static_cast<size_t>(b.num_tokens * b.num_heads), false);
  for (const auto& [t, h] : b.options.nan_q_heads) unjudged[t * b.num_heads + h] = true;
  return unjudged;
}

// NaN scan and gap scan over every token: cheap, and catches a kernel that skips or overruns.
void scan_poison(const HostBatch& b, const Outputs& o, const std::vector<bool>& unjudged, CheckReport& r) {
  const int64_t row_extent = b.num_heads * b.out_head_stride;
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    for (int64_t e = 0; e < b.out_token_stride; ++e) {
      const uint16_t bits = o.out[t * b.out_token_stride + e];
      const bool inside = e < row_extent && e % b.out_head_stride < b.head_dim;
      if (!inside) {
        r.out_gap_writes += bits != kBf16PoisonBits;
      } else if (unjudged[t * b.num_heads + e / b.out_head_stride]) {
        continue;
      } else if (std::isnan(reference::bf16_to_float(bits))) {
        r.out_nan += 1;
        r.out_unwritten += bits == kBf16PoisonBits;
      }
    }
  }
  if (!b.options.with_lse) return;
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    for (int64_t e = 0; e < b.lse_token_stride; ++e) {
      const bool is_nan = std::isnan(o.lse[t * b.lse_token_stride + e]);
      if (e >= b.num_heads) {
        r.lse_gap_writes += !is_nan;
      } else if (!unjudged[t * b.num_heads + e]) {
        r.lse_nan += is_nan;
      }
    }
  }
}

int64_t token_macs(const HostBatch& b, int64_t t) { return 2 * b.valid_entries[t] * b.num_heads * b.head_dim; }

// Token t's lengths for a failure line: "lens 5" or "lens 5, extra lens 300".
std::string lens_text(const HostBatch& b, int64_t t) {
  std::string text = "lens " + std::to_string(b.lens[t]);
  if (b.extra) text += ", extra lens " + std::to_string(b.extra->lens[t]);
  return text;
}

}  // namespace

std::string CheckReport::summary() const {
  std::ostringstream s;
  s << (ok ? "PASS" : "FAIL") << ": compared " << tokens_compared << "/" << tokens_total
    << " tokens; out max_abs_err " << max_abs_err << ", rel_l2 " << rel_l2 << ", worst err/tol "
    << max_err_over_tol << ", violations " << out_violations << ", NaN " << out_nan << " (unwritten "
    << out_unwritten << "), gap writes " << out_gap_writes << "; lse max rel err " << lse_max_err
    << ", violations " << lse_violations << ", NaN " << lse_nan << ", gap writes " << lse_gap_writes;
  return s.str();
}

std::vector<int64_t> sample_tokens(int64_t num_tokens, int64_t count, uint64_t seed) {
  std::vector<int64_t> all(num_tokens);
  std::iota(all.begin(), all.end(), int64_t{0});
  if (count >= num_tokens) return all;
  Rng rng(seed);
  for (int64_t i = 0; i < count; ++i) std::swap(all[i], all[rng.uniform_int(i, num_tokens - 1)]);
  all.resize(count);
  std::sort(all.begin(), all.end());
  return all;
}

int64_t reference_macs(const HostBatch& batch, const std::vector<int64_t>& tokens) {
  int64_t macs = 0;
  for (int64_t t : tokens) macs += token_macs(batch, t);
  return macs;
}

std::vector<int64_t> budgeted_tokens(const HostBatch& batch, int64_t max_macs, int64_t max_tokens, uint64_t seed) {
  std::vector<int64_t> tokens, others;
  for (int64_t t = 0; t < batch.num_tokens; ++t) (batch.valid_entries[t] == 0 ? tokens : others).push_back(t);
  Rng rng(seed);
  for (int64_t i = static_cast<int64_t>(others.size()) - 1; i > 0; --i) {
    std::swap(others[i], others[rng.uniform_int(0, i)]);
  }
  int64_t macs = 0, taken = 0;
  for (int64_t t : others) {
    if (taken >= max_tokens) break;
    const int64_t cost = token_macs(batch, t);
    if (taken > 0 && cost > max_macs - macs) continue;  // a cheaper one may fit
    tokens.push_back(t);
    macs += cost;
    ++taken;
  }
  std::sort(tokens.begin(), tokens.end());
  return tokens;
}

ReferenceOutputs compute_reference(const HostBatch& b, std::vector<int64_t> tokens, int threads) {
  if (tokens.empty()) {
    tokens.resize(b.num_tokens);
    std::iota(tokens.begin(), tokens.end(), int64_t{0});
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  ReferenceOutputs ref;
  ref.tokens = tokens;
  ref.result.num_tokens = n;
  ref.result.num_heads = b.num_heads;
  ref.result.head_dim = b.head_dim;
  ref.result.out.assign(n * b.num_heads * b.head_dim, 0.0);
  ref.result.lse.assign(n * b.num_heads, 0.0);
  // Pieces of a few tokens, four per thread, so that tokens of unequal cost even out.
  const int64_t grain = threads <= 1 ? std::max<int64_t>(n, 1) : std::max<int64_t>(1, n / (4 * threads));
  parallel_for(n, grain, threads, [&](int64_t begin, int64_t end) {
    const HostBatch compact = select_tokens(b, std::vector<int64_t>(tokens.begin() + begin, tokens.begin() + end));
    HostTensors tensors = materialize_host(compact);
    const DecodeArgs args = host_args(compact, tensors);
    const Status valid = validate_args(args);
    if (!valid.ok()) throw std::invalid_argument("check_outputs: reference arguments invalid: " + valid.message);
    const reference::Result part = reference::compute(args);
    std::copy(part.out.begin(), part.out.end(), ref.result.out.begin() + begin * b.num_heads * b.head_dim);
    std::copy(part.lse.begin(), part.lse.end(), ref.result.lse.begin() + begin * b.num_heads);
  });
  return ref;
}

CheckReport check_outputs(const HostBatch& b, const Outputs& o, std::vector<int64_t> tokens, const Tolerance& tol,
                          int threads) {
  return check_against(b, o, compute_reference(b, std::move(tokens), threads), tol);
}

CheckReport check_against(const HostBatch& b, const Outputs& o, const ReferenceOutputs& reference,
                          const Tolerance& tol) {
  if (static_cast<int64_t>(o.out.size()) != b.num_tokens * b.out_token_stride ||
      (b.options.with_lse && static_cast<int64_t>(o.lse.size()) != b.num_tokens * b.lse_token_stride)) {
    throw std::invalid_argument("check_outputs: output buffers do not match the batch's shapes");
  }
  const std::vector<int64_t>& tokens = reference.tokens;
  const reference::Result& ref = reference.result;
  const std::vector<bool> unjudged = unjudged_heads(b);
  CheckReport r;
  r.tokens_total = b.num_tokens;
  r.tokens_compared = static_cast<int64_t>(tokens.size());
  scan_poison(b, o, unjudged, r);

  int64_t reported = 0;
  double sum_sq_err = 0.0, sum_sq_ref = 0.0;
  for (int64_t i = 0; i < r.tokens_compared; ++i) {
    const int64_t t = tokens[i];
    const double kmax = b.token_kmax[t];
    for (int64_t h = 0; h < b.num_heads; ++h) {
      if (unjudged[t * b.num_heads + h]) continue;
      for (int64_t d = 0; d < b.head_dim; ++d) {
        const double got = reference::bf16_to_float(o.out[t * b.out_token_stride + h * b.out_head_stride + d]);
        const double want = ref.out_at(i, h, d);
        const double err = std::isnan(got) ? std::numeric_limits<double>::infinity() : std::fabs(got - want);
        const double bound = tol.out_rel * std::fabs(want) + tol.out_kmax * kmax;
        sum_sq_err += err * err;
        sum_sq_ref += want * want;
        r.max_abs_err = std::max(r.max_abs_err, err);
        if (bound > 0.0) r.max_err_over_tol = std::max(r.max_err_over_tol, err / bound);
        if (!(err <= bound)) {
          r.out_violations += 1;
          if (bound == 0.0) r.max_err_over_tol = std::numeric_limits<double>::infinity();
          std::ostringstream line;
          line << "out[t=" << t << ", h=" << h << ", d=" << d << "] = " << got << ", reference " << want
               << ", tolerance " << bound << " (" << lens_text(b, t) << ", valid entries "
               << b.valid_entries[t] << ")";
          note_failure(r, reported, line.str());
        }
      }
      if (!b.options.with_lse) continue;
      const double got = o.lse[t * b.lse_token_stride + h];
      const double want = ref.lse_at(i, h);
      bool pass;
      if (std::isinf(want)) {
        pass = got == want;
      } else {
        const double rel = std::fabs(got - want) / std::max(1.0, std::fabs(want));
        r.lse_max_err = std::max(r.lse_max_err, std::isnan(rel) ? std::numeric_limits<double>::infinity() : rel);
        pass = rel <= tol.lse_rel;
      }
      if (!pass) {
        r.lse_violations += 1;
        std::ostringstream line;
        line << "lse[t=" << t << ", h=" << h << "] = " << got << ", reference " << want << " ("
             << lens_text(b, t) << ", valid entries " << b.valid_entries[t] << ")";
        note_failure(r, reported, line.str());
      }
    }
  }
  r.rel_l2 = sum_sq_ref > 0.0 ? std::sqrt(sum_sq_err / sum_sq_ref) : std::sqrt(sum_sq_err);
  if (r.out_nan > 0) note_failure(r, reported, std::to_string(r.out_nan) + " NaN out elements");
  if (r.out_gap_writes > 0) note_failure(r, reported, std::to_string(r.out_gap_writes) + " out stride-gap elements written");
  if (r.lse_nan > 0) note_failure(r, reported, std::to_string(r.lse_nan) + " NaN lse elements");
  if (r.lse_gap_writes > 0) note_failure(r, reported, std::to_string(r.lse_gap_writes) + " lse stride-gap elements written");
  if (!(r.rel_l2 <= tol.out_rel_l2)) note_failure(r, reported, "out rel_l2 " + std::to_string(r.rel_l2) + " > " + std::to_string(tol.out_rel_l2));
  r.ok = r.out_nan == 0 && r.out_gap_writes == 0 && r.out_violations == 0 && r.lse_nan == 0 &&
         r.lse_gap_writes == 0 && r.lse_violations == 0 && r.rel_l2 <= tol.out_rel_l2;
  return r;
}

}  // namespace swa_decode::testing
