// reccl/reccl.hpp -- umbrella header for everything a host C++20 compiler builds: vocabulary,
// concepts, every policy (schedules, allocators, telemetry, epochs and the control loop), the
// composed collective type, the CPU engine, the pool and the host-proxy transport. Included on
// their own: the InfiniBand verbs backend (reccl/proxy/backend_ibverbs.hpp, needs libibverbs) and
// the NVLink path (reccl/device, reccl/host: needs nvcc and NCCL).
#pragma once

#include "config.hpp"
#include "error.hpp"
#include "transport.hpp"
#include "types.hpp"

#include "policy/allocator/aimd.hpp"
#include "policy/allocator/allocator.hpp"
#include "policy/allocator/equal.hpp"
#include "policy/allocator/proportional.hpp"
#include "policy/allocator/texcp.hpp"
#include "policy/control.hpp"
#include "policy/epoch.hpp"
#include "policy/schedule/all_to_all.hpp"
#include "policy/schedule/multirail_broadcast.hpp"
#include "policy/schedule/one_shot.hpp"
#include "policy/schedule/ring.hpp"
#include "policy/schedule/schedule.hpp"
#include "policy/schedule/tree.hpp"
#include "policy/schedule/two_shot.hpp"
#include "policy/split.hpp"
#include "policy/telemetry/cost_model.hpp"
#include "policy/telemetry/none.hpp"
#include "policy/telemetry/stall_counter.hpp"
#include "policy/telemetry/telemetry.hpp"

#include "collective.hpp"
#include "cpu/communicator.hpp"
#include "host/pool.hpp"
#include "proxy/backend_host.hpp"
#include "proxy/proxy.hpp"
#include "proxy/transport.hpp"
#include "proxy/work_queue.hpp"
