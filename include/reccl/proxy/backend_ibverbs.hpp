// reccl/proxy/backend_ibverbs.hpp -- a proxy backend over InfiniBand / RoCE verbs (rdma-core
// libibverbs): one RC queue pair per peer, the window registered once, RDMA WRITE for a put, RDMA
// WRITE WITH IMMEDIATE as the signal, RDMA READ for a get, completions polled by the proxy.
//
// NOT YET RUN ON HARDWARE: no machine lent to this project has an RDMA device. It compiles (CI
// builds it against libibverbs-dev), and its tests skip with "skipped: no RDMA device" where
// ibv_get_device_list finds none. Treat it as unverified until those tests have run on a NIC.
//
//   rank r                                                       rank p
//   ┌──────────────────────────────┐   RC QP (r -> p)            ┌─────────────────────────────┐
//   │ window MR (lkey)             │── RDMA WRITE (put) ────────▶│ window MR (rkey)            │
//   │ send CQ: put/signal/get done │── WRITE_WITH_IMM (signal) ─▶│ recv CQ: imm = flag|value   │
//   │ recv CQ ◀── imm from peers   │◀─ RDMA READ (get) ──────────│   proxy raises flags[flag]  │
//   └──────────────────────────────┘                             └─────────────────────────────┘
//
// Set-up (the constructor, collective over all ranks): open the device (ibv_get_device_list,
// ibv_open_device), allocate a PD, register the window (local write, remote write, remote read),
// create one send CQ and one receive CQ, one RC QP per peer (RESET -> INIT), publish an
// `ib_endpoint` (LID, GID, QP numbers, window address and rkey) through the caller's all-gather
// (the host runtime passes an ncclAllGather over the communicator: NCCL's own bootstrap is not a
// public API), then move each QP to RTR (towards the peer's QP for me) and RTS, and post receives.
//
// Signals: a zero-length RDMA WRITE WITH IMMEDIATE on the peer's QP, after the puts posted before
// it on that QP. RC executes a QP's messages in order, so when the receiver's completion of the
// immediate arrives, the earlier writes have been placed; the receiving proxy then release-stores
// the flag (decoded as in signal_imm.hpp) into its host flag words, where waits poll it.
// Caveat for GPU windows (GPUDirect RDMA): placement in GPU memory may still be in flight in the
// PCIe fabric when the CQE is seen; NCCL issues a read-back ("flush") before releasing the flag.
// This backend does not yet, because it has only host windows in view.
//
// Completions: every work request is signaled; poll_completions reaps both CQs and reports the send
// operations still in flight. A full send queue is waited on with a deadline
// (ib_config::completion_timeout_ns), never indefinitely; a failed completion is status::internal
// with the verbs status recorded in last_error().
//
// Compiled only when RECCL_HAVE_IBVERBS is defined (link with -libverbs).
#pragma once

#if defined(RECCL_HAVE_IBVERBS)

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../types.hpp"
#include "backend_host.hpp"
#include "proxy.hpp"
#include "signal_imm.hpp"
#include "work_queue.hpp"

namespace reccl::proxy {

/// Device, port and queue sizes of an ibverbs backend.
struct ib_config {
  std::string device_name;  ///< empty: the first device ibv_get_device_list returns
  std::uint8_t port = 1;
  int gid_index = -1;  ///< -1: address by LID (InfiniBand); >= 0: that GID (RoCE needs one)
  std::uint32_t send_depth = 256;  ///< send WRs in flight per QP (and the CQ sized for all peers)
  std::uint32_t recv_depth = 256;  ///< receives posted per QP (signals in flight from one peer)
  std::uint64_t completion_timeout_ns = 5'000'000'000;  ///< longest wait for send-queue room
};

/// What one rank publishes in the all-gather. Fixed size, no pointers (raw addresses as integers).
struct ib_endpoint {
  std::uint32_t magic = 0;
  std::uint32_t nranks = 0;
  std::uint64_t window_addr = 0;
  std::uint64_t window_bytes = 0;
  std::uint32_t window_rkey = 0;
  std::uint32_t n_flags = 0;  ///< must be the same on every rank (flag indices name the peer's flags)
  std::uint32_t psn = 0;
  std::uint16_t lid = 0;
  std::uint8_t gid[16] = {};
  std::uint32_t qpn[max_ranks] = {};  ///< my QP towards rank i (0 for myself)
};
inline constexpr std::uint32_t ib_endpoint_magic = 0x72656343u;  // "recC"

/// Number of RDMA devices ibv_get_device_list finds (0 if none, or if the call fails).
inline int ib_device_count() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return 0;
  ibv_free_device_list(list);
  return n;
}

/// The verbs backend of one rank. Construct it on every rank at the same time (the constructor
/// calls the all-gather); check status() before use. Not copyable. `mine` is this rank's window and
/// flags (the same struct the host backend takes); its memory must outlive the backend.
class ibverbs_backend {
 public:
  /// All-gather of `bytes` from every rank: `all` receives nranks blocks, rank i's at i * bytes.
  /// Returns status::ok or the failure; it must be collective (every rank calls it once here).
  using all_gather_fn = std::function<status(void const* mine, void* all, std::size_t bytes)>;

  ibverbs_backend(int rank, int nranks, host_memory mine, ib_config cfg, all_gather_fn const& all_gather)
      : rank_(rank), nranks_(nranks), mine_(mine), cfg_(std::move(cfg)) {
    st_ = setup(all_gather);
  }
  ibverbs_backend(ibverbs_backend const&) = delete;
  ibverbs_backend& operator=(ibverbs_backend const&) = delete;
  ~ibverbs_backend() { teardown(); }

  /// status::ok once every QP reached RTS; otherwise why not (see last_error()).
  status status_code() const { return st_; }
  std::string const& last_error() const { return error_; }

  status put(work_request const& r) {
    if (st_ != status::ok) return st_;
    if (!valid_peer(r.peer) || !in_range(r.src_offset, r.bytes, mine_.window_bytes) ||
        !in_range(r.dst_offset, r.bytes, peers_[static_cast<std::size_t>(r.peer)].window_bytes) || r.bytes > max_msg_)
      return status::invalid_argument;
    if (r.bytes == 0) return status::ok;
    ibv_sge sge{};
    sge.addr = reinterpret_cast<std::uint64_t>(mine_.window) + r.src_offset;
    sge.length = static_cast<std::uint32_t>(r.bytes);
    sge.lkey = mr_->lkey;
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = peers_[static_cast<std::size_t>(r.peer)].window_addr + r.dst_offset;
    wr.wr.rdma.rkey = peers_[static_cast<std::size_t>(r.peer)].window_rkey;
    return post(r.peer, wr);
  }

  status signal(work_request const& r) {
    if (st_ != status::ok) return st_;
    if (!valid_peer(r.peer) || r.flag_index >= mine_.n_flags || r.flag_index >= imm_max_flags)
      return status::invalid_argument;
    std::uint64_t& last = sent_[static_cast<std::size_t>(r.peer) * mine_.n_flags + r.flag_index];
    if (!signal_delta_ok(last, r.value)) {
      error_ = "signal value " + std::to_string(r.value) + " after " + std::to_string(last) +
               " on flag " + std::to_string(r.flag_index) + " cannot travel in an immediate";
      return status::invalid_argument;
    }
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.num_sge = 0;  // zero-length: the immediate is the message
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(encode_signal_imm(r.flag_index, r.value));
    wr.wr.rdma.remote_addr = peers_[static_cast<std::size_t>(r.peer)].window_addr;
    wr.wr.rdma.rkey = peers_[static_cast<std::size_t>(r.peer)].window_rkey;
    status const s = post(r.peer, wr);
    if (s == status::ok) last = r.value;
    return s;
  }

  status get(work_request const& r) {
    if (st_ != status::ok) return st_;
    if (!valid_peer(r.peer) || !in_range(r.dst_offset, r.bytes, mine_.window_bytes) ||
        !in_range(r.src_offset, r.bytes, peers_[static_cast<std::size_t>(r.peer)].window_bytes) || r.bytes > max_msg_)
      return status::invalid_argument;
    if (r.bytes == 0) return status::ok;
    ibv_sge sge{};
    sge.addr = reinterpret_cast<std::uint64_t>(mine_.window) + r.dst_offset;
    sge.length = static_cast<std::uint32_t>(r.bytes);
    sge.lkey = mr_->lkey;
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_RDMA_READ;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = peers_[static_cast<std::size_t>(r.peer)].window_addr + r.src_offset;
    wr.wr.rdma.rkey = peers_[static_cast<std::size_t>(r.peer)].window_rkey;
    return post(r.peer, wr);
  }

  /// Reaps send completions and incoming signals (never blocks).
  poll_result poll_completions() {
    if (st_ != status::ok) return {st_, 0};
    status const s = reap();
    return {s, outstanding_};
  }

 private:
  bool valid_peer(int p) const { return p >= 0 && p < nranks_ && p != rank_; }
  static bool in_range(std::uint64_t off, std::uint64_t bytes, std::uint64_t size) { return off <= size && bytes <= size - off; }

  status fail(status s, std::string what) {
    if (error_.empty()) error_ = std::move(what);
    return s;
  }

  // Posts one send WR on the peer's QP, first waiting (bounded) for room in its send queue.
  status post(int peer, ibv_send_wr& wr) {
    std::size_t const p = static_cast<std::size_t>(peer);
    if (in_flight_[p] >= cfg_.send_depth) {
      std::uint64_t const deadline = clock_ns() + cfg_.completion_timeout_ns;
      while (in_flight_[p] >= cfg_.send_depth) {
        if (status const s = reap(); s != status::ok) return s;
        if (in_flight_[p] < cfg_.send_depth) break;
        if (clock_ns() >= deadline)
          return fail(status::timeout, "send queue to rank " + std::to_string(peer) + " stayed full past the deadline");
      }
    }
    wr.wr_id = p;  // the completion names the QP whose slot it frees
    ibv_send_wr* bad = nullptr;
    if (int const e = ibv_post_send(qps_[p], &wr, &bad); e != 0)
      return fail(status::internal, "ibv_post_send to rank " + std::to_string(peer) + " failed: " + std::strerror(e));
    ++in_flight_[p];
    ++outstanding_;
    return status::ok;
  }

  status post_recv(std::size_t p) {
    ibv_recv_wr wr{};
    wr.wr_id = p;
    wr.num_sge = 0;  // signals carry no payload
    ibv_recv_wr* bad = nullptr;
    if (int const e = ibv_post_recv(qps_[p], &wr, &bad); e != 0)
      return fail(status::internal, "ibv_post_recv for rank " + std::to_string(p) + " failed: " + std::strerror(e));
    return status::ok;
  }

  status reap() {
    ibv_wc wc[32];
    for (;;) {
      int const n = ibv_poll_cq(send_cq_, 32, wc);
      if (n < 0) return fail(status::internal, "ibv_poll_cq (send) failed");
      for (int i = 0; i < n; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS)
          return fail(status::internal, std::string("send completion to rank ") + std::to_string(wc[i].wr_id) + ": " +
                                            ibv_wc_status_str(wc[i].status));
        --in_flight_[wc[i].wr_id];
        --outstanding_;
      }
      if (n < 32) break;
    }
    for (;;) {
      int const n = ibv_poll_cq(recv_cq_, 32, wc);
      if (n < 0) return fail(status::internal, "ibv_poll_cq (recv) failed");
      for (int i = 0; i < n; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS)
          return fail(status::internal, std::string("receive completion from rank ") + std::to_string(wc[i].wr_id) +
                                            ": " + ibv_wc_status_str(wc[i].status));
        if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM) return fail(status::internal, "unexpected receive opcode");
        std::uint32_t const imm = ntohl(wc[i].imm_data);
        std::uint32_t const idx = imm_flag_index(imm);
        if (idx >= mine_.n_flags) return fail(status::internal, "signal for flag " + std::to_string(idx) + " out of range");
        // Only this proxy writes my flags (signals from every peer arrive here), so the decoded
        // value's base is the flag's current value.
        std::uint64_t const v = decode_signal_value(imm, load_relaxed(&mine_.flags[idx]));
        raise_release(&mine_.flags[idx], v);
        if (status const s = post_recv(static_cast<std::size_t>(wc[i].wr_id)); s != status::ok) return s;
      }
      if (n < 32) break;
    }
    return status::ok;
  }

  status setup(all_gather_fn const& all_gather) {
    if (nranks_ < 1 || nranks_ > max_ranks || rank_ < 0 || rank_ >= nranks_)
      return fail(status::invalid_argument, "rank/nranks out of range");
    if (mine_.window == nullptr || mine_.window_bytes == 0 || mine_.flags == nullptr || mine_.n_flags == 0 ||
        mine_.n_flags > imm_max_flags)
      return fail(status::invalid_argument, "window and flags must be non-empty, at most 4096 flags");
    if (!all_gather) return fail(status::invalid_argument, "no all-gather callback");

    // Every rank calls the all-gather exactly once, even after a local failure (with an endpoint
    // whose magic is 0), so no peer blocks in it waiting for this rank.
    ib_endpoint me{};
    status local = open_device(me);
    std::vector<ib_endpoint> all(static_cast<std::size_t>(nranks_));
    status const g = all_gather(&me, all.data(), sizeof(ib_endpoint));
    if (local != status::ok) return local;
    if (g != status::ok) return fail(g, "endpoint all-gather failed");
    for (int i = 0; i < nranks_; ++i) {
      ib_endpoint const& e = all[static_cast<std::size_t>(i)];
      if (e.magic != ib_endpoint_magic) return fail(status::mismatch, "rank " + std::to_string(i) + " failed to open its device");
      if (e.nranks != static_cast<std::uint32_t>(nranks_))
        return fail(status::mismatch, "rank " + std::to_string(i) + " reports another rank count");
      if (e.n_flags != mine_.n_flags)
        return fail(status::mismatch, "rank " + std::to_string(i) + " reports another flag count");
    }
    peers_.assign(all.begin(), all.end());
    for (int p = 0; p < nranks_; ++p) {
      if (p == rank_) continue;
      if (status const s = connect(p, all[static_cast<std::size_t>(p)], me.psn); s != status::ok) return s;
      for (std::uint32_t k = 0; k < cfg_.recv_depth; ++k)
        if (status const s = post_recv(static_cast<std::size_t>(p)); s != status::ok) return s;
    }
    return status::ok;
  }

  status open_device(ib_endpoint& me) {
    int n = 0;
    devices_ = ibv_get_device_list(&n);
    if (devices_ == nullptr || n == 0) return fail(status::invalid_argument, "no RDMA device");
    ibv_device* dev = nullptr;
    for (int i = 0; i < n; ++i)
      if (cfg_.device_name.empty() || cfg_.device_name == ibv_get_device_name(devices_[i])) {
        dev = devices_[i];
        break;
      }
    if (dev == nullptr) return fail(status::invalid_argument, "RDMA device " + cfg_.device_name + " not found");
    ctx_ = ibv_open_device(dev);
    if (ctx_ == nullptr) return fail(status::internal, "ibv_open_device failed");
    ibv_device_attr dattr{};
    if (ibv_query_device(ctx_, &dattr) != 0) return fail(status::internal, "ibv_query_device failed");
    if (ibv_query_port(ctx_, cfg_.port, &port_) != 0) return fail(status::internal, "ibv_query_port failed");
    if (port_.state != IBV_PORT_ACTIVE) return fail(status::internal, "port " + std::to_string(cfg_.port) + " is not active");
    max_msg_ = port_.max_msg_sz;
    rd_atomic_ = static_cast<std::uint8_t>(std::min(16, std::min(dattr.max_qp_rd_atom, dattr.max_qp_init_rd_atom)));
    if (rd_atomic_ == 0) rd_atomic_ = 1;
    pd_ = ibv_alloc_pd(ctx_);
    if (pd_ == nullptr) return fail(status::internal, "ibv_alloc_pd failed");
    mr_ = ibv_reg_mr(pd_, mine_.window, mine_.window_bytes,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (mr_ == nullptr) return fail(status::internal, std::string("ibv_reg_mr failed: ") + std::strerror(errno));
    int const peers = std::max(1, nranks_ - 1);
    send_cq_ = ibv_create_cq(ctx_, static_cast<int>(cfg_.send_depth) * peers, nullptr, nullptr, 0);
    recv_cq_ = ibv_create_cq(ctx_, static_cast<int>(cfg_.recv_depth) * peers, nullptr, nullptr, 0);
    if (send_cq_ == nullptr || recv_cq_ == nullptr) return fail(status::internal, "ibv_create_cq failed");

    qps_.assign(static_cast<std::size_t>(nranks_), nullptr);
    in_flight_.assign(static_cast<std::size_t>(nranks_), 0);
    sent_.assign(static_cast<std::size_t>(nranks_) * mine_.n_flags, 0);
    me.psn = 0x1000u + static_cast<std::uint32_t>(rank_);
    for (int p = 0; p < nranks_; ++p) {
      if (p == rank_) continue;
      ibv_qp_init_attr ia{};
      ia.send_cq = send_cq_;
      ia.recv_cq = recv_cq_;
      ia.qp_type = IBV_QPT_RC;
      ia.cap.max_send_wr = cfg_.send_depth;
      ia.cap.max_recv_wr = cfg_.recv_depth;
      ia.cap.max_send_sge = 1;
      ia.cap.max_recv_sge = 1;
      ibv_qp* qp = ibv_create_qp(pd_, &ia);
      if (qp == nullptr) return fail(status::internal, "ibv_create_qp for rank " + std::to_string(p) + " failed");
      qps_[static_cast<std::size_t>(p)] = qp;
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.pkey_index = 0;
      a.port_num = cfg_.port;
      a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
      if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
        return fail(status::internal, "QP to rank " + std::to_string(p) + ": RESET -> INIT failed");
      me.qpn[p] = qp->qp_num;
    }
    me.lid = port_.lid;
    if (cfg_.gid_index >= 0) {
      ibv_gid gid{};
      if (ibv_query_gid(ctx_, cfg_.port, cfg_.gid_index, &gid) != 0) return fail(status::internal, "ibv_query_gid failed");
      std::memcpy(me.gid, gid.raw, sizeof me.gid);
    }
    me.window_addr = reinterpret_cast<std::uint64_t>(mine_.window);
    me.window_bytes = mine_.window_bytes;
    me.window_rkey = mr_->rkey;
    me.n_flags = mine_.n_flags;
    me.nranks = static_cast<std::uint32_t>(nranks_);
    me.magic = ib_endpoint_magic;
    return status::ok;
  }

  // INIT -> RTR (towards the peer's QP for me) -> RTS.
  status connect(int p, ib_endpoint const& peer, std::uint32_t my_psn) {
    ibv_qp* qp = qps_[static_cast<std::size_t>(p)];
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = port_.active_mtu;
    a.dest_qp_num = peer.qpn[rank_];
    a.rq_psn = peer.psn;
    a.max_dest_rd_atomic = rd_atomic_;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = peer.lid;
    a.ah_attr.sl = 0;
    a.ah_attr.src_path_bits = 0;
    a.ah_attr.port_num = cfg_.port;
    if (cfg_.gid_index >= 0) {
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, sizeof peer.gid);
      a.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(cfg_.gid_index);
      a.ah_attr.grh.hop_limit = 1;
    }
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
      return fail(status::internal, "QP to rank " + std::to_string(p) + ": INIT -> RTR failed");
    ibv_qp_attr b{};
    b.qp_state = IBV_QPS_RTS;
    b.timeout = 14;
    b.retry_cnt = 7;
    b.rnr_retry = 7;
    b.sq_psn = my_psn;
    b.max_rd_atomic = rd_atomic_;
    if (ibv_modify_qp(qp, &b,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC) != 0)
      return fail(status::internal, "QP to rank " + std::to_string(p) + ": RTR -> RTS failed");
    return status::ok;
  }

  void teardown() {
    for (ibv_qp* qp : qps_)
      if (qp) ibv_destroy_qp(qp);
    qps_.clear();
    if (send_cq_) ibv_destroy_cq(send_cq_);
    if (recv_cq_) ibv_destroy_cq(recv_cq_);
    if (mr_) ibv_dereg_mr(mr_);
    if (pd_) ibv_dealloc_pd(pd_);
    if (ctx_) ibv_close_device(ctx_);
    if (devices_) ibv_free_device_list(devices_);
    send_cq_ = recv_cq_ = nullptr;
    mr_ = nullptr;
    pd_ = nullptr;
    ctx_ = nullptr;
    devices_ = nullptr;
  }

  int rank_, nranks_;
  host_memory mine_;
  ib_config cfg_;
  status st_ = status::internal;
  std::string error_;

  ibv_device** devices_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_port_attr port_{};
  ibv_pd* pd_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  std::vector<ibv_qp*> qps_;                 // [peer]
  std::vector<ib_endpoint> peers_;           // [peer]
  std::vector<std::uint32_t> in_flight_;     // [peer] send WRs not yet completed
  std::vector<std::uint64_t> sent_;          // [peer * n_flags + flag] last value signalled
  std::uint64_t outstanding_ = 0;
  std::uint64_t max_msg_ = 0;
  std::uint8_t rd_atomic_ = 1;
};

static_assert(Backend<ibverbs_backend>);

}  // namespace reccl::proxy

#endif  // RECCL_HAVE_IBVERBS
