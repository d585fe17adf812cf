// DeepSeek-V4's attention layers as generated batches (testing/batch.h), for the bench and the GPU
// tests: one definition of what a "realistic" window-only, C4A and C128A layer is.
//
// Every request has its own context, drawn uniformly from [1, 2 * mean_context]; its window is its
// last min(context, W) positions, as in every batch. On top of it:
//  - swa:   the window alone, in a pool that covers every request's whole context.
//  - c4a:   the top-k an indexer picked: min(top_k, context / 4) of the request's context / 4
//           compressed positions, drawn without replacement, in a pool of blocks of 64 that holds
//           all of them (FlashMLA's C4A layers); top_k 512 (V4-Flash) or 1024 (V4-Pro).
//  - c128a: every one of its context / 128 compressed positions, in order, in blocks of 2
//           (FlashMLA's C128A layers); a mean context of 64k gives 512 entries, of 1M 8192.
// In c4a and c128a the window's pool keeps only the blocks the window touches (engines free
// sliding-window blocks behind the window: a 1M context would otherwise need 512 MiB of window
// pool per request), and 1 row in 32 is a CUDA-graph padding row (lens 0 in both sources, its ids
// left in place). Unused slots of both pools are poisoned, as in every batch.
//
// Every source's rows are in one format: the seed's (kE4m3: D e4m3 bytes a row, a bf16 scale per
// slot, the window in blocks of 256) or the engines' (kModel1, docs/semantics.md "Row formats":
// 576-byte rows with their scale rows in each block's footer, blocks padded to a multiple of 576
// bytes as FlashMLA lays them out, the window in blocks of 64 as vLLM's and SGLang's SWA caches).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "testing/batch.h"

namespace swa_decode::testing {

enum class LayerKind { kSwa, kC4a, kC128a };

inline constexpr int64_t kC4aCompressRatio = 4;
inline constexpr int64_t kC128aCompressRatio = 128;
inline constexpr int64_t kC4aBlockSize = 64;
inline constexpr int64_t kC128aBlockSize = 2;
inline constexpr double kLayerPaddingRowFraction = 1.0 / 32;
inline constexpr int64_t kSeedWindowBlockSize = 256;   // DeepSeek-V4 serving's pages
inline constexpr int64_t kModel1WindowBlockSize = 64;  // the engines' SWA cache for MODEL1 rows

struct LayerSpec {
  LayerKind kind = LayerKind::kSwa;
  KvFormat format = KvFormat::kE4m3;  // of every source: kE4m3 ("seed") or kModel1 ("model1")
  int64_t mean_context = 0;  // 0 = default_mean_context(kind)
  int64_t top_k = 0;         // c4a only; 0 = default_top_k(num_heads)
};

const char* layer_name(LayerKind kind);                  // "swa", "c4a", "c128a"
std::optional<LayerKind> parse_layer(std::string_view name);
// The bench's names of the row formats (its --format and its JSON rows' "format"): "seed", "model1".
const char* format_name(KvFormat format);
std::optional<KvFormat> parse_format(std::string_view name);

// swa 4096 (contexts 1..8192, the bench's batch before layers existed), c4a 32768 (up to 64k),
// c128a 65536 (512 compressed entries on average).
int64_t default_mean_context(LayerKind kind);
// The largest mean context a layer takes: swa 8192 (its pool covers whole contexts: 16 GiB at 4096
// requests), c4a 65536 (its compressed pool: 4096 requests x up to 32768 rows = 34 GiB),
// c128a 1048576 (2M contexts give kMaxExtraEntries = 16384 compressed entries).
int64_t max_mean_context(LayerKind kind);
// 1024 at H >= 128 (V4-Pro), 512 below (V4-Flash has 64 heads).
int64_t default_top_k(int64_t num_heads);

// "" when `spec` is a layer this file can build for `num_heads`, else why not.
std::string layer_problem(const LayerSpec& spec, int64_t num_heads);

// The batch options of `num_tokens` requests of a layer with the window `window_size`: sinks and
// the LSE on, int32 ids and lengths (what engines pass) unless `index_dtype` says otherwise, bf16
// scales (kE4m3), every source in spec.format, every default of `spec` resolved. Throws
// std::invalid_argument on a layer_problem.
BatchOptions layer_options(const LayerSpec& spec, int64_t num_tokens, int64_t num_heads, int64_t window_size,
                           DType index_dtype, uint64_t seed);

// The extra entries a layer's row has on average, about (for sizing input sets before generating):
// 0, top_k, or mean_context / 128.
int64_t expected_extra_entries(const LayerSpec& spec, int64_t num_heads);

}  // namespace swa_decode::testing
