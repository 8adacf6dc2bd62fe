// reccl/error.hpp -- the exception the host API throws: a status plus where it happened.
//
// Device code reports a status word; host entry points (the CPU engine's collectives, the host
// runtime) turn anything but status::ok / status::recovered into a reccl::error that names the
// rank, the VT and the epoch (collective number) involved, when they are known (-1 otherwise).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "types.hpp"

namespace reccl {

/// Error of a host-side reccl call. `code()` is never status::ok or status::recovered.
/// what() reads e.g. "reccl timeout (rank 2, VT 1, epoch 5): rank 2 never arrived".
class error : public std::runtime_error {
 public:
  error(status code, std::string const& detail, int rank = -1, int vt = -1, std::int64_t epoch = -1)
      : std::runtime_error(compose(code, detail, rank, vt, epoch)),
        code_(code), rank_(rank), vt_(vt), epoch_(epoch), detail_(detail) {}

  status code() const noexcept { return code_; }
  int rank() const noexcept { return rank_; }          ///< rank concerned, -1 if none
  int vt() const noexcept { return vt_; }              ///< VT concerned, -1 if none
  std::int64_t epoch() const noexcept { return epoch_; }  ///< collective number, -1 if none
  std::string const& detail() const noexcept { return detail_; }

 private:
  static std::string compose(status code, std::string const& detail, int rank, int vt, std::int64_t epoch) {
    std::string s = "reccl ";
    s += name(code);
    std::string where;
    auto add = [&](char const* what, long long v) {
      if (v < 0) return;
      where += where.empty() ? " (" : ", ";
      where += what;
      where += std::to_string(v);
    };
    add("rank ", rank);
    add("VT ", vt);
    add("epoch ", epoch);
    if (!where.empty()) where += ")";
    return s + where + ": " + detail;
  }

  status code_;
  int rank_, vt_;
  std::int64_t epoch_;
  std::string detail_;
};

/// An invalid_argument about this rank's buffers (null, misaligned, overlapping, not registered
/// where the algorithm needs it): a mistake one rank can make while its peers' calls are fine. The
/// GPU communicators fail the call's lane on every rank before they throw it, so that peers already
/// waiting in that call stop at once. Other invalid arguments (dtype, op, root, lane, algorithm,
/// sizes, split) come from values every rank must pass alike: every rank rejects them, nothing is
/// launched, and the communicator stays usable.
class buffer_error : public error {
 public:
  explicit buffer_error(std::string const& detail, int rank = -1) : error(status::invalid_argument, detail, rank) {}
};

/// Throws invalid_argument when collective `c` reduces dtype `t` and this program's reducing kernels
/// leave `t` out (RECCL_DTYPES, types.hpp). Every GPU entry point calls it before it picks a kernel.
inline void require_compiled(collective c, dtype t) {
  if (!reduces(c) || dtype_compiled(t)) return;
  static constexpr char const* macro_names[] = {"int32", "int64", "float16", "bfloat16", "float32", "float64"};
  std::string built;
  for (unsigned k = 0; k < 6; ++k)
    if ((compiled_dtypes >> k) & 1u) built += std::string(built.empty() ? "" : "|") + macro_names[k];
  throw error(status::invalid_argument, std::string(name(c)) + " on " + std::string(name(t)) +
                                            ": this program's reduction kernels are compiled for RECCL_DTYPES=" + built +
                                            " only (rebuild with " + macro_names[static_cast<unsigned>(t)] +
                                            " added to RECCL_DTYPES)");
}

}  // namespace reccl
