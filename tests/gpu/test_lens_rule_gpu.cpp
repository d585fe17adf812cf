// The lengths rule on the GPU (docs/semantics.md, "Valid entries"; issue 12): one lens entry for
// lens_rows_per_entry = n consecutive tokens, and no lens at all (every index column counts), in
// the window and in the extra source, through the public decode() on the kernel under test
// (SWA_DECODE_TEST_KERNEL=auto|portable|sm90, tests/gpu/gpu_test.h).
//
// Each case is one problem run twice on the device: with one length per token (n = 1, the rule
// every other GPU test holds to the float64 reference), and with the lengths as the call under test
// passes them (one per group of n tokens, or none). The valid entries are the same, so out and lse
// must be the same bits. Consecutive groups have different lengths, so a kernel that read lens[t]
// instead of lens[t / n] reads another group's length (or past the T / n entries the device holds);
// a kernel that read a missing lens would fault. Rows come from HostProblem::fill_slot; every slot
// no valid entry names stays poisoned (NaN), and every index column past a token's length or its
// source's limit names a slot of the pool's last block, which is never filled.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "swa_decode/swa_decode.h"
#include "src/api/validate.h"
#include "src/common/window_rule.h"
#include "src/reference/reference.h"
#include "testing/host_problem.h"
#include "tests/gpu/gpu_test.h"

namespace {

namespace st = swa_decode::testing;
namespace ref = swa_decode::reference;
using st::Source;
using swa_decode::DecodeArgs;
using swa_decode::DType;
using swa_decode::KvFormat;

constexpr int64_t kGarbageColumns = 8;  // index columns past each limit, naming poisoned slots

// One source of a case, and how the call under test passes its lengths.
struct SourceSpec {
  KvFormat format = KvFormat::kE4m3;
  int64_t block_size = 64;
  int64_t num_blocks = 12;
  int64_t limit = 128;            // window_size, or extra.max_entries
  int64_t rows_per_entry = 1;     // lens_rows_per_entry of the call under test
  bool no_lens = false;           // the call under test passes no lens (every column counts)
};

struct CaseSpec {
  const char* name;
  int64_t num_tokens, num_heads;
  SourceSpec window;
  std::optional<SourceSpec> extra;
  uint64_t seed;
};

// A source's ids and lengths alternate int32 / int64 with the seed, the extra source's the other
// way round from the window's.
DType index_dtype(uint64_t seed, bool extra) { return (seed % 2 == 0) != extra ? DType::kInt32 : DType::kInt64; }
DType lens_dtype(uint64_t seed, bool extra) { return (seed % 3 == 0) != extra ? DType::kInt64 : DType::kInt32; }

// The case's shape at `num_heads` heads (the harness runs the cases at one head).
st::ProblemShape shape_of(const CaseSpec& c, int64_t num_heads) {
  const SourceSpec& w = c.window;
  st::ProblemShape s{.num_tokens = c.num_tokens, .num_heads = num_heads, .head_dim = swa_decode::kGpuHeadDim,
                     .num_blocks = w.num_blocks, .block_size = w.block_size, .window_size = w.limit,
                     .index_cols = w.limit + kGarbageColumns, .index_dtype = index_dtype(c.seed, false),
                     .lens_dtype = lens_dtype(c.seed, false), .kv_format = w.format};
  if (c.extra) {
    const SourceSpec& x = *c.extra;
    s.extra = st::ExtraShape{.num_blocks = x.num_blocks, .block_size = x.block_size, .max_entries = x.limit,
                             .index_cols = x.limit + kGarbageColumns, .index_dtype = index_dtype(c.seed, true),
                             .lens_dtype = lens_dtype(c.seed, true), .format = x.format};
  }
  return s;
}

// Gives token t of `source` the length `len` and its columns: within the first
// columns_in_window(len) mostly random usable slots (all but the pool's last block), ~5% holes
// (-1) and ~5% ids past the pool; every other column a poisoned slot of the last block.
void set_token(st::HostProblem& p, Source source, int64_t t, int64_t len, int64_t limit, int64_t index_cols,
               int64_t block_size) {
  const int64_t usable = p.num_slots(source) - block_size;
  st::Rng& rng = p.rng();
  p.set_len(t, len, source);
  const int32_t columns = swa_decode::columns_in_window(len, static_cast<int32_t>(limit));
  for (int64_t c = 0; c < index_cols; ++c) {
    if (c >= columns) {
      p.set_index_raw(t, c, usable + rng.uniform_int(0, block_size - 1), source);
      continue;
    }
    const double draw = rng.uniform();
    if (draw < 0.05) {
      p.set_index_raw(t, c, -1, source);
    } else if (draw < 0.10) {
      p.set_index_raw(t, c, p.num_slots(source) + rng.uniform_int(0, 1000), source);
    } else {
      p.set_index(t, c, rng.uniform_int(0, usable - 1), source);
    }
  }
}

// The per-token length of token t in a source: the group's, from a cycle in which consecutive
// groups differ (the limit, -1, a random length, 0, past the limit, 1); with no lens, every index
// column (index_cols), which columns_in_window limits as a missing lens is limited.
int64_t token_length(const SourceSpec& spec, int64_t t, int64_t index_cols, uint64_t seed) {
  if (spec.no_lens) return index_cols;
  const int64_t group = t / spec.rows_per_entry;
  const int64_t kinds[] = {spec.limit, -1, 1 + static_cast<int64_t>((seed * 7 + group * 13) % spec.limit), 0,
                           spec.limit + 3, 1};
  return kinds[group % 6];
}

// The bits of a float vector, so that NaN and -inf compare exactly.
std::vector<uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  if (!values.empty()) std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

// A case built: its problem, the arguments with one length per token, and those of the call
// under test (lengths per group of tokens, or none).
class LensCase {
 public:
  explicit LensCase(const CaseSpec& spec, int64_t num_heads) : problem_(shape_of(spec, num_heads), spec.seed) {
    const st::ProblemShape& s = problem_.shape();
    for (int64_t t = 0; t < spec.num_tokens; ++t) {
      const int64_t len = token_length(spec.window, t, s.index_cols, spec.seed);
      set_token(problem_, Source::kWindow, t, len, s.window_size, s.index_cols, s.block_size);
      int64_t extra_len = 0;
      if (spec.extra) {
        extra_len = token_length(*spec.extra, t, s.extra->index_cols, spec.seed + 1);
        set_token(problem_, Source::kExtra, t, extra_len, s.extra->max_entries, s.extra->index_cols,
                  s.extra->block_size);
      }
      tokens_with_entries_ += len > 0 || extra_len > 0;
    }
    std::vector<float> sinks(static_cast<size_t>(num_heads));
    for (size_t h = 0; h < sinks.size(); ++h) sinks[h] = -2.0f + 0.3f * static_cast<float>(h % 11);
    problem_.set_sink(sinks);
    per_token_ = problem_.args();
    under_test_ = problem_.args_with_lens_per_rows(spec.window.rows_per_entry,
                                                   spec.extra ? spec.extra->rows_per_entry : 1);
    if (spec.window.no_lens) under_test_.lens = nullptr;
    if (spec.extra && spec.extra->no_lens) under_test_.extra.lens = nullptr;
  }

  const DecodeArgs& per_token() const { return per_token_; }
  const DecodeArgs& under_test() const { return under_test_; }
  int64_t tokens_with_entries() const { return tokens_with_entries_; }

 private:
  st::HostProblem problem_;
  DecodeArgs per_token_, under_test_;
  int64_t tokens_with_entries_ = 0;
};

class LensRuleGpu : public st::GpuTest {
 protected:
  void expect_same_as_per_token_lengths(const CaseSpec& spec) {
    SCOPED_TRACE(spec.name);
    const LensCase c(spec, spec.num_heads);
    st::Produced want, got;
    if (!run_on_device(c.per_token(), want) || !run_on_device(c.under_test(), got)) return;
    ASSERT_GT(c.tokens_with_entries(), 0);  // the case reads rows: its out is not all zeros
    EXPECT_EQ(got.out, want.out);
    EXPECT_EQ(bits_of(got.lse), bits_of(want.lse));
  }
};

SourceSpec model1(int64_t block_size, int64_t num_blocks, int64_t limit, int64_t rows_per_entry, bool no_lens = false) {
  return SourceSpec{.format = KvFormat::kModel1, .block_size = block_size, .num_blocks = num_blocks, .limit = limit,
                    .rows_per_entry = rows_per_entry, .no_lens = no_lens};
}

SourceSpec e4m3(int64_t block_size, int64_t num_blocks, int64_t limit, int64_t rows_per_entry, bool no_lens = false) {
  return SourceSpec{.format = KvFormat::kE4m3, .block_size = block_size, .num_blocks = num_blocks, .limit = limit,
                    .rows_per_entry = rows_per_entry, .no_lens = no_lens};
}

// The window alone: its lengths one per s_q = 2, 3 or 4 query rows (FlashMLA's batch rows), or
// none, at the head counts and token counts that pick different splits.
std::vector<CaseSpec> window_cases() {
  return {
      {"e4m3, n=3, H=16, T=48", 48, 16, e4m3(64, 12, 128, 3), std::nullopt, 1},
      {"e4m3, n=2, H=128, T=2", 2, 128, e4m3(256, 4, 128, 2), std::nullopt, 2},
      {"e4m3, no lens, H=64, T=12", 12, 64, e4m3(64, 12, 128, 1, true), std::nullopt, 3},
      {"model1, n=2, H=64, T=64", 64, 64, model1(64, 12, 128, 2), std::nullopt, 4},
      {"model1, n=4, H=128, T=4", 4, 128, model1(64, 8, 128, 4), std::nullopt, 5},
      {"model1, no lens, H=8, T=30", 30, 8, model1(64, 12, 128, 1, true), std::nullopt, 6},
  };
}

// Both sources (the layer kernels), each with its own n or no lens: FlashMLA's shapes (both
// sources one length per batch row of s_q rows) and mixes of the two rules.
std::vector<CaseSpec> both_source_cases() {
  return {
      {"model1 C4A-like, both n=2, H=64, T=32", 32, 64, model1(64, 12, 128, 2), model1(64, 40, 512, 2), 11},
      {"model1, both n=4, H=128, T=4", 4, 128, model1(256, 4, 128, 4), model1(64, 40, 1100, 4), 12},
      {"model1, window n=2, extra no lens, H=16, T=6", 6, 16, model1(64, 8, 128, 2),
       model1(2, 600, 300, 1, true), 13},
      {"e4m3, window no lens, extra n=3, H=64, T=9", 9, 64, e4m3(64, 12, 128, 1, true), e4m3(64, 20, 512, 3), 14},
      {"e4m3 window n=1, model1 extra n=6, H=128, T=12", 12, 128, e4m3(64, 12, 128, 1), model1(64, 40, 512, 6), 15},
      {"model1, neither has lens, H=64, T=8", 8, 64, model1(64, 8, 128, 1, true), model1(64, 20, 256, 1, true), 16},
  };
}

TEST_F(LensRuleGpu, WindowLengthsPerGroupOfRowsOrNone) {
  for (const CaseSpec& c : window_cases()) expect_same_as_per_token_lengths(c);
}

TEST_F(LensRuleGpu, BothSourcesEachWithItsOwnRule) {
  for (const CaseSpec& c : both_source_cases()) expect_same_as_per_token_lengths(c);
}

// The cases on the CPU backend at one head (no GPU needed): they build (every group's tokens share
// a length), read rows, give no NaN, and the call under test equals the per-token one there too.
TEST(LensRuleHarness, TheCasesAgreeOnTheCpuBackend) {
  std::vector<CaseSpec> cases = window_cases();
  for (const CaseSpec& c : both_source_cases()) cases.push_back(c);
  for (const CaseSpec& spec : cases) {
    SCOPED_TRACE(spec.name);
    const LensCase c(spec, 1);
    ASSERT_GT(c.tokens_with_entries(), 0);
    ASSERT_TRUE(swa_decode::validate_args(c.under_test()).ok()) << swa_decode::validate_args(c.under_test()).message;
    const ref::Result want = ref::compute(c.per_token()), got = ref::compute(c.under_test());
    for (const double v : want.out) ASSERT_FALSE(std::isnan(v));
    EXPECT_EQ(got.out, want.out);
    EXPECT_EQ(got.lse, want.lse);
  }
}

}  // namespace
