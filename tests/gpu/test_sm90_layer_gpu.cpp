// The sm90 layer kernel (src/kernels/sm90/decode_sm90_layer.cuh, "sm90_wgmma_layer") against the
// float64 reference on problems with an extra KV source: one softmax over each token's valid window
// entries followed by its valid extra entries (docs/semantics.md, "The extra source").
//
// Every case is a testing::HostProblem (every cache slot and scale of both pools NaN until a valid
// entry names it), copied to the device as it is and decoded with decode_with_kernel(kSm90Wgmma),
// whatever SWA_DECODE_TEST_KERNEL says. Index columns a token must not read (past its length or
// past the source's limit) name in-range slots that stay poisoned, so reading one turns the
// output NaN. Skips without a CUDA device, on a device other than sm_90 and in a build without the
// sm_90a kernels; on an sm_90 device every case must be one the layer kernel runs.
//
// The reference runs on the host on every core; each case keeps tokens x heads x entries small,
// and the large ones compare a few token ranges (the rest is still checked for NaN and for writes
// outside the output views).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "swa_decode/limits.h"
#include "swa_decode/swa_decode.h"
#include "src/api/decode.h"
#include "src/common/window_rule.h"
#include "src/dispatch/select_kernel.h"
#include "src/reference/reference.h"
#include "testing/cuda_check.h"
#include "testing/device_args.h"
#include "testing/device_buffer.h"
#include "testing/host_numerics.h"
#include "testing/host_problem.h"

namespace {

namespace st = swa_decode::testing;
using swa_decode::DecodeArgs;
using swa_decode::DType;
using swa_decode::KernelId;
using st::HostProblem;
using st::Source;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kHeadDim = swa_decode::kGpuHeadDim;
// The last slots of each pool are named only by columns a token must not read, so they stay NaN.
constexpr int64_t kPoisonSlots = 8;
// Index columns past each source's limit, holding those poisoned slots.
constexpr int64_t kColumnsPastLimit = 8;

// Its arguments printed one after the other (GCC 12 warns, a known -Wrestrict false positive, on
// "literal" + std::string).
template <typename... Parts>
std::string text(const Parts&... parts) {
  std::ostringstream stream;
  stream.precision(9);
  (stream << ... << parts);
  return stream.str();
}

// ---- the problem ----

struct SourceSpec {
  int64_t limit = 128;  // window_size for the window, extra.max_entries for the extra source
  int64_t num_blocks = 16, block_size = 64;
  int64_t kv_token_pad = 0, kv_block_pad = 0;  // bytes; multiples of 16 (the sm90 kernels copy 16-byte pieces)
  DType index_dtype = DType::kInt32;
  DType lens_dtype = DType::kInt32;
  DType inv_scale_dtype = DType::kBFloat16;
  swa_decode::KvFormat format = swa_decode::KvFormat::kE4m3;  // kModel1: its own strides, kv pads ignored
  std::vector<int64_t> lens = {};  // the value written to lens, per token (cycled); empty: uniform in [0, limit]
  // Shares of the columns within a token's length: -1 holes, ids outside [0, num_slots) (ids past
  // the extra pool that would name window slots among them), repeats of an earlier valid slot.
  double holes = 0.0, out_of_range = 0.0, duplicates = 0.0;
};

// Ids written over columns [begin, end) of one token's index row after the draw (holes mid-row).
struct IdRun {
  int64_t token;
  Source source;
  int64_t begin, end;
  int64_t id;
};

struct LayerCase {
  int64_t tokens = 8, heads = 64;
  SourceSpec window;
  SourceSpec extra = {.limit = 512};
  // One cache and one set of scales for both sources: the extra ids name the window's slots, and a
  // duplicate may repeat a slot of either source.
  bool shared_cache = false;
  std::vector<float> sinks;  // cycled over the heads; empty: no sink
  bool with_lse = true;
  int64_t q_head_pad = 0, q_token_pad = 0, out_head_pad = 0, out_token_pad = 0, lse_pad = 0;
  bool head_major_q = false;
  std::vector<int64_t> nan_heads;  // q of these heads is NaN in every token: their output is unspecified
  std::vector<IdRun> id_runs;
  // Tokens compared with the reference, as [begin, end) ranges; empty: all of them.
  std::vector<std::pair<int64_t, int64_t>> compared;
  bool through_graph = false;  // the decode captured in a CUDA graph, which is then launched
  // The plan decode() must run; empty: sm90_wgmma_layer or one of its key splits (_split2/4/8).
  std::string kernel;
  uint64_t seed = 1;
};

// A case of `tokens` x `heads` with the extra source `extra`, the sinks (cycled) and the seed; the
// rest as LayerCase's defaults.
LayerCase layer_case(int64_t tokens, int64_t heads, const SourceSpec& extra, std::vector<float> sinks, uint64_t seed) {
  LayerCase c;
  c.tokens = tokens;
  c.heads = heads;
  c.extra = extra;
  c.sinks = std::move(sinks);
  c.seed = seed;
  return c;
}

st::ProblemShape problem_shape(const LayerCase& c) {
  st::ProblemShape s;
  s.num_tokens = c.tokens;
  s.num_heads = c.heads;
  s.head_dim = kHeadDim;
  s.num_blocks = c.window.num_blocks;
  s.block_size = c.window.block_size;
  s.window_size = c.window.limit;
  s.index_cols = c.window.limit + kColumnsPastLimit;
  s.q_head_pad = c.q_head_pad;
  s.q_token_pad = c.q_token_pad;
  s.out_head_pad = c.out_head_pad;
  s.out_token_pad = c.out_token_pad;
  s.kv_token_pad = c.window.kv_token_pad;
  s.kv_block_pad = c.window.kv_block_pad;
  s.index_pad = 3;
  s.lse_pad = c.lse_pad;
  s.head_major_q = c.head_major_q;
  s.inv_scale_dtype = c.window.inv_scale_dtype;
  s.index_dtype = c.window.index_dtype;
  s.lens_dtype = c.window.lens_dtype;
  s.kv_format = c.window.format;
  s.extra = st::ExtraShape{.num_blocks = c.extra.num_blocks, .block_size = c.extra.block_size,
                           .max_entries = c.extra.limit, .index_cols = c.extra.limit + kColumnsPastLimit,
                           .kv_token_pad = c.extra.kv_token_pad, .kv_block_pad = c.extra.kv_block_pad,
                           .index_pad = 5, .inv_scale_dtype = c.extra.inv_scale_dtype,
                           .index_dtype = c.extra.index_dtype, .lens_dtype = c.extra.lens_dtype,
                           .format = c.extra.format, .shares_window_cache = c.shared_cache};
  return s;
}

// One source's lengths and index rows for every token, drawn by `spec`. `used` holds the valid
// slots drawn so far for the token (per pool), so that duplicates repeat real entries.
void draw_source(HostProblem& p, const LayerCase& c, const SourceSpec& spec, Source source,
                 std::vector<std::vector<int64_t>>& used_by_pool) {
  st::Rng& rng = p.rng();
  const int64_t num_slots = p.num_slots(source);
  const int64_t usable = num_slots - kPoisonSlots;
  const int pool = source == Source::kExtra && !c.shared_cache ? 1 : 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    std::vector<int64_t>& used = used_by_pool[static_cast<size_t>(pool * c.tokens + t)];
    const int64_t len = spec.lens.empty() ? rng.uniform_int(0, spec.limit) : spec.lens[t % spec.lens.size()];
    p.set_len(t, len, source);
    const int64_t columns = swa_decode::columns_in_window(len, static_cast<int32_t>(spec.limit));
    for (int64_t col = 0; col < spec.limit + kColumnsPastLimit; ++col) {
      if (col >= columns) {  // never read: a poisoned in-range slot
        p.set_index_raw(t, col, usable + rng.uniform_int(0, kPoisonSlots - 1), source);
        continue;
      }
      const double u = rng.uniform();
      if (u < spec.holes) {
        p.set_index_raw(t, col, -1, source);
      } else if (u < spec.holes + spec.out_of_range) {
        const int64_t id = rng.uniform() < 0.5 ? num_slots + rng.uniform_int(0, 2 * num_slots) : -2 - rng.uniform_int(0, 9);
        p.set_index_raw(t, col, id, source);
      } else if (u < spec.holes + spec.out_of_range + spec.duplicates && !used.empty()) {
        p.set_index(t, col, used[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(used.size()) - 1))], source);
      } else {
        const int64_t slot = rng.uniform_int(0, usable - 1);
        p.set_index(t, col, slot, source);
        used.push_back(slot);
      }
    }
  }
}

void build_problem(HostProblem& p, const LayerCase& c) {
  std::vector<std::vector<int64_t>> used(static_cast<size_t>(2 * c.tokens));
  draw_source(p, c, c.window, Source::kWindow, used);
  draw_source(p, c, c.extra, Source::kExtra, used);
  for (const IdRun& run : c.id_runs) {
    for (int64_t col = run.begin; col < run.end; ++col) p.set_index_raw(run.token, col, run.id, run.source);
  }
  if (!c.sinks.empty()) {
    std::vector<float> sinks(static_cast<size_t>(c.heads));
    for (int64_t h = 0; h < c.heads; ++h) sinks[h] = c.sinks[h % c.sinks.size()];
    p.set_sink(sinks);
  }
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t h : c.nan_heads) {
      for (int64_t d = 0; d < kHeadDim; ++d) p.set_q(t, h, d, kNaN);
    }
  }
}

// ---- the reference, on every core ----

template <typename T>
const T* advanced(const void* base, int64_t elements) {
  return base == nullptr ? nullptr : static_cast<const T*>(base) + elements;
}

// reference::compute over tokens [t0, t0 + tokens) and heads [h0, h0 + heads) of `a` (host pointers):
// the same arguments with the per-token and per-head pointers moved, which the reference reads as
// a problem of its own.
swa_decode::reference::Result reference_block(const DecodeArgs& a, int64_t t0, int64_t tokens, int64_t h0,
                                              int64_t heads) {
  DecodeArgs b = a;
  b.num_tokens = tokens;
  b.num_heads = heads;
  b.q = advanced<uint16_t>(a.q, t0 * a.stride_q_token + h0 * a.stride_q_head);
  b.attn_sink = advanced<float>(a.attn_sink, h0);
  b.indices = a.index_dtype == DType::kInt64 ? static_cast<const void*>(advanced<int64_t>(a.indices, t0 * a.stride_indices_token))
                                             : static_cast<const void*>(advanced<int32_t>(a.indices, t0 * a.stride_indices_token));
  b.lens = a.lens_dtype == DType::kInt64 ? static_cast<const void*>(advanced<int64_t>(a.lens, t0))
                                         : static_cast<const void*>(advanced<int32_t>(a.lens, t0));
  const swa_decode::KvSource& x = a.extra;
  b.extra.indices = x.index_dtype == DType::kInt64
                        ? static_cast<const void*>(advanced<int64_t>(x.indices, t0 * x.stride_indices_token))
                        : static_cast<const void*>(advanced<int32_t>(x.indices, t0 * x.stride_indices_token));
  b.extra.lens = x.lens_dtype == DType::kInt64 ? static_cast<const void*>(advanced<int64_t>(x.lens, t0))
                                               : static_cast<const void*>(advanced<int32_t>(x.lens, t0));
  b.out = nullptr;
  b.lse = nullptr;
  return swa_decode::reference::compute(b);
}

// The reference's out [H, D] and lse [H] of each token in `tokens`, in blocks of one token and 16
// heads spread over the host's cores.
struct TokenReference {
  std::vector<double> out, lse;
};
std::map<int64_t, TokenReference> reference_of(const DecodeArgs& a, const std::vector<int64_t>& tokens) {
  constexpr int64_t kHeadBlock = 16;
  const int64_t H = a.num_heads, D = a.head_dim;
  std::map<int64_t, TokenReference> refs;
  for (int64_t t : tokens) refs[t] = TokenReference{std::vector<double>(H * D), std::vector<double>(H)};
  std::vector<std::pair<int64_t, int64_t>> blocks;  // (token, first head)
  for (int64_t t : tokens) {
    for (int64_t h = 0; h < H; h += kHeadBlock) blocks.emplace_back(t, h);
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < blocks.size(); i = next++) {
      const auto [t, h0] = blocks[i];
      const int64_t heads = std::min(kHeadBlock, H - h0);
      const swa_decode::reference::Result r = reference_block(a, t, 1, h0, heads);
      TokenReference& ref = refs.at(t);  // distinct (token, head) elements per block: no race
      for (int64_t h = 0; h < heads; ++h) {
        ref.lse[h0 + h] = r.lse_at(0, h);
        for (int64_t d = 0; d < D; ++d) ref.out[(h0 + h) * D + d] = r.out_at(0, h, d);
      }
    }
  };
  const unsigned workers = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w) threads.emplace_back(work);
  for (std::thread& thread : threads) thread.join();
  return refs;
}

// ---- the check ----

// Largest |dequantized k| over token t's valid entries of both sources (0 for an empty token):
// the tolerance's scale (testing/check.h, Tolerance).
// s is the source's part of `host` (host itself for the window, host.extra for the extra source).
template <class Src>
double source_kmax(const DecodeArgs& host, const Src& s, Source source, int64_t limit, int64_t t) {
  const auto read_int = [](const void* base, DType dtype, int64_t i) {
    return dtype == DType::kInt64 ? static_cast<const int64_t*>(base)[i] : static_cast<const int32_t*>(base)[i];
  };
  const int64_t columns = swa_decode::columns_in_window(read_int(s.lens, s.lens_dtype, t), static_cast<int32_t>(limit));
  const int64_t num_slots = s.num_blocks * s.block_size;
  double kmax = 0.0;
  for (int64_t c = 0; c < columns; ++c) {
    const int64_t slot = read_int(s.indices, s.index_dtype, t * s.stride_indices_token + c);
    if (!swa_decode::slot_is_valid(slot, num_slots)) continue;
    for (const double v : st::host_row_values(host, source, slot)) kmax = std::max(kmax, std::fabs(v));
  }
  return kmax;
}

struct Report {
  int64_t compared_tokens = 0, nan = 0, gap_writes = 0, out_violations = 0, lse_violations = 0;
  double worst_over_tolerance = 0.0, err_sq = 0.0, ref_sq = 0.0;
  std::string failures;
  // The first few failing elements: the message is built only while there is room, so that a
  // broken kernel (every element NaN) does not cost a string per element.
  template <typename... Parts>
  void fail(const Parts&... parts) {
    if (failures.size() < 2000) failures += text(parts...) + "\n";
  }
};

// out and lse against the reference for the compared tokens, and over every token: nothing NaN
// (an unwritten element still holds the 0xFFFF poison, a NaN too) but in the NaN heads, nothing
// written between the [T, H, D] / [T, H] views.
Report check(const LayerCase& c, const DecodeArgs& host, const std::vector<uint16_t>& out_before,
             const std::vector<uint16_t>& out, const std::vector<float>& lse) {
  const int64_t T = host.num_tokens, H = host.num_heads, D = host.head_dim;
  std::vector<int64_t> tokens;
  if (c.compared.empty()) {
    for (int64_t t = 0; t < T; ++t) tokens.push_back(t);
  } else {
    for (const auto& [begin, end] : c.compared) {
      for (int64_t t = begin; t < end; ++t) tokens.push_back(t);
    }
  }
  const std::map<int64_t, TokenReference> refs = reference_of(host, tokens);
  const auto nan_head = [&](int64_t h) { return std::find(c.nan_heads.begin(), c.nan_heads.end(), h) != c.nan_heads.end(); };
  Report r;
  r.compared_tokens = static_cast<int64_t>(tokens.size());
  for (int64_t t : tokens) {
    const double kmax = std::max(source_kmax(host, host, Source::kWindow, host.window_size, t),
                                 source_kmax(host, host.extra, Source::kExtra, host.extra.max_entries, t));
    const TokenReference& ref = refs.at(t);
    for (int64_t h = 0; h < H; ++h) {
      if (nan_head(h)) continue;
      for (int64_t d = 0; d < D; ++d) {
        const double want = ref.out[h * D + d];
        const double got = swa_decode::reference::bf16_to_float(out[t * host.stride_out_token + h * host.stride_out_head + d]);
        const double err = std::fabs(got - want);
        const double tolerance = 0x1.0p-8 * std::fabs(want) + 0x1.0p-6 * kmax;
        const bool ok = kmax == 0.0 ? got == 0.0 : err <= tolerance;  // an empty token: exactly 0
        if (kmax > 0.0) r.worst_over_tolerance = std::max(r.worst_over_tolerance, err / tolerance);
        r.err_sq += err * err;
        r.ref_sq += want * want;
        if (!ok) {
          ++r.out_violations;
          r.fail("out[", t, "][", h, "][", d, "] = ", got, ", want ", want, " (kmax ", kmax, ")");
        }
      }
      if (lse.empty()) continue;
      const double want = ref.lse[h];
      const double got = lse[t * host.stride_lse_token + h];
      const bool ok = std::isinf(want) ? got == want : std::fabs(got - want) <= 1e-3 * std::max(1.0, std::fabs(want));
      if (!ok) {
        ++r.lse_violations;
        r.fail("lse[", t, "][", h, "] = ", got, ", want ", want);
      }
    }
  }
  std::vector<bool> in_out_view(out.size(), false), in_lse_view(lse.size(), false);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      if (!lse.empty()) {
        in_lse_view[t * host.stride_lse_token + h] = true;
        if (!nan_head(h) && std::isnan(lse[t * host.stride_lse_token + h])) {
          ++r.nan;
          r.fail("lse[", t, "][", h, "] is NaN");
        }
      }
      for (int64_t d = 0; d < D; ++d) {
        const int64_t i = t * host.stride_out_token + h * host.stride_out_head + d;
        in_out_view[i] = true;
        if (!nan_head(h) && (out[i] & 0x7FFF) > 0x7F80) {
          ++r.nan;
          r.fail("out[", t, "][", h, "][", d, "] is NaN or unwritten");
        }
      }
    }
  }
  for (size_t i = 0; i < out.size(); ++i) r.gap_writes += !in_out_view[i] && out[i] != out_before[i];
  for (size_t i = 0; i < lse.size(); ++i) r.gap_writes += !in_lse_view[i] && !std::isnan(lse[i]);
  return r;
}

// Whether a report passes, the rel-L2 bar included (issue 2's 1e-2, as testing/check.h).
double rel_l2(const Report& r) { return r.ref_sq > 0.0 ? std::sqrt(r.err_sq / r.ref_sq) : 0.0; }
void expect_passes(const Report& r) {
  EXPECT_EQ(r.out_violations, 0) << r.failures;
  EXPECT_EQ(r.lse_violations, 0) << r.failures;
  EXPECT_EQ(r.nan, 0) << r.failures;
  EXPECT_EQ(r.gap_writes, 0) << "writes outside the out / lse views";
  EXPECT_LE(rel_l2(r), 1e-2);
}

// ---- the fixture ----

class GpuSm90Layer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!st::cuda_device_available()) GTEST_SKIP() << "no CUDA device: GPU tests skipped";
    int device = 0, major = 0, minor = 0;
    SWAD_TESTING_CUDA_CHECK(cudaGetDevice(&device));
    SWAD_TESTING_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    SWAD_TESTING_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major != 9 || minor != 0) GTEST_SKIP() << "the sm90 layer kernel runs on compute capability 9.0 only";
    if (!swa_decode::sm90_kernel_built()) GTEST_SKIP() << "this build has no sm_90a kernel";
  }

  // One case: draw, copy, decode on the layer kernel, check.
  void run_case(const LayerCase& c) {
    SCOPED_TRACE(text("T=", c.tokens, " H=", c.heads, " W=", c.window.limit, " X=", c.extra.limit, " seed=", c.seed));
    HostProblem p(problem_shape(c), c.seed);
    build_problem(p, c);
    DecodeArgs host = p.args();
    if (!c.with_lse) host.lse = nullptr;
    st::Stream stream;
    // Uploaded and synchronized before it returns: the decode runs on a non-blocking stream that
    // would not wait for copies on the legacy stream.
    const st::DeviceArgs device(host, stream.get());
    const swa_decode::SupportInfo support = swa_decode::query_support_for_kernel(device.args(), KernelId::kSm90Wgmma);
    ASSERT_TRUE(support.supported) << support.why_not;
    if (c.kernel.empty()) {
      EXPECT_EQ(support.kernel.rfind("sm90_wgmma_layer", 0), 0u) << support.kernel;
    } else {
      EXPECT_EQ(support.kernel, c.kernel);
    }
    if (c.through_graph) {
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      SWAD_TESTING_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
      const swa_decode::Status status = swa_decode::decode_with_kernel(device.args(), KernelId::kSm90Wgmma);
      SWAD_TESTING_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
      ASSERT_TRUE(status.ok()) << status.message;
      SWAD_TESTING_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      SWAD_TESTING_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
      stream.synchronize();
      SWAD_TESTING_CUDA_CHECK(cudaGraphExecDestroy(exec));
      SWAD_TESTING_CUDA_CHECK(cudaGraphDestroy(graph));
    } else {
      const swa_decode::Status status = swa_decode::decode_with_kernel(device.args(), KernelId::kSm90Wgmma);
      ASSERT_TRUE(status.ok()) << status.message;
      stream.synchronize();
    }
    const Report r = check(c, host, p.out_buffer(), device.out(), device.lse());
    expect_passes(r);
    std::printf("  %lld tokens compared, worst error / tolerance %.3f, rel L2 %.2e\n",
                static_cast<long long>(r.compared_tokens), r.worst_over_tolerance, rel_l2(r));
  }
};

// Extra lengths around the tile size (128 columns), up to C128A at 1M context (8192), each with a
// full window and an empty one.
TEST_F(GpuSm90Layer, ExtraEntryCounts) {
  LayerCase c = layer_case(0, 64, {.limit = 8192, .num_blocks = 64, .block_size = 64}, {0.5f, -1.0f, 2.0f}, 11);
  for (const int64_t extra_len : {0, 1, 127, 128, 129, 512, 1000, 8192}) {
    for (const int64_t window_len : {128, 0}) {
      c.window.lens.push_back(window_len);
      c.extra.lens.push_back(extra_len);
    }
  }
  c.tokens = static_cast<int64_t>(c.window.lens.size());
  run_case(c);
}

// Below a wave of items the layer kernel splits each token's columns over 2-8 CTAs (pairs) of a
// cluster (KeySplit, sm90_layer_plan.h: whole subtiles a share, window first): shares that end in
// the window, straddle it, hold nothing (fewer columns than shares) or a lone column; once
// replayed from a CUDA graph; then the same tokens 10 times over (70: more items than 132 SMs
// hold at one wave), which the persistent kernel runs without a split.
TEST_F(GpuSm90Layer, KeySplitShares) {
  const std::pair<int64_t, int64_t> lens[] = {{128, 0}, {0, 64}, {1, 0}, {64, 65}, {100, 700}, {128, 1024}, {0, 0}};
  for (const int64_t heads : {128, 64}) {
    for (const int repeats : {1, 10}) {
      for (const bool graph : {false, true}) {
        if (repeats > 1 && graph) continue;
        LayerCase c = layer_case(0, heads, {.limit = 1024, .num_blocks = 400, .block_size = 64}, {0.5f, -kInf, 3.0f},
                                 1300 + static_cast<uint64_t>(heads) + (graph ? 1 : 0) + 10 * repeats);
        for (int r = 0; r < repeats; ++r) {
          for (const auto& [window_len, extra_len] : lens) {
            c.window.lens.push_back(window_len);
            c.extra.lens.push_back(extra_len);
          }
        }
        c.tokens = static_cast<int64_t>(c.window.lens.size());
        c.through_graph = graph;
        c.kernel = repeats > 1 ? "sm90_wgmma_layer" : heads > 64 ? "sm90_wgmma_layer_split4" : "sm90_wgmma_layer_split8";
        SCOPED_TRACE(text("H=", heads, " T=", c.tokens, graph ? " graph" : ""));
        run_case(c);
      }
    }
  }
}

// H = 1, 16 and 64 run one item (64 heads, zero rows past H) per token; 65 and 128 two, the second
// slab partly empty at 65. Every edge case mixed in, the dtypes varied with H.
class GpuSm90LayerHeads : public GpuSm90Layer, public ::testing::WithParamInterface<int64_t> {};

TEST_P(GpuSm90LayerHeads, MixedEdgeCases) {
  const int64_t heads = GetParam();
  LayerCase c = layer_case(12, heads, {.limit = 600, .num_blocks = 24, .block_size = 32}, {1.0f, -0.5f, 3.0f, -kInf},
                           100 + static_cast<uint64_t>(heads));
  c.window.lens = {128, 0, -1, 1, 127, 129, 64, 128, 5, 300, 128, 100};
  c.extra.lens = {600, 1, 0, 129, -1, 700, 256, 333, 128, 599, 0, 40};
  for (SourceSpec* s : {&c.window, &c.extra}) {
    s->holes = 0.1;
    s->out_of_range = 0.05;
    s->duplicates = 0.1;
  }
  const bool wide = heads % 2 == 1;
  c.window.index_dtype = wide ? DType::kInt64 : DType::kInt32;
  c.extra.index_dtype = wide ? DType::kInt32 : DType::kInt64;
  c.extra.lens_dtype = heads >= 64 ? DType::kInt64 : DType::kInt32;
  c.window.inv_scale_dtype = heads >= 64 ? DType::kFloat32 : DType::kBFloat16;
  c.extra.inv_scale_dtype = heads == 16 || heads == 128 ? DType::kFloat32 : DType::kBFloat16;
  run_case(c);
}

INSTANTIATE_TEST_SUITE_P(Heads, GpuSm90LayerHeads, ::testing::Values(1, 16, 64, 65, 128),
                         [](const ::testing::TestParamInfo<int64_t>& info) { return text("H", info.param); });

// Tokens with entries in one source only, in neither, and with index columns that hold no entry:
// all holes, all ids out of range, a whole 128-column tile of holes between two with entries, and
// a last tile of holes. A token without entries gets out 0 and lse -inf whatever the sink.
TEST_F(GpuSm90Layer, EmptyAndOneSidedTokens) {
  for (const int64_t heads : {16, 128}) {
    LayerCase c = layer_case(0, heads, {.limit = 400, .num_blocks = 16, .block_size = 64}, {kInf, -kInf, 0.0f, 4.0f},
                             200 + static_cast<uint64_t>(heads));
    // token:          0    1   2    3   4   5   6    7    8    9    10   11
    c.window.lens = {0, -1, 128, 50, 0, -1, 128, 128, 90, 128, 0, 128};
    c.extra.lens = {300, 200, 0, -1, 0, -1, 300, 400, 384, 300, 400, 0};
    c.tokens = static_cast<int64_t>(c.window.lens.size());
    c.id_runs = {
        {6, Source::kWindow, 0, 128, -1},   // 6: every column a hole or past its pool
        {6, Source::kExtra, 0, 300, 1 << 30},
        {7, Source::kExtra, 128, 256, -1},  // 7: the middle extra tile holds nothing
        {8, Source::kExtra, 256, 384, -1},  // 8: the last extra tile holds nothing
        {9, Source::kWindow, 0, 128, -1},   // 9: extra entries only, behind a window of holes
        {10, Source::kExtra, 0, 400, -1},   // 10: nothing at all, in 4 tiles of holes
        {11, Source::kWindow, 0, 128, -5},  // 11: nothing at all, one tile of negative ids
    };
    run_case(c);
  }
}

// kModel1 rows (448 e4m3 bytes with 7 power-of-two scales in the block's footer, 64 bf16 RoPE
// values) in either source or both, beside seed rows in the other: the layer kernel dequantizes
// each subtile by its source's format. Blocks of 2 (C128A's compressed cache) and 64, holes,
// duplicates and ids out of range, every unused row and footer poisoned.
TEST_F(GpuSm90Layer, Model1RowsInEitherSource) {
  using swa_decode::KvFormat;
  for (const auto& [window_format, extra_format] :
       std::vector<std::pair<KvFormat, KvFormat>>{{KvFormat::kModel1, KvFormat::kE4m3},
                                                  {KvFormat::kE4m3, KvFormat::kModel1},
                                                  {KvFormat::kModel1, KvFormat::kModel1}}) {
    for (const int64_t heads : {16, 128}) {
      LayerCase c = layer_case(9, heads, {.limit = 700, .num_blocks = 512, .block_size = 2, .holes = 0.05,
                                          .out_of_range = 0.05, .duplicates = 0.1},
                               {0.5f, -1.0f}, 500 + static_cast<uint64_t>(heads));
      c.window.format = window_format;
      c.extra.format = extra_format;
      c.window.holes = 0.05;
      c.window.duplicates = 0.1;
      c.window.lens = {128, 0, 100, 128, 1, 64, 65, 128, -1};
      c.extra.lens = {700, 300, 0, 1, 129, 64, 65, 640, 700};
      SCOPED_TRACE(text("window ", window_format == KvFormat::kModel1 ? "model1" : "seed", ", extra ",
                        extra_format == KvFormat::kModel1 ? "model1" : "seed", ", H ", heads));
      run_case(c);
    }
  }
}

// Both sources name one cache and one set of scales, the extra ids repeating window slots: a slot
// named twice in the window and once in the extra source is three entries.
TEST_F(GpuSm90Layer, BothSourcesShareOneCache) {
  LayerCase c = layer_case(10, 64, {.limit = 512, .holes = 0.05, .duplicates = 0.5}, {0.0f, 1.5f}, 300);
  c.shared_cache = true;
  c.window.num_blocks = 8;  // 512 slots for up to 128 + 512 entries a token: many repeats
  c.window.duplicates = 0.2;
  run_case(c);
}

// Lengths of -1, 0, 1, the limit, past the limit (both sources; int64 lengths hold values an int32
// would not), with in-range ids of poisoned slots in every column past the length and the limit.
TEST_F(GpuSm90Layer, LengthsPastTheLimits) {
  LayerCase c = layer_case(8, 32, {.limit = 256, .lens_dtype = DType::kInt64}, {-2.0f}, 400);
  c.window.limit = 96;
  c.window.lens_dtype = DType::kInt64;
  c.window.lens = {-1, 0, 1, 96, 97, int64_t{1} << 40, 50, 96};
  c.extra.lens = {256, 257, int64_t{1} << 35, -1, 0, 1, -(int64_t{1} << 40), 255};
  run_case(c);
}

// Sinks of +inf (out 0, lse unchanged), -inf and finite values across the heads of one slab; then
// no sink at all and no lse, captured in a CUDA graph (the launch allocates and synchronizes nothing).
TEST_F(GpuSm90Layer, SinksAndNoLse) {
  LayerCase c = layer_case(6, 64, {.limit = 300}, {kInf, -kInf, 0.0f, 3.5f, -1.0f, 8.0f, 20.0f, -20.0f}, 500);
  run_case(c);
  c.sinks.clear();
  c.with_lse = false;
  c.through_graph = true;
  c.seed = 501;
  run_case(c);
}

// The index, length and scale dtypes of the two sources chosen independently: each one both ways.
TEST_F(GpuSm90Layer, IndexLengthAndScaleDtypesOfEachSource) {
  struct Dtypes {
    DType index, lens, scale;
  };
  const Dtypes narrow{DType::kInt32, DType::kInt32, DType::kBFloat16};
  const Dtypes wide{DType::kInt64, DType::kInt64, DType::kFloat32};
  const Dtypes mixed_a{DType::kInt64, DType::kInt32, DType::kBFloat16};
  const Dtypes mixed_b{DType::kInt32, DType::kInt64, DType::kFloat32};
  const std::pair<Dtypes, Dtypes> combos[] = {{narrow, wide}, {wide, narrow}, {mixed_a, mixed_b}, {mixed_b, mixed_a}};
  uint64_t seed = 600;
  for (const auto& [w, x] : combos) {
    LayerCase c = layer_case(8, 16, {.limit = 300, .index_dtype = x.index, .lens_dtype = x.lens, .inv_scale_dtype = x.scale},
                             {1.0f}, seed++);
    c.window.index_dtype = w.index;
    c.window.lens_dtype = w.lens;
    c.window.inv_scale_dtype = w.scale;
    c.extra.holes = c.window.holes = 0.05;
    run_case(c);
  }
}

// More work items than CTAs (T = 300: 600 items at H = 128, 300 at H = 64, on at most one CTA per
// SM): every CTA walks several items and carries q, the records and the barrier phases from one to
// the next. Three token ranges are compared; every token is checked for NaN.
TEST_F(GpuSm90Layer, SeveralItemsPerCta) {
  for (const int64_t heads : {128, 64}) {
    LayerCase c = layer_case(300, heads, {.limit = 256, .num_blocks = 32, .block_size = 64}, {0.25f, -kInf},
                             700 + static_cast<uint64_t>(heads));
    c.window.holes = c.extra.holes = 0.05;
    c.extra.duplicates = 0.05;
    c.compared = {{0, 6}, {147, 153}, {294, 300}};
    run_case(c);
  }
}

// Tokens of very different work (0 to 1500 extra entries, a few ten times the rest), more than one
// per CTA: the kernel sorts them by cost and deals them out largest first (sm90_layer_schedule.cuh),
// so no token may be run twice, skipped or mixed up with one of equal cost. Every token compared.
TEST_F(GpuSm90Layer, TokensOfUnequalWorkInCostOrder) {
  for (const int64_t heads : {128, 64}) {
    LayerCase c = layer_case(0, heads, {.limit = 1500, .num_blocks = 64, .block_size = 64}, {0.5f, -kInf},
                             1200 + static_cast<uint64_t>(heads));
    for (int64_t t = 0; t < 280; ++t) {
      c.window.lens.push_back(t % 5 == 0 ? 0 : t % 3 == 0 ? 40 : 128);
      c.extra.lens.push_back(t % 23 == 0 ? 1500 : t % 4 == 0 ? 0 : t % 4 == 1 ? 64 : t % 4 == 2 ? 300 : 65);
    }
    c.tokens = static_cast<int64_t>(c.window.lens.size());
    c.extra.holes = 0.05;
    run_case(c);
  }
}

// More tokens than the ranked order takes (kMaxRankedTokens = 1152: a bitonic sort) and than the
// sort takes (kMaxSortedTokens = 16384: round robin again), with lengths of unequal work. Three
// token ranges compared; every token checked for NaN.
TEST_F(GpuSm90Layer, ManyTokens) {
  for (const int64_t tokens : {2000, 16500}) {
    LayerCase c = layer_case(tokens, 1, {.limit = 300, .num_blocks = 8, .block_size = 64}, {1.0f},
                             1300 + static_cast<uint64_t>(tokens));
    c.window.num_blocks = 8;
    c.extra.lens = {0, 300, 5, 64, 129, 0, 0, 17};
    c.compared = {{0, 4}, {tokens / 2 - 2, tokens / 2 + 2}, {tokens - 4, tokens}};
    run_case(c);
  }
}

// The largest extra source (kMaxExtraEntries = 16384 columns, 128 tiles) at H = 128.
TEST_F(GpuSm90Layer, LargestExtraSource) {
  LayerCase c = layer_case(3, 128, {.limit = swa_decode::kMaxExtraEntries, .num_blocks = 64, .block_size = 64},
                           {1.0f, -1.0f}, 800);
  c.extra.lens = {swa_decode::kMaxExtraEntries, 9000, 0};
  c.window.lens = {128, 0, 128};
  c.extra.holes = 0.02;
  c.compared = {{0, 2}};
  run_case(c);
}

// q of some heads NaN (engines pass uninitialized padding heads): every other head, in the same
// warp, warpgroup, slab and CTA, must come out as if they were not there.
TEST_F(GpuSm90Layer, NanHeadsStayInTheirRows) {
  LayerCase c = layer_case(6, 128, {.limit = 400}, {0.5f}, 900);
  c.nan_heads = {5, 64, 100, 127};
  run_case(c);
}

// Padded rows in both caches (576- and 592-byte strides, padded blocks), q and out with padded
// head and token strides, head-major q, lse with a padded token stride.
TEST_F(GpuSm90Layer, StridedTensors) {
  for (const bool head_major : {false, true}) {
    LayerCase c = layer_case(8, 64, {.limit = 300, .kv_token_pad = 80, .kv_block_pad = 16}, {2.0f}, 1000 + head_major);
    c.window.kv_token_pad = 64;
    c.window.kv_block_pad = 32;
    c.head_major_q = head_major;
    c.q_head_pad = 64;
    c.q_token_pad = 8;
    c.out_head_pad = 8;
    c.out_token_pad = 16;
    c.lse_pad = 3;
    c.window.holes = c.extra.holes = 0.1;
    run_case(c);
  }
}

// ---- the harness itself, on the CPU backend (runs without a GPU) ----

// A case of each kind above, small enough for the CPU backend: tokens with entries in one source,
// in neither, tiles of holes, one cache for both, sinks of +-inf.
LayerCase harness_case(bool shared_cache) {
  LayerCase c = layer_case(6, 8, {.limit = 300, .num_blocks = 8, .block_size = 32}, {kInf, -kInf, 1.0f}, 1100 + shared_cache);
  c.shared_cache = shared_cache;
  c.window.lens = {0, 128, 60, -1, 128, 128};
  c.extra.lens = {300, 0, 1, -1, 300, 129};
  // Token 1: a window of holes; 4: a middle extra tile of holes; 5: a window of holes before extra entries.
  c.id_runs = {{1, Source::kWindow, 0, 128, -1}, {4, Source::kExtra, 128, 256, -1}, {5, Source::kWindow, 0, 128, -1}};
  c.window.duplicates = c.extra.duplicates = 0.1;
  c.window.holes = c.extra.holes = 0.1;
  c.extra.out_of_range = 0.05;
  c.out_head_pad = 8;
  c.lse_pad = 2;
  return c;
}

struct CpuRun {
  std::vector<uint16_t> out_before, out;
  std::vector<float> lse;
};
CpuRun run_on_cpu_backend(HostProblem& p, const DecodeArgs& host) {
  CpuRun run{.out_before = p.out_buffer(), .out = {}, .lse = {}};
  const swa_decode::Status status = swa_decode::decode(host);
  EXPECT_TRUE(status.ok()) << status.message;
  run.out = p.out_buffer();
  run.lse = p.lse_buffer();
  return run;
}

TEST(Sm90LayerHarness, CpuBackendPassesTheCheck) {
  for (const bool shared_cache : {false, true}) {
    const LayerCase c = harness_case(shared_cache);
    HostProblem p(problem_shape(c), c.seed);
    build_problem(p, c);
    const DecodeArgs host = p.args();
    ASSERT_TRUE(swa_decode::query_support(host).supported);
    const CpuRun run = run_on_cpu_backend(p, host);
    const Report r = check(c, host, run.out_before, run.out, run.lse);
    expect_passes(r);
    EXPECT_EQ(r.compared_tokens, c.tokens);
    EXPECT_GT(r.worst_over_tolerance, 0.0) << "the outputs were compared";
    // Tokens 1 and 3 have no entry in either source; 0 and 5 (extra only), 2 and 4 (both) do.
    EXPECT_EQ(run.lse[1 * host.stride_lse_token], -kInf);
    EXPECT_EQ(run.lse[3 * host.stride_lse_token], -kInf);
    EXPECT_TRUE(std::isfinite(run.lse[5 * host.stride_lse_token]));
  }
}

TEST(Sm90LayerHarness, CheckCatchesWrongNanAndStrayOutputs) {
  const LayerCase c = harness_case(false);
  HostProblem p(problem_shape(c), c.seed);
  build_problem(p, c);
  const DecodeArgs host = p.args();
  const CpuRun good = run_on_cpu_backend(p, host);
  const int64_t D = kHeadDim;

  CpuRun wrong = good;  // token 2, head 1, dim 7 moved by far more than its tolerance
  const int64_t at = 2 * host.stride_out_token + 1 * host.stride_out_head + 7;
  wrong.out[at] = st::float_to_bf16_bits(swa_decode::reference::bf16_to_float(good.out[at]) + 1.0f);
  EXPECT_EQ(check(c, host, wrong.out_before, wrong.out, wrong.lse).out_violations, 1);

  CpuRun not_zero = good;  // token 1 has no entry: its out must be exactly 0
  not_zero.out[1 * host.stride_out_token + 3] = st::float_to_bf16_bits(1e-6f);
  EXPECT_EQ(check(c, host, not_zero.out_before, not_zero.out, not_zero.lse).out_violations, 1);

  CpuRun unwritten = good;  // the poison left in an element of a token that is not compared
  unwritten.out[4 * host.stride_out_token + 2 * host.stride_out_head + D - 1] = st::kBf16PoisonBits;
  LayerCase some_tokens = c;
  some_tokens.compared = {{0, 2}};
  EXPECT_EQ(check(some_tokens, host, unwritten.out_before, unwritten.out, unwritten.lse).nan, 1);

  CpuRun stray = good;  // between head 0 and head 1 (out head stride D + 8), and in lse's padding
  stray.out[D + 2] = 0;
  stray.lse[c.heads] = 0.0f;
  EXPECT_EQ(check(c, host, stray.out_before, stray.out, stray.lse).gap_writes, 2);

  CpuRun bad_lse = good;
  bad_lse.lse[5 * host.stride_lse_token + 2] += 0.1f;
  EXPECT_EQ(check(c, host, bad_lse.out_before, bad_lse.out, bad_lse.lse).lse_violations, 1);
}

// The columns a token must not read name slots that stay poisoned: a kernel that read one more
// column of either source (here, the reference told so by a longer length) turns the output NaN.
TEST(Sm90LayerHarness, ColumnsPastTheLengthArePoisoned) {
  for (const Source source : {Source::kWindow, Source::kExtra}) {
    const LayerCase c = harness_case(false);
    HostProblem p(problem_shape(c), c.seed);
    build_problem(p, c);
    p.set_len(2, source == Source::kWindow ? 61 : 2, source);  // token 2: 60 window columns, 1 extra column
    const DecodeArgs host = p.args();
    const swa_decode::reference::Result r = swa_decode::reference::compute(host);
    // Head 1: its sink is -inf (head 0's +inf sink would give 0 whatever the entries).
    EXPECT_TRUE(std::isnan(r.out_at(2, 1, 0))) << "column past the length of source " << static_cast<int>(source);
    EXPECT_TRUE(std::isnan(r.lse_at(2, 0)));
  }
}

}  // namespace
