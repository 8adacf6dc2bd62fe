// reccl/reccl.hpp -- umbrella header for everything a host C++20 compiler builds: vocabulary,
// concepts, every policy (schedules, allocators, telemetry, epochs and the control loop), the
// composed collective type and the CPU engine. The NVLink path (kernels and the NCCL host runtime)
// needs nvcc and NCCL and lives under reccl/device and reccl/host.
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
