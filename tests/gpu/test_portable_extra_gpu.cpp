// The portable kernel with an extra source (issue 11) against the float64 reference, on problems
// built entry by entry (testing/host_problem.h), so that each case puts entries exactly where the
// kernel changes course: the 1024-column chunks it compacts the extra source in
// (portable_plan.h, kExtraChunkColumns), the column shares of the ranks of its split variant, a
// later chunk whose scales raise value_norm, an empty window before a non-empty extra source and
// the reverse, both sources on one cache. Sparse tokens (a handful of entries at those columns)
// make each entry weigh a tenth or more of the output, so a dropped, doubled or misplaced entry
// fails by far; dense tokens cover full chunks and tiles. Every slot no valid entry names, and
// every scale, is NaN (columns past a length or a limit name such slots), and the outputs are NaN
// before the run.
//
// The cases run on the portable kernel only (decode_with_kernel), with the variant the dispatch
// picks for the shape on this device (printed; on an H200 the shapes are chosen to reach g1, g2
// and g1 split 8 and 4 ways). They skip without a GPU, and when SWA_DECODE_TEST_KERNEL names another
// family.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "swa_decode/swa_decode.h"
#include "src/api/decode.h"
#include "src/common/window_rule.h"
#include "src/reference/reference.h"
#include "testing/cuda_check.h"
#include "testing/device_args.h"
#include "testing/device_buffer.h"
#include "testing/host_numerics.h"
#include "testing/host_problem.h"
#include "testing/kernel_under_test.h"

namespace {

namespace st = swa_decode::testing;
using st::Source;
using swa_decode::DecodeArgs;
using swa_decode::DType;
using swa_decode::KernelId;

constexpr int64_t kHeadDim = 512;
constexpr int64_t kNoEntry = -1;
constexpr double kInf = std::numeric_limits<double>::infinity();

// What a token reads from one source: its length and the id in each column (kNoEntry for a hole;
// any id, in range or not, is allowed).
struct SourcePlan {
  int64_t len = 0;
  std::function<int64_t(int64_t column)> id = [](int64_t) { return kNoEntry; };
};

// Entries at `columns` only (all other columns holes), slot ids from `slot`.
SourcePlan sparse(int64_t len, std::vector<int64_t> columns, std::function<int64_t(int64_t)> slot) {
  return SourcePlan{len, [columns = std::move(columns), slot = std::move(slot)](int64_t c) {
                      return std::find(columns.begin(), columns.end(), c) != columns.end() ? slot(c) : kNoEntry;
                    }};
}

// A problem built token by token from plans. Rows get random e4m3 codes (|value| <= 7.5) and a
// scale from the case's scale_of(source, slot) the first time a valid column names them; the last
// block of each pool is never filled, and every column past a token's length or its source's limit
// names one of its (NaN) slots, so reading such a column poisons the output.
class Build {
 public:
  Build(const st::ProblemShape& shape, uint64_t seed, std::function<double(Source, int64_t)> scale_of)
      : problem_(shape, seed), scale_of_(std::move(scale_of)), kmax_(static_cast<size_t>(shape.num_tokens), 0.0) {}

  st::HostProblem& problem() { return problem_; }
  // Slots a plan may use: all but the pool's last block (the poisoned one).
  int64_t usable_slots(Source source) const {
    const st::ProblemShape& s = problem_.shape();
    const bool own_pool = source == Source::kExtra && !s.extra->shares_window_cache;
    return problem_.num_slots(source) - (own_pool ? s.extra->block_size : s.block_size);
  }
  int64_t random_slot(Source source) { return problem_.rng().uniform_int(0, usable_slots(source) - 1); }
  int64_t poisoned_slot(Source source) { return usable_slots(source) + problem_.rng().uniform_int(0, 3); }

  void token(int64_t t, const SourcePlan& window, const SourcePlan& extra) {
    place(t, Source::kWindow, window, problem_.shape().window_size, problem_.shape().index_cols);
    place(t, Source::kExtra, extra, problem_.shape().extra->max_entries, problem_.shape().extra->index_cols);
  }
  // Largest |k| over token t's valid entries of both sources (0 without any): the tolerance's scale.
  double kmax(int64_t t) const { return kmax_[static_cast<size_t>(t)]; }

 private:
  void place(int64_t t, Source source, const SourcePlan& plan, int64_t limit, int64_t index_cols) {
    problem_.set_len(t, plan.len, source);
    const int64_t columns = swa_decode::columns_in_window(plan.len, static_cast<int32_t>(limit));
    for (int64_t c = 0; c < index_cols; ++c) {
      if (c >= columns) {  // never read: a valid-looking id of a poisoned row
        problem_.set_index_raw(t, c, poisoned_slot(source), source);
        continue;
      }
      const int64_t id = plan.id(c);
      problem_.set_index_raw(t, c, id, source);
      if (swa_decode::slot_is_valid(id, problem_.num_slots(source))) {
        EXPECT_LT(id, usable_slots(source)) << "a plan named a poisoned slot as an entry";
        kmax_[static_cast<size_t>(t)] = std::max(kmax_[static_cast<size_t>(t)], fill(source, id));
      }
    }
  }

  // Gives the slot its row the first time; returns the row's largest |code value| * scale.
  double fill(Source source, int64_t slot) {
    const bool shared = problem_.shape().extra->shares_window_cache;
    const auto key = std::make_pair(source == Source::kExtra && !shared, slot);
    const auto found = row_kmax_.find(key);
    if (found != row_kmax_.end()) return found->second;
    std::vector<uint8_t> codes(static_cast<size_t>(kHeadDim));
    double largest = 0.0;
    for (uint8_t& code : codes) {
      int64_t drawn;
      do drawn = problem_.rng().uniform_int(0, 255); while ((drawn & 0x78) > 0x48);  // exponent <= 9: |v| <= 7.5
      code = static_cast<uint8_t>(drawn);
      largest = std::max(largest, std::fabs(st::e4m3_to_double(code)));
    }
    const float scale = st::round_to_bf16(static_cast<float>(scale_of_(source, slot)));
    problem_.set_row(slot, codes, scale, source);
    return row_kmax_[key] = largest * std::fabs(scale);
  }

  st::HostProblem problem_;
  std::function<double(Source, int64_t)> scale_of_;
  std::vector<double> kmax_;
  std::map<std::pair<bool, int64_t>, double> row_kmax_;
};

// A scale in [0.5, 2] that depends on the slot only.
double plain_scale(int64_t slot) { return 0.5 + 1.5 * static_cast<double>((slot * 2654435761u) % 1000) / 1000.0; }

class PortableExtraGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      const st::KernelUnderTest kernel = st::kernel_under_test_from_environment();
      if (kernel.id != KernelId::kNone && kernel.id != KernelId::kPortableMma) {
        GTEST_SKIP() << "SWA_DECODE_TEST_KERNEL=" << kernel.family << ": these tests run the portable kernel only";
      }
    } catch (const std::invalid_argument& e) {
      FAIL() << e.what();
    }
    if (!st::cuda_device_available()) GTEST_SKIP() << "no CUDA device: GPU tests skipped";
    SWAD_TESTING_CUDA_CHECK(cudaGetDevice(&device_));
    SWAD_TESTING_CUDA_CHECK(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, device_));
    SWAD_TESTING_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
  }

  // The reference on the host, the portable kernel on the device, and the comparison:
  // |out - ref| <= 2^-8 |ref| + 2^-6 kmax_t per element (testing/check.h derives these bounds),
  // lse within 1e-3 * max(1, |ref|), -inf exactly where the reference has it, nothing NaN.
  // Heads in `nan_q_heads` (token, head) have NaN in q: their results are unspecified, and only
  // they may differ. Returns the kernel that ran, e.g. "portable_mma_g1_split4".
  std::string expect_matches_reference(Build& build, const std::vector<std::pair<int64_t, int64_t>>& nan_q_heads = {}) {
    st::HostProblem& problem = build.problem();
    DecodeArgs host = problem.args();
    const swa_decode::Status reference = swa_decode::decode(host);
    EXPECT_TRUE(reference.ok()) << reference.message;
    const st::DeviceArgs device(host);
    const swa_decode::SupportInfo support = swa_decode::query_support_for_kernel(device.args(), KernelId::kPortableMma);
    EXPECT_TRUE(support.supported) << support.why_not;
    if (!support.supported) return support.why_not;
    std::printf("portable extra case: %s\n", support.kernel.c_str());
    std::fflush(stdout);
    const swa_decode::Status status = swa_decode::decode_with_kernel(device.args(), KernelId::kPortableMma);
    EXPECT_TRUE(status.ok()) << status.message;
    SWAD_TESTING_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> out = device.out();
    const std::vector<float> lse = device.lse();

    int64_t failures = 0;
    double err2 = 0.0, ref2 = 0.0;
    const int64_t T = host.num_tokens, H = host.num_heads;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        if (std::find(nan_q_heads.begin(), nan_q_heads.end(), std::make_pair(t, h)) != nan_q_heads.end()) continue;
        const float ref_lse = problem.lse(t, h);
        const float got_lse = lse[static_cast<size_t>(t * host.stride_lse_token + h)];
        const bool lse_ok = std::isinf(ref_lse) ? got_lse == ref_lse
                                                : std::fabs(got_lse - ref_lse) <= 1e-3 * std::max(1.0f, std::fabs(ref_lse));
        if (!lse_ok && failures++ < 8) ADD_FAILURE() << "lse[" << t << "][" << h << "] = " << got_lse << ", reference " << ref_lse;
        for (int64_t d = 0; d < host.head_dim; ++d) {
          const size_t at = static_cast<size_t>(t * host.stride_out_token + h * host.stride_out_head + d);
          const double ref = swa_decode::reference::bf16_to_float(problem.out_bits(t, h, d));
          const double got = swa_decode::reference::bf16_to_float(out[at]);
          const double bound = 0x1.0p-8 * std::fabs(ref) + 0x1.0p-6 * build.kmax(t);
          err2 += (got - ref) * (got - ref);
          ref2 += ref * ref;
          if (!(std::fabs(got - ref) <= bound) && failures++ < 8) {
            ADD_FAILURE() << "out[" << t << "][" << h << "][" << d << "] = " << got << ", reference " << ref
                          << ", bound " << bound << " (kmax " << build.kmax(t) << ")";
          }
        }
      }
    }
    EXPECT_EQ(failures, 0) << "elements past their tolerance, kernel " << support.kernel;
    if (ref2 > 0.0) {
      EXPECT_LE(std::sqrt(err2 / ref2), 1e-2) << "rel-L2 of out, kernel " << support.kernel;
    }
    return support.kernel;
  }

  // Whether the dispatch would pick `variant` for a case on this device: the expectations of the
  // shapes below hold on an sm_90 with 128 to 160 SMs (an H200 has 132).
  bool on_h200_class_device() const { return cc_major_ == 9 && num_sms_ >= 128 && num_sms_ <= 160; }

  int device_ = 0, cc_major_ = 0, num_sms_ = 0;
};

st::ProblemShape shape_with_extra(int64_t T, int64_t H, int64_t window, int64_t extra_limit) {
  st::ProblemShape s;
  s.num_tokens = T;
  s.num_heads = H;
  s.head_dim = kHeadDim;
  s.block_size = 64;
  s.num_blocks = 8;
  s.window_size = window;
  s.index_cols = window + 24;  // garbage past the window
  st::ExtraShape x;
  x.block_size = 64;
  x.num_blocks = 40;  // 2496 usable slots
  x.max_entries = extra_limit;
  x.index_cols = extra_limit + 40;  // garbage past the limit
  s.extra = x;
  return s;
}

void set_sinks(st::HostProblem& problem, int64_t H) {
  std::vector<float> sinks(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) sinks[static_cast<size_t>(h)] = static_cast<float>(-2.0 + 0.37 * static_cast<double>(h % 11));
  sinks[3 % H] = static_cast<float>(kInf);   // all weight on the sink: out 0, lse unchanged
  sinks[4 % H] = static_cast<float>(-kInf);  // no sink
  problem.set_sink(sinks);
}

// Dense plans: every column valid except a `hole_every`-th hole (0: none) and an out-of-range id
// each `foreign_every`-th column (0: none), ids random.
SourcePlan dense(Build& build, Source source, int64_t len, int64_t hole_every = 0, int64_t foreign_every = 0) {
  std::vector<int64_t> ids(static_cast<size_t>(std::max<int64_t>(len, 0) + 64));
  for (int64_t c = 0; c < static_cast<int64_t>(ids.size()); ++c) {
    int64_t id = build.random_slot(source);
    if (hole_every > 0 && c % hole_every == hole_every - 1) id = kNoEntry;
    if (foreign_every > 0 && c % foreign_every == foreign_every - 2) id = build.problem().num_slots(source) + c;
    ids[static_cast<size_t>(c)] = id;
  }
  return SourcePlan{len, [ids](int64_t c) { return c < static_cast<int64_t>(ids.size()) ? ids[static_cast<size_t>(c)] : kNoEntry; }};
}

// One group per CTA (12 tokens x 1 head block; on sm_90 each token split over a 4-CTA cluster,
// choose_window_splits: 8 ways would be 96 CTAs, more than half of 132 SMs, and 94 extra tiles are
// under kHeavyExtraTiles; so a rank's 768-column share crosses a chunk boundary too; the unsplit
// kernel elsewhere and in ChunkBoundariesTwoGroups): every chunk boundary of a 3000-entry
// extra source, lengths -1 / 0 / 1 / 1023 / 1024 / 1025 / past the limit, holes and ids past the
// extra pool, a later chunk with 16x the scales, q NaN in one head.
TEST_F(PortableExtraGpu, ChunkBoundariesOneGroup) {
  st::ProblemShape s = shape_with_extra(12, 16, 128, 3000);
  s.extra->index_dtype = DType::kInt64;
  s.extra->inv_scale_dtype = DType::kFloat32;
  // Slots 1024.. of the extra pool weigh 16x: tokens drawing from them in their second chunk raise
  // value_norm there.
  Build build(s, 1101, [](Source source, int64_t slot) {
    return plain_scale(slot) * (source == Source::kExtra && slot >= 1024 ? 16.0 : 1.0);
  });
  const auto low = [&](int64_t) { return build.problem().rng().uniform_int(0, 1023); };
  const auto high = [&](int64_t) { return build.problem().rng().uniform_int(1024, build.usable_slots(Source::kExtra) - 1); };
  const auto any = [&](Source source) { return [&build, source](int64_t) { return build.random_slot(source); }; };
  const std::vector<int64_t> boundaries = {0, 1, 1022, 1023, 1024, 1025, 2046, 2047, 2048, 2049, 2999};
  build.token(0, dense(build, Source::kWindow, 128), dense(build, Source::kExtra, 3000));
  build.token(1, SourcePlan{0}, sparse(3000, boundaries, any(Source::kExtra)));
  build.token(2, dense(build, Source::kWindow, 128), dense(build, Source::kExtra, 1024));
  build.token(3, sparse(128, {0, 127}, any(Source::kWindow)), sparse(1025, {1024}, high));
  build.token(4, SourcePlan{0}, SourcePlan{0});  // empty: out 0, lse -inf
  build.token(5, dense(build, Source::kWindow, 97, 5), SourcePlan{-1});
  // Length past the limit: columns 3000.. are never read (they name poisoned rows).
  build.token(6, sparse(128, {5}, any(Source::kWindow)), sparse(5000, {2998, 2999}, any(Source::kExtra)));
  build.token(7, sparse(1, {0}, any(Source::kWindow)), dense(build, Source::kExtra, 2048, 3, 10));
  // The same slot on both sides of the first chunk boundary and twice inside the second chunk.
  build.token(8, SourcePlan{0}, sparse(3000, {1023, 1024, 1500, 1501}, [](int64_t c) { return c < 1500 ? 77 : 1777; }));
  build.token(9, SourcePlan{0}, sparse(1, {0}, low));
  // Low scales in the window and the first chunk, 16x from the second: value_norm rises at 1024.
  build.token(10, dense(build, Source::kWindow, 128),
              SourcePlan{2049, [&](int64_t c) { return c < 1024 ? low(c) : high(c); }});
  build.token(11, dense(build, Source::kWindow, 64), dense(build, Source::kExtra, 1500, 7));
  for (int64_t d = 0; d < kHeadDim; ++d) build.problem().set_q(11, 9, d, std::numeric_limits<float>::quiet_NaN());
  set_sinks(build.problem(), s.num_heads);
  const std::string kernel = expect_matches_reference(build, {{11, 9}});
  if (on_h200_class_device()) {
    EXPECT_EQ(kernel, "portable_mma_g1_split4");
  }
}

// Two groups per CTA (17 tokens x 4 head blocks fill an H200): a 1100-entry extra source (one full
// chunk and a short one) with holes, rows padded to 520 bytes (8-byte copies for both sources) and
// the window's dtypes swapped against the extra source's.
TEST_F(PortableExtraGpu, ChunkBoundariesTwoGroups) {
  st::ProblemShape s = shape_with_extra(17, 128, 128, 1100);
  s.index_dtype = s.lens_dtype = DType::kInt64;
  s.inv_scale_dtype = DType::kFloat32;
  s.extra->kv_token_pad = 8;
  Build build(s, 1201, [](Source source, int64_t slot) { return plain_scale(slot) * (source == Source::kExtra ? 2.0 : 1.0); });
  const auto any = [&](Source source) { return [&build, source](int64_t) { return build.random_slot(source); }; };
  for (int64_t t = 0; t < s.num_tokens; ++t) {
    switch (t % 4) {
      case 0: build.token(t, dense(build, Source::kWindow, 128, 9), dense(build, Source::kExtra, 1100, 2)); break;
      case 1: build.token(t, SourcePlan{0}, sparse(1100, {0, 31, 32, 1023, 1024, 1099}, any(Source::kExtra))); break;
      case 2: build.token(t, sparse(128, {3, 64, 127}, any(Source::kWindow)), SourcePlan{t % 8 == 2 ? 0 : -5}); break;
      default: build.token(t, dense(build, Source::kWindow, 40), sparse(1025, {1023, 1024}, any(Source::kExtra))); break;
    }
  }
  set_sinks(build.problem(), s.num_heads);
  const std::string kernel = expect_matches_reference(build);
  if (on_h200_class_device()) {
    EXPECT_EQ(kernel, "portable_mma_g2");
  }
}

// One token of 128 heads: 8 one-group CTAs, which an H200 splits 8 ways (4 ways behind 4 empty
// tokens). Each rank takes a 32-column-aligned share of the extra columns: entries on the share
// boundaries, a rank with two chunks, ranks without any entry, and ranks whose value_norms differ
// by 2^5 (the combine brings them to the largest).
TEST_F(PortableExtraGpu, SplitOverTheCluster) {
  struct SplitCase {
    const char* what;
    std::function<void(Build&)> plan;
  };
  const auto any = [](Build& build, Source source) { return [&build, source](int64_t) { return build.random_slot(source); }; };
  const std::vector<SplitCase> cases = {
      // 3000 columns: shares of 384 (12 tiles), boundaries at 384, 768, .. 2688.
      {"dense window and extra",
       [&](Build& b) { b.token(0, dense(b, Source::kWindow, 128), dense(b, Source::kExtra, 3000, 11)); }},
      {"entries on the share boundaries, empty window",
       [&](Build& b) { b.token(0, SourcePlan{0}, sparse(3000, {0, 383, 384, 767, 768, 1535, 1536, 2303, 2304, 2687, 2688, 2999}, any(b, Source::kExtra))); }},
      // 40 columns: ranks 0 and 1 get [0, 32) and [32, 40), ranks 2 to 7 nothing.
      {"two ranks without entries",
       [&](Build& b) { b.token(0, SourcePlan{0}, dense(b, Source::kExtra, 40)); }},
      // 10240 columns: shares of 1280, two chunks each (1024 + 256).
      {"two chunks a rank",
       [&](Build& b) { b.token(0, sparse(128, {0, 100}, any(b, Source::kWindow)),
                               sparse(10240, {0, 1023, 1024, 1279, 1280, 2303, 2304, 2559, 2560, 8959, 8960, 10239},
                                      any(b, Source::kExtra))); }},
      // Ranks 6 and 7's columns (2304..) name slots with 32x the scale of the others'.
      {"value_norm differs by rank",
       [&](Build& b) {
         b.token(0, dense(b, Source::kWindow, 128), SourcePlan{3000, [&b](int64_t c) {
                   return c < 2304 ? b.problem().rng().uniform_int(0, 1023)
                                   : b.problem().rng().uniform_int(1024, b.usable_slots(Source::kExtra) - 1);
                 }});
       }},
      {"window only, extra length 0", [&](Build& b) { b.token(0, dense(b, Source::kWindow, 128), SourcePlan{0}); }},
      {"nothing in either source", [&](Build& b) { b.token(0, SourcePlan{-1}, SourcePlan{0}); }},
  };
  // Alone, the token's 8 CTAs split 8 ways (half the SMs or fewer); behind 3 empty tokens (32
  // CTAs, 320 extra tiles) 8 ways too, as a heavy source, in 32 clusters of 8 (more than the 30 an
  // H200 runs at once); behind 4 (40 CTAs) 4 ways, the shares then twice as wide (768 columns of
  // 3000, 2560 of 10240: three chunks a rank).
  uint64_t seed = 1301;
  for (const int64_t tokens : {1, 4, 5}) {
    for (const SplitCase& c : cases) {
      SCOPED_TRACE(std::string(c.what) + ", " + std::to_string(tokens) + " tokens");
      st::ProblemShape s = shape_with_extra(tokens, 128, 128, 10240);
      s.extra->lens_dtype = DType::kInt64;
      Build build(s, seed++, [](Source source, int64_t slot) {
        return plain_scale(slot) * (source == Source::kExtra && slot >= 1024 ? 32.0 : 1.0);
      });
      c.plan(build);
      for (int64_t t = 1; t < tokens; ++t) build.token(t, SourcePlan{0}, SourcePlan{0});
      set_sinks(build.problem(), s.num_heads);
      const std::string kernel = expect_matches_reference(build);
      if (on_h200_class_device()) {
        EXPECT_EQ(kernel, tokens == 5 ? "portable_mma_g1_split4" : "portable_mma_g1_split8");
      }
    }
  }
}

// Both sources on the window's cache and scales, naming the same slots (duplicates count in both,
// and within each): dense tokens, and sparse ones where a slot named three times outweighs the
// others, so counting a duplicate once, or reading the extra ids through another cache, fails.
// 80 heads in one-group CTAs (40 of them: split 4 ways on sm_90, since 8 ways would fill more than
// half the SMs with 47 tiles a token, choose_window_splits).
TEST_F(PortableExtraGpu, BothSourcesOnOneCache) {
  st::ProblemShape s = shape_with_extra(8, 80, 128, 1500);
  s.num_blocks = 30;  // the shared pool: 1856 usable slots
  s.extra->shares_window_cache = true;
  s.extra->index_dtype = DType::kInt64;
  Build build(s, 1401, [](Source, int64_t slot) { return plain_scale(slot); });
  const int64_t slots = build.usable_slots(Source::kWindow);
  for (int64_t t = 0; t < s.num_tokens; ++t) {
    const int64_t first = 100 * t;
    if (t % 2 == 0) {
      // The window's slots again at the start of the extra source, then others of the same pool.
      build.token(t, SourcePlan{128, [first](int64_t c) { return first + c; }},
                  SourcePlan{t % 4 == 0 ? 1500 : 1100,
                             [first, slots](int64_t c) { return c < 128 ? first + c : (first + 128 + c) % slots; }});
    } else {
      // Slot `first` in window column 0 and extra columns 0 and 1023; `first + 1` in window column 5
      // and extra column 1024 (the next chunk).
      build.token(t, sparse(128, {0, 5}, [first](int64_t c) { return c == 0 ? first : first + 1; }),
                  sparse(1100, {0, 1023, 1024}, [first](int64_t c) { return c < 1024 ? first : first + 1; }));
    }
  }
  set_sinks(build.problem(), s.num_heads);
  const std::string kernel = expect_matches_reference(build);
  if (on_h200_class_device()) {
    EXPECT_EQ(kernel, "portable_mma_g1_split4");
  }
}

}  // namespace
