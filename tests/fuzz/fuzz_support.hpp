// What the fuzz targets share: numbers drawn from the input with a bias to the values checks get wrong (0, 1,
// the edges of int32 / int64, powers of two near them), and buffers allocated at exactly their stated size so that
// AddressSanitizer reports any access past them.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

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
    const std::vector<std::uint8_t> fill = in.ConsumeBytes<std::uint8_t>(std::min<std::size_t>(bytes, 64));
    for (std::size_t i = 0; i < bytes; ++i) {
      data_.get()[i] = std::byte{fill.empty() ? static_cast<std::uint8_t>(i * 37) : fill[i % fill.size()]};
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

}  // namespace attnkit::fuzz
