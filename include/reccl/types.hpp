// reccl/types.hpp -- vocabulary shared by every layer: data types, reduction ops, collective kinds,
// status codes. No CUDA, no NCCL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config.hpp"

namespace reccl {

enum class dtype : std::uint8_t { int32, int64, float16, bfloat16, float32, float64 };
enum class redop : std::uint8_t { sum, prod, min, max, avg };
enum class collective : std::uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all };

RECCL_HOST_DEVICE constexpr std::size_t size_of(dtype t) {
  switch (t) {
    case dtype::int32: return 4;
    case dtype::int64: return 8;
    case dtype::float16: return 2;
    case dtype::bfloat16: return 2;
    case dtype::float32: return 4;
    case dtype::float64: return 8;
  }
  return 0;
}

/// Sets of dtypes as bit masks (bit `static_cast<int>(t)` for dtype t): the names RECCL_DTYPES takes.
namespace dtype_bits {
inline constexpr std::uint32_t int32 = 1u << 0, int64 = 1u << 1, float16 = 1u << 2, bfloat16 = 1u << 3,
                               float32 = 1u << 4, float64 = 1u << 5, all = 0x3fu;
}  // namespace dtype_bits

/// The dtypes this program's reducing GPU kernels (all-reduce, reduce-scatter) are compiled for.
/// Every kernel family (one-shot, two-shot, pipelined, the adaptive lane's, the proxy's) has one
/// instantiation per element type, so a program that reduces only a few dtypes can leave the others
/// out and compile a fraction of the device code, by defining RECCL_DTYPES before any reccl header:
///
///   nvcc -DRECCL_DTYPES=bfloat16 ...
///   target_compile_definitions(app PRIVATE "RECCL_DTYPES=bfloat16|float32")   # CMake
///
/// (names from reccl::dtype_bits joined with `|`; not with commas, which nvcc splits -D on). Unset,
/// it is every dtype. A reduction on a dtype left out throws reccl::error(invalid_argument) naming
/// it and RECCL_DTYPES; collectives that only move data (all-gather, broadcast, all-to-all) run on
/// every dtype either way. Give every translation unit of a program the same value: the dispatch
/// functions are inline, and one program has one definition of each.
#if defined(RECCL_DTYPES)
inline constexpr std::uint32_t compiled_dtypes = [] {
  using namespace dtype_bits;
  return std::uint32_t{RECCL_DTYPES};  // empty: 0, refused below
}();
#else
inline constexpr std::uint32_t compiled_dtypes = dtype_bits::all;
#endif
static_assert(compiled_dtypes != 0 && (compiled_dtypes & ~dtype_bits::all) == 0,
              "RECCL_DTYPES must name one or more dtypes from reccl::dtype_bits, e.g. bfloat16|float32");

/// Whether the reducing GPU kernels for `t` are compiled into this program (see compiled_dtypes).
constexpr bool dtype_compiled(dtype t) { return ((compiled_dtypes >> static_cast<unsigned>(t)) & 1u) != 0; }

/// True for collectives that combine values (and so take a redop).
RECCL_HOST_DEVICE constexpr bool reduces(collective c) {
  return c == collective::all_reduce || c == collective::reduce_scatter;
}

constexpr std::string_view name(dtype t) {
  switch (t) {
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
    case dtype::float16: return "half";
    case dtype::bfloat16: return "bfloat16";
    case dtype::float32: return "float";
    case dtype::float64: return "double";
  }
  return "?";
}
constexpr std::string_view name(redop o) {
  switch (o) {
    case redop::sum: return "sum";
    case redop::prod: return "prod";
    case redop::min: return "min";
    case redop::max: return "max";
    case redop::avg: return "avg";
  }
  return "?";
}
constexpr std::string_view name(collective c) {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_gather: return "all_gather";
    case collective::broadcast: return "broadcast";
    case collective::all_to_all: return "all_to_all";
  }
  return "?";
}

/// Outcome of a collective or of one wait. Device code reports these in a status word; the host
/// runtime turns anything but `ok`/`recovered` into a reccl::error.
enum class status : std::uint32_t {
  ok = 0,
  recovered,         ///< a VT missed its deadline; live VTs finished its range; result is correct
  timeout,           ///< a peer never arrived within the deadline (every VT lost, or a rank lost)
  invalid_argument,  ///< null/misaligned pointer, bad count, VT count 0 or above the transport's limit
  mismatch,          ///< ranks disagree (count, dtype, op, epoch, VT count, checksum)
  internal,
};

constexpr std::string_view name(status s) {
  switch (s) {
    case status::ok: return "ok";
    case status::recovered: return "recovered";
    case status::timeout: return "timeout";
    case status::invalid_argument: return "invalid_argument";
    case status::mismatch: return "mismatch";
    case status::internal: return "internal";
  }
  return "?";
}

}  // namespace reccl
