// reccl/host/call_digest.hpp -- the 32-bit FNV-1a digest that ranks compare to find out whether they
// agree: on a call's arguments and plan (the NVLink path's entry barrier) and on a configuration
// (the creation handshake). Equal inputs give equal digests on every rank and host; it is not a
// cryptographic hash.
#pragma once

#include <cstddef>
#include <cstdint>

namespace reccl::detail {

inline constexpr std::uint32_t fnv_basis = 2166136261u;

inline std::uint32_t fnv1a(void const* data, std::size_t bytes, std::uint32_t h = fnv_basis) {
  auto const* p = static_cast<unsigned char const*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}
/// Adds the object representation of `v` (a trivially copyable value without padding).
template <class T> std::uint32_t fnv_add(std::uint32_t h, T const& v) { return fnv1a(&v, sizeof(T), h); }

}  // namespace reccl::detail
