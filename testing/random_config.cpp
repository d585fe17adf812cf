#include "testing/random_config.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "src/api/validate.h"
#include "testing/check.h"
#include "testing/host_numerics.h"

namespace swa_decode::testing {
namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kTwoTo32 = int64_t{1} << 32;
// A configuration's kModel1 draws come from a stream of their own (ConfigSpace::model1_share).
constexpr uint64_t kFormatStream = 0x3D0D'E11F'0A3A'7B01ull;

// Sizes where the kernels change behaviour: 16-head mma groups and 32-head two-group CTAs; 32-key
// tiles, the portable split's 4 tiles (W >= 97) and sm90's whole window (128); block sizes of one
// row, of a tile, of DeepSeek-V4 serving (256) and the largest.
const std::vector<int64_t> kSpecialHeads = {1, 2, 15, 16, 17, 31, 32, 33, 64, 65, 96, 97, 112, 127, 128};
const std::vector<int64_t> kSpecialWindows = {1, 2, 31, 32, 33, 96, 97, 127, 128, 129, 255, 256, 512, 1023, 1024};
const std::vector<int64_t> kSpecialBlockSizes = {1, 2, 16, 32, 64, 256, 1024};
// Extra sources: entry limits around the tile sizes a kernel walks them in and DeepSeek-V4's 512
// and 1024 top-k; block sizes of FlashMLA's C128A (2) and C4A (64) caches.
const std::vector<int64_t> kSpecialExtraEntries = {1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 512, 1023, 1024, 2048, 4096};
const std::vector<int64_t> kSpecialExtraBlockSizes = {1, 2, 4, 16, 64, 128, 256};

// Integer log-uniform in [lo, hi]: every octave as likely as every other.
int64_t log_uniform(Rng& rng, int64_t lo, int64_t hi) {
  const double log_lo = std::log(static_cast<double>(lo));
  const double log_hi = std::log(static_cast<double>(hi) + 1.0);
  return std::clamp<int64_t>(static_cast<int64_t>(std::exp(log_lo + rng.uniform() * (log_hi - log_lo))), lo, hi);
}

bool coin(Rng& rng, double p) { return rng.uniform() < p; }

// One of `special` within [lo, hi] with probability 0.3, else log-uniform in [lo, hi].
int64_t draw_size(Rng& rng, int64_t lo, int64_t hi, const std::vector<int64_t>& special) {
  std::vector<int64_t> usable;
  for (int64_t v : special) {
    if (v >= lo && v <= hi) usable.push_back(v);
  }
  if (!usable.empty() && coin(rng, 0.3)) return usable[rng.uniform_int(0, static_cast<int64_t>(usable.size()) - 1)];
  return log_uniform(rng, lo, hi);
}

// A padding of 1 to max_elements / unit whole units (at least one unit), or 0 half the time.
int64_t padding(Rng& rng, int64_t unit, int64_t max_elements) {
  return unit * rng.uniform_int(1, std::max<int64_t>(1, max_elements / unit));
}
int64_t maybe_padding(Rng& rng, int64_t unit, int64_t max_elements) {
  return coin(rng, 0.5) ? padding(rng, unit, max_elements) : 0;
}

// The strides one misaligned draw breaks (only dimensions of size > 1 count, as in the API).
enum class Misaligned { kNone, kKvToken, kKvBlock, kQHead, kQToken, kOutHead, kOutToken };

Misaligned pick_misaligned(Rng& rng, int64_t tokens, int64_t heads, int64_t block_size) {
  Misaligned options[6] = {Misaligned::kKvBlock};  // the pool always has >= 2 blocks
  int count = 1;
  if (block_size > 1) options[count++] = Misaligned::kKvToken;
  if (heads > 1) {
    options[count++] = Misaligned::kQHead;
    options[count++] = Misaligned::kOutHead;
  }
  if (tokens > 1) {
    options[count++] = Misaligned::kQToken;
    options[count++] = Misaligned::kOutToken;
  }
  return options[rng.uniform_int(0, count - 1)];
}

int64_t token_lens(Rng& rng, int64_t context, int64_t window, DType lens_dtype) {
  const bool wide = lens_dtype == DType::kInt64;
  const double u = rng.uniform();
  if (u < 0.40) return std::min(context, window);  // what a serving engine writes
  if (u < 0.48) return 0;
  if (u < 0.56) {  // negative: -1 padding rows, others, the most negative, and for int64 lengths
                   // -2^32 + k, which a kernel narrowing to int32 would read as k
    const double v = rng.uniform();
    if (v < 0.45) return -1;
    if (v < 0.70) return -rng.uniform_int(2, 1000000);
    if (v < 0.85 || !wide) return wide ? kInt64Min : kInt32Min;
    return -kTwoTo32 + rng.uniform_int(1, window);
  }
  if (u < 0.68) return std::max<int64_t>(0, window + rng.uniform_int(-1, 1));
  if (u < 0.78) return rng.uniform_int(1, window);
  if (u < 0.88) return rng.uniform_int(window + 2, 3 * window + 10);
  // Huge: INT32_MAX, and for int64 INT64_MAX and 2^32 + k (k once narrowed to int32).
  if (!wide) return kInt32Max;
  const double v = rng.uniform();
  if (v < 0.34) return kInt32Max;
  if (v < 0.67) return kInt64Max;
  return kTwoTo32 + rng.uniform_int(0, window);
}

// Per-head q magnitudes and an inv_scale magnitude (powers of two: exact in bf16) across the range
// the f16 path rescales, with the scale keeping the largest heads' scores at a few units.
void draw_magnitudes(Rng& rng, BatchOptions& o) {
  const int64_t count = rng.uniform_int(1, 6);
  int max_exponent = std::numeric_limits<int>::min();
  for (int64_t i = 0; i < count; ++i) {
    const int exponent = static_cast<int>(rng.uniform_int(-30, 24));
    max_exponent = std::max(max_exponent, exponent);
    o.q_magnitudes.push_back(std::ldexp(1.0, exponent));
  }
  const int scale_exponent = static_cast<int>(rng.uniform_int(-20, 12));
  o.inv_scale_magnitude = std::ldexp(1.0, scale_exponent);
  const double default_scale = 1.0 / std::sqrt(static_cast<double>(o.head_dim));
  o.scale = static_cast<float>(std::ldexp(default_scale, -max_exponent - scale_exponent));
}

// An extra source for a drawn configuration (after every other draw, so that a configuration
// without one is what it was before extra sources existed): its own pool or the window's, every
// dtype, strides in `kv_unit` bytes, C128A-like (every compressed position) or C4A-like (a top-k
// of them) entries, lengths from every class token_lens draws, holes, duplicates within and across
// the sources, ids past its slots, garbage past its entries, and CUDA-graph padding rows.
void draw_extra(Rng& rng, const ConfigSpace& space, int64_t kv_unit, BatchOptions& o) {
  ExtraOptions x;
  const int64_t T = o.num_tokens, D = o.head_dim;
  x.max_entries = draw_size(rng, 1, space.max_extra_entries, kSpecialExtraEntries);
  x.index_cols = x.max_entries + (coin(rng, 0.5) ? rng.uniform_int(1, 64) : 0);
  x.index_row_pad = coin(rng, 0.3) ? rng.uniform_int(1, 7) : 0;
  x.shares_window_cache = coin(rng, 0.15);
  x.block_size = draw_size(rng, 1, space.max_extra_block_size, kSpecialExtraBlockSizes);
  x.kv_row_stride = D + (coin(rng, 0.6) ? padding(rng, kv_unit, 96) : 0);
  x.kv_block_pad = maybe_padding(rng, kv_unit, 256);
  x.index_dtype = coin(rng, 0.5) ? DType::kInt32 : DType::kInt64;
  x.lens_dtype = coin(rng, 0.5) ? DType::kInt32 : DType::kInt64;
  x.inv_scale_dtype = coin(rng, 0.5) ? DType::kBFloat16 : DType::kFloat32;
  const bool every_position = coin(rng, 0.4);
  x.top_k = every_position ? 0 : rng.uniform_int(1, x.index_cols);
  // A shared cache's entries are context positions (compress_ratio 1 or 4 of them); an own pool's
  // positions are drawn: up to index_cols when all of them are entries, up to 4 X for a top-k.
  x.compress_ratio = x.shares_window_cache && coin(rng, 0.5) ? 4 : 1;
  for (int64_t t = 0; t < T; ++t) {
    int64_t positions;
    if (x.shares_window_cache) {
      positions = std::min(o.context_lens[t] / x.compress_ratio, every_position ? x.index_cols : kInt64Max);
    } else {
      positions = coin(rng, 0.08) ? 0 : log_uniform(rng, 1, every_position ? x.index_cols : 4 * x.max_entries);
    }
    x.positions.push_back(positions);
    const int64_t entries = every_position ? positions : std::min(x.top_k, positions);
    x.lens.push_back(token_lens(rng, entries, x.max_entries, x.lens_dtype));
  }
  x.hole_fraction = coin(rng, 0.4) ? 0.3 * rng.uniform() : 0.0;
  x.duplicate_fraction = coin(rng, 0.3) ? 0.3 * rng.uniform() : 0.0;
  x.out_of_range_fraction = coin(rng, 0.4) ? 0.25 * rng.uniform() : 0.0;
  x.all_invalid_fraction = coin(rng, 0.2) ? 0.4 * rng.uniform() : 0.0;
  x.garbage_past_entries = coin(rng, 0.6);
  x.cross_duplicate_fraction = x.shares_window_cache && coin(rng, 0.6) ? 0.3 * rng.uniform() : 0.0;
  o.extra = x;
  if (coin(rng, 0.15)) o.padding_row_fraction = 0.3 * rng.uniform();
}

// The kModel1 sources of a configuration drawn as one (ConfigSpace::model1_share): one of the
// window, the extra source's own pool or both at random; the window whenever there is no extra
// source or it shares the window's cache (it then has the window's format). Each gets 576-byte
// rows and FlashMLA's padded block plus 1..3 whole rows of bytes half the time; the strides drawn
// for kE4m3 rows are dropped.
void draw_model1_sources(Rng& rng, BatchOptions& o) {
  ExtraOptions* own_extra = o.extra && !o.extra->shares_window_cache ? &*o.extra : nullptr;
  enum Which : int64_t { kWindowOnly = 0, kExtraOnly = 1, kBoth = 2 };
  const int64_t which = own_extra == nullptr ? kWindowOnly : rng.uniform_int(kWindowOnly, kBoth);
  auto model1_layout = [&](KvFormat& format, int64_t& row_stride, int64_t& block_pad) {
    format = KvFormat::kModel1;
    row_stride = kModel1RowBytes;
    block_pad = coin(rng, 0.5) ? kModel1RowBytes * rng.uniform_int(1, 3) : 0;
  };
  if (which != kExtraOnly) model1_layout(o.kv_format, o.kv_row_stride, o.kv_block_pad);
  if (which != kWindowOnly) model1_layout(own_extra->format, own_extra->kv_row_stride, own_extra->kv_block_pad);
}

const char* class_name(ShapeClass c) {
  switch (c) {
    case ShapeClass::kGeneral: return "general";
    case ShapeClass::kSm90: return "sm90";
    case ShapeClass::kMisaligned: return "misaligned";
  }
  return "?";
}

template <typename T>
void print_list(std::ostringstream& s, const char* name, const std::vector<T>& values) {
  s << " " << name << "=[";
  for (size_t i = 0; i < values.size(); ++i) s << (i ? "," : "") << values[i];
  s << "]";
}

uint64_t parse_count(const char* name, const char* text) {
  const std::string value(text);
  if (value.empty() || value.size() > 19 || value.find_first_not_of("0123456789") != std::string::npos) {
    throw std::invalid_argument(std::string(name) + " must be a non-negative decimal integer, got \"" + value + "\"");
  }
  return std::strtoull(value.c_str(), nullptr, 10);
}

// ---- the driver ----

struct Job {
  RandomConfig config;
  std::shared_ptr<const HostBatch> batch;
  std::vector<int64_t> tokens;
  std::vector<FamilyRun> runs;
};

// Bounded, so that the configuration loop stays at most `capacity` jobs ahead of the checks.
class JobQueue {
 public:
  explicit JobQueue(size_t capacity) : capacity_(capacity) {}
  void push(Job job) {
    std::unique_lock<std::mutex> lock(mutex_);
    not_full_.wait(lock, [&] { return jobs_.size() < capacity_; });
    jobs_.push_back(std::move(job));
    not_empty_.notify_one();
  }
  bool pop(Job& job) {  // false once closed and drained
    std::unique_lock<std::mutex> lock(mutex_);
    not_empty_.wait(lock, [&] { return closed_ || !jobs_.empty(); });
    if (jobs_.empty()) return false;
    job = std::move(jobs_.front());
    jobs_.pop_front();
    not_full_.notify_one();
    return true;
  }
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    not_empty_.notify_all();
  }

 private:
  size_t capacity_;
  std::mutex mutex_;
  std::condition_variable not_empty_, not_full_;
  std::deque<Job> jobs_;
  bool closed_ = false;
};

bool outputs_untouched(const Outputs& o) {
  for (uint16_t bits : o.out) {
    if (bits != kBf16PoisonBits) return false;
  }
  for (float value : o.lse) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    if (bits != 0xFFFFFFFFu) return false;
  }
  return true;
}

std::string failure_message(const RandomConfig& c, const std::string& family, const std::string& kernel,
                            const std::string& what, const std::string& replay) {
  std::ostringstream s;
  s << "random-configs: FAIL seed=" << c.seed << " config=" << c.index << " family=" << family
    << " kernel=" << (kernel.empty() ? "-" : kernel) << ": " << what << "\n  config: " << c.describe()
    << "\n  replay: SWA_DECODE_RANDOM_SEED=" << c.seed << " SWA_DECODE_RANDOM_CONFIG=" << c.index << " " << replay;
  return s.str();
}

// Checks one job's families and merges the outcome into `result` under `mutex`.
void check_job(const Job& job, const std::vector<std::string>& names, const ExtraCheck& extra,
               const std::string& replay, RandomRunResult& result, std::mutex& mutex) {
  std::vector<FamilyTally> tallies(names.size());
  std::vector<std::string> failures;
  int64_t macs = 0;
  double seconds = 0.0;
  std::optional<ReferenceOutputs> reference;  // computed once, for the first family that ran
  for (size_t f = 0; f < job.runs.size() && f < names.size(); ++f) {
    const FamilyRun& run = job.runs[f];
    FamilyTally& tally = tallies[f];
    std::vector<std::string> problems;
    if (!run.problem.empty()) problems.push_back(run.problem);
    if (!run.ran) {
      tally.skipped = 1;
      if (!outputs_untouched(run.outputs)) problems.push_back("skipped (" + run.why_not + ") but wrote out or lse");
    } else {
      tally.ran = 1;
      tally.ran_with_extra = job.batch->extra ? 1 : 0;
      tally.ran_with_model1 = job.batch->has_model1_source() ? 1 : 0;
      tally.ran_by_kernel[run.kernel] = 1;
      const auto start = std::chrono::steady_clock::now();
      try {
        if (!reference) {
          reference = compute_reference(*job.batch, job.tokens);
          macs += reference_macs(*job.batch, job.tokens);
        }
        const CheckReport report = check_against(*job.batch, run.outputs, *reference);
        tally.max_rel_l2 = report.rel_l2;
        tally.max_err_over_tol = report.max_err_over_tol;
        tally.max_lse_err = report.lse_max_err;
        if (!report.ok) problems.push_back(report.summary() + "\n" + report.failures);
        if (extra) {
          const std::string extra_problem = extra(*job.batch, run.outputs, job.tokens);
          if (!extra_problem.empty()) problems.push_back(extra_problem);
        }
      } catch (const std::exception& e) {
        problems.push_back(std::string("the check threw: ") + e.what());
      }
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (!problems.empty()) {
      tally.failed = 1;
      std::string what;
      for (const std::string& p : problems) what += (what.empty() ? "" : "\n  ") + p;
      failures.push_back(failure_message(job.config, names[f], run.kernel, what, replay));
    }
  }
  if (job.runs.size() != names.size()) {
    failures.push_back(failure_message(job.config, "-", "", "the runner returned " + std::to_string(job.runs.size()) +
                                       " family runs for " + std::to_string(names.size()) + " families", replay));
  }

  std::lock_guard<std::mutex> lock(mutex);
  for (size_t f = 0; f < names.size(); ++f) {
    FamilyTally& total = result.families[f];
    const FamilyTally& one = tallies[f];
    total.ran += one.ran;
    total.ran_with_extra += one.ran_with_extra;
    total.ran_with_model1 += one.ran_with_model1;
    total.skipped += one.skipped;
    total.failed += one.failed;
    total.max_rel_l2 = std::max(total.max_rel_l2, one.max_rel_l2);
    total.max_err_over_tol = std::max(total.max_err_over_tol, one.max_err_over_tol);
    total.max_lse_err = std::max(total.max_lse_err, one.max_lse_err);
    for (const auto& [kernel, count] : one.ran_by_kernel) total.ran_by_kernel[kernel] += count;
  }
  result.failed_configs += failures.empty() ? 0 : 1;
  result.reference_macs += macs;
  result.reference_seconds += seconds;
  result.failures.insert(result.failures.end(), failures.begin(), failures.end());
}

}  // namespace

ConfigSpace gpu_space() { return ConfigSpace{}; }

ConfigSpace cpu_space() {
  return ConfigSpace{.head_dims = {1, 8, 13, 16, 64},
                     .max_heads = 20,
                     .max_window = kMaxWindow,
                     .max_block_size = 256,
                     .gpu_strides = false,
                     .sm90_share = 0.0,
                     .misaligned_share = 0.0,
                     .tokens = {.max_small = 6, .max_mid = 12, .min_large = 16, .max_large = 24, .mid_share = 0.2,
                                .large_share = 0.1, .sm90_large_share = 0.0},
                     .extra_share = 0.3,
                     .max_extra_entries = 1024,
                     .max_extra_block_size = 64,
                     .model1_share = 0.08,
                     .reference_macs_per_check = std::numeric_limits<int64_t>::max(),
                     .max_checked_tokens = std::numeric_limits<int64_t>::max()};
}

RandomConfig draw_config(const ConfigSpace& space, uint64_t seed, int64_t index) {
  Rng rng(seed ^ (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ull));
  rng.next_u64();
  Rng format_rng(seed ^ (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ull) ^ kFormatStream);
  const bool model1 = coin(format_rng, space.model1_share);
  RandomConfig c;
  c.seed = seed;
  c.index = index;
  const double class_draw = rng.uniform();
  c.shape_class = class_draw < space.sm90_share ? ShapeClass::kSm90
                  : class_draw < space.sm90_share + space.misaligned_share ? ShapeClass::kMisaligned
                                                                          : ShapeClass::kGeneral;
  const bool sm90 = c.shape_class == ShapeClass::kSm90;
  BatchOptions& o = c.options;
  o.seed = rng.next_u64();
  o.head_dim = space.head_dims[rng.uniform_int(0, static_cast<int64_t>(space.head_dims.size()) - 1)];
  if (model1) o.head_dim = kModel1HeadDim;  // the draw above is kept, so the stream stays in step
  o.num_heads = draw_size(rng, 1, space.max_heads, kSpecialHeads);
  const int64_t max_window = sm90 ? std::min(kSm90Window, space.max_window) : space.max_window;
  o.window_size = draw_size(rng, 1, max_window, kSpecialWindows);
  o.block_size = draw_size(rng, 1, space.max_block_size, kSpecialBlockSizes);
  const TokenCounts& tokens = space.tokens;
  const double large_share = sm90 ? tokens.sm90_large_share : tokens.large_share;
  const double token_draw = rng.uniform();
  o.num_tokens = token_draw < large_share                      ? rng.uniform_int(tokens.min_large, tokens.max_large)
                 : token_draw < large_share + tokens.mid_share ? rng.uniform_int(tokens.max_small + 1, tokens.max_mid)
                                                               : rng.uniform_int(1, tokens.max_small);
  o.index_dtype = coin(rng, 0.5) ? DType::kInt32 : DType::kInt64;
  o.lens_dtype = coin(rng, 0.5) ? DType::kInt32 : DType::kInt64;
  o.inv_scale_dtype = coin(rng, 0.5) ? DType::kBFloat16 : DType::kFloat32;
  const int64_t T = o.num_tokens, H = o.num_heads, D = o.head_dim, W = o.window_size;

  // Strides. GPU kernels need cache strides in 4 bytes (16 for sm90) and q / out strides in
  // 8 elements; a misaligned draw breaks exactly one stride of a dimension of size > 1.
  const int64_t kv_unit = !space.gpu_strides ? 1 : (sm90 || coin(rng, 0.5)) ? 16 : 4;
  const int64_t q_unit = space.gpu_strides ? 8 : 1;
  const Misaligned broken = c.shape_class == ShapeClass::kMisaligned ? pick_misaligned(rng, T, H, o.block_size)
                                                                     : Misaligned::kNone;
  auto misalign = [&](Misaligned which, int64_t modulus) {
    return which == broken ? rng.uniform_int(1, modulus - 1) : 0;
  };
  o.kv_row_stride = D + (coin(rng, 0.6) ? padding(rng, kv_unit, 96) : 0) + misalign(Misaligned::kKvToken, 4);
  o.kv_block_pad = maybe_padding(rng, kv_unit, 256) + misalign(Misaligned::kKvBlock, 4);
  const double q_layout = rng.uniform();
  if (q_layout < 0.35) {
    o.q_head_stride = D + misalign(Misaligned::kQHead, 8);
    o.q_token_stride = H * o.q_head_stride + misalign(Misaligned::kQToken, 8);
  } else if (q_layout < 0.8 || T == 1) {
    o.q_head_stride = D + maybe_padding(rng, q_unit, 64) + misalign(Misaligned::kQHead, 8);
    o.q_token_stride = H * o.q_head_stride + padding(rng, q_unit, 64) + misalign(Misaligned::kQToken, 8);
  } else {
    o.q_head_major = true;
    o.q_token_stride = D + maybe_padding(rng, q_unit, 64) + misalign(Misaligned::kQToken, 8);
    o.q_head_stride = T * o.q_token_stride + maybe_padding(rng, q_unit, 64) + misalign(Misaligned::kQHead, 8);
  }
  const bool out_padded = coin(rng, 0.5);
  o.out_head_stride = D + (out_padded ? maybe_padding(rng, q_unit, 64) : 0) + misalign(Misaligned::kOutHead, 8);
  o.out_token_stride =
      H * o.out_head_stride + (out_padded ? padding(rng, q_unit, 64) : 0) + misalign(Misaligned::kOutToken, 8);
  o.with_lse = coin(rng, 0.85);
  // FlashMLA's +inf for an empty token, as its drop-in asks.
  o.empty_token_lse = coin(rng, 0.3) ? EmptyTokenLse::kPositiveInfinity : EmptyTokenLse::kNegativeInfinity;
  o.lse_token_stride = H + (coin(rng, 0.5) ? rng.uniform_int(1, 5) : 0);

  // Index rows wider than the window, with garbage (in-range ids of poisoned slots) past it.
  o.index_cols = W + (coin(rng, 0.5) ? rng.uniform_int(1, 64) : 0);
  o.index_row_pad = coin(rng, 0.3) ? rng.uniform_int(1, 7) : 0;
  o.garbage_past_window = coin(rng, 0.6);
  o.hole_fraction = coin(rng, 0.5) ? 0.3 * rng.uniform() : 0.0;
  o.duplicate_fraction = coin(rng, 0.4) ? 0.4 * rng.uniform() : 0.0;
  o.out_of_range_fraction = coin(rng, 0.5) ? 0.25 * rng.uniform() : 0.0;
  o.all_invalid_fraction = coin(rng, 0.25) ? 0.4 * rng.uniform() : 0.0;

  // Contexts shorter and longer than the window; lens from every class the semantics name.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t context = coin(rng, 0.5) ? rng.uniform_int(1, W) : rng.uniform_int(W, 2 * W + 64);
    o.context_lens.push_back(context);
    o.lens.push_back(token_lens(rng, context, W, o.lens_dtype));
  }

  // Sinks: none, or per head finite, +inf (all weight on the sink) or -inf (no sink).
  if (coin(rng, 0.75)) {
    for (int64_t h = 0; h < H; ++h) {
      const double u = rng.uniform();
      o.sinks.push_back(u < 0.6 ? static_cast<float>(-4.0 + 12.0 * rng.uniform()) : u < 0.8 ? -kInfF : kInfF);
    }
  }

  const double default_scale = 1.0 / std::sqrt(static_cast<double>(D));
  const double scale_draw = rng.uniform();
  const double scale_factor = scale_draw < 0.90   ? 1.0
                              : scale_draw < 0.95 ? -1.0
                                                  : (coin(rng, 0.5) ? 1.0 : -1.0) * (0.25 + 1.75 * rng.uniform());
  o.scale = static_cast<float>(scale_factor * default_scale);
  if (coin(rng, 0.1)) draw_magnitudes(rng, o);
  if (coin(rng, space.extra_share)) draw_extra(rng, space, kv_unit, o);
  if (model1) draw_model1_sources(format_rng, o);

  // What the GPU kernels must say about these shapes (docs/semantics.md: D = 512, cache strides
  // in 4 bytes, q / out strides in 8 elements; strides of size-1 dimensions do not count; the pool
  // always has at least two blocks), and whether sm90 runs them (W <= kSm90Window, cache strides
  // in 16 bytes). An extra source's cache follows the same rules (a shared one is the window's).
  auto cache_aligned = [](int64_t block_size, int64_t row_stride, int64_t block_pad, int64_t unit) {
    return (block_size == 1 || row_stride % unit == 0) && (block_size * row_stride + block_pad) % unit == 0;
  };
  auto kv_aligned = [&](int64_t unit) {
    const ExtraOptions* x = o.extra ? &*o.extra : nullptr;
    return cache_aligned(o.block_size, o.kv_row_stride, o.kv_block_pad, unit) &&
           (x == nullptr || x->shares_window_cache || cache_aligned(x->block_size, x->kv_row_stride, x->kv_block_pad, unit));
  };
  auto rows_aligned = [&](int64_t head_stride, int64_t token_stride) {
    return (H == 1 || head_stride % 8 == 0) && (T == 1 || token_stride % 8 == 0);
  };
  c.kernel_aligned = D == kGpuHeadDim && kv_aligned(4) && rows_aligned(o.q_head_stride, o.q_token_stride) &&
                     rows_aligned(o.out_head_stride, o.out_token_stride);
  c.sm90_shaped = c.kernel_aligned && kv_aligned(16) && W <= kSm90Window;
  return c;
}

std::string RandomConfig::describe() const {
  const BatchOptions& o = options;
  std::ostringstream s;
  s.precision(9);
  s << "seed=" << seed << " config=" << index << " class=" << class_name(shape_class)
    << " kernel_aligned=" << kernel_aligned << " sm90_shaped=" << sm90_shaped << " T=" << o.num_tokens
    << " H=" << o.num_heads << " D=" << o.head_dim << " W=" << o.window_size << " index_cols=" << o.index_cols
    << " index_row_pad=" << o.index_row_pad << " garbage_past_window=" << o.garbage_past_window
    << " block_size=" << o.block_size << " kv_row_stride=" << o.kv_row_stride << " kv_block_pad=" << o.kv_block_pad
    << " q=" << (o.q_head_major ? "head-major" : "token-major") << " q_head_stride=" << o.q_head_stride
    << " q_token_stride=" << o.q_token_stride << " out_head_stride=" << o.out_head_stride
    << " out_token_stride=" << o.out_token_stride << " lse=" << (o.with_lse ? "on" : "off")
    << " empty_token_lse=" << (o.empty_token_lse == EmptyTokenLse::kPositiveInfinity ? "+inf" : "-inf")
    << " lse_token_stride=" << o.lse_token_stride << " indices=" << dtype_name(o.index_dtype)
    << " lens=" << dtype_name(o.lens_dtype) << " inv_scale=" << dtype_name(o.inv_scale_dtype)
    << " scale=" << o.scale << " inv_scale_magnitude=" << o.inv_scale_magnitude << " holes=" << o.hole_fraction
    << " duplicates=" << o.duplicate_fraction << " out_of_range=" << o.out_of_range_fraction
    << " all_invalid=" << o.all_invalid_fraction << " batch_seed=" << o.seed
    << " kv_format=" << (o.kv_format == KvFormat::kModel1 ? "model1" : "e4m3");
  print_list(s, "q_magnitudes", o.q_magnitudes);
  print_list(s, "lens", o.lens);
  print_list(s, "context", o.context_lens);
  print_list(s, "sinks", o.sinks);
  if (o.padding_row_fraction > 0.0) s << " padding_rows=" << o.padding_row_fraction;
  if (o.extra) {
    const ExtraOptions& x = *o.extra;
    s << " extra: X=" << x.max_entries << " index_cols=" << x.index_cols << " index_row_pad=" << x.index_row_pad
      << " shares_window_cache=" << x.shares_window_cache << " compress_ratio=" << x.compress_ratio
      << " top_k=" << x.top_k << " block_size=" << x.block_size << " kv_row_stride=" << x.kv_row_stride
      << " kv_block_pad=" << x.kv_block_pad << " indices=" << dtype_name(x.index_dtype)
      << " lens=" << dtype_name(x.lens_dtype) << " inv_scale=" << dtype_name(x.inv_scale_dtype)
      << " holes=" << x.hole_fraction << " duplicates=" << x.duplicate_fraction
      << " out_of_range=" << x.out_of_range_fraction << " all_invalid=" << x.all_invalid_fraction
      << " garbage_past_entries=" << x.garbage_past_entries << " cross_duplicates=" << x.cross_duplicate_fraction
      << " format=" << (x.format == KvFormat::kModel1 ? "model1" : "e4m3");
    print_list(s, "extra_positions", x.positions);
    print_list(s, "extra_lens", x.lens);
  }
  return s.str();
}

std::vector<int64_t> choose_checked_tokens(const HostBatch& batch, const ConfigSpace& space, uint64_t seed) {
  return budgeted_tokens(batch, space.reference_macs_per_check, space.max_checked_tokens, seed);
}

RunPlan plan_from_env(int64_t default_count) {
  RunPlan plan;
  plan.count = default_count;
  if (const char* seed = std::getenv("SWA_DECODE_RANDOM_SEED")) plan.seed = parse_count("SWA_DECODE_RANDOM_SEED", seed);
  if (const char* one = std::getenv("SWA_DECODE_RANDOM_CONFIG")) {
    plan.first = static_cast<int64_t>(parse_count("SWA_DECODE_RANDOM_CONFIG", one));
    plan.count = 1;
    plan.single = true;
  } else if (const char* count = std::getenv("SWA_DECODE_RANDOM_CONFIGS")) {
    plan.count = static_cast<int64_t>(parse_count("SWA_DECODE_RANDOM_CONFIGS", count));
  }
  return plan;
}

RandomRunResult run_random_configs(const ConfigSpace& space, const RunPlan& plan,
                                   const std::vector<std::string>& family_names, const RunFamilies& run,
                                   const ExtraCheck& extra, const std::string& replay) {
  const auto start = std::chrono::steady_clock::now();
  RandomRunResult result;
  result.configs = plan.count;
  for (const std::string& name : family_names) {
    FamilyTally tally;
    tally.family = name;
    result.families.push_back(tally);
  }
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // One checker per core (at most 32), never more than there are configurations.
  result.threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({cores, 32, plan.count})));

  std::mutex mutex;
  JobQueue queue(2 * static_cast<size_t>(result.threads));
  std::vector<std::thread> workers;
  for (int i = 0; i < result.threads; ++i) {
    workers.emplace_back([&] {
      Job job;
      while (queue.pop(job)) check_job(job, family_names, extra, replay, result, mutex);
    });
  }
  for (int64_t index = plan.first; index < plan.first + plan.count; ++index) {
    Job job;
    job.config = draw_config(space, plan.seed, index);
    try {
      job.batch = std::make_shared<const HostBatch>(make_batch(job.config.options));
      job.tokens = choose_checked_tokens(*job.batch, space, job.config.options.seed ^ 0xC4EC4EDull);
      job.runs = run(job.config, *job.batch);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex);
      result.failed_configs += 1;
      result.failures.push_back(failure_message(job.config, "-", "", std::string("threw: ") + e.what(), replay));
      continue;
    } catch (...) {  // never leave the workers joinable on the way out
      std::lock_guard<std::mutex> lock(mutex);
      result.failed_configs += 1;
      result.failures.push_back(failure_message(job.config, "-", "", "threw a non-standard exception", replay));
      continue;
    }
    queue.push(std::move(job));
  }
  queue.close();
  for (std::thread& worker : workers) worker.join();
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void print_result(const RandomRunResult& r, const RunPlan& plan) {
  std::printf("random-configs: seed=%llu first=%lld configs=%lld threads=%d wall_s=%.2f failed_configs=%lld\n",
              static_cast<unsigned long long>(plan.seed), static_cast<long long>(plan.first),
              static_cast<long long>(r.configs), r.threads, r.wall_seconds, static_cast<long long>(r.failed_configs));
  for (const FamilyTally& f : r.families) {
    std::printf("random-configs: family=%s ran=%lld skipped=%lld failed=%lld max_rel_l2=%.3e max_err_over_tol=%.3f "
                "max_lse_err=%.3e ran_with_extra=%lld ran_with_model1=%lld\n",
                f.family.c_str(), static_cast<long long>(f.ran), static_cast<long long>(f.skipped),
                static_cast<long long>(f.failed), f.max_rel_l2, f.max_err_over_tol, f.max_lse_err,
                static_cast<long long>(f.ran_with_extra), static_cast<long long>(f.ran_with_model1));
    for (const auto& [kernel, count] : f.ran_by_kernel) {
      std::printf("random-configs: family=%s kernel=%s ran=%lld\n", f.family.c_str(), kernel.c_str(),
                  static_cast<long long>(count));
    }
  }
  const double gmac = static_cast<double>(r.reference_macs) * 1e-9;
  const double rate = r.reference_seconds > 0.0 ? gmac / r.reference_seconds : 0.0;
  // The checks' time summed over the worker threads is what one thread would take.
  std::printf("random-configs: reference_gmac=%.2f single_threaded_check_s=%.2f gmac_per_s=%.2f\n", gmac,
              r.reference_seconds, rate);
  std::fflush(stdout);
}

std::vector<CoverageMinimum> gpu_coverage_minimums() {
  // The default draw on a simulated H200 (tests/cpu/test_random_configs_cpu.cpp prints it), of
  // 1000 (at 4b2355b): 223 with an extra source, 207 with kModel1 sources. free runs 969 (212 with
  // an extra source, 205 kModel1): 377 g1, 148 g1_split4, 30 g1_split8, 27 g2, 177 few_heads_n16,
  // 138 n8, 57 sm90_wgmma, 12 sm90_wgmma_layer, 3 layer_split2. portable runs 969: 672 g1, 161
  // g1_split4, 30 g1_split8, 105 g2, 1 g2_split4. sm90 runs 614 (126 with an extra source, 155
  // kModel1): 488 sm90_wgmma, 75 layer, 24 / 10 / 17 layer_split2 / 4 / 8. few_heads runs 361 (223
  // n16, 138 n8; it reads the sources of 612). Every variant must run; the family totals stay near
  // all they can run; each family must run about half of the extra sources and kModel1 sources it
  // can (the CPU test judges a family that reads neither yet on the other configurations).
  return {
      {"free", "", 0.85},
      {"free", "portable_mma_g1", 0.35},
      {"free", "portable_mma_g1_split4", 0.06},
      {"free", "portable_mma_g1_split8", 0.025},
      {"free", "portable_mma_g2", 0.02},
      {"free", "sm90_wgmma", 0.03},
      {"free", "", 0.10, /*with_extra=*/true},
      {"free", "", 0.10, /*with_extra=*/false, /*with_model1=*/true},
      {"portable", "", 0.85},
      {"portable", "portable_mma_g1", 0.35},
      {"portable", "portable_mma_g1_split4", 0.06},
      {"portable", "portable_mma_g1_split8", 0.025},
      {"portable", "portable_mma_g2", 0.05},
      {"portable", "", 0.10, /*with_extra=*/true},
      {"portable", "", 0.10, /*with_extra=*/false, /*with_model1=*/true},
      {"sm90", "", 0.30},
      {"sm90", "", 0.06, /*with_extra=*/true},
      {"sm90", "", 0.07, /*with_extra=*/false, /*with_model1=*/true},
      // The few-heads kernel: a seed-format window alone, W <= 128, 16-byte rows (since issue 13).
      {"free", "few_heads_n16", 0.10},
      {"free", "few_heads_n8", 0.10},
      {"few_heads", "", 0.30},
      {"few_heads", "few_heads_n16", 0.18},
      {"few_heads", "few_heads_n8", 0.10},
  };
}

std::string coverage_shortfall(const FamilyTally& tally, int64_t configs, bool per_kernel, bool with_extra,
                               bool with_model1) {
  std::string shortfall;
  for (const CoverageMinimum& m : gpu_coverage_minimums()) {
    if (m.family != tally.family || (!m.kernel.empty() && !per_kernel) || (m.with_extra && !with_extra) ||
        (m.with_model1 && !with_model1)) {
      continue;
    }
    int64_t ran = m.with_extra ? tally.ran_with_extra : m.with_model1 ? tally.ran_with_model1 : tally.ran;
    if (!m.kernel.empty()) {
      const auto it = tally.ran_by_kernel.find(m.kernel);
      ran = it == tally.ran_by_kernel.end() ? 0 : it->second;
    }
    const auto minimum = static_cast<int64_t>(std::ceil(m.share * static_cast<double>(configs)));
    if (ran < minimum) {
      shortfall += "family=" + m.family + " kernel=" + (m.kernel.empty() ? "any" : m.kernel) +
                   (m.with_extra ? " with an extra source" : "") + (m.with_model1 ? " with a kModel1 source" : "") +
                   " ran " +
                   std::to_string(ran) + " of " + std::to_string(configs) + " configurations, minimum " +
                   std::to_string(minimum) + "\n";
    }
  }
  return shortfall;
}

}  // namespace swa_decode::testing
