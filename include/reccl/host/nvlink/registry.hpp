// reccl/host/nvlink/registry.hpp -- a rank's registered (zero-copy) buffers: each one's local
// range, its NCCL window or CUDA IPC mapping (neither on loopback) and the address of every rank's
// copy of it.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "../../device/primitives.hpp"
#include "../ipc_windows.hpp"

namespace reccl::detail {

struct registered_buffer {
  char* base = nullptr;
  std::size_t bytes = 0;
  ncclWindow_t win = nullptr;              ///< created on an NCCL communicator
  std::shared_ptr<ipc_windows> ipc;        ///< created with create_p2p(): the CUDA IPC mapping
  char* peers[device::max_lsa] = {};
};

/// The buffer holding all of [p, p + bytes), or nullptr.
inline registered_buffer const* find_registered(std::vector<registered_buffer> const& buffers, void const* p,
                                                std::size_t bytes) {
  auto const* c = static_cast<char const*>(p);
  for (auto const& b : buffers)
    if (c >= b.base && c + bytes <= b.base + b.bytes) return &b;
  return nullptr;
}

}  // namespace reccl::detail
