// Cycle marks inside one block, for finding where a short block's time goes (its row setup, its first copies,
// each tile, its finish): a build with the CMake option ATTNKIT_CUDA_PHASES prints, from one thread of every
// 16th block, the clock64() cycles between consecutive marks and the block's start and end on the global timer.
// scripts/gpu-check --phases runs the timing tool built so and bench/block_phases.py sums the lines up. In every
// other build the macros are empty. The printf changes the kernel around it (registers, scheduling): the marks
// say where the time goes, not how long the kernel takes (that is the benchmark's).
#pragma once

#ifdef ATTNKIT_CUDA_PHASES
#include <cstdio>

namespace attnkit::cuda {

struct BlockPhases {
  static constexpr int kMarks = 10;
  long long at[kMarks];
  unsigned long long start_ns;

  __device__ static unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  __device__ void begin() {
    for (int i = 0; i < kMarks; ++i) at[i] = 0;
    at[0] = clock64();
    start_ns = global_ns();
  }
  // Marks 1 .. kMarks - 1, in program order; a mark the block did not pass prints as "-".
  __device__ void mark(int i) { at[i] = clock64(); }
  __device__ void print(const char* kernel) const {
    const unsigned long long end_ns = global_ns();
    char text[256];
    int n = 0;
    long long last = at[0];
    for (int i = 1; i < kMarks; ++i) {
      if (at[i] == 0) {
        text[n++] = ' ';
        text[n++] = '-';
        continue;
      }
      n += snprintf_cycles(text + n, at[i] - last);
      last = at[i];
    }
    text[n] = '\0';
    printf("phases %s block %d start_ns %llu end_ns %llu cycles%s\n", kernel, static_cast<int>(blockIdx.x), start_ns,
           end_ns, text);
  }
  // " <v>" in decimal (device printf has no snprintf).
  __device__ static int snprintf_cycles(char* out, long long v) {
    char digits[24];
    int d = 0;
    if (v < 0) v = 0;
    do {
      digits[d++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v > 0 && d < 20);
    out[0] = ' ';
    for (int i = 0; i < d; ++i) out[1 + i] = digits[d - 1 - i];
    return d + 1;
  }
};

}  // namespace attnkit::cuda

#define ATTNKIT_PHASES_BEGIN() \
  ::attnkit::cuda::BlockPhases block_phases_; \
  block_phases_.begin();
#define ATTNKIT_PHASE(i) block_phases_.mark(i);
#define ATTNKIT_PHASES_PRINT(kernel, reporting_thread) \
  if (threadIdx.x == (reporting_thread) && blockIdx.x % 16 == 0) block_phases_.print(kernel);
#else
#define ATTNKIT_PHASES_BEGIN()
#define ATTNKIT_PHASE(i)
#define ATTNKIT_PHASES_PRINT(kernel, reporting_thread)
#endif
