// reccl/reccl.hpp -- umbrella header for host-compilable reccl: vocabulary, concepts, policies,
// the CPU engine. Device kernels and the NCCL host runtime live under reccl/device and reccl/host.
#pragma once

#include "config.hpp"
#include "types.hpp"
#include "transport.hpp"
#include "policy/split.hpp"
#include "policy/schedule/schedule.hpp"
#include "policy/allocator/allocator.hpp"
