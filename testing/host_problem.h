// A small decode problem in host memory, built slot by slot, for the CPU tests (reference,
// validation, kernel selection). The other half of the one test fixture is testing/batch.h
// (realistic random batches for the GPU tests and the bench); both draw from testing::Rng, poison
// with testing's constants and round to bf16 with testing::float_to_bf16_bits (host_numerics.h).
//
// Every cache row of either source (the window and the optional extra source) starts out poisoned
// (e4m3 NaN kE4m3NaN in every byte, scale NaN), out holds
// kBf16PoisonBits and lse NaN, and only the slots a test names as entries get real data, so a read
// of anything docs/semantics.md calls "no entry" turns the result into NaN. A source in kModel1 rows
// (docs/semantics.md, "Row formats") is poisoned the same way: e4m3 NaN in every e4m3 byte, bf16
// NaN (0xFFFF) in every RoPE value and UE8M0 NaN (kUe8m0NaN) in every byte of every footer scale
// row; filling a slot writes its row and its 7 scale bytes, never the pad byte.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "swa_decode/swa_decode.h"
#include "testing/host_numerics.h"

namespace swa_decode::testing {

// The extra source of a problem (docs/semantics.md, "The extra source"); its head dim and token
// count are the problem's. Defaults: a pool of 2 blocks of 4 slots, 4 entries a token.
struct ExtraShape {
  int64_t num_blocks = 2, block_size = 4;
  int64_t max_entries = 4, index_cols = 4;
  int64_t kv_token_pad = 0, kv_block_pad = 0, index_pad = 0;  // as ProblemShape's
  DType inv_scale_dtype = DType::kBFloat16;
  DType index_dtype = DType::kInt32;
  DType lens_dtype = DType::kInt32;
  // Row layout; kModel1 needs head_dim 512 and ignores kv_token_pad (rows are 576 bytes), lays each
  // block out as FlashMLA does (block_size * 584 bytes rounded up to a multiple of 576), adds
  // kv_block_pad (keep it a multiple of 576) and passes no inv_scale (nullptr, num_scales 0).
  KvFormat format = KvFormat::kE4m3;
  // Both sources point at the window's cache and scales: the extra ids name the window's slots,
  // and num_blocks, block_size, the kv pads, inv_scale_dtype and format above are ignored.
  bool shares_window_cache = false;
};

// Defaults small enough to follow by hand: q [2, 3, 8], a pool of 3 blocks of 4 slots, W = 4.
struct ProblemShape {
  int64_t num_tokens = 2, num_heads = 3, head_dim = 8;
  int64_t num_blocks = 3, block_size = 4;
  int64_t window_size = 4, index_cols = 4;
  // Padding (elements; bytes for kv) added to each stride, 0 = contiguous; non-zero makes every
  // tensor strided. For head-major q, q_head_pad follows each token row and q_token_pad each head.
  int64_t q_head_pad = 0, q_token_pad = 0;
  int64_t out_head_pad = 0, out_token_pad = 0;
  int64_t kv_token_pad = 0, kv_block_pad = 0;
  int64_t index_pad = 0, lse_pad = 0;
  bool head_major_q = false;  // q laid out as [H, T, D] (stride_q_token < stride_q_head)
  DType inv_scale_dtype = DType::kBFloat16;
  DType index_dtype = DType::kInt32;
  DType lens_dtype = DType::kInt32;
  KvFormat kv_format = KvFormat::kE4m3;  // the window's rows, as ExtraShape::format
  EmptyTokenLse empty_token_lse = EmptyTokenLse::kNegativeInfinity;
  std::optional<ExtraShape> extra = std::nullopt;  // none: args().extra.kv_cache is nullptr
};

// Which of a problem's sources a call addresses. Every slot and index call takes one and defaults
// to the window.
enum class Source { kWindow, kExtra };

// The head_dim values of `slot`'s row in `source` of `a`, whose tensors are in host memory (a
// HostProblem's args()), decoded as docs/semantics.md reads them: kE4m3 codes times the slot's
// inverse scale; kModel1 codes times 2^(scale - 127), then the bf16 RoPE values. The tests' own
// reading of a row (tolerance scales, exact expectations), apart from the reference's.
std::vector<double> host_row_values(const DecodeArgs& a, Source source, int64_t slot);

class HostProblem {
 public:
  HostProblem(const ProblemShape& shape, uint64_t seed);

  // Slots of a source's cache (the window's for an extra source that shares it).
  int64_t num_slots(Source source = Source::kWindow) const { return pool(source).num_slots; }
  const ProblemShape& shape() const { return s_; }

  // Gives `slot` a real row (random finite e4m3 codes with |value| <= 7.5) and a scale in [0.5, 2];
  // in kModel1, scale bytes in [125, 128] (0.25..2) and RoPE values drawn from N(0, 1) in bf16.
  void fill_slot(int64_t slot, Source source = Source::kWindow);
  // kE4m3 only: gives `slot` the row codes[d % codes.size()] and `inv_scale`.
  void set_row(int64_t slot, const std::vector<uint8_t>& codes, float inv_scale, Source source = Source::kWindow);
  // Stores bf16(value) as the bf16 and as the fp32 scale, so both dtypes give the same result.
  void set_scale(int64_t slot, float value, Source source = Source::kWindow) {
    pool(source).scales.set(slot, float_to_bf16_bits(value), round_to_bf16(value));
  }
  uint8_t* row(int64_t slot, Source source = Source::kWindow);
  // kModel1 only: gives `slot` the e4m3 bytes codes[d % codes.size()] (d < 448), the UE8M0 scale
  // bytes `scale_codes` and the RoPE values rope_bits[i % rope_bits.size()] (bf16 bits, i < 64).
  void set_model1_row(int64_t slot, const std::vector<uint8_t>& codes, const std::array<uint8_t, 7>& scale_codes,
                      const std::vector<uint16_t>& rope_bits, Source source = Source::kWindow);
  // kModel1 only: the 8-byte scale row of `slot` in its block's footer.
  uint8_t* model1_scales(int64_t slot, Source source = Source::kWindow);

  // Writes an index without filling its row (use for ids that must never be read).
  void set_index_raw(int64_t t, int64_t c, int64_t id, Source source = Source::kWindow) {
    Ids& to = ids(source);
    to.indices.set(t * to.stride_indices_token + c, static_cast<int32_t>(id), id);
  }
  // Writes a slot id and fills the slot's row if the id names one.
  void set_index(int64_t t, int64_t c, int64_t slot, Source source = Source::kWindow);
  void set_len(int64_t t, int64_t len, Source source = Source::kWindow) {
    ids(source).lens.set(t, static_cast<int32_t>(len), len);
  }
  void set_q(int64_t t, int64_t h, int64_t d, float value) { q_[q_offset(t, h, d)] = float_to_bf16_bits(value); }
  void set_sink(std::vector<float> sink) { sink_ = std::move(sink); }

  // Backend::kCpu arguments over this problem's tensors (valid while it lives).
  DecodeArgs args();
  // args() with each source's lens holding one length per n consecutive tokens (its
  // lens_rows_per_entry n, docs/semantics.md "Valid entries"): entry e is the length set_len gave
  // every token of [e * n, (e + 1) * n). Throws std::invalid_argument, naming the token, if a token
  // of a group has another length or n does not divide num_tokens. extra_rows_per_entry is unused
  // without an extra source. The lengths stay valid until the next call.
  DecodeArgs args_with_lens_per_rows(int64_t window_rows_per_entry, int64_t extra_rows_per_entry = 1);

  uint16_t out_bits(int64_t t, int64_t h, int64_t d) const {
    return out_[t * args_.stride_out_token + h * args_.stride_out_head + d];
  }
  float lse(int64_t t, int64_t h) const { return lse_[t * args_.stride_lse_token + h]; }
  const std::vector<uint16_t>& out_buffer() const { return out_; }
  const std::vector<float>& lse_buffer() const { return lse_; }
  Rng& rng() { return rng_; }

 private:
  // One tensor in both dtypes it may take (int32 / int64 indices and lens, bf16 bits / fp32
  // scales), always written together, so the problem is the same whichever dtype args() names.
  template <typename First, typename Second>
  class InBothDtypes {
   public:
    InBothDtypes(size_t count, First first, Second second) : first_(count, first), second_(count, second) {}
    void set(int64_t i, First first, Second second) {
      first_[i] = first;
      second_[i] = second;
    }
    const void* data(bool second) const {
      return second ? static_cast<const void*>(second_.data()) : static_cast<const void*>(first_.data());
    }

   private:
    std::vector<First> first_;
    std::vector<Second> second_;
  };

  // One source's paged cache and scales, every slot poisoned until a test fills it.
  struct Pool {
    Pool(int64_t num_blocks, int64_t block_size, int64_t stride_kv_block, int64_t stride_kv_token, KvFormat format);
    int64_t block_size, stride_kv_block, stride_kv_token, num_slots;
    KvFormat format;
    std::vector<uint8_t> cache;
    InBothDtypes<uint16_t, float> scales;  // bf16 bits, fp32
    std::vector<bool> filled;
  };
  // One source's ids and lengths: no entry (-1) and length 0 until a test sets them.
  struct Ids {
    Ids(int64_t num_tokens, int64_t stride_indices_token);
    int64_t stride_indices_token;
    InBothDtypes<int32_t, int64_t> indices;
    InBothDtypes<int32_t, int64_t> lens;
  };

  int64_t q_offset(int64_t t, int64_t h, int64_t d) const {
    return t * args_.stride_q_token + h * args_.stride_q_head + d;
  }
  bool extra_shares_window_cache() const { return s_.extra.value().shares_window_cache; }
  Pool& pool(Source source) {
    return source == Source::kWindow || extra_shares_window_cache() ? window_pool_ : extra_pool_.value();
  }
  const Pool& pool(Source source) const {
    return source == Source::kWindow || extra_shares_window_cache() ? window_pool_ : extra_pool_.value();
  }
  Ids& ids(Source source) { return source == Source::kWindow ? window_ids_ : extra_ids_.value(); }

  ProblemShape s_;
  Rng rng_;
  DecodeArgs args_;  // shapes, strides and dtypes, set once; args() adds the tensor pointers
  std::vector<uint16_t> q_;
  Pool window_pool_;
  Ids window_ids_;
  std::optional<Pool> extra_pool_;  // none without an extra source or when it shares the window's
  std::optional<Ids> extra_ids_;
  // args_with_lens_per_rows' lengths, one per group of tokens, of the window and the extra source.
  std::optional<InBothDtypes<int32_t, int64_t>> window_group_lens_, extra_group_lens_;
  std::vector<float> sink_;
  std::vector<uint16_t> out_;
  std::vector<float> lse_;
};

}  // namespace swa_decode::testing
