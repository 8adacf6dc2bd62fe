/* reccl_nccl.h -- what libreccl_nccl.so adds to NCCL's API: introspection for tests and tools.
 * Declare-only C header; resolve the symbols with dlsym where the shim may be absent. */
#ifndef RECCL_NCCL_H
#define RECCL_NCCL_H

#ifdef __cplusplus
extern "C" {
#endif

struct ncclComm;

/** How the shim handles `comm`: 0 = undecided (no collective reccl could serve has run yet),
 *  1 = served by reccl, 2 = forwarded to NCCL (reccl's state could not be built; logged). */
int reccl_nccl_comm_state(struct ncclComm* comm);

/** Collective calls reccl has launched on `comm` so far (0 for a communicator it does not serve). */
unsigned long long reccl_nccl_served_calls(struct ncclComm* comm);

/** Collective calls reccl has launched in this process, on every communicator, destroyed ones
 *  included. */
unsigned long long reccl_nccl_total_served_calls(void);

#ifdef __cplusplus
}
#endif

#endif /* RECCL_NCCL_H */
