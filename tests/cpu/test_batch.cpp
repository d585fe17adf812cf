// The batch generator (testing/batch.h) on its kModel1 paths, which the GPU tests and the bench
// rely on without a GPU here to run them: FlashMLA's padded block strides, the 0xFF poison of every
// byte no valid entry names (rows, footer scale rows, their pad bytes, the padding after the footer),
// the upload's spans (pool_spans + fill_span) against the dense copy the CPU reference reads, the
// layers of `swa-decode bench --format model1`, and the floor's 584 bytes a row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

#include "src/api/validate.h"
#include "src/reference/reference.h"
#include "testing/batch.h"
#include "testing/host_numerics.h"
#include "testing/layer.h"
#include "testing/strides.h"

namespace swa_decode {
namespace {

namespace st = swa_decode::testing;

// A small C4A-like batch: the window in `window_format` (blocks of 64), an extra source of its
// own pool in `extra_format` (blocks of `extra_block_size`), both with one padding row of bytes
// after the block when they are kModel1.
st::BatchOptions two_source_options(KvFormat window_format, KvFormat extra_format, int64_t extra_block_size) {
  st::BatchOptions o;
  o.num_tokens = 6;
  o.num_heads = 4;
  o.head_dim = kModel1HeadDim;
  o.window_size = 128;
  o.block_size = 64;
  o.max_context = 700;
  o.kv_format = window_format;
  if (window_format == KvFormat::kModel1) o.kv_block_pad = kModel1RowBytes;
  o.hole_fraction = 0.1;
  o.with_sink = true;
  o.seed = 5;
  st::ExtraOptions x;
  x.format = extra_format;
  x.block_size = extra_block_size;
  x.top_k = 40;
  if (extra_format == KvFormat::kModel1) x.kv_block_pad = kModel1RowBytes;
  o.extra = x;
  return o;
}

// Whether byte `offset` of `pool` belongs to a live slot's data: its 576-byte row or the 7 scale
// bytes of its scale row (never the pad byte).
std::vector<bool> live_bytes(const st::HostSource& pool) {
  std::vector<bool> live(static_cast<size_t>(pool.kv_cache_bytes()), false);
  for (int64_t slot : pool.live_slots) {
    for (int64_t i = 0; i < kModel1RowBytes; ++i) live[pool.kv_row_offset(slot) + i] = true;
    for (int64_t i = 0; i < st::kModel1ScalesPerRow; ++i) live[pool.kv_scale_row_offset(slot) + i] = true;
  }
  return live;
}

TEST(BatchModel1, BlocksArePaddedAsFlashMlaPadsThem) {
  EXPECT_EQ(st::model1_strides(2).group, 1728);
  EXPECT_EQ(st::model1_strides(64).group, 37440);
  EXPECT_EQ(st::model1_strides(256).group, 149760);
  EXPECT_EQ(st::model1_strides(64, kModel1RowBytes).group, 37440 + 576);
  EXPECT_EQ(st::model1_strides(1).row, kModel1RowBytes);

  const st::HostBatch b = st::make_batch(two_source_options(KvFormat::kModel1, KvFormat::kModel1, 2));
  EXPECT_EQ(b.kv_row_stride, kModel1RowBytes);
  EXPECT_EQ(b.kv_block_stride, 37440 + 576);
  ASSERT_TRUE(b.extra);
  EXPECT_EQ(b.extra->kv_block_stride, 1728 + 576);
  EXPECT_EQ(b.live_row_bytes(), kModel1RowBytes + kModel1ScaleRowBytes);
  EXPECT_EQ(b.scale_bytes(), 0);
}

// Every byte of a kModel1 pool that is not a live row or one of its 7 scale bytes is 0xFF, and
// the live rows are finite and where the format says; the arguments over them validate and pass
// no inv_scale.
TEST(BatchModel1, PoisonsEveryByteNoValidEntryNames) {
  st::HostBatch b = st::make_batch(two_source_options(KvFormat::kModel1, KvFormat::kModel1, 64));
  for (const st::HostSource* pool : {&b.window(), static_cast<const st::HostSource*>(&*b.extra)}) {
    SCOPED_TRACE(pool == &b.window() ? "window" : "extra");
    ASSERT_FALSE(pool->live_slots.empty());
    const std::vector<uint8_t> bytes = st::dense_kv_cache(*pool);
    const std::vector<bool> live = live_bytes(*pool);
    int64_t poisoned = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (!live[i]) {
        ASSERT_EQ(bytes[i], 0xFF) << "byte " << i;
        ++poisoned;
      }
    }
    EXPECT_GT(poisoned, 0);
    for (size_t i = 0; i < pool->live_slots.size(); ++i) {
      const int64_t slot = pool->live_slots[i];
      const uint8_t* kept = &pool->live_rows[i * pool->live_row_bytes()];
      EXPECT_EQ(std::memcmp(&bytes[pool->kv_row_offset(slot)], kept, kModel1RowBytes), 0) << "slot " << slot;
      EXPECT_EQ(std::memcmp(&bytes[pool->kv_scale_row_offset(slot)], kept + kModel1RowBytes, st::kModel1ScalesPerRow),
                0);
      for (int64_t d = 0; d < kModel1E4m3Dims; ++d) ASSERT_FALSE(std::isnan(st::e4m3_to_double(kept[d])));
      for (int64_t k = 0; k < st::kModel1ScalesPerRow; ++k) ASSERT_NE(kept[kModel1RowBytes + k], st::kUe8m0NaN);
      for (int64_t r = 0; r < st::kModel1RopeDims; ++r) {
        uint16_t bits;
        std::memcpy(&bits, kept + kModel1E4m3Dims + 2 * r, sizeof(bits));
        ASSERT_TRUE(std::isfinite(reference::bf16_to_float(bits)));
      }
    }
  }
  st::HostTensors tensors = st::materialize_host(b);
  const DecodeArgs args = st::host_args(b, tensors);
  EXPECT_EQ(args.kv_format, KvFormat::kModel1);
  EXPECT_EQ(args.extra.format, KvFormat::kModel1);
  EXPECT_EQ(args.inv_scale, nullptr);
  EXPECT_EQ(args.extra.inv_scale, nullptr);
  const Status valid = validate_args(args);
  EXPECT_TRUE(valid.ok()) << valid.message;
}

// What an upload writes, span by span over a poisoned buffer, is the dense copy the reference
// reads, for either format and for spans cut small (down to less than one kModel1 block).
TEST(BatchModel1, UploadSpansRebuildTheDenseCache) {
  auto name = [](KvFormat format) { return std::string(format == KvFormat::kModel1 ? "kModel1" : "kE4m3"); };
  const KvFormat formats[][2] = {{KvFormat::kModel1, KvFormat::kModel1},
                                 {KvFormat::kE4m3, KvFormat::kModel1},
                                 {KvFormat::kModel1, KvFormat::kE4m3},
                                 {KvFormat::kE4m3, KvFormat::kE4m3}};
  for (const auto& [window_format, extra_format] : formats) {
    for (int64_t extra_block_size : {2, 64}) {
      const st::HostBatch b = st::make_batch(two_source_options(window_format, extra_format, extra_block_size));
      for (const st::HostSource* pool : {&b.window(), &*b.extra}) {
        const std::vector<uint8_t> dense = st::dense_kv_cache(*pool);
        for (const auto& [max_gap, max_bytes] : {std::pair<int64_t, int64_t>{0, 1}, {0, 4096}, {64 << 10, 64 << 20}}) {
          SCOPED_TRACE("window " + name(window_format) + ", extra " + name(extra_format) + " B " +
                       std::to_string(extra_block_size) +
                       (pool == &b.window() ? ", window pool" : ", extra pool") + ", max_gap " +
                       std::to_string(max_gap) + ", max_bytes " + std::to_string(max_bytes));
          std::vector<uint8_t> uploaded(dense.size(), pool->poison_byte());
          int64_t end_of_last = 0, rows = 0;
          for (const st::PoolSpan& span : st::pool_spans(*pool, max_gap, max_bytes)) {
            ASSERT_GE(span.begin, end_of_last) << "spans overlap";
            end_of_last = span.end;
            rows += span.end_live - span.first_live;
            st::fill_span(*pool, span, &uploaded[span.begin]);
          }
          EXPECT_EQ(rows, static_cast<int64_t>(pool->live_slots.size()));
          EXPECT_TRUE(uploaded == dense);
        }
      }
    }
  }
}

// `swa-decode bench --format model1`: every source in kModel1 (the window in blocks of 64, C4A's
// compressed entries in blocks of 64, C128A's in blocks of 2), and a floor of 584 bytes a row read
// beside its id; --format seed keeps the layers as they were (the window in blocks of 256).
TEST(BatchModel1, BenchLayersPutEverySourceInTheFormat) {
  for (const st::LayerKind kind : {st::LayerKind::kSwa, st::LayerKind::kC4a, st::LayerKind::kC128a}) {
    SCOPED_TRACE(st::layer_name(kind));
    const st::LayerSpec seed{.kind = kind, .mean_context = 2048};
    const st::LayerSpec model1{.kind = kind, .format = KvFormat::kModel1, .mean_context = 2048};
    const st::BatchOptions seed_options = st::layer_options(seed, 4, 16, 128, DType::kInt32, 3);
    const st::BatchOptions model1_options = st::layer_options(model1, 4, 16, 128, DType::kInt32, 3);
    EXPECT_EQ(seed_options.kv_format, KvFormat::kE4m3);
    EXPECT_EQ(seed_options.block_size, st::kSeedWindowBlockSize);
    EXPECT_EQ(model1_options.kv_format, KvFormat::kModel1);
    EXPECT_EQ(model1_options.block_size, st::kModel1WindowBlockSize);
    ASSERT_EQ(seed_options.extra.has_value(), kind != st::LayerKind::kSwa);
    if (seed_options.extra) {
      EXPECT_EQ(seed_options.extra->format, KvFormat::kE4m3);
      EXPECT_EQ(model1_options.extra->format, KvFormat::kModel1);
      EXPECT_EQ(model1_options.extra->block_size, seed_options.extra->block_size);
    }

    const st::HostBatch b = st::make_batch(model1_options);
    const int64_t T = b.num_tokens, extra_entries = b.total_extra_entries(0, T);
    const int64_t window_entries = b.total_valid_entries(0, T) - extra_entries;
    EXPECT_GT(window_entries, 0);
    EXPECT_EQ(b.floor_bytes(0, T), 2 * T * b.num_heads * b.head_dim * 2 + (window_entries + extra_entries) * (584 + 4));
    st::HostTensors tensors = st::materialize_host(b);
    const Status valid = validate_args(st::host_args(b, tensors));
    EXPECT_TRUE(valid.ok()) << valid.message;
  }
  EXPECT_EQ(st::parse_format("model1"), KvFormat::kModel1);
  EXPECT_EQ(st::parse_format("seed"), KvFormat::kE4m3);
  EXPECT_FALSE(st::parse_format("e4m3").has_value());
  EXPECT_STREQ(st::format_name(KvFormat::kModel1), "model1");
}

// The generator refuses kModel1 options the format does not allow, saying which.
TEST(BatchModel1, RefusesLayoutsTheFormatDoesNotAllow) {
  st::BatchOptions o = two_source_options(KvFormat::kModel1, KvFormat::kE4m3, 64);
  o.head_dim = 64;
  EXPECT_THROW(st::make_batch(o), std::invalid_argument);
  o = two_source_options(KvFormat::kModel1, KvFormat::kE4m3, 64);
  o.kv_block_pad = 16;
  EXPECT_THROW(st::make_batch(o), std::invalid_argument);
  o = two_source_options(KvFormat::kE4m3, KvFormat::kModel1, 64);
  o.extra->kv_row_stride = 584;
  EXPECT_THROW(st::make_batch(o), std::invalid_argument);
  o = two_source_options(KvFormat::kModel1, KvFormat::kModel1, 64);
  o.inv_scale_magnitude = 3.0;  // UE8M0 holds powers of two only
  EXPECT_THROW(st::make_batch(o), std::invalid_argument);
}

}  // namespace
}  // namespace swa_decode
