// Random decode configurations over everything docs/semantics.md allows, and the driver that runs
// each one through one or more kernel families and checks every family against the float64
// reference (testing/check.h). tests/gpu/test_random_configs.cpp runs it on every GPU kernel
// family (D = 512); tests/cpu/test_random_configs_cpu.cpp on the CPU backend with small shapes.
//
// A configuration is a pure function of (seed, index): a failure prints both with the whole
// configuration, and SWA_DECODE_RANDOM_SEED=<seed> SWA_DECODE_RANDOM_CONFIG=<index> replays that
// one configuration alone.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "swa_decode/limits.h"
#include "src/kernels/sm90/sm90_plan.h"
#include "testing/batch.h"
#include "testing/check.h"
#include "testing/device_batch.h"

namespace swa_decode::testing {

// How many tokens a configuration has: [1, max_small] mostly, [max_small + 1, max_mid] or
// [min_large, max_large] sometimes (large enough for the sm90 kernel's free choice, T >= 64, and for
// two-group portable CTAs); the sm90-shaped draws take large counts more often.
struct TokenCounts {
  int64_t max_small = 8;
  int64_t max_mid = 32;
  int64_t min_large = 64, max_large = 80;
  double mid_share = 0.18;
  double large_share = 0.12;
  double sm90_large_share = 0.30;
};

// The largest window the sm90 kernel holds in shared memory (its plan's kKeys): the draws shaped
// for sm90 stay within it, and sm90 must run exactly those.
inline constexpr int64_t kSm90Window = sm90::kKeys;

// What the draw may produce; the defaults are the GPU test's space (gpu_space()).
struct ConfigSpace {
  std::vector<int64_t> head_dims = {kGpuHeadDim};
  int64_t max_heads = kMaxGpuHeads;
  int64_t max_window = kMaxWindow;
  int64_t max_block_size = 1024;
  // true: q / out strides in multiples of 8 elements and cache strides of 4 bytes (what the GPU
  // kernels run), except for `misaligned_share` of the draws; false: any stride the semantics allow.
  bool gpu_strides = true;
  // Draws shaped for the sm90 kernel (W <= kSm90Window, cache strides of 16 bytes); the others take W
  // log-uniform in [1, max_window], so some of them fit sm90 as well.
  double sm90_share = 0.30;
  double misaligned_share = 0.03;  // valid arguments no GPU kernel runs (decode must say kNotSupported)
  TokenCounts tokens;
  // Draws with an extra source (docs/semantics.md, "The extra source"): its entry limit X is
  // log-uniform in [1, max_extra_entries] or one of the sizes where kernels change tiles; its pool
  // its own (blocks of up to max_extra_block_size) or the window's; every dtype and stride.
  double extra_share = 0.25;
  int64_t max_extra_entries = 4096;
  int64_t max_extra_block_size = 256;
  // Draws with sources in kModel1 rows (docs/semantics.md, "Row formats"): the window's, the extra
  // source's own pool's or both, with D = 512, 576-byte rows and FlashMLA's padded blocks, plus 1..3
  // more rows of bytes half the time. Whether a draw is one is decided by a stream of its own and
  // its formats after every other draw, so that every other configuration is what it was before
  // the format existed; such a draw differs from its kE4m3 twin only in D (and what derives from
  // it) and in its sources' cache layouts.
  double model1_share = 0.20;
  // The reference check of one family's outputs compares every empty token and, of the others, at
  // most max_checked_tokens within this many multiply-adds (at least one token). The reference
  // runs ~0.5-1 GMAC/s per core (plain double loops): 6M multiply-adds is ~6-12 ms per check.
  int64_t reference_macs_per_check = 6'000'000;
  int64_t max_checked_tokens = 8;
};

// D = 512, every GPU shape and stride, 30% shaped for sm90, 3% misaligned, 20% with kModel1 sources.
ConfigSpace gpu_space();
// D in {1, 8, 13, 16, 64}, H <= 20, any stride (the CPU backend runs every valid argument set),
// extra sources in 30% of the draws with X <= 1024, kModel1 sources (D = 512) in 8%, every token
// checked.
ConfigSpace cpu_space();

enum class ShapeClass { kGeneral, kSm90, kMisaligned };

struct RandomConfig {
  uint64_t seed = 0;
  int64_t index = 0;
  ShapeClass shape_class = ShapeClass::kGeneral;
  BatchOptions options;       // every stride explicit (no 0 = default)
  bool kernel_aligned = true;  // D = 512 and strides the GPU kernels run (docs/semantics.md)
  bool sm90_shaped = false;    // kernel_aligned, W <= kSm90Window and 16-byte cache strides (both caches)
  std::string describe() const;  // every option on one line
};

RandomConfig draw_config(const ConfigSpace& space, uint64_t seed, int64_t index);

// The tokens a configuration's check compares (budgeted_tokens within ConfigSpace's
// reference_macs_per_check and max_checked_tokens), sorted.
std::vector<int64_t> choose_checked_tokens(const HostBatch& batch, const ConfigSpace& space, uint64_t seed);

// Which configurations to run, from the environment: SWA_DECODE_RANDOM_SEED (default kDefaultRandomSeed),
// SWA_DECODE_RANDOM_CONFIG=N (only configuration N) or SWA_DECODE_RANDOM_CONFIGS=count (the first
// count). Throws std::invalid_argument on a value that is not a plain non-negative integer.
inline constexpr uint64_t kDefaultRandomSeed = 20250610;
struct RunPlan {
  uint64_t seed = kDefaultRandomSeed;
  int64_t first = 0;
  int64_t count = 0;
  bool single = false;  // SWA_DECODE_RANDOM_CONFIG was set
};
RunPlan plan_from_env(int64_t default_count);

// What one kernel family did with one configuration. Outputs were poisoned before the run.
struct FamilyRun {
  bool ran = false;
  std::string kernel;   // what ran (SupportInfo::kernel); empty when skipped
  std::string why_not;  // when skipped
  std::string problem;  // non-empty: the API misbehaved (a failure whatever the outputs say)
  Outputs outputs;      // checked against the reference if ran; must be untouched if skipped
};

// Runs every family on one configuration, in the order of the family names (called on one thread,
// in configuration order, so it may use one CUDA stream).
using RunFamilies = std::function<std::vector<FamilyRun>(const RandomConfig&, const HostBatch&)>;
// A further check of a family's outputs on `tokens` (runs on a worker thread): "" when they pass.
using ExtraCheck = std::function<std::string(const HostBatch&, const Outputs&, const std::vector<int64_t>& tokens)>;

struct FamilyTally {
  std::string family;
  int64_t ran = 0, skipped = 0, failed = 0;
  int64_t ran_with_extra = 0;  // of `ran`, configurations with an extra source
  int64_t ran_with_model1 = 0;  // of `ran`, configurations with a kModel1 source
  double max_rel_l2 = 0.0, max_err_over_tol = 0.0, max_lse_err = 0.0;
  std::map<std::string, int64_t> ran_by_kernel;
};

struct RandomRunResult {
  std::vector<FamilyTally> families;  // in the order of the family names
  int64_t configs = 0;
  int64_t failed_configs = 0;
  int64_t reference_macs = 0;       // over every configuration's reference (one, shared by its families)
  double reference_seconds = 0.0;   // time in the checks, summed over the worker threads
  double wall_seconds = 0.0;
  int threads = 1;
  std::vector<std::string> failures;  // one per failing (configuration, family), with the replay line
};

// Draws plan.count configurations from `space`, builds each batch, calls `run`, and checks every
// family that ran on worker threads (check_outputs, then `extra` if given). `replay` is the command
// a failure message names after the environment variables (e.g. the gtest filter).
RandomRunResult run_random_configs(const ConfigSpace& space, const RunPlan& plan,
                                   const std::vector<std::string>& family_names, const RunFamilies& run,
                                   const ExtraCheck& extra, const std::string& replay);

// "random-configs: ..." lines: per family ran / skipped / largest errors, per kernel, the
// reference's multiply-adds and times.
void print_result(const RandomRunResult& result, const RunPlan& plan);

// Configurations the GPU test draws by default (SWA_DECODE_RANDOM_CONFIGS overrides).
inline constexpr int64_t kGpuRandomConfigs = 1000;

// Minimum runs per family and kernel for a number of configurations of gpu_space() on a device that
// runs the family: the GPU test fails below them, and the CPU test checks on a simulated H200 that
// the default draw clears them. Shares are about half of what that draw gives on an H200. Which
// portable variant runs depends on the SM count, so the per-kernel minimums hold for the H200 only.
struct CoverageMinimum {
  std::string family;
  std::string kernel;  // empty: any kernel of the family
  double share;        // of the configurations run
  bool with_extra = false;  // count only the runs of configurations with an extra source
  bool with_model1 = false;  // count only the runs of configurations with a kModel1 source
};
std::vector<CoverageMinimum> gpu_coverage_minimums();
// Applied only from this many configurations on (a replay of one configuration runs no minimum).
inline constexpr int64_t kMinConfigsForCoverage = 200;
// "" when `tally` clears every minimum of its family (the per-kernel ones only if asked, the
// extra-source ones only if `with_extra`, the kModel1 ones only if `with_model1`); else one line per
// minimum missed.
std::string coverage_shortfall(const FamilyTally& tally, int64_t configs, bool per_kernel, bool with_extra = true,
                               bool with_model1 = true);

}  // namespace swa_decode::testing
