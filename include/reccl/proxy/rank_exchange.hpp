// reccl/proxy/rank_exchange.hpp -- how ranks in different processes swap the few bytes a proxy
// transport needs at setup and teardown (memory handles, queue-pair addresses, barriers).
//
// A rank_exchange is an all-gather: every rank calls it with the same `bytes`, in the same order
// of calls; `all` receives rank i's `mine` at offset i * bytes, for every rank i. It returns when
// every rank's bytes are in `all`, so a call is also a barrier. It throws (reccl::error or any
// std::exception) if a rank does not arrive or the transfer fails; what a failed call leaves in
// `all` is unspecified.
//
// reccl::nccl_exchange (reccl/host/exchange.hpp) runs it as an ncclAllGather over a communicator;
// processes of one machine may use anything that all-gathers (a file, a pipe, shared memory).
#pragma once

#include <cstddef>
#include <functional>

namespace reccl::proxy {

using rank_exchange = std::function<void(void const* mine, void* all, std::size_t bytes)>;

}  // namespace reccl::proxy
