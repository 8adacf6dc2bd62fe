// reccl/host/nccl.hpp -- the one place NCCL enters reccl: headers, version detection, error checks.
//
// reccl's device path needs NCCL >= 2.28.3 (symmetric windows, ncclDevCommCreate, LSA pointers).
// The device API has no ABI guarantee across NCCL releases, so reccl must be compiled against the
// NCCL it runs with; differences between releases are hidden here behind NCCL_VERSION_CODE.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string>

#include "error.hpp"

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 28, 3)
#error "reccl's NVLink path needs NCCL >= 2.28.3 (symmetric windows and the device API)"
#endif

/// 2.29 made ncclDevCommRequirements a versioned struct that must start from its initializer.
#define RECCL_NCCL_HAS_VERSIONED_REQUIREMENTS (NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0))

namespace reccl::detail {

/// NCCL's message for `r`, plus the communicator's last detailed error when there is one.
inline std::string nccl_message(ncclResult_t r, ncclComm_t comm) {
  std::string m = ncclGetErrorString(r);
  char const* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') m += std::string(" (") + last + ")";
  return m;
}

inline void check_nccl(ncclResult_t r, ncclComm_t comm, char const* what) {
  if (r == ncclSuccess) return;
  status const s = (r == ncclInvalidArgument || r == ncclInvalidUsage) ? status::invalid_argument : status::internal;
  throw error(s, std::string(what) + " failed: " + nccl_message(r, comm));
}

/// check_nccl for cleanup that cannot throw: a failed call is written to stderr. Returns whether `r`
/// is ncclSuccess.
inline bool report_nccl(ncclResult_t r, char const* what) noexcept {
  if (r == ncclSuccess) return true;
  std::fprintf(stderr, "reccl: warning: %s failed during cleanup: %s\n", what, ncclGetErrorString(r));
  return false;
}

/// Empty device-communicator requirements for the NCCL this was compiled against.
inline ncclDevCommRequirements empty_requirements() {
#if RECCL_NCCL_HAS_VERSIONED_REQUIREMENTS
  ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof(reqs));
#endif
  return reqs;
}

/// NCCL version of the library actually loaded (may differ from the headers'; reccl refuses that).
inline int loaded_nccl_version() {
  int v = 0;
  check_nccl(ncclGetVersion(&v), nullptr, "ncclGetVersion");
  return v;
}

/// Throws unless the loaded NCCL library is the version of the headers reccl was compiled with (the
/// device API has no ABI guarantee across releases); RECCL_ALLOW_NCCL_MISMATCH=1 overrides.
inline void require_matching_nccl() {
  int const lib = loaded_nccl_version();
  char const* allow = std::getenv("RECCL_ALLOW_NCCL_MISMATCH");
  if (lib != NCCL_VERSION_CODE && !(allow != nullptr && allow[0] == '1'))
    throw error(status::invalid_argument,
                "NCCL library version " + std::to_string(lib) + " differs from the headers reccl was compiled with (" +
                    std::to_string(NCCL_VERSION_CODE) +
                    "); the device API has no ABI guarantee across releases (set RECCL_ALLOW_NCCL_MISMATCH=1 to "
                    "override)");
}

/// An NCCL group that is closed on every path: end() closes it and reports NCCL's result; if a
/// throw leaves the scope first, the destructor closes it (a failure is only reported on stderr:
/// the throw in flight says what went wrong).
class nccl_group {
 public:
  nccl_group() { check_nccl(ncclGroupStart(), nullptr, "ncclGroupStart()"); }
  nccl_group(nccl_group const&) = delete;
  nccl_group& operator=(nccl_group const&) = delete;
  ~nccl_group() {
    if (open_) report_nccl(ncclGroupEnd(), "ncclGroupEnd()");
  }
  void end() {
    open_ = false;
    check_nccl(ncclGroupEnd(), nullptr, "ncclGroupEnd()");
  }

 private:
  bool open_ = true;
};

}  // namespace reccl::detail

/// Throw reccl::error with NCCL's message if `expr` fails; `comm` may be nullptr.
#define RECCL_NCCL_CHECK(comm, expr) ::reccl::detail::check_nccl((expr), (comm), #expr)
/// Report (on stderr, never a throw) if `expr` fails; see report_nccl. For destructors and cleanup.
#define RECCL_NCCL_REPORT(expr) ::reccl::detail::report_nccl((expr), #expr)
