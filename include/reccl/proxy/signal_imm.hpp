// reccl/proxy/signal_imm.hpp -- how a 64-bit signal travels in the 32-bit immediate of an RDMA
// write: the flag index in the high bits, the value's low bits, the rest rebuilt by the receiver.
//
//   imm (32 bits) = flag_index (12 bits) | value mod 2^20 (20 bits)
//
//   receiver: last = its flag's current value; v = last with its low 20 bits replaced by the
//             immediate's; if v < last, v += 2^20 (the low bits wrapped).
//
// Exact as long as each flag's values never decrease and successive signals on one flag differ by
// less than 2^20: the sender checks both (signal_delta_ok) and rejects a signal that breaks them.
// Transport flags are step and slot counters, so their steps are small. Plain C++ (no verbs), so
// the encoding is tested where no RDMA device exists.
#pragma once

#include <cstdint>

#include "../config.hpp"

namespace reccl::proxy {

inline constexpr int imm_value_bits = 20;
inline constexpr std::uint32_t imm_max_flags = 1u << (32 - imm_value_bits);  ///< 4096 flags per rank
inline constexpr std::uint64_t imm_value_mask = (std::uint64_t{1} << imm_value_bits) - 1;

/// Immediate for (flag_index < imm_max_flags, value).
RECCL_HOST_DEVICE constexpr std::uint32_t encode_signal_imm(std::uint32_t flag_index, std::uint64_t value) {
  return (flag_index << imm_value_bits) | static_cast<std::uint32_t>(value & imm_value_mask);
}
/// Flag index carried by an immediate.
RECCL_HOST_DEVICE constexpr std::uint32_t imm_flag_index(std::uint32_t imm) { return imm >> imm_value_bits; }
/// The full value of an immediate, given the receiver's current value of that flag.
RECCL_HOST_DEVICE constexpr std::uint64_t decode_signal_value(std::uint32_t imm, std::uint64_t last) {
  std::uint64_t v = (last & ~imm_value_mask) | (imm & imm_value_mask);
  if (v < last) v += imm_value_mask + 1;
  return v;
}
/// Whether a signal of `value` after `last` on one flag is representable (no decrease, step < 2^20).
RECCL_HOST_DEVICE constexpr bool signal_delta_ok(std::uint64_t last, std::uint64_t value) {
  return value >= last && value - last <= imm_value_mask;
}

}  // namespace reccl::proxy
