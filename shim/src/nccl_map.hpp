// shim/src/nccl_map.hpp -- NCCL's call arguments in reccl's vocabulary, or "forward this call".
//
// A call is mapped only when reccl computes exactly what NCCL defines, decided from what every rank
// passes alike (dtype, op, count), so that all ranks make the same choice:
//  * reductions: int32, int64, fp16, bf16, fp32, fp64 with sum, prod, min, max, avg; uint32/uint64
//    with sum and prod (two's-complement wrap-around gives the same bits as unsigned arithmetic).
//    Not mapped: 8-bit integers, fp8, unsigned min/max/avg, ops from ncclRedOpCreatePreMulSum.
//  * copying collectives (all-gather, broadcast, all-to-all) move bytes, so any dtype maps: the
//    call is expressed in 4-byte (else 2-byte) words when the byte count allows; an odd byte count
//    is forwarded.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <optional>

#include <reccl/types.hpp>

namespace reccl::shim {

inline std::size_t nccl_type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: break;
  }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
  if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2) return 1;
#endif
  return 0;
}

inline std::optional<redop> map_op(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return redop::sum;
    case ncclProd: return redop::prod;
    case ncclMin: return redop::min;
    case ncclMax: return redop::max;
    case ncclAvg: return redop::avg;
    default: return std::nullopt;  // PreMulSum and other user-created ops
  }
}

/// The reccl dtype that reduces `t` under `op` bit-exactly as NCCL does, if any.
inline std::optional<dtype> map_reduction_type(ncclDataType_t t, redop op) {
  bool const wraps = op == redop::sum || op == redop::prod;
  switch (t) {
    case ncclInt32: return dtype::int32;
    case ncclInt64: return dtype::int64;
    case ncclUint32: return wraps ? std::optional<dtype>(dtype::int32) : std::nullopt;
    case ncclUint64: return wraps ? std::optional<dtype>(dtype::int64) : std::nullopt;
    case ncclFloat16: return dtype::float16;
    case ncclBfloat16: return dtype::bfloat16;
    case ncclFloat32: return dtype::float32;
    case ncclFloat64: return dtype::float64;
    default: return std::nullopt;
  }
}

/// A byte stream of `count` elements of `t` as (dtype, count) of 4- or 2-byte words.
struct words {
  dtype type;
  std::size_t count;
};
inline std::optional<words> map_bytes(ncclDataType_t t, std::size_t count) {
  std::size_t const es = nccl_type_size(t);
  if (es == 0) return std::nullopt;
  std::size_t const bytes = count * es;
  if (bytes % 4 == 0) return words{dtype::int32, bytes / 4};
  if (bytes % 2 == 0) return words{dtype::float16, bytes / 2};
  return std::nullopt;
}

}  // namespace reccl::shim
