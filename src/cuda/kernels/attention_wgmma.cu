// The Hopper tensor-core attention kernel's launchers: the build (plain, three per SM, persistent, narrow, stored
// K/V type) a problem runs on, the shared memory and residency the plan asks about. The kernel and its design:
// attention_wgmma_kernel-inl.cuh.
#include "cuda/kernels/attention_wgmma_kernel-inl.cuh"

#include <algorithm>
#include <cstdint>

namespace attnkit::cuda {
namespace {

using namespace wgmma_block;  // (sm90/wgmma_block_layout.cuh)

template <class T, int D, class S, bool kPlain = false, bool kThree = false, bool kPersistent = false, int kQk = D,
          int kV = D>
void launch_stored(const KernelParams& p, const WarpgroupMaps& maps, std::int64_t blocks, cudaStream_t stream,
                   bool overlap) {
  constexpr auto kernel = attention_wgmma_kernel<T, D, S, kPlain, kThree, kPersistent, kQk, kV>;
  allow_max_dynamic_smem<kernel>();
  KernelParams params = p;
  params.q_by_tma = maps.q_by_tma != 0;  // (read from the parameters' first lines, which every block reads anyway)
  params.block_end = p.first_block + blocks;
  const std::int64_t grid = kPersistent ? std::min(blocks, p.persistent_places) : blocks;
  launch_kernel(kernel, dim3(static_cast<unsigned>(grid)), block_threads<T, D, S>(),
                smem_bytes_for<T, D, S, kThree>(), stream, overlap, params, maps);
}

// Quantized caches are built for head dims 64 and 128 (warpgroup_supports says so), and so is the plain
// build (the short sequences it is for have head dim 64 or 128).
template <class T, int D>
void launch_typed(const KernelParams& p, const WarpgroupMaps& maps, std::int64_t blocks, cudaStream_t stream,
                  bool overlap) {
  if constexpr (D == 64 || D == 128) {
    if (p.k_type == KvType::Int8) return launch_stored<T, D, std::int8_t>(p, maps, blocks, stream, overlap);
    if (p.k_type == KvType::Int4) return launch_stored<T, D, Int4Tag>(p, maps, blocks, stream, overlap);
    if constexpr (D == 64) {
      // (With the GQA op's Q rotary only where every row sees every key: its causal prefill has not run in this
      // build on a GPU yet, and runs two per SM.)
      const bool rotary_ok = p.rotary.cos == nullptr || sees_keys_as_plain(p);
      if (p.three_per_sm && sees_keys_by_rule_only(p) && rotary_ok) {
        // A persistent grid needs Q by TMA (its producer loads the next unit's) and one key range for every unit.
        const bool persistent = maps.q_by_tma != 0 && !p.kv_copies && blocks > p.persistent_places &&
                                p.persistent_places > 0 && p.tail_pieces <= 1 && !p.cluster_merge && p.k_len > 0;
        if (runs_plain(p)) {
          if (persistent) return launch_stored<T, D, T, true, true, true>(p, maps, blocks, stream, overlap);
          return launch_stored<T, D, T, true, true>(p, maps, blocks, stream, overlap);
        }
        return launch_stored<T, D, T, false, true>(p, maps, blocks, stream, overlap);
      }
    }
    if (runs_plain(p)) return launch_stored<T, D, T, true>(p, maps, blocks, stream, overlap);
  }
  launch_stored<T, D, T>(p, maps, blocks, stream, overlap);
}

// A narrow build (warpgroup_widths): the general build, and the plain one in the 128 bucket (where the plain
// builds are).
template <class T, int D, int kQk, int kV>
void launch_narrow(const KernelParams& p, const WarpgroupMaps& maps, std::int64_t blocks, cudaStream_t stream,
                   bool overlap) {
  if constexpr (D == 128) {
    if (runs_plain(p)) return launch_stored<T, D, T, true, false, false, kQk, kV>(p, maps, blocks, stream, overlap);
  }
  launch_stored<T, D, T, false, false, false, kQk, kV>(p, maps, blocks, stream, overlap);
}

}  // namespace

bool warpgroup_supports(DType dtype, std::int64_t head_dim, std::int64_t v_head_dim, KvType k_type, KvType v_type) {
  // Float K/V: any dims of whole 16-byte chunks in a bucket (the wider dim's); a quantized cache at the exact
  // equal dims 64 and 128.
  const bool dims = head_dim % 8 == 0 && v_head_dim % 8 == 0 && warpgroup_bucket(warpgroup_width(head_dim, v_head_dim)) > 0;
  const bool storage = k_type == v_type && (k_type == KvType::Float ||
                                            (head_dim == v_head_dim && (head_dim == 64 || head_dim == 128)));
  return (dtype == DType::f16 || dtype == DType::bf16) && dims && storage;
}

std::size_t warpgroup_smem_bytes(std::int64_t width, KvType type, bool three) {
  const std::int64_t head_dim = warpgroup_bucket(width);
  if (three && head_dim == 64 && type == KvType::Float) return smem_bytes_for<__half, 64, __half, true>();
  // The element type does not change the layout: float16 stands for both.
  switch (type) {
    case KvType::Int8: return head_dim == 64 ? smem_bytes_for<__half, 64, std::int8_t>() : smem_bytes_for<__half, 128, std::int8_t>();
    case KvType::Int4: return head_dim == 64 ? smem_bytes_for<__half, 64, Int4Tag>() : smem_bytes_for<__half, 128, Int4Tag>();
    case KvType::Float: break;
  }
  return head_dim == 64    ? smem_bytes_for<__half, 64, __half>()
         : head_dim == 128 ? smem_bytes_for<__half, 128, __half>()
         : head_dim == 192 ? smem_bytes_for<__half, 192, __half>()
                           : smem_bytes_for<__half, 256, __half>();
}

std::int64_t warpgroup_rows(std::int64_t head_dim, KvType type) {
  return type == KvType::Float && warpgroup_bucket(head_dim) != 64 ? kWarpgroupRows : 64;
}

int warpgroup_resident_blocks(DType dtype, std::int64_t head_dim, KvType type, bool three) {
  if (warpgroup_bucket(head_dim) != 64 || type != KvType::Float) return 1;
  // (The general build's instance stands for both builds: the same threads, registers and shared memory.)
  using Half = __half;
  using Brain = __nv_bfloat16;
  static const int blocks[2][2] = {
      {resident_blocks_per_sm<attention_wgmma_kernel<Half, 64, Half, false, false>>(block_threads<Half, 64, Half>(),
                                                                                    smem_bytes_for<Half, 64, Half>()),
       resident_blocks_per_sm<attention_wgmma_kernel<Half, 64, Half, false, true>>(
           block_threads<Half, 64, Half>(), smem_bytes_for<Half, 64, Half, true>())},
      {resident_blocks_per_sm<attention_wgmma_kernel<Brain, 64, Brain, false, false>>(
           block_threads<Brain, 64, Brain>(), smem_bytes_for<Brain, 64, Brain>()),
       resident_blocks_per_sm<attention_wgmma_kernel<Brain, 64, Brain, false, true>>(
           block_threads<Brain, 64, Brain>(), smem_bytes_for<Brain, 64, Brain, true>())}};
  return blocks[dtype == DType::f16 ? 0 : 1][three ? 1 : 0];
}

void launch_warpgroup(const KernelParams& p, const WarpgroupMaps& maps, DType dtype, std::int64_t blocks,
                      cudaStream_t stream, bool overlap) {
  static_assert(sizeof(kWarpgroupBucketDims) / sizeof(int) == 4, "a branch below per built bucket");
  static_assert(sizeof(kWarpgroupNarrowBuilds) / sizeof(WarpgroupWidths) == 4, "a branch below per narrow build");
  const int bucket = warpgroup_bucket(warpgroup_width(p.head_dim, p.v_head_dim));
  const WarpgroupWidths widths = warpgroup_widths(p.head_dim, p.v_head_dim, p.narrow);
  const auto is = [&](WarpgroupWidths w) { return widths.bucket == w.bucket && widths.qk == w.qk && widths.v == w.v; };
  const auto typed = [&](auto element) {
    using T = decltype(element);
    constexpr WarpgroupWidths n0 = kWarpgroupNarrowBuilds[0], n1 = kWarpgroupNarrowBuilds[1],
                              n2 = kWarpgroupNarrowBuilds[2], n3 = kWarpgroupNarrowBuilds[3];
    if (p.narrow && is(n0)) launch_narrow<T, n0.bucket, n0.qk, n0.v>(p, maps, blocks, stream, overlap);
    else if (p.narrow && is(n1)) launch_narrow<T, n1.bucket, n1.qk, n1.v>(p, maps, blocks, stream, overlap);
    else if (p.narrow && is(n2)) launch_narrow<T, n2.bucket, n2.qk, n2.v>(p, maps, blocks, stream, overlap);
    else if (p.narrow && is(n3)) launch_narrow<T, n3.bucket, n3.qk, n3.v>(p, maps, blocks, stream, overlap);
    else if (bucket == 64) launch_typed<T, 64>(p, maps, blocks, stream, overlap);
    else if (bucket == 128) launch_typed<T, 128>(p, maps, blocks, stream, overlap);
    else if (bucket == 192) launch_typed<T, 192>(p, maps, blocks, stream, overlap);
    else launch_typed<T, 256>(p, maps, blocks, stream, overlap);
  };
  if (dtype == DType::f16) typed(__half{});
  else typed(__nv_bfloat16{});
}

}  // namespace attnkit::cuda
