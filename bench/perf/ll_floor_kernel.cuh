// bench/perf/ll_floor_kernel.cuh -- the floor of a small all-reduce: a minimal LL one-shot with
// nothing a library needs (no deadline, no status word, no argument agreement). Used by
// reccl_ll_floor (a CTA sweep) and reccl_small_ladder (the ladder's first rung).
//
// Protocol: each 8-byte store carries one 4-byte word of data (two bf16) and a 4-byte epoch; a CTA
// keeps its epoch in device memory, and a reader polls its slot until the epoch matches. Slots are
// double-buffered by epoch parity: a rank can be at most one call ahead of a peer that still reads.
// Every rank writes its words into every peer's slot for it, then sums the peers' words in rank
// order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

inline constexpr int ll_floor_max_ranks = 4;

struct ll_floor_peers {
  std::uint64_t* slots[ll_floor_max_ranks];  ///< rank q's receive slots: [parity][source rank][word]
};

/// One call of rank `me`: `words` 4-byte words of bf16 pairs; launch with any grid (grid-stride).
__global__ void ll_floor_allreduce(std::uint32_t const* in, std::uint32_t* out, ll_floor_peers p, int me, int nranks, std::uint32_t* epochs,
                                   int words) {
  __shared__ std::uint32_t epoch_s;
  if (threadIdx.x == 0) epoch_s = epochs[blockIdx.x] + 1;
  __syncthreads();
  std::uint32_t const e = epoch_s;
  std::size_t const parity = (e & 1u) * static_cast<std::size_t>(nranks) * words;
  int const stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
    std::uint64_t const pkt = (static_cast<std::uint64_t>(e) << 32) | in[i];
    for (int q = 0; q < nranks; ++q) {
      if (q == me) continue;
      std::uint64_t* const dst = p.slots[q] + parity + static_cast<std::size_t>(me) * words + i;
      asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(dst), "l"(pkt) : "memory");
    }
  }
  std::uint64_t const* const mine = p.slots[me] + parity;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
    float2 acc = make_float2(0.f, 0.f);
    for (int q = 0; q < nranks; ++q) {
      std::uint32_t w;
      if (q == me) {
        w = in[i];
      } else {
        std::uint64_t pkt;
        do {
          asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(pkt) : "l"(mine + static_cast<std::size_t>(q) * words + i) : "memory");
        } while (static_cast<std::uint32_t>(pkt >> 32) != e);
        w = static_cast<std::uint32_t>(pkt);
      }
      float2 const f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(&w));
      acc.x += f.x;
      acc.y += f.y;
    }
    __nv_bfloat162 const z = __floats2bfloat162_rn(acc.x, acc.y);
    out[i] = *reinterpret_cast<std::uint32_t const*>(&z);
  }
  __syncthreads();
  if (threadIdx.x == 0) epochs[blockIdx.x] = e;
}
