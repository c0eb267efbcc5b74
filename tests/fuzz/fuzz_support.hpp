// What the fuzz targets share: numbers drawn from the input with a bias to the values checks get wrong (0, 1,
// the edges of int32 / int64, powers of two near them), and buffers allocated at exactly their stated size so that
// AddressSanitizer reports any access past them.
#pragma once

#include <attnkit/layout.hpp>

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

namespace attnkit::fuzz {

inline constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
inline constexpr std::int64_t kInt64Min = std::numeric_limits<std::int64_t>::min();

// An int64 that is usually small (in [lo, hi]) and sometimes an edge value or any 64-bit pattern.
inline std::int64_t edgy_int(FuzzedDataProvider& in, std::int64_t lo, std::int64_t hi) {
  static constexpr std::int64_t kEdges[] = {0,
                                            1,
                                            -1,
                                            2,
                                            63,
                                            64,
                                            65,
                                            255,
                                            256,
                                            257,
                                            std::int64_t{1} << 31,
                                            (std::int64_t{1} << 31) - 1,
                                            std::int64_t{1} << 32,
                                            std::int64_t{1} << 50,
                                            std::int64_t{1} << 61,
                                            std::int64_t{1} << 62,
                                            (std::int64_t{1} << 62) + 250,
                                            kInt64Max,
                                            kInt64Max - 1,
                                            kInt64Min};
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: return in.PickValueInArray(kEdges);
    case 1: return in.ConsumeIntegral<std::int64_t>();
    default: return in.ConsumeIntegralInRange<std::int64_t>(lo, hi);
  }
}

// A heap buffer of exactly `bytes` bytes (none for 0 bytes), filled from the input, then with a fixed pattern.
class Buffer {
 public:
  Buffer() = default;
  Buffer(FuzzedDataProvider& in, std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    data_.reset(static_cast<std::byte*>(std::malloc(bytes)));
    // Byte i is fill[i % fill.size()], or i * 37 (mod 256) when the input has no bytes left.
    std::vector<std::uint8_t> fill = in.ConsumeBytes<std::uint8_t>(std::min<std::size_t>(bytes, 64));
    if (fill.empty()) {
      fill.resize(std::min<std::size_t>(bytes, 256));
      for (std::size_t i = 0; i < fill.size(); ++i) fill[i] = static_cast<std::uint8_t>(i * 37);
    }
    // One period, then the filled part copied after itself (a whole number of periods each time): no compare per
    // byte, which the coverage instrumentation turned into most of a fuzzing step's time.
    std::memcpy(data_.get(), fill.data(), fill.size());
    for (std::size_t done = fill.size(); done < bytes; done *= 2) {
      std::memcpy(data_.get() + done, data_.get(), std::min(done, bytes - done));
    }
  }
  std::byte* data() const { return data_.get(); }
  std::size_t bytes() const { return bytes_; }
  std::vector<std::byte> copy() const {
    return data_ ? std::vector<std::byte>(data_.get(), data_.get() + bytes_) : std::vector<std::byte>{};
  }
  bool equals(const std::vector<std::byte>& snapshot) const {
    return snapshot.size() == bytes_ && (bytes_ == 0 || std::memcmp(snapshot.data(), data_.get(), bytes_) == 0);
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t bytes_ = 0;
};

// A written buffer must keep its bytes when a call is rejected: anything else is a bug worth a crash report.
inline void require_unchanged(const Buffer& b, const std::vector<std::byte>& snapshot) {
  if (!b.equals(snapshot)) std::abort();
}

// Elements a fuzz target allocates for one buffer at most.
inline constexpr std::int64_t kMaxElements = std::int64_t{1} << 15;

// One tensor's layout: a dense or padded one for its extents (most inputs: they reach the kernels), or any
// offset and strides.
inline Layout draw_layout(FuzzedDataProvider& in, std::int64_t heads, std::int64_t rows, std::int64_t cols) {
  // The dense helpers multiply the extents in int64 (the caller's arithmetic): only for extents whose product fits.
  const bool small = heads >= 0 && rows >= 0 && cols >= 0 && heads < (1 << 20) && rows < (1 << 20) &&
                     cols < (1 << 20);  // then heads * rows * (cols + 9) < 2^61
  switch (small ? in.ConsumeIntegralInRange<int>(0, 5) : 5) {
    case 0: return Layout::head_first(heads, rows, cols);
    case 1: return Layout::positions_first(heads, rows, cols);
    case 2: {  // padded: an offset, longer rows, gaps between heads and batch entries
      const std::int64_t pad = in.ConsumeIntegralInRange<std::int64_t>(0, 9);
      const Layout d = Layout::head_first(heads, rows, cols + pad);
      return {pad, d.batch_stride + pad, d.head_stride + pad, d.row_stride};
    }
    case 3: {  // broadcast: a stride of 0 somewhere
      Layout l = Layout::head_first(heads, rows, cols);
      const int which = in.ConsumeIntegralInRange<int>(0, 2);
      (which == 0 ? l.batch_stride : which == 1 ? l.head_stride : l.row_stride) = 0;
      return l;
    }
    default:
      return {edgy_int(in, 0, 64), edgy_int(in, 0, 4096), edgy_int(in, 0, 1024), edgy_int(in, 0, 128)};
  }
}

// Highest index + 1 a layout reaches (saturated at int64's top), computed apart from the library's checks.
inline std::int64_t reach(const Layout& l, std::int64_t b, std::int64_t h, std::int64_t r, std::int64_t c) {
  if (b <= 0 || h <= 0 || r <= 0 || c <= 0) return 0;
  // Each product is below 2^126 in magnitude; the sum is saturated term by term so that it cannot pass 2^127.
  const __int128 terms[] = {static_cast<__int128>(b - 1) * l.batch_stride, static_cast<__int128>(h - 1) * l.head_stride,
                            static_cast<__int128>(r - 1) * l.row_stride, static_cast<__int128>(c)};
  constexpr __int128 kFar = static_cast<__int128>(1) << 100;
  __int128 top = l.offset;
  for (__int128 t : terms) {
    top += t;
    if (top > kFar || top < -kFar) break;
  }
  return top > kInt64Max || top < 0 ? kInt64Max : static_cast<std::int64_t>(top);
}

// A buffer for `needed` elements of `bits` bits: usually exactly that, sometimes fewer (the checks must refuse
// it), sometimes null, and sometimes a stated size beyond an address space (refused before any access: only
// then may the allocation be smaller than the statement).
struct Arg {
  Buffer buffer;
  std::int64_t elements = 0;
  bool null = false;
};
inline Arg draw_arg(FuzzedDataProvider& in, std::int64_t needed, std::int64_t bits) {
  Arg a;
  needed = std::max<std::int64_t>(needed, 0);
  const int mode = in.ConsumeIntegralInRange<int>(0, 15);
  if (mode == 0) {
    a.null = true;
    a.elements = in.ConsumeBool() ? needed : 0;
    return a;
  }
  std::int64_t stated = std::min(needed, kMaxElements);
  if (mode == 1) stated = in.ConsumeIntegralInRange<std::int64_t>(0, stated);
  const std::int64_t address_space = std::numeric_limits<std::ptrdiff_t>::max() / std::max<std::int64_t>(bits / 8, 1);
  if (mode == 2 && bits >= 16) {  // 1-byte elements: no int64 count is beyond an address space
    a.elements = address_space + in.ConsumeIntegralInRange<std::int64_t>(1, 1 << 20);
    a.buffer = Buffer(in, 64);
    return a;
  }
  a.elements = stated;
  a.buffer = Buffer(in, static_cast<std::size_t>((stated * bits + 7) / 8));
  return a;
}

inline const void* ptr(const Arg& a) { return a.null ? nullptr : a.buffer.data(); }

// An int32 array of `count` values: usually cumulative steps of at most `step` (cu_seqlens), or values below
// `below` (block tables); sometimes whatever draw_arg gives.
inline Arg draw_sequence_array(FuzzedDataProvider& in, std::int64_t count, std::int64_t step, std::int64_t below, bool cumulative) {
  Arg a = draw_arg(in, count, 32);
  if (a.null || a.elements > count || !in.ConsumeBool()) return a;  // (past count: a stated size beyond memory)
  auto* v = reinterpret_cast<std::int32_t*>(a.buffer.data());
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < a.elements; ++i) {
    constexpr std::int64_t kTop = std::numeric_limits<std::int32_t>::max();
    // (below may be any drawn int64: below - 1 only where it cannot overflow)
    const std::int64_t most = std::clamp<std::int64_t>(cumulative ? step : below > 0 ? below - 1 : 0, 0, kTop);
    const std::int64_t x = in.ConsumeIntegralInRange<std::int64_t>(0, most);
    at = std::min(cumulative ? (i == 0 ? 0 : at + x) : x, kTop);  // (both terms at most 2^31: no overflow)
    v[i] = static_cast<std::int32_t>(at);
  }
  return a;
}

}  // namespace attnkit::fuzz
