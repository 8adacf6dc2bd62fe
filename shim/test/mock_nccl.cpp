// A stand-in libnccl.so.2 for the shim's forwarding tests: every collective call is recorded with
// its arguments, so a test can check that the shim passed a call on unchanged. It owns no GPU:
// ncclMemAlloc fails, so a shim that tries to build reccl's state on it gives up and forwards.
#include <nccl.h>

#include <cstdio>
#include <mutex>
#include <string>

namespace {
std::mutex mu;
std::string calls;

void record(char const* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  std::lock_guard<std::mutex> lk(mu);
  calls += buf;
  calls += '\n';
}
void const* vp(void const* p) { return p; }
}  // namespace

extern "C" {

// ---- for the tests ----
__attribute__((visibility("default"))) char const* reccl_mock_nccl_calls() {
  static thread_local std::string copy;
  std::lock_guard<std::mutex> lk(mu);
  copy = calls;
  return copy.c_str();
}
__attribute__((visibility("default"))) void reccl_mock_nccl_clear() {
  std::lock_guard<std::mutex> lk(mu);
  calls.clear();
}

// ---- NCCL's API, as far as the shim uses it ----
ncclResult_t ncclGetVersion(int* v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}
char const* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "mock error"; }
char const* ncclGetLastError(ncclComm_t) { return "mock NCCL has no GPU"; }
ncclResult_t ncclCommCount(const ncclComm_t, int* n) {
  *n = 2;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t, int* r) {
  *r = 0;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t, int* d) {
  *d = 0;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* e) {
  *e = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclMemAlloc(void** p, size_t) {
  *p = nullptr;
  return ncclSystemError;
}
ncclResult_t ncclMemFree(void*) { return ncclSuccess; }
ncclResult_t ncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t* w, int) {
  *w = nullptr;
  return ncclSystemError;
}
ncclResult_t ncclCommWindowDeregister(ncclComm_t, ncclWindow_t) { return ncclSuccess; }
// C symbols: the device API's struct types (nccl_device.h, CUDA-only) do not matter to the linker
ncclResult_t ncclDevCommCreate(ncclComm_t, void const*, void*) { return ncclSystemError; }
ncclResult_t ncclDevCommDestroy(ncclComm_t, void const*) { return ncclSuccess; }

ncclResult_t ncclGroupStart() {
  record("GroupStart");
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  record("GroupEnd");
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t c) {
  record("CommFinalize(%p)", vp(c));
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
  record("CommDestroy(%p)", vp(c));
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
  record("CommAbort(%p)", vp(c));
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
  record("AllReduce(%p,%p,%zu,%d,%d,%p,%p)", s, vp(r), n, int(t), int(op), vp(c), vp(st));
  return ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t st) {
  record("ReduceScatter(%p,%p,%zu,%d,%d,%p,%p)", s, vp(r), n, int(t), int(op), vp(c), vp(st));
  return ncclSuccess;
}
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  record("AllGather(%p,%p,%zu,%d,%p,%p)", s, vp(r), n, int(t), vp(c), vp(st));
  return ncclSuccess;
}
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) {
  record("Broadcast(%p,%p,%zu,%d,%d,%p,%p)", s, vp(r), n, int(t), root, vp(c), vp(st));
  return ncclSuccess;
}
ncclResult_t ncclBcast(void* b, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) {
  record("Bcast(%p,%zu,%d,%d,%p,%p)", vp(b), n, int(t), root, vp(c), vp(st));
  return ncclSuccess;
}
ncclResult_t ncclAlltoAll(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
  record("AlltoAll(%p,%p,%zu,%d,%p,%p)", s, vp(r), n, int(t), vp(c), vp(st));
  return ncclSuccess;
}
ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
  record("Send(%p,%zu,%d,%d,%p,%p)", s, n, int(t), peer, vp(c), vp(st));
  return ncclSuccess;
}

}  // extern "C"
