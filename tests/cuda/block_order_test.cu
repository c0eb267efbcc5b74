// The block coordinates every CUDA attention kernel starts from (kernel_params.cuh), on the host: no GPU needed, so
// this runs in CI. block_coord must give every block index its own (batch, K/V head, row block, split) in index
// order and in the heavy-first order (in any group size), the fast-division path must agree with the 64-bit one,
// heavy-first must start each group's pairs on their last row block, and row_of must number a K/V head's rows
// query-major.
#include <cuda/common/kernel_params.cuh>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>

namespace attnkit::test {
namespace {

using cuda::block_coord;
using cuda::BlockCoord;
using cuda::KernelParams;

KernelParams shape(std::int64_t batch, std::int64_t kv_heads, std::int64_t row_blocks, std::int64_t splits) {
  KernelParams k{};
  k.batch = batch;
  k.kv_heads = kv_heads;
  k.group = 4;
  k.q_len = 16;
  k.group_rows = k.group * k.q_len;
  k.row_blocks = row_blocks;
  k.splits = splits;
  k.k_len = 1000;
  k.split_keys = (k.k_len + splits - 1) / splits;
  return k;
}

TEST(BlockOrder, EveryBlockGetsItsOwnCoordinatesInEveryOrder) {
  int shapes = 0;
  for (std::int64_t batch : {1, 2, 3}) {
    for (std::int64_t kv_heads : {1, 3, 8}) {
      for (std::int64_t row_blocks : {1, 2, 5, 32}) {
        for (std::int64_t splits : {1, 3}) {
          const std::int64_t pairs = batch * kv_heads;
          for (std::int64_t group : {std::int64_t{0}, std::int64_t{1}, std::int64_t{2}, std::int64_t{5}, pairs}) {
            const bool heavy = group > 0;
            KernelParams fast = shape(batch, kv_heads, row_blocks, splits);
            cuda::set_block_order(fast, heavy, group);
            ASSERT_TRUE(fast.fast_coords);
            KernelParams wide = fast;
            wide.fast_coords = false;  // the 64-bit path
            const std::int64_t blocks = pairs * row_blocks * splits;
            std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>> seen;
            for (std::int64_t block = 0; block < blocks; ++block) {
              const BlockCoord c = block_coord(fast, block);
              const BlockCoord w = block_coord(wide, block);
              ASSERT_EQ(std::make_tuple(c.b, c.kvh, c.row_block, c.split, c.key_begin, c.key_end),
                        std::make_tuple(w.b, w.kvh, w.row_block, w.split, w.key_begin, w.key_end))
                  << "block " << block;
              ASSERT_TRUE(c.b >= 0 && c.b < batch && c.kvh >= 0 && c.kvh < kv_heads && c.row_block >= 0 &&
                          c.row_block < row_blocks && c.split >= 0 && c.split < splits)
                  << "block " << block;
              ASSERT_EQ(c.key_begin, c.split * fast.split_keys);
              seen.emplace(c.b, c.kvh, c.row_block, c.split);
              if (heavy && block % (fast.heavy_group * row_blocks * splits) < splits) {
                // A group's first blocks: its first pair on its last row block.
                EXPECT_EQ(c.row_block, row_blocks - 1) << "block " << block;
              }
            }
            EXPECT_EQ(static_cast<std::int64_t>(seen.size()), blocks)
                << "batch " << batch << ", kv_heads " << kv_heads << ", row_blocks " << row_blocks << ", splits "
                << splits << ", heavy group " << group;
            ++shapes;
          }
        }
      }
    }
  }
  EXPECT_EQ(shapes, 3 * 3 * 4 * 2 * 5);
}

TEST(BlockOrder, HeavyFirstRunsEachGroupsRowBlocksInDescendingOrder) {
  KernelParams k = shape(2, 5, 7, 1);  // 10 pairs in groups of 4: 4, 4 and a last group of 2
  cuda::set_block_order(k, true, 4);
  std::int64_t previous_group = -1, previous_row_block = 0;
  for (std::int64_t block = 0; block < 10 * 7; ++block) {
    const BlockCoord c = block_coord(k, block);
    const std::int64_t pair = c.b * k.kv_heads + c.kvh;
    const std::int64_t group = pair / 4;
    ASSERT_GE(group, previous_group) << "block " << block;  // groups one after the other
    if (group == previous_group) ASSERT_LE(c.row_block, previous_row_block) << "block " << block;
    previous_group = group;
    previous_row_block = c.row_block;
  }
}

TEST(BlockOrder, RowsOfAKvHeadAreQueryMajor) {
  for (std::int64_t group : {1, 3, 4, 8}) {
    for (std::int64_t q_len : {1, 5, 17}) {
      KernelParams k = shape(1, 2, 1, 1);
      k.group = group;
      k.q_len = q_len;
      k.group_rows = group * q_len;
      cuda::set_block_order(k, false, 0);
      KernelParams wide = k;
      wide.fast_coords = false;
      for (std::int64_t kvh = 0; kvh < 2; ++kvh) {
        for (std::int64_t pair = 0; pair < k.group_rows; ++pair) {
          const cuda::RowOf r = cuda::row_of(k, kvh, pair);
          const cuda::RowOf w = cuda::row_of(wide, kvh, pair);
          ASSERT_EQ(r.head, w.head);
          ASSERT_EQ(r.query, w.query);
          EXPECT_EQ(r.query * group + (r.head - kvh * group), pair);
          EXPECT_TRUE(r.head >= kvh * group && r.head < (kvh + 1) * group && r.query < q_len);
        }
      }
    }
  }
}

// A plain launch with a split tail: blocks before tail_block are the whole row blocks block_coord gives them, and
// each later row block is tail_pieces consecutive blocks whose key ranges tile [0, k_len) in order.
TEST(BlockOrder, ASplitTailCoversEachOfItsRowBlocksKeysOnceInOrder) {
  for (std::int64_t piece_tiles : {1, 2, 3, 7}) {
    for (std::int64_t tail_block : {0, 7, 13}) {
      KernelParams k = shape(2, 3, 3, 1);  // 18 row blocks of 1000 keys: 8 tiles of 128
      const std::int64_t pieces = (8 + piece_tiles - 1) / piece_tiles;  // as the plan counts them
      k.tail_block = tail_block;
      k.tail_pieces = pieces;
      k.tail_piece_keys = 128 * piece_tiles;
      cuda::set_block_order(k, false, 0);
      KernelParams whole = k;
      whole.tail_pieces = 0;
      const std::int64_t row_blocks = k.batch * k.kv_heads * k.row_blocks;
      std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> seen;
      std::int64_t block = 0;
      for (; block < tail_block; ++block) {
        ASSERT_FALSE(cuda::is_tail_piece(k, block));
        const BlockCoord c = cuda::plain_block_coord(k, block);
        const BlockCoord w = block_coord(whole, block);
        ASSERT_EQ(std::make_tuple(c.b, c.kvh, c.row_block, c.split, c.key_begin, c.key_end),
                  std::make_tuple(w.b, w.kvh, w.row_block, std::int64_t{0}, std::int64_t{0}, k.k_len));
      }
      for (std::int64_t row_block = tail_block; row_block < row_blocks; ++row_block) {
        const BlockCoord w = block_coord(whole, row_block);
        std::int64_t next_key = 0;
        for (std::int64_t piece = 0; piece < pieces; ++piece, ++block) {
          ASSERT_TRUE(cuda::is_tail_piece(k, block));
          const BlockCoord c = cuda::plain_block_coord(k, block);
          ASSERT_EQ(std::make_tuple(c.b, c.kvh, c.row_block, c.split), std::make_tuple(w.b, w.kvh, w.row_block, piece))
              << "block " << block;
          EXPECT_EQ(c.key_begin, std::min(next_key, k.k_len)) << "block " << block;
          EXPECT_EQ(c.key_begin % 128, 0);
          next_key = c.key_end;
          EXPECT_TRUE(seen.insert({c.b, c.kvh, c.row_block}).second || piece > 0);
        }
        EXPECT_EQ(next_key, k.k_len) << "row block " << row_block;
      }
      EXPECT_EQ(static_cast<std::int64_t>(seen.size()), row_blocks - tail_block);
    }
  }
}

}  // namespace
}  // namespace attnkit::test
