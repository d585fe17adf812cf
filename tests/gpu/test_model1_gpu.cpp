// The engines' cache format (kModel1, docs/semantics.md "Row formats") on the GPU (issue 12),
// through the public decode() on the kernel under test (SWA_DECODE_TEST_KERNEL=auto|portable|sm90,
// tests/gpu/gpu_test.h): a family that cannot run a case skips it with kernel_under_test's marker.
//
// Problems are built entry by entry (testing/host_problem.h): every row, RoPE value and footer
// scale row no valid entry names is NaN (e4m3 0x7F, bf16 0xFFFF, UE8M0 0xFF), the last block of
// every pool is never filled and every column past a token's length or its source's limit names
// one of its slots, and out / lse are NaN before the run (testing/device_args.h).
//
// Model1Gpu compares realistic random rows (HostProblem::fill_slot: |e4m3| <= 7.5 at scale bytes
// 125..128, RoPE ~ N(0, 1)) against the float64 reference: the window alone in kModel1, an extra
// source in kModel1 beside a kE4m3 window and beside a kModel1 one, a kModel1 window beside a kE4m3
// extra source, both sources on one kModel1 cache, block sizes 2, 64 and 256 with FlashMLA's block
// strides and padded ones, H in {1, 8, 16, 48, 64, 128}, T in {1, 7, 64, 100, 300}, lengths -1 / 0 /
// past the limit, holes, ids past the pool, duplicates, NaN in padding heads of q (gaps between token
// rows) and in some heads, and sinks of +-inf. Model1GpuEdges takes the format's edges: scale bytes 0 and
// 254 and RoPE values at bf16's extremes in one entry read with q = 0, whose out must be the row
// itself bit for bit, and values near 2^100 read by a nonzero q.
//
// Model1Harness checks the expectations and the comparison on the CPU backend (no GPU needed).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <functional>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "swa_decode/swa_decode.h"
#include "src/common/window_rule.h"
#include "src/reference/reference.h"
#include "testing/check.h"
#include "testing/cuda_check.h"
#include "testing/device_args.h"
#include "testing/host_numerics.h"
#include "testing/host_problem.h"
#include "testing/parallel_for.h"
#include "tests/gpu/gpu_test.h"

namespace {

using swa_decode::DecodeArgs;
using swa_decode::DType;
using swa_decode::KvFormat;
namespace st = swa_decode::testing;
namespace ref = swa_decode::reference;
using st::Source;

constexpr int64_t kHeadDim = 512;
constexpr int64_t kE4m3Dims = swa_decode::kModel1E4m3Dims;            // 448
constexpr int64_t kRopeDims = kHeadDim - kE4m3Dims;                     // 64
constexpr int64_t kScalesPerRow = kE4m3Dims / 64;                       // 7
constexpr int64_t kGarbageColumns = 40;  // index columns past each limit, naming poisoned slots
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- What a case is ----

// One source of a case.
struct SourceSpec {
  KvFormat format = KvFormat::kModel1;
  int64_t block_size = 64;
  int64_t num_blocks = 40;
  int64_t block_pad = 0;  // bytes past FlashMLA's block stride (a multiple of 576 for kModel1)
  int64_t limit = 128;    // window_size, or extra.max_entries
};

struct CaseSpec {
  const char* name;
  int64_t num_tokens, num_heads;
  SourceSpec window;
  std::optional<SourceSpec> extra;
  bool shared_cache = false;  // the extra source reads the window's cache (its own spec is then unused)
  uint64_t seed = 1;
};

// The shape of a case: ids and lengths alternate int32 / int64 with the seed, q carries three
// padding heads of NaN after each token's heads (HostProblem leaves its padding poisoned), and out
// a gap of a head after each token's rows, which must stay unwritten.
st::ProblemShape shape_of(const CaseSpec& c) {
  st::ProblemShape s{.num_tokens = c.num_tokens, .num_heads = c.num_heads, .head_dim = kHeadDim,
                     .num_blocks = c.window.num_blocks, .block_size = c.window.block_size,
                     .window_size = c.window.limit, .index_cols = c.window.limit + kGarbageColumns,
                     .q_token_pad = 3 * kHeadDim, .out_token_pad = kHeadDim, .kv_block_pad = c.window.block_pad,
                     .inv_scale_dtype = c.seed % 2 == 0 ? DType::kFloat32 : DType::kBFloat16,
                     .index_dtype = c.seed % 2 == 0 ? DType::kInt32 : DType::kInt64,
                     .lens_dtype = c.seed % 3 == 0 ? DType::kInt64 : DType::kInt32,
                     .kv_format = c.window.format};
  if (c.extra) {
    const SourceSpec& x = *c.extra;
    s.extra = st::ExtraShape{.num_blocks = x.num_blocks, .block_size = x.block_size, .max_entries = x.limit,
                             .index_cols = x.limit + kGarbageColumns, .kv_block_pad = x.block_pad,
                             .inv_scale_dtype = c.seed % 2 == 0 ? DType::kBFloat16 : DType::kFloat32,
                             .index_dtype = c.seed % 2 == 0 ? DType::kInt64 : DType::kInt32,
                             .lens_dtype = c.seed % 3 == 0 ? DType::kInt32 : DType::kInt64,
                             .format = x.format, .shares_window_cache = c.shared_cache};
  }
  return s;
}

// ---- Rows ----

// ---- Building a case token by token ----

// Fills a case's ids and lengths and gives every slot a valid entry names a row. Per token and
// source the length is one of: the limit, a random one in [1, limit], -1, 0, or past the limit
// (the window's and the extra source's kinds are offset, so every token mixes them: an empty
// window beside a full extra source, the reverse, both empty). Inside the length ~4% of the
// columns are holes (-1), ~4% ids past the pool or negative, ~4% repeat an earlier column's id;
// the rest name random usable slots. Every other column names a poisoned slot.
class CaseBuilder {
 public:
  explicit CaseBuilder(const CaseSpec& spec) : spec_(spec), problem_(shape_of(spec), spec.seed) {}

  st::HostProblem& problem() { return problem_; }
  const CaseSpec& spec() const { return spec_; }

  // From now on, a kModel1 row a valid entry names gets its bytes from `fill` (once per slot)
  // instead of HostProblem::fill_slot.
  using RowFiller = std::function<void(st::HostProblem&, Source, int64_t slot)>;
  void fill_rows_with(RowFiller fill) { fill_row_ = std::move(fill); }

  // Slots of the pool `source` reads that may be entries: all but its last block.
  int64_t usable_slots(Source source) const {
    const st::ProblemShape& s = problem_.shape();
    const bool own_pool = source == Source::kExtra && !s.extra->shares_window_cache;
    return problem_.num_slots(source) - (own_pool ? s.extra->block_size : s.block_size);
  }

  // Every token of the case, as the class comment says.
  void plan_all_tokens() {
    for (int64_t t = 0; t < spec_.num_tokens; ++t) {
      const int64_t kind = spec_.num_tokens == 1 ? 0 : t;  // T = 1: the one token reads full lengths
      plan(t, Source::kWindow, kind);
      if (spec_.extra) plan(t, Source::kExtra, kind == 0 ? 0 : kind + 4);
    }
  }

  // One token of one source: exactly the columns `ids` (then poisoned ids up to index_cols) and
  // length `len`; ids naming usable slots get rows.
  void set_columns(int64_t t, Source source, int64_t len, const std::vector<int64_t>& ids) {
    problem_.set_len(t, len, source);
    const int64_t cols = index_cols(source);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t id = c < static_cast<int64_t>(ids.size()) ? ids[c] : poisoned_slot(source);
      if (swa_decode::slot_is_valid(id, problem_.num_slots(source)) && id < usable_slots(source)) {
        const bool own_pool = source == Source::kExtra && !spec_.shared_cache;
        const KvFormat format = own_pool ? spec_.extra->format : spec_.window.format;
        if (fill_row_ && format == KvFormat::kModel1 && custom_rows_.insert({own_pool, id}).second) {
          fill_row_(problem_, source, id);
        }
        problem_.set_index(t, c, id, source);  // fills a row HostProblem's way unless already filled
      } else {
        problem_.set_index_raw(t, c, id, source);
      }
    }
  }

 private:
  int64_t limit(Source source) const {
    return source == Source::kWindow ? problem_.shape().window_size : problem_.shape().extra->max_entries;
  }
  int64_t index_cols(Source source) const {
    return source == Source::kWindow ? problem_.shape().index_cols : problem_.shape().extra->index_cols;
  }
  int64_t poisoned_slot(Source source) {
    return usable_slots(source) + problem_.rng().uniform_int(0, 1);
  }

  void plan(int64_t t, Source source, int64_t kind) {
    const int64_t max = limit(source);
    st::Rng& rng = problem_.rng();
    int64_t len;
    switch (kind % 11) {
      case 3: len = -1; break;
      case 5: len = 0; break;
      case 7: len = max + 1 + rng.uniform_int(0, kGarbageColumns); break;  // columns past the limit are poisoned
      case 0: case 1: case 9: len = max; break;
      default: len = rng.uniform_int(1, max); break;
    }
    const int64_t columns = swa_decode::columns_in_window(len, static_cast<int32_t>(max));
    std::vector<int64_t> ids;
    for (int64_t c = 0; c < columns; ++c) {
      const double draw = rng.uniform();
      if (draw < 0.04) {
        ids.push_back(-1);
      } else if (draw < 0.08) {
        const int64_t past_the_pool = problem_.num_slots(source) + rng.uniform_int(0, 5000);
        ids.push_back(draw < 0.06 ? past_the_pool : -2 - rng.uniform_int(0, 100));
      } else if (draw < 0.12 && c > 0) {
        ids.push_back(ids[static_cast<size_t>(rng.uniform_int(0, c - 1))]);
      } else {
        ids.push_back(rng.uniform_int(0, usable_slots(source) - 1));
      }
    }
    set_columns(t, source, len, ids);
  }

  CaseSpec spec_;
  st::HostProblem problem_;
  RowFiller fill_row_;
  std::set<std::pair<bool, int64_t>> custom_rows_;  // (the extra source's own pool, slot)
};

// Largest |k| over token t's valid entries in both sources (0 without any): the scale of the
// tolerance (testing/check.h, Tolerance).
std::vector<double> token_kmax(st::HostProblem& p) {
  const DecodeArgs a = p.args();
  std::vector<double> kmax(static_cast<size_t>(a.num_tokens), 0.0);
  const auto read_int = [](const void* base, DType dtype, int64_t i) {
    return dtype == DType::kInt64 ? static_cast<const int64_t*>(base)[i]
                                  : static_cast<int64_t>(static_cast<const int32_t*>(base)[i]);
  };
  const auto scan = [&](Source source, const swa_decode::KvSource& src) {
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      const int64_t len = read_int(src.lens, src.lens_dtype, t);
      const int32_t columns = swa_decode::columns_in_window(len, static_cast<int32_t>(src.max_entries));
      for (int64_t c = 0; c < columns; ++c) {
        const int64_t slot = read_int(src.indices, src.index_dtype, t * src.stride_indices_token + c);
        if (!swa_decode::slot_is_valid(slot, src.num_blocks * src.block_size)) continue;
        for (const double v : st::host_row_values(a, source, slot)) kmax[t] = std::max(kmax[t], std::fabs(v));
      }
    }
  };
  scan(Source::kWindow, swa_decode::KvSource{.kv_cache = a.kv_cache, .num_blocks = a.num_blocks,
                                             .block_size = a.block_size, .indices = a.indices,
                                             .index_dtype = a.index_dtype, .stride_indices_token = a.stride_indices_token,
                                             .lens = a.lens, .lens_dtype = a.lens_dtype, .max_entries = a.window_size});
  if (a.extra.kv_cache != nullptr) scan(Source::kExtra, a.extra);
  return kmax;
}

// ---- The reference and the comparison ----

int64_t dtype_bytes(DType dtype) { return dtype == DType::kInt64 ? 8 : 4; }

// The float64 result, [T, H, D] and [T, H], computed a few tokens at a time on every host core
// (the reference is single-threaded; a 64-token case at H = 64 is ~1.3 GMAC).
struct Exact {
  std::vector<double> out, lse;
};
Exact exact_result(const DecodeArgs& host) {
  const int64_t T = host.num_tokens, H = host.num_heads, D = host.head_dim;
  Exact exact{std::vector<double>(static_cast<size_t>(T * H * D)), std::vector<double>(static_cast<size_t>(T * H))};
  st::parallel_for(T, 4, st::host_threads(), [&](int64_t begin, int64_t end) {
    DecodeArgs part = host;  // tokens [begin, end): every per-token pointer moves to token `begin`
    part.num_tokens = end - begin;
    part.q = static_cast<const uint16_t*>(host.q) + begin * host.stride_q_token;
    part.indices = static_cast<const uint8_t*>(host.indices) +
                   begin * host.stride_indices_token * dtype_bytes(host.index_dtype);
    part.lens = static_cast<const uint8_t*>(host.lens) + begin * dtype_bytes(host.lens_dtype);
    if (host.extra.kv_cache != nullptr) {
      part.extra.indices = static_cast<const uint8_t*>(host.extra.indices) +
                           begin * host.extra.stride_indices_token * dtype_bytes(host.extra.index_dtype);
      part.extra.lens = static_cast<const uint8_t*>(host.extra.lens) + begin * dtype_bytes(host.extra.lens_dtype);
    }
    const ref::Result r = ref::compute(part);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        exact.lse[t * H + h] = r.lse_at(t - begin, h);
        for (int64_t d = 0; d < D; ++d) exact.out[(t * H + h) * D + d] = r.out_at(t - begin, h, d);
      }
    }
  });
  return exact;
}

using st::Produced;  // what a run produced (tests/gpu/gpu_test.h)

// The outcome of comparing a run with the exact result: the counts and the first few failures.
struct Verdict {
  int64_t compared = 0;          // out elements compared
  int64_t out_violations = 0;    // past testing::Tolerance's per-element bound, or NaN
  int64_t lse_violations = 0;    // off by more than lse_rel, or -inf on one side only
  int64_t gap_writes = 0;        // out elements between token rows that changed
  double err2 = 0.0, ref2 = 0.0; // for the rel-L2
  std::string failures;
  bool ok(const st::Tolerance& tolerance) const {
    const bool rel_l2_ok = ref2 == 0.0 || std::sqrt(err2 / ref2) <= tolerance.out_rel_l2;
    return out_violations == 0 && lse_violations == 0 && gap_writes == 0 && rel_l2_ok;
  }
  void note(const std::string& line) {
    if (std::count(failures.begin(), failures.end(), '\n') < 8) failures += line + "\n";
  }
};

// Every (token, head) but those of `nan_q_heads` (their q holds NaN: unspecified) against the exact
// result: |out - ref| <= out_rel |ref| + out_kmax kmax_t (so an empty token's out must be 0), lse
// within lse_rel max(1, |ref|) and -inf exactly where the reference has it; the gaps of out after
// each token's rows must still hold the NaN poison.
Verdict compare(const DecodeArgs& a, const Produced& got, const Exact& exact, const std::vector<double>& kmax,
                const std::set<std::pair<int64_t, int64_t>>& nan_q_heads, const st::Tolerance& tolerance = {}) {
  Verdict v;
  const int64_t T = a.num_tokens, H = a.num_heads, D = a.head_dim;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = H * a.stride_out_head; i < a.stride_out_token; ++i) {
      if (got.out[static_cast<size_t>(t * a.stride_out_token + i)] != st::kBf16PoisonBits) ++v.gap_writes;
    }
    for (int64_t h = 0; h < H; ++h) {
      if (nan_q_heads.count({t, h}) != 0) continue;
      const double ref_lse = exact.lse[t * H + h];
      const double got_lse = got.lse[static_cast<size_t>(t * a.stride_lse_token + h)];
      const double lse_bound = tolerance.lse_rel * std::max(1.0, std::fabs(ref_lse));
      const bool lse_ok = std::isinf(ref_lse) ? got_lse == ref_lse : std::fabs(got_lse - ref_lse) <= lse_bound;
      if (!lse_ok) {
        ++v.lse_violations;
        v.note("lse[" + std::to_string(t) + "][" + std::to_string(h) + "] = " + std::to_string(got_lse) + ", exact " +
               std::to_string(ref_lse));
      }
      for (int64_t d = 0; d < D; ++d) {
        const double ref = exact.out[(t * H + h) * D + d];
        const double out = ref::bf16_to_float(
            got.out[static_cast<size_t>(t * a.stride_out_token + h * a.stride_out_head + d)]);
        const double bound = tolerance.out_rel * std::fabs(ref) + tolerance.out_kmax * kmax[t];
        ++v.compared;
        v.err2 += (out - ref) * (out - ref);
        v.ref2 += ref * ref;
        if (!(std::fabs(out - ref) <= bound)) {
          ++v.out_violations;
          v.note("out[" + std::to_string(t) + "][" + std::to_string(h) + "][" + std::to_string(d) + "] = " +
                 std::to_string(out) + ", exact " + std::to_string(ref) + ", bound " + std::to_string(bound));
        }
      }
    }
  }
  return v;
}

// Sinks of -inf, +inf (all weight on the sink: out 0) and finite values across the heads.
void set_sinks(st::HostProblem& p, int64_t H) {
  std::vector<float> sinks(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) {
    sinks[h] = h % 7 == 1 ? -kInf : h % 7 == 4 ? kInf : -3.0f + 0.45f * static_cast<float>(h % 13);
  }
  p.set_sink(sinks);
}

// NaN in every dim of q for some (token, head) pairs: a lone head, and the head after it.
std::set<std::pair<int64_t, int64_t>> poison_q_heads(st::HostProblem& p, int64_t T, int64_t H) {
  std::set<std::pair<int64_t, int64_t>> heads;
  for (int64_t t = 2; t < T; t += 9) {
    heads.insert({t, (t * 5) % H});
    if (t % 2 == 0 && H > 1) heads.insert({t, (t * 5 + 1) % H});
  }
  for (const auto& [t, h] : heads) {
    for (int64_t d = 0; d < kHeadDim; ++d) p.set_q(t, h, d, kNaN);
  }
  return heads;
}

class Model1Gpu : public st::GpuTest {
 protected:
  // A whole random case against the reference, with sinks and NaN q heads.
  void expect_case_matches_reference(const CaseSpec& spec) {
    CaseBuilder builder(spec);
    builder.plan_all_tokens();
    set_sinks(builder.problem(), spec.num_heads);
    expect_built_case_matches_reference(builder, poison_q_heads(builder.problem(), spec.num_tokens, spec.num_heads));
  }

  // A built case against the reference; the heads of `nan_q_heads` are not compared.
  void expect_built_case_matches_reference(CaseBuilder& builder,
                                           const std::set<std::pair<int64_t, int64_t>>& nan_q_heads) {
    const CaseSpec& spec = builder.spec();
    SCOPED_TRACE(spec.name);
    st::HostProblem& p = builder.problem();
    const DecodeArgs host = p.args();
    Produced got;
    if (!run_on_device(host, got)) return;
    const st::Tolerance tolerance;
    const Verdict v = compare(host, got, exact_result(host), token_kmax(p), nan_q_heads, tolerance);
    EXPECT_TRUE(v.ok(tolerance)) << v.out_violations << " out and " << v.lse_violations << " lse elements past their "
                                 << "bounds, " << v.gap_writes << " gap writes, rel-L2 "
                                 << (v.ref2 > 0.0 ? std::sqrt(v.err2 / v.ref2) : 0.0) << " of " << v.compared
                                 << " elements\n" << v.failures;
    std::printf("model1 case %s: %lld elements, rel-L2 %.3g\n", spec.name, static_cast<long long>(v.compared),
                v.ref2 > 0.0 ? std::sqrt(v.err2 / v.ref2) : 0.0);
    std::fflush(stdout);
  }
};

SourceSpec seed_source(int64_t block_size, int64_t num_blocks, int64_t limit) {
  return SourceSpec{.format = KvFormat::kE4m3, .block_size = block_size, .num_blocks = num_blocks, .limit = limit};
}

// The window alone in kModel1: blocks of 2, 64 and 256 rows, at each head count of the issue. The
// last two are shapes an H200's free choice runs on the sm90 window kernel (H > 16, T >= 64, W <=
// 128): two slabs of 64 heads, and one slab that both consumers share.
TEST_F(Model1Gpu, WindowOnly) {
  const CaseSpec cases[] = {
      {"B=64, H=8, T=300", 300, 8, {.block_size = 64, .num_blocks = 40}, std::nullopt, false, 11},
      {"B=256, H=128, T=7", 7, 128, {.block_size = 256, .num_blocks = 6}, std::nullopt, false, 12},
      {"B=2 padded, H=1, T=64", 64, 1, {.block_size = 2, .num_blocks = 600, .block_pad = 576}, std::nullopt, false, 13},
      {"B=64 padded, H=16, T=1", 1, 16, {.block_size = 64, .num_blocks = 8, .block_pad = 1152}, std::nullopt, false, 14},
      {"B=256, H=64, T=64, W=1024", 64, 64, {.block_size = 256, .num_blocks = 12, .limit = 1024}, std::nullopt, false, 15},
      {"B=64, H=128, T=100", 100, 128, {.block_size = 64, .num_blocks = 40}, std::nullopt, false, 16},
      {"B=256 padded, H=48, T=64, W=100", 64, 48, {.block_size = 256, .num_blocks = 6, .block_pad = 576, .limit = 100},
       std::nullopt, false, 17},
  };
  for (const CaseSpec& c : cases) expect_case_matches_reference(c);
}

// A kModel1 extra source beside a kE4m3 window (a layer whose compressed cache is the engines').
TEST_F(Model1Gpu, Model1ExtraBesideAnE4m3Window) {
  const CaseSpec cases[] = {
      {"C4A-like, H=64, T=64", 64, 64, seed_source(64, 12, 128), SourceSpec{.block_size = 64, .num_blocks = 40, .limit = 512},
       false, 21},
      {"C128A-like, H=16, T=7", 7, 16, seed_source(256, 4, 128), SourceSpec{.block_size = 2, .num_blocks = 1100, .limit = 2000},
       false, 22},
      {"H=1, T=300", 300, 1, seed_source(64, 12, 128), SourceSpec{.block_size = 256, .num_blocks = 6, .block_pad = 576,
                                                                   .limit = 300},
       false, 23},
  };
  for (const CaseSpec& c : cases) expect_case_matches_reference(c);
}

// Both sources in kModel1, each with its own cache (the engines' layers), across the chunk
// boundary of a long extra source (more than 1024 columns) and at T = 1 (which an H200 splits over
// a cluster).
TEST_F(Model1Gpu, Model1ExtraBesideAModel1Window) {
  const CaseSpec cases[] = {
      {"C4A of V4-Pro, H=128, T=7", 7, 128, {.block_size = 256, .num_blocks = 6},
       SourceSpec{.block_size = 64, .num_blocks = 40, .limit = 1100}, false, 31},
      {"C128A, H=128, T=1", 1, 128, {.block_size = 64, .num_blocks = 8},
       SourceSpec{.block_size = 2, .num_blocks = 1500, .block_pad = 576, .limit = 2600}, false, 32},
      {"C4A of V4-Flash, H=64, T=64", 64, 64, {.block_size = 64, .num_blocks = 12, .block_pad = 576},
       SourceSpec{.block_size = 64, .num_blocks = 40, .limit = 512}, false, 33},
      {"H=8, T=300", 300, 8, {.block_size = 2, .num_blocks = 400}, SourceSpec{.block_size = 256, .num_blocks = 6, .limit = 200},
       false, 34},
  };
  for (const CaseSpec& c : cases) expect_case_matches_reference(c);
}

// A kModel1 window beside a kE4m3 extra source.
TEST_F(Model1Gpu, Model1WindowBesideAnE4m3Extra) {
  const CaseSpec cases[] = {
      {"H=16, T=300", 300, 16, {.block_size = 64, .num_blocks = 12}, seed_source(64, 20, 64), false, 41},
      {"H=128, T=7", 7, 128, {.block_size = 256, .num_blocks = 4}, seed_source(2, 1100, 1500), false, 42},
      {"H=64, T=1", 1, 64, {.block_size = 2, .num_blocks = 200, .block_pad = 576}, seed_source(256, 4, 600), false, 43},
  };
  for (const CaseSpec& c : cases) expect_case_matches_reference(c);
}

// Both sources on one kModel1 cache: every extra id names a window slot, so slots are named by both
// sources of a token and each entry counts once per column that names it.
TEST_F(Model1Gpu, BothSourcesReadOneModel1Cache) {
  const CaseSpec cases[] = {
      {"shared, H=16, T=64", 64, 16, {.block_size = 64, .num_blocks = 30}, SourceSpec{.limit = 300}, true, 51},
      {"shared, H=128, T=7", 7, 128, {.block_size = 2, .num_blocks = 900}, SourceSpec{.limit = 1200}, true, 52},
  };
  for (const CaseSpec& c : cases) expect_case_matches_reference(c);
  // A token whose window and extra columns name the same three slots, one of them twice in each.
  CaseBuilder builder({"shared, named by both", 2, 16, {.block_size = 64, .num_blocks = 4}, SourceSpec{.limit = 8}, true, 53});
  builder.set_columns(0, Source::kWindow, 4, {5, 9, 5, 70});
  builder.set_columns(0, Source::kExtra, 5, {9, 5, -1, 70, 5});
  builder.set_columns(1, Source::kWindow, 0, {});
  builder.set_columns(1, Source::kExtra, 3, {100, 100, 101});
  expect_built_case_matches_reference(builder, {});
}

// ---- The format's edges ----

// An e4m3 code whose value times 2^(scale - 127) is 0 or a normal, finite bf16 (>= 2^-126 and
// < 2^128 in magnitude): the elements a bit-exact comparison can hold the GPU to, whatever its
// tensor cores do with subnormals (the tolerance-based cases cover those).
uint8_t code_for_scale(st::Rng& rng, uint8_t scale) {
  for (;;) {
    const auto code = static_cast<uint8_t>(rng.uniform_int(0, 255));
    const double v = std::fabs(ref::decode_e4m3(code)) * std::ldexp(1.0, scale - 127);
    if (std::isnan(v)) continue;
    if (v == 0.0 || (v >= std::ldexp(1.0, -126) && v < std::ldexp(1.0, 128))) return code;
  }
}

// RoPE values at bf16's extremes: the largest finite magnitudes, the smallest normal ones, values
// far out in between, ordinary ones and both zeros.
constexpr std::array<uint16_t, 12> kRopeExtremes = {0x7F7F, 0xFF7F, 0x0080, 0x8080, 0x7F00, 0x80FF,
                                                    0x3FC0, 0xBF80, 0x5F00, 0x2000, 0x0000, 0x8000};
// Scale bytes a row's seven blocks take in turn: both ends of the range and a few between.
constexpr std::array<uint8_t, 8> kEdgeScaleBytes = {0, 254, 127, 1, 253, 0, 254, 140};

// One entry per token with scale bytes 0, 254 and others and RoPE values at the extremes, read
// with q = 0 and no sink: its weight is exactly 1, so out must be the row itself, bit for bit
// (as 0 + row: -0 comes out +0, as in the reference), and lse exactly 0. The entry is in a kModel1
// source (alternating by token when both are), among holes and ids past the pool; the other source
// reads nothing (length 0 or -1).
struct ExactRowCase {
  const char* name;
  SourceSpec window;
  std::optional<SourceSpec> extra;
};

struct ExactRows {
  CaseBuilder builder;
  std::vector<std::vector<uint16_t>> expected;  // [T][512]: bf16 bits of the row token t reads
};

ExactRows exact_row_problem(const ExactRowCase& c, int64_t T, int64_t H) {
  ExactRows rows{CaseBuilder({c.name, T, H, c.window, c.extra, false, 61}), {}};
  st::HostProblem& p = rows.builder.problem();
  const bool window_model1 = c.window.format == KvFormat::kModel1;
  const bool extra_model1 = c.extra && c.extra->format == KvFormat::kModel1;
  for (int64_t t = 0; t < T; ++t) {
    const Source source = extra_model1 && (!window_model1 || t % 2 == 1) ? Source::kExtra : Source::kWindow;
    const int64_t slot = 1 + t;  // blocks 0 to 3 at B = 2
    std::array<uint8_t, 7> scales;
    for (int64_t i = 0; i < kScalesPerRow; ++i) scales[i] = kEdgeScaleBytes[(t + i) % kEdgeScaleBytes.size()];
    std::vector<uint8_t> codes(static_cast<size_t>(kE4m3Dims));
    for (int64_t d = 0; d < kE4m3Dims; ++d) codes[d] = code_for_scale(p.rng(), scales[d / 64]);
    std::vector<uint16_t> rope(static_cast<size_t>(kRopeDims));
    for (int64_t i = 0; i < kRopeDims; ++i) rope[i] = kRopeExtremes[(t + i) % kRopeExtremes.size()];
    p.set_model1_row(slot, codes, scales, rope, source);
    rows.builder.set_columns(t, source, 6, {-1, p.num_slots(source) + 7, slot, -1, -5, p.num_slots(source)});
    if (c.extra) rows.builder.set_columns(t, source == Source::kExtra ? Source::kWindow : Source::kExtra, -(t % 2), {});
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < kHeadDim; ++d) p.set_q(t, h, d, 0.0f);
    }
    std::vector<uint16_t> bits(static_cast<size_t>(kHeadDim));
    const std::vector<double> k = st::host_row_values(p.args(), source, slot);
    for (int64_t d = 0; d < kHeadDim; ++d) bits[d] = ref::double_to_bf16(0.0 + k[d]);
    rows.expected.push_back(std::move(bits));
  }
  return rows;
}

// Mismatches against bit-exact rows and lse == 0 for every (token, head), and the first few.
std::pair<int64_t, std::string> exact_row_mismatches(const DecodeArgs& a, const Produced& got,
                                                     const std::vector<std::vector<uint16_t>>& expected) {
  int64_t mismatches = 0;
  std::string first;
  const auto note = [&](const char* what, int64_t t, int64_t h, int64_t d, double value, double want) {
    if (mismatches++ >= 8) return;
    char line[128];
    std::snprintf(line, sizeof(line), "%s[%lld][%lld][%lld] = %a, want %a\n", what, static_cast<long long>(t),
                  static_cast<long long>(h), static_cast<long long>(d), value, want);
    first += line;
  };
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    for (int64_t h = 0; h < a.num_heads; ++h) {
      const float lse = got.lse[static_cast<size_t>(t * a.stride_lse_token + h)];
      if (lse != 0.0f) note("lse", t, h, 0, lse, 0.0);
      for (int64_t d = 0; d < a.head_dim; ++d) {
        const uint16_t bits = got.out[static_cast<size_t>(t * a.stride_out_token + h * a.stride_out_head + d)];
        if (bits != expected[t][d]) {
          note("out", t, h, d, ref::bf16_to_float(bits), ref::bf16_to_float(expected[t][d]));
        }
      }
    }
  }
  return {mismatches, first};
}

SourceSpec edge_source(KvFormat format, int64_t block_size) {
  return SourceSpec{.format = format, .block_size = block_size, .num_blocks = 5, .limit = 8};
}

const ExactRowCase kExactRowCases[] = {
    {"kModel1 window alone, B=2", edge_source(KvFormat::kModel1, 2), std::nullopt},
    {"kModel1 window alone, B=256", edge_source(KvFormat::kModel1, 256), std::nullopt},
    {"both kModel1, B=2 and 256", edge_source(KvFormat::kModel1, 2), edge_source(KvFormat::kModel1, 256)},
    {"both kModel1, B=256 and 64", edge_source(KvFormat::kModel1, 256), edge_source(KvFormat::kModel1, 64)},
    {"kModel1 window, kE4m3 extra", edge_source(KvFormat::kModel1, 64), edge_source(KvFormat::kE4m3, 64)},
    {"kE4m3 window, kModel1 extra", edge_source(KvFormat::kE4m3, 64), edge_source(KvFormat::kModel1, 2)},
};

class Model1GpuEdges : public Model1Gpu {};

// Scale bytes 0 and 254 and RoPE values at bf16's extremes, each row read alone with q = 0: the
// row itself comes out. H = 8 at T = 7 is 7 one-group CTAs (an H200 splits them over clusters),
// H = 64 four head blocks a token.
TEST_F(Model1GpuEdges, OneEntryWithQZeroIsTheRowItself) {
  for (const ExactRowCase& c : kExactRowCases) {
    SCOPED_TRACE(c.name);
    for (const int64_t heads : {8, 64}) {
      ExactRows rows = exact_row_problem(c, 7, heads);
      const DecodeArgs host = rows.builder.problem().args();
      Produced got;
      if (!run_on_device(host, got)) continue;
      const auto [mismatches, first] = exact_row_mismatches(host, got, rows.expected);
      EXPECT_EQ(mismatches, 0) << "H=" << heads << "\n" << first;
    }
  }
}

// A kModel1 row of the given scale bytes: |e4m3| <= 7.5, RoPE values `rope(rng)` as bf16.
template <typename Scale, typename Rope>
void set_row_with(st::HostProblem& p, Source source, int64_t slot, Scale scale_byte, Rope rope_value) {
  std::array<uint8_t, 7> scales;
  for (uint8_t& s : scales) s = scale_byte(p.rng());
  std::vector<uint8_t> codes(static_cast<size_t>(kE4m3Dims));
  for (uint8_t& code : codes) {
    int64_t drawn;
    do drawn = p.rng().uniform_int(0, 255); while ((drawn & 0x78) > 0x48);  // exponent <= 9: |value| <= 7.5
    code = static_cast<uint8_t>(drawn);
  }
  std::vector<uint16_t> rope(static_cast<size_t>(kRopeDims));
  for (uint16_t& bits : rope) bits = st::float_to_bf16_bits(static_cast<float>(rope_value(p.rng())));
  p.set_model1_row(slot, codes, scales, rope, source);
}

// Values near 2^100 (scale bytes 200..227, RoPE ~ 2^90 N(0, 1)) read by q ~ 2^-100 N(0, 1): scores
// of a few units, as in a realistic row, and sums of p_j v_j up to ~2^120, inside fp32 (at most
// 256 x 364 entries x 7.5 x 2^100; docs/semantics.md, "Row formats").
TEST_F(Model1GpuEdges, LargeValuesReadByANonzeroQ) {
  const CaseSpec spec{"values near 2^100", 30, 16, {.block_size = 64, .num_blocks = 12, .limit = 64},
                      SourceSpec{.block_size = 2, .num_blocks = 700, .limit = 300}, false, 71};
  CaseBuilder builder(spec);
  builder.fill_rows_with([](st::HostProblem& p, Source source, int64_t slot) {
    set_row_with(p, source, slot, [](st::Rng& rng) { return static_cast<uint8_t>(rng.uniform_int(200, 227)); },
                 [](st::Rng& rng) { return std::ldexp(rng.normal(), 90); });
  });
  builder.plan_all_tokens();
  st::HostProblem& p = builder.problem();
  for (int64_t t = 0; t < spec.num_tokens; ++t) {
    for (int64_t h = 0; h < spec.num_heads; ++h) {
      for (int64_t d = 0; d < kHeadDim; ++d) p.set_q(t, h, d, static_cast<float>(std::ldexp(p.rng().normal(), -100)));
    }
  }
  set_sinks(p, spec.num_heads);
  expect_built_case_matches_reference(builder, {});
}

// Blocks of scale byte 0 (values down to 2^-136, below bf16's subnormals) beside ordinary ones,
// and RoPE values that are bf16 subnormals, read by an ordinary q.
TEST_F(Model1GpuEdges, ScaleByteZeroAndSubnormalRopeBesideOrdinaryValues) {
  const CaseSpec spec{"scale byte 0 and subnormals", 64, 64, {.block_size = 256, .num_blocks = 4, .block_pad = 576},
                      SourceSpec{.block_size = 64, .num_blocks = 20, .limit = 512}, false, 81};
  CaseBuilder builder(spec);
  builder.fill_rows_with([](st::HostProblem& p, Source source, int64_t slot) {
    set_row_with(p, source, slot,
                 [](st::Rng& rng) {
                   return static_cast<uint8_t>(rng.uniform() < 0.4 ? rng.uniform_int(0, 2) : rng.uniform_int(122, 128));
                 },
                 [](st::Rng& rng) {
                   const double draw = rng.uniform();
                   if (draw < 0.3) return std::ldexp(rng.normal(), -130);  // bf16 subnormals
                   return draw < 0.4 ? std::ldexp(rng.normal(), -120) : rng.normal();
                 });
  });
  builder.plan_all_tokens();
  set_sinks(builder.problem(), spec.num_heads);
  expect_built_case_matches_reference(builder, poison_q_heads(builder.problem(), spec.num_tokens, spec.num_heads));
}

// ---- The harness itself, on the CPU backend ----

// The CPU backend computes the exact rows the GPU must return: the expectations are the spec's.
TEST(Model1Harness, ExactRowsComeBackFromTheCpuBackend) {
  for (const ExactRowCase& c : kExactRowCases) {
    SCOPED_TRACE(c.name);
    ExactRows rows = exact_row_problem(c, 7, 3);
    st::HostProblem& p = rows.builder.problem();
    ASSERT_TRUE(swa_decode::decode(p.args()).ok());
    const auto [mismatches, first] = exact_row_mismatches(p.args(), {p.out_buffer(), p.lse_buffer()}, rows.expected);
    EXPECT_EQ(mismatches, 0) << first;
    // And the expectations are not vacuous: the rows hold both scale ends and both bf16 extremes.
    const std::vector<uint16_t>& row = rows.expected[0];
    EXPECT_NE(std::find(row.begin(), row.end(), uint16_t{0x7F7F}), row.end());
    EXPECT_NE(std::find(row.begin(), row.end(), uint16_t{0x0080}), row.end());
  }
}

// A case run on the CPU backend passes the comparison; a wrong element, a write into a gap of
// out, a wrong lse or a NaN head that is not excused each fail it.
TEST(Model1Harness, TheComparisonPassesTheReferenceAndCatchesWrongOutputs) {
  CaseBuilder builder({"harness", 12, 5, {.block_size = 2, .num_blocks = 80, .limit = 16},
                       SourceSpec{.block_size = 64, .num_blocks = 3, .limit = 40}, false, 91});
  builder.plan_all_tokens();
  st::HostProblem& p = builder.problem();
  set_sinks(p, 5);
  const std::set<std::pair<int64_t, int64_t>> nan_q_heads = poison_q_heads(p, 12, 5);
  ASSERT_FALSE(nan_q_heads.empty());
  const DecodeArgs host = p.args();
  ASSERT_TRUE(swa_decode::decode(host).ok());
  const Exact exact = exact_result(host);
  const std::vector<double> kmax = token_kmax(p);
  const Produced reference{p.out_buffer(), p.lse_buffer()};
  const st::Tolerance tolerance;
  EXPECT_TRUE(compare(host, reference, exact, kmax, nan_q_heads).ok(tolerance));
  EXPECT_FALSE(compare(host, reference, exact, kmax, {}).ok(tolerance)) << "a NaN head must fail unless excused";

  int64_t t = 0;  // a token with entries, and a head whose q is not NaN
  while (kmax[t] == 0.0) ++t;
  const int64_t h = nan_q_heads.count({t, 0}) != 0 ? 1 : 0;
  Produced wrong = reference;
  uint16_t& element = wrong.out[static_cast<size_t>(t * host.stride_out_token + h * host.stride_out_head + 3)];
  element = st::float_to_bf16_bits(ref::bf16_to_float(element) + static_cast<float>(0.1 * kmax[t]));
  EXPECT_FALSE(compare(host, wrong, exact, kmax, nan_q_heads).ok(tolerance));
  Produced gap = reference;
  gap.out[static_cast<size_t>(t * host.stride_out_token + host.num_heads * host.stride_out_head)] = 0;
  EXPECT_EQ(compare(host, gap, exact, kmax, nan_q_heads).gap_writes, 1);
  Produced lse = reference;
  lse.lse[static_cast<size_t>(t * host.stride_lse_token + h)] += 0.01f;
  EXPECT_EQ(compare(host, lse, exact, kmax, nan_q_heads).lse_violations, 1);
}

// Every slot no valid entry of a built case names keeps its poison: its e4m3 bytes, its RoPE
// values and its footer scale row (the 7 scales and the pad byte) all NaN; the rows that are
// named are real.
TEST(Model1Harness, BuiltCasesPoisonEverySlotNoValidEntryNames) {
  CaseBuilder builder({"poison", 40, 2, {.block_size = 2, .num_blocks = 60, .limit = 24},
                       SourceSpec{.block_size = 64, .num_blocks = 3, .limit = 50}, false, 93});
  builder.plan_all_tokens();
  st::HostProblem& p = builder.problem();
  const DecodeArgs a = p.args();
  for (const Source source : {Source::kWindow, Source::kExtra}) {
    const swa_decode::KvSource& x = a.extra;
    const bool extra = source == Source::kExtra;
    std::set<int64_t> named;
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      const void* lens = extra ? x.lens : a.lens;
      const DType lens_dtype = extra ? x.lens_dtype : a.lens_dtype;
      const void* ids = extra ? x.indices : a.indices;
      const DType ids_dtype = extra ? x.index_dtype : a.index_dtype;
      const int64_t stride = extra ? x.stride_indices_token : a.stride_indices_token;
      const auto at = [](const void* base, DType dtype, int64_t i) {
        return dtype == DType::kInt64 ? static_cast<const int64_t*>(base)[i] : static_cast<const int32_t*>(base)[i];
      };
      const int32_t columns = swa_decode::columns_in_window(at(lens, lens_dtype, t),
                                                            static_cast<int32_t>(extra ? x.max_entries : a.window_size));
      for (int64_t c = 0; c < columns; ++c) {
        const int64_t id = at(ids, ids_dtype, t * stride + c);
        if (swa_decode::slot_is_valid(id, p.num_slots(source))) named.insert(id);
      }
    }
    ASSERT_GT(named.size(), 10u);
    int64_t poisoned = 0;
    for (int64_t slot = 0; slot < p.num_slots(source); ++slot) {
      const uint8_t* row = p.row(slot, source);
      const uint8_t* scales = p.model1_scales(slot, source);
      const bool real = named.count(slot) != 0;
      if (real) {
        EXPECT_NE(scales[0], st::kUe8m0NaN) << slot;
        continue;
      }
      ++poisoned;
      for (int64_t d = 0; d < kE4m3Dims; ++d) ASSERT_EQ(row[d], st::kE4m3NaN) << slot << " " << d;
      for (int64_t d = kE4m3Dims; d < swa_decode::kModel1RowBytes; ++d) ASSERT_EQ(row[d], 0xFF) << slot << " " << d;
      for (int64_t i = 0; i < swa_decode::kModel1ScaleRowBytes; ++i) ASSERT_EQ(scales[i], st::kUe8m0NaN) << slot;
    }
    EXPECT_GT(poisoned, 0);
  }
}

}  // namespace
