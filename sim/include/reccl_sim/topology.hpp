// reccl_sim/topology.hpp -- the modelled cluster: GPUs, NVLink, one NIC per GPU (rail), ToR
// switches, spines; directed links with a capacity and a latency; routing.
//
//              spine 0            spine 1             (spines; ECMP picks one per flow)
//               │  ╲            ╱  │
//          up/down  ╲        ╱   up/down               ToR→spine capacity =
//               │     ╲    ╱       │                   (NICs under the ToR × NIC rate)
//             ToR 0      ToR 1    ...                  / (spines × oversubscription); with
//                                                     spraying, one pooled link of all spines
//            ╱ │ ╲       ╱ │ ╲
//      nic_out/nic_in  (one NIC per GPU: rail k = GPU k of its node)
//          │   │   │
//        GPU0 GPU1 ... GPU7     node 0  ── NVLink via NVSwitch: nvl_out(g) ─▶ switch ─▶ nvl_in(h)
//
// Every link is directed (full duplex = two links). Capacities are in payload bytes per second:
// a NIC's line rate is derated by the packet header overhead (RoCEv2 by default, see
// cluster_params). A path is the list of links a transfer crosses; a transfer between GPUs of one
// node crosses the sender's NVLink port and the receiver's. A transfer between nodes leaves through
// the NIC of a chosen GPU of its node (its rail) -- reaching that GPU over NVLink first when it is
// not the sender (as NCCL's PXN does) -- crosses the ToR, a spine when the ToRs differ, and enters
// through a chosen NIC of the receiving node.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "rng.hpp"

namespace reccl_sim {

/// Physical description of a cluster. SI units: bytes per second, seconds. The defaults describe
/// H100/H200 HGX nodes: 8 GPUs on NVSwitch, 8 × 400 Gb/s NICs, RoCEv2 with a 4096-byte MTU.
struct cluster_params {
  int nodes = 4;
  int gpus_per_node = 8;  ///< one NIC per GPU (rail-aligned)
  int nodes_per_tor = 1;  ///< nodes under one top-of-rack switch
  int spines = 2;
  /// ToR downlink capacity / ToR uplink capacity (1 = non-blocking, 2 = half the uplink bandwidth).
  double oversubscription = 1.0;

  /// NVLink 4 per GPU and direction: 18 links × 25 GB/s = 450 GB/s (H100/H200 datasheet: 900 GB/s
  /// both directions). Measured SM-driven copies reach ~370 GB/s (shared/reference baseline).
  double nvlink_bw = 450e9;
  /// One NVLink hop: a store through the NVSwitch plus the flag the receiver polls (~1 µs).
  double nvlink_latency = 1.0e-6;

  /// NIC line rate: 400 Gb/s = 50 GB/s.
  double nic_line_rate = 50e9;
  /// Payload per packet (RDMA MTU) and the bytes each packet adds on the wire. RoCEv2 over
  /// Ethernet: preamble+SFD 8, Ethernet header 14, IPv4 20, UDP 8, BTH 12, ICRC 4, FCS 4,
  /// inter-frame gap 12 = 82 bytes, so 4096 / 4178 = 98.0% of the line rate is payload.
  int mtu = 4096;
  int packet_overhead = 82;
  /// One NIC traversal (PCIe + NIC pipeline), per side: ib_write_lat between two hosts is
  /// ~1.5 µs back to back, i.e. ~0.7–0.8 µs per NIC.
  double nic_latency = 0.8e-6;
  /// One switch traversal including its cable (cut-through port-to-port ~0.5 µs plus ~10–30 m of
  /// fibre at 5 ns/m).
  double switch_latency = 0.6e-6;

  /// How flows between ToRs spread over the spines. ecmp: each flow hashes onto one spine (per
  /// flow label, as RoCE ECMP does with one QP per connection), so flows can collide. spray: every
  /// flow is spread evenly over all spines (packet spraying / adaptive routing), modelled as one
  /// uplink and one downlink per ToR with the spines' combined capacity.
  enum class spine_routing : std::uint8_t { ecmp, spray };
  spine_routing routing = spine_routing::ecmp;
  /// Seed of the ECMP hash: which spine each flow lands on.
  std::uint64_t ecmp_seed = 1;

  /// Payload bytes per second of a NIC link.
  double nic_payload_rate() const { return nic_line_rate * mtu / static_cast<double>(mtu + packet_overhead); }
  int tors() const { return (nodes + nodes_per_tor - 1) / nodes_per_tor; }
  /// Spine links per ToR and direction: the spines, or one pooled link when spraying.
  int spine_links() const { return routing == spine_routing::spray ? 1 : spines; }
};

enum class link_kind : std::uint8_t { nvl_out, nvl_in, nic_out, nic_in, tor_up, spine_down };

inline char const* name(link_kind k) {
  switch (k) {
    case link_kind::nvl_out: return "nvl_out";
    case link_kind::nvl_in: return "nvl_in";
    case link_kind::nic_out: return "nic_out";
    case link_kind::nic_in: return "nic_in";
    case link_kind::tor_up: return "tor_up";
    case link_kind::spine_down: return "spine_down";
  }
  return "?";
}

/// A directed link. `up == false` gives it zero capacity; `loss` is the probability that a packet
/// crossing it is dropped (see loss.hpp for what that does to a flow).
struct link {
  double capacity = 0;  ///< payload bytes per second
  double latency = 0;   ///< seconds added to any path crossing it
  link_kind kind = link_kind::nvl_out;
  std::int32_t owner = 0;  ///< GPU (NVLink, NIC links) or ToR (switch links)
  std::int32_t spine = -1; ///< spine of a switch link
  bool up = true;
  double loss = 0;
  double effective_capacity() const { return up ? capacity : 0.0; }
};

inline constexpr int max_hops = 8;

/// The links one transfer crosses, in order.
struct path {
  std::int32_t link[max_hops] = {};
  std::int32_t n = 0;
  void push(std::int32_t l) {
    if (n >= max_hops) throw std::logic_error("reccl_sim: path longer than max_hops");
    link[n++] = l;
  }
  bool operator==(path const& o) const {
    if (n != o.n) return false;
    for (int i = 0; i < n; ++i)
      if (link[i] != o.link[i]) return false;
    return true;
  }
};

/// The cluster's links and routing. Link state (up/down, loss) is mutable; routes are not: a flow's
/// path is fixed by its endpoints, rails and ECMP label (a dead NIC is not routed around -- that is
/// the collective library's job).
class topology {
 public:
  explicit topology(cluster_params const& p) : p_(p) {
    if (p.nodes < 1) throw std::invalid_argument("cluster.nodes must be >= 1");
    if (p.gpus_per_node < 1) throw std::invalid_argument("cluster.gpus_per_node must be >= 1");
    if (p.nodes_per_tor < 1) throw std::invalid_argument("cluster.nodes_per_tor must be >= 1");
    if (p.spines < 1) throw std::invalid_argument("cluster.spines must be >= 1");
    if (!(p.oversubscription > 0)) throw std::invalid_argument("cluster.oversubscription must be > 0");
    if (!(p.nvlink_bw > 0) || !(p.nic_line_rate > 0)) throw std::invalid_argument("cluster bandwidths must be > 0");
    if (p.mtu < 1 || p.packet_overhead < 0) throw std::invalid_argument("cluster.mtu must be >= 1, packet_overhead >= 0");
    if (p.nvlink_latency < 0 || p.nic_latency < 0 || p.switch_latency < 0)
      throw std::invalid_argument("cluster latencies must be >= 0");
    int const g = gpus();
    links_.resize(static_cast<std::size_t>(4 * g + 2 * p.tors() * p.spine_links()));
    double const nic = p.nic_payload_rate();
    for (int i = 0; i < g; ++i) {
      links_[nvl_out(i)] = link{p.nvlink_bw, p.nvlink_latency, link_kind::nvl_out, i};
      links_[nvl_in(i)] = link{p.nvlink_bw, 0.0, link_kind::nvl_in, i};
      // The sender's NIC and its ToR traversal are charged on the way out, the receiver's NIC on
      // the way in.
      links_[nic_out(i)] = link{nic, p.nic_latency + p.switch_latency, link_kind::nic_out, i};
      links_[nic_in(i)] = link{nic, p.nic_latency, link_kind::nic_in, i};
    }
    double const up = p.nodes_per_tor * p.gpus_per_node * nic / (p.spine_links() * p.oversubscription);
    for (int t = 0; t < p.tors(); ++t)
      for (int s = 0; s < p.spine_links(); ++s) {
        links_[tor_up(t, s)] = link{up, p.switch_latency, link_kind::tor_up, t, s};
        links_[spine_down(s, t)] = link{up, p.switch_latency, link_kind::spine_down, t, s};
      }
  }

  cluster_params const& params() const { return p_; }
  int gpus() const { return p_.nodes * p_.gpus_per_node; }
  int node_of(int gpu) const { return gpu / p_.gpus_per_node; }
  int local_of(int gpu) const { return gpu % p_.gpus_per_node; }
  int gpu(int node, int local) const { return node * p_.gpus_per_node + local; }
  int tor_of_node(int node) const { return node / p_.nodes_per_tor; }

  // Link ids.
  int nvl_out(int g) const { return g; }
  int nvl_in(int g) const { return gpus() + g; }
  int nic_out(int g) const { return 2 * gpus() + g; }
  int nic_in(int g) const { return 3 * gpus() + g; }
  int tor_up(int t, int s) const { return 4 * gpus() + t * p_.spine_links() + s; }
  int spine_down(int s, int t) const { return 4 * gpus() + p_.tors() * p_.spine_links() + t * p_.spine_links() + s; }

  std::vector<link> const& links() const { return links_; }
  std::vector<link>& links() { return links_; }
  std::size_t num_links() const { return links_.size(); }

  /// Marks a GPU's NIC (both directions) up or down.
  void set_nic_up(int g, bool up) {
    check_gpu(g);
    links_[nic_out(g)].up = up;
    links_[nic_in(g)].up = up;
  }
  /// Packet loss probability on a GPU's NIC, both directions (a bad transceiver or fibre).
  void set_nic_loss(int g, double p) {
    check_gpu(g);
    if (!(p >= 0 && p < 1)) throw std::invalid_argument("NIC loss must be in [0, 1)");
    links_[nic_out(g)].loss = p;
    links_[nic_in(g)].loss = p;
  }
  /// Multiplies a link's capacity (e.g. to model a degraded port); factor in (0, 1].
  void scale_capacity(int l, double factor) {
    if (!(factor > 0)) throw std::invalid_argument("capacity factor must be > 0");
    links_.at(static_cast<std::size_t>(l)).capacity *= factor;
  }

  /// The path from GPU `src` to GPU `dst`. Between nodes the transfer leaves through the NIC of
  /// GPU `src_rail` (a GPU of src's node) and enters through the NIC of GPU `dst_rail` (a GPU of
  /// dst's node); `label` feeds the ECMP hash that picks the spine, unless `spine` >= 0 pins it.
  /// src == dst gives an empty path.
  path route(int src, int dst, int src_rail, int dst_rail, std::uint64_t label, int spine = -1) const {
    check_gpu(src);
    check_gpu(dst);
    path r;
    if (src == dst) return r;
    int const ns = node_of(src), nd = node_of(dst);
    if (ns == nd) {
      r.push(nvl_out(src));
      r.push(nvl_in(dst));
      return r;
    }
    check_gpu(src_rail);
    check_gpu(dst_rail);
    if (node_of(src_rail) != ns) throw std::invalid_argument("route: src_rail is not on the sender's node");
    if (node_of(dst_rail) != nd) throw std::invalid_argument("route: dst_rail is not on the receiver's node");
    if (src_rail != src) {
      r.push(nvl_out(src));
      r.push(nvl_in(src_rail));
    }
    r.push(nic_out(src_rail));
    int const ts = tor_of_node(ns), td = tor_of_node(nd);
    if (ts != td) {
      if (spine >= p_.spine_links())
        throw std::invalid_argument("route: spine " + std::to_string(spine) +
                                    (p_.routing == cluster_params::spine_routing::spray ? " cannot be pinned when flows are sprayed"
                                                                                         : " does not exist"));
      int const s = spine >= 0 ? spine
                               : static_cast<int>(hash_mix(p_.ecmp_seed, static_cast<std::uint64_t>(src_rail),
                                                           static_cast<std::uint64_t>(dst_rail), label) %
                                                  static_cast<std::uint64_t>(p_.spine_links()));
      r.push(tor_up(ts, s));
      r.push(spine_down(s, td));
    }
    r.push(nic_in(dst_rail));
    if (dst_rail != dst) {
      r.push(nvl_out(dst_rail));
      r.push(nvl_in(dst));
    }
    return r;
  }

  /// One-way latency of a path: the sum of its links' latencies.
  double latency(path const& r) const {
    double t = 0;
    for (int i = 0; i < r.n; ++i) t += links_[static_cast<std::size_t>(r.link[i])].latency;
    return t;
  }
  /// Probability that a packet is lost somewhere on the path: 1 − Π(1 − loss).
  double loss(path const& r) const {
    double keep = 1;
    for (int i = 0; i < r.n; ++i) keep *= 1.0 - links_[static_cast<std::size_t>(r.link[i])].loss;
    return 1.0 - keep;
  }
  bool path_up(path const& r) const {
    for (int i = 0; i < r.n; ++i)
      if (!links_[static_cast<std::size_t>(r.link[i])].up) return false;
    return true;
  }
  /// Human-readable link name, e.g. "nic_out[g9]" or "tor_up[t1,s0]".
  std::string link_name(int l) const {
    link const& k = links_.at(static_cast<std::size_t>(l));
    std::string s = name(k.kind);
    if (k.kind == link_kind::tor_up || k.kind == link_kind::spine_down)
      return s + "[t" + std::to_string(k.owner) + ",s" + std::to_string(k.spine) + "]";
    return s + "[g" + std::to_string(k.owner) + "]";
  }

 private:
  void check_gpu(int g) const {
    if (g < 0 || g >= gpus())
      throw std::invalid_argument("GPU id " + std::to_string(g) + " outside [0, " + std::to_string(gpus()) + ")");
  }
  cluster_params p_;
  std::vector<link> links_;
};

}  // namespace reccl_sim
