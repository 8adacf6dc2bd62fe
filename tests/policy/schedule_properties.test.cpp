// Property tests of every schedule, run through the symbolic replay (reccl/testing/schedule_replay.hpp).
//
// For each schedule x supported collective x rank count x element count, the plan is replayed over
// a 1-VT split (the reference) and over three other splits, and every replay must show:
//  * the plan is well formed: sends match receives, lengths agree, no step reads what it writes,
//    no piece outside its VT's block, nothing sent or folded before it was written;
//  * reductions: every output element of every rank holds each rank's matching input element
//    exactly once; all-reduce gives the same expression on every rank; the expression is the
//    schedule's documented order (one_shot/two_shot: the left fold 0..N-1; ring: the rotation that
//    starts at tile mod N; tree: the heap fold);
//  * copies (all-gather, broadcast, all-to-all): every output element is the right source element
//    and is written exactly once;
//  * the expression of every output element is identical (same hash-consed id) under every split
//    and VT count, so moving a VT boundary never changes a bit;
//  * the plan moves the schedule's nominal volume (e.g. 2(N-1)·count elements for a ring
//    all-reduce), whatever the split.
//
// Sampled matrix (seed fixed, so every run checks the same cases):
//   nranks  1..16 (all), then 17, 24, 31, 32, 33, 48, 61, 63, 64 (powers of two, primes, 64)
//   count   0, 1, a small odd count (~2N), a larger odd count (4N·tile..8N·tile up to N = 16,
//           N·tile..2N·tile above; tile capped at 8 here); above 16 ranks, per-segment counts
//           (reduce-scatter, all-gather, all-to-all) are 3..7 and N/2..N instead
//   splits  the 1-VT reference + 3 splits per case; their VT counts walk 1, 2, ..., 16, 1, ... across
//           cases, and their shapes cycle through: random cut points; leading 1-element blocks;
//           empty blocks (first, last, every third); masked VTs (empty, live bit cleared)
//   tile    (ring all-reduce chunking) drawn from {1, 2, 3, 5, 1024} per case
//   root    drawn per case (broadcast)
//   multirail_broadcast: ranks_per_node 0 (one node), 1, the smallest and largest proper divisor
//   all_to_all: no relay, then 1..8 random relays (via on the source's node when nodes > 1,
//           share_ppm drawn from {0, 1, 10^6, random})
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <reccl/policy/schedule/all_to_all.hpp>
#include <reccl/policy/schedule/multirail_broadcast.hpp>
#include <reccl/policy/schedule/one_shot.hpp>
#include <reccl/testing/schedule_replay.hpp>
#include <reccl/policy/schedule/ring.hpp>
#include <reccl/policy/schedule/tree.hpp>
#include <reccl/policy/schedule/two_shot.hpp>

using namespace reccl;
using namespace reccl::schedule;
using id = expr_arena::id;

namespace {

std::vector<int> const rank_counts = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13,
                                      14, 15, 16, 17, 24, 31, 32, 33, 48, 61, 63, 64};

/// Splits for the property runs. Deterministic given the generator state.
struct split_maker {
  std::mt19937_64 rng;
  int walk = 0;  // walks VT counts 1..16 and the four shapes across calls

  split one_vt(std::uint64_t count) {
    split s;
    s.n_vts = 1;
    s.live_mask = all_live(1);
    s.total = count;
    s.count[0] = count;
    return s;
  }

  split next(std::uint64_t count) {
    int const nv = 1 + walk % max_vts;
    int const shape = (walk / max_vts + walk) % 4;
    ++walk;
    split s;
    s.n_vts = nv;
    s.live_mask = all_live(nv);
    s.total = count;
    if (shape == 1) {  // leading 1-element blocks, the last VT takes the rest
      std::uint64_t left = count;
      for (int i = 0; i + 1 < nv; ++i) {
        s.count[i] = left > 0 ? 1 : 0;
        left -= s.count[i];
      }
      s.count[nv - 1] = left;
      return s;
    }
    std::vector<std::uint64_t> cuts;
    for (int i = 0; i + 1 < nv; ++i) cuts.push_back(count == 0 ? 0 : rng() % (count + 1));
    std::sort(cuts.begin(), cuts.end());
    std::uint64_t prev = 0;
    for (int i = 0; i < nv; ++i) {
      std::uint64_t const end = i + 1 < nv ? cuts[i] : count;
      s.count[i] = end - prev;
      prev = end;
    }
    if ((shape == 2 || shape == 3) && nv > 1) {
      // empty: VT 0, the last VT, every third VT; their elements go to VT 1 (never emptied)
      for (int i = 0; i < nv; ++i) {
        if (i == 1 || !(i == 0 || i == nv - 1 || i % 3 == 0)) continue;
        s.count[1] += s.count[i];
        s.count[i] = 0;
        if (shape == 3) s.live_mask &= ~(1u << i);
      }
    }
    return s;
  }
};

std::string describe(params const& p, std::uint64_t count) {
  std::ostringstream o;
  o << name(p.coll) << " nranks=" << p.nranks << " count=" << count << " root=" << p.root << " tile=" << p.tile
    << " ranks_per_node=" << p.ranks_per_node << " relays=" << p.n_relays;
  for (int k = 0; k < p.n_relays; ++k)
    o << " (" << p.relays[k].src << "->" << p.relays[k].via << "->" << p.relays[k].dst << " " << p.relays[k].share_ppm
      << "ppm)";
  return o.str();
}

std::string describe(split const& s) {
  std::ostringstream o;
  o << "split n_vts=" << s.n_vts << " live=0x" << std::hex << s.live_mask << std::dec << " [";
  for (int i = 0; i < s.n_vts; ++i) o << (i ? " " : "") << s.count[i];
  return o.str() + "]";
}

/// The documented fold order of element `index` for a schedule (nullptr-like empty function when
/// only split-independence is required).
using order_fn = std::function<id(expr_arena&, params const&, std::uint64_t out_index, std::uint64_t in_index)>;

/// Checks one symbolic replay's outputs. Returns "" or the first violation.
std::string check_outputs(params const& p, std::uint64_t count, symbolic_result const& r, expr_arena& a,
                          order_fn const& order) {
  int const n = p.nranks;
  std::uint64_t const full = n == 64 ? ~std::uint64_t{0} : ((std::uint64_t{1} << n) - 1);
  for (int rank = 0; rank < n; ++rank) {
    auto const [off, len] = r.output(rank);
    if (r.work[rank].size() < off + len) return "work buffer too small";
    for (std::uint64_t i = 0; i < len; ++i) {
      id const e = r.work[rank][off + i];
      auto at = [&] {  // built only for a failure
        return "rank " + std::to_string(rank) + " output element " + std::to_string(i) + " = " + a.to_string(e) + ": ";
      };
      if (e == expr_arena::none) return at() + "never written";
      switch (p.coll) {
        case collective::all_reduce:
        case collective::reduce_scatter: {
          std::uint64_t const in_index = p.coll == collective::reduce_scatter ? rank * count + i : i;
          auto const info = a.describe(e);
          if (info.rank_mask != full || info.leaves != static_cast<std::uint32_t>(n) || info.repeated_rank)
            return at() + "does not hold every rank's contribution exactly once";
          if (!info.one_index || info.index != in_index) return at() + "mixes elements of different indices";
          if (p.coll == collective::all_reduce && rank > 0) {
            if (e != r.work[0][i]) return at() + "differs from rank 0's";
          } else if (order && e != order(a, p, i, in_index)) {
            return at() + "not the documented fold order";
          }
          break;
        }
        case collective::all_gather:
          if (e != expr_arena::leaf(static_cast<int>(i / count), i % count)) return at() + "wrong source element";
          if (r.work_writes[rank][off + i] != 1) return at() + "written " + std::to_string(r.work_writes[rank][off + i]) + " times";
          break;
        case collective::broadcast:
          if (e != expr_arena::leaf(p.root, i)) return at() + "wrong source element";
          if (r.work_writes[rank][off + i] != 1) return at() + "written " + std::to_string(r.work_writes[rank][off + i]) + " times";
          break;
        case collective::all_to_all:
          if (e != expr_arena::leaf(static_cast<int>(i / count), rank * count + i % count)) return at() + "wrong source element";
          if (r.work_writes[rank][off + i] != 1) return at() + "written " + std::to_string(r.work_writes[rank][off + i]) + " times";
          break;
      }
    }
    for (std::size_t i = 0; i < r.scratch_writes[rank].size(); ++i)
      if (r.scratch_writes[rank][i] > 1) return "rank " + std::to_string(rank) + " scratch element written twice";
  }
  return "";
}

std::uint64_t total(std::vector<std::uint64_t> const& v) {
  std::uint64_t s = 0;
  for (auto x : v) s += x;
  return s;
}

/// Elements the plan should deliver in total (all ranks, all VTs) for this split.
using volume_fn = std::function<std::uint64_t(params const&, std::uint64_t count, split const&)>;

struct case_stats {
  int cases = 0, replays = 0;
};

/// Replays schedule S on (p, count): 1-VT reference + 3 splits; checks every property.
template <class S>
void check_case(params const& p, std::uint64_t count, split_maker& sm, order_fn const& order, volume_fn const& volume,
                case_stats& st) {
  expr_arena a;
  std::string const what = describe(p, count);
  split const one = sm.one_vt(count);
  symbolic_result const ref = replay_symbolic<S>(p, count, one, a);
  ++st.cases;
  ++st.replays;
  REQUIRE_MESSAGE(ref.ok(), what << ", 1 VT: " << ref.error);
  std::string err = check_outputs(p, count, ref, a, order);
  CHECK_MESSAGE(err.empty(), what << ", 1 VT: " << err);
  CHECK_MESSAGE(total(ref.stats.received) == volume(p, count, one), what << ": delivered " << total(ref.stats.received)
                                                                       << " elements, expected " << volume(p, count, one));
  CHECK(total(ref.stats.received) == total(ref.stats.sent));
  for (int t = 0; t < 3; ++t) {
    split const sp = sm.next(count);
    symbolic_result const r = replay_symbolic<S>(p, count, sp, a);
    ++st.replays;
    REQUIRE_MESSAGE(r.ok(), what << ", " << describe(sp) << ": " << r.error);
    err = check_outputs(p, count, r, a, order_fn{});  // the order itself: equal to the reference's, below
    CHECK_MESSAGE(err.empty(), what << ", " << describe(sp) << ": " << err);
    // the same expression for every output element as under one VT
    for (int rank = 0; rank < p.nranks && err.empty(); ++rank) {
      auto const [off, len] = r.output(rank);
      for (std::uint64_t i = 0; i < len; ++i)
        if (r.work[rank][off + i] != ref.work[rank][off + i]) {
          err = "rank " + std::to_string(rank) + " element " + std::to_string(i) + ": " + a.to_string(r.work[rank][off + i]) +
                " under this split, " + a.to_string(ref.work[rank][off + i]) + " under one VT";
          break;
        }
    }
    CHECK_MESSAGE(err.empty(), what << ", " << describe(sp) << ": " << err);
    CHECK_MESSAGE(total(r.stats.received) == volume(p, count, sp),
                  what << ", " << describe(sp) << ": delivered " << total(r.stats.received) << ", expected "
                       << volume(p, count, sp));
  }
}

/// Element counts for rank count n: 0, 1, a small odd and a larger odd count. `per_segment`: count
/// is one of N segments (reduce-scatter, all-gather, all-to-all), so every rank holds N * count
/// elements; above 16 ranks those counts stay below N (small 3..7, larger N/2..N).
std::vector<std::uint64_t> counts_for(int n, std::uint64_t tile, bool per_segment, std::mt19937_64& rng) {
  std::uint64_t const t = std::min<std::uint64_t>(tile, 8);  // keep big tiles from blowing up sizes
  std::uint64_t const nn = static_cast<std::uint64_t>(n);
  std::uint64_t small = 2 * nn + 1 + 2 * (rng() % 3);
  std::uint64_t lo = n <= 16 ? 4 * nn * t : nn * t, hi = n <= 16 ? 8 * nn * t : 2 * nn * t;
  if (per_segment && n > 16) small = 3 + 2 * (rng() % 3), lo = nn / 2, hi = nn;
  std::uint64_t const large = (lo + rng() % (hi - lo + 1)) | 1u;
  return {0, 1, small, large};
}

bool per_segment(collective c) {
  return c == collective::reduce_scatter || c == collective::all_gather || c == collective::all_to_all;
}

std::uint64_t pick_tile(std::mt19937_64& rng) {
  static constexpr std::uint64_t tiles[] = {1, 2, 3, 5, 1024};
  return tiles[rng() % 5];
}

// --- documented fold orders ----------------------------------------------------------------------

id left_fold(expr_arena& a, params const& p, std::uint64_t, std::uint64_t in_index) {
  return a.left_fold(p.nranks, in_index);
}

/// Ring: chunk c starts at rank c+1 and every next rank folds its own input first:
/// e_1 = x_{c+1}, e_j = x_{c+j} ⊕ e_{j-1} (ranks mod N), ending on rank c.
id ring_fold(expr_arena& a, int n, int chunk, std::uint64_t in_index) {
  id e = expr_arena::leaf((chunk + 1) % n, in_index);
  for (int j = 2; j <= n; ++j) e = a.combine(expr_arena::leaf((chunk + j) % n, in_index), e);
  return e;
}

id tree_order_at(expr_arena& a, int n, int v, std::uint64_t index) {
  id e = expr_arena::leaf(v, index);
  if (2 * v + 1 < n) e = a.combine(e, tree_order_at(a, n, 2 * v + 1, index));
  if (2 * v + 2 < n) e = a.combine(e, tree_order_at(a, n, 2 * v + 2, index));
  return e;
}

}  // namespace

TEST_CASE("ring: every collective, every rank count 1..16 and a sample to 64, many splits") {
  split_maker sm{std::mt19937_64{0x5eed01}};
  std::mt19937_64 rng{0x5eed02};
  case_stats st;
  for (collective coll : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast}) {
    for (int n : rank_counts) {
      params p;
      p.coll = coll;
      p.nranks = n;
      p.tile = pick_tile(rng);
      p.root = static_cast<int>(rng() % n);
      for (std::uint64_t count : counts_for(n, p.tile, per_segment(coll), rng)) {
        order_fn order;
        if (coll == collective::all_reduce)  // chunk = tile index mod N
          order = [](expr_arena& a, params const& q, std::uint64_t i, std::uint64_t in_index) {
            return ring_fold(a, q.nranks, static_cast<int>((i / q.tile) % static_cast<std::uint64_t>(q.nranks)), in_index);
          };
        if (coll == collective::reduce_scatter)  // chunk = segment = the rank that keeps it
          order = [count](expr_arena& a, params const& q, std::uint64_t, std::uint64_t in_index) {
            return ring_fold(a, q.nranks, static_cast<int>(in_index / count), in_index);
          };
        volume_fn vol = [](params const& q, std::uint64_t c, split const&) {
          std::uint64_t const n1 = static_cast<std::uint64_t>(q.nranks - 1), nn = n1 + 1;
          switch (q.coll) {
            case collective::all_reduce: return 2 * n1 * c;  // count = the whole vector
            case collective::broadcast: return n1 * c;
            default: return nn * n1 * c;                     // count = one rank's segment
          }
        };
        check_case<ring>(p, count, sm, order, vol, st);
      }
    }
  }
  MESSAGE("ring: " << st.cases << " cases, " << st.replays << " replays");
}

TEST_CASE("tree: all-reduce and broadcast, every rank count 1..16 and a sample to 64, many splits") {
  split_maker sm{std::mt19937_64{0x5eed03}};
  std::mt19937_64 rng{0x5eed04};
  case_stats st;
  for (collective coll : {collective::all_reduce, collective::broadcast}) {
    for (int n : rank_counts) {
      params p;
      p.coll = coll;
      p.nranks = n;
      p.root = static_cast<int>(rng() % n);
      for (std::uint64_t count : counts_for(n, 1, per_segment(p.coll), rng)) {
        order_fn order;
        if (coll == collective::all_reduce)
          order = [](expr_arena& a, params const& q, std::uint64_t, std::uint64_t in_index) {
            return tree_order_at(a, q.nranks, 0, in_index);
          };
        volume_fn vol = [](params const& q, std::uint64_t c, split const&) {
          std::uint64_t const n1 = static_cast<std::uint64_t>(q.nranks - 1);
          return q.coll == collective::all_reduce ? 2 * n1 * c : n1 * c;
        };
        check_case<tree>(p, count, sm, order, vol, st);
      }
    }
  }
  MESSAGE("tree: " << st.cases << " cases, " << st.replays << " replays");
}

TEST_CASE("one_shot: every collective folds in canonical rank order under every split") {
  split_maker sm{std::mt19937_64{0x5eed05}};
  std::mt19937_64 rng{0x5eed06};
  case_stats st;
  for (collective coll : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                          collective::all_to_all}) {
    for (int n : rank_counts) {
      params p;
      p.coll = coll;
      p.nranks = n;
      p.root = static_cast<int>(rng() % n);
      for (std::uint64_t count : counts_for(n, 1, per_segment(p.coll), rng)) {
        order_fn order;
        if (reduces(coll)) order = left_fold;
        volume_fn vol = [](params const& q, std::uint64_t c, split const&) {
          std::uint64_t const nn = static_cast<std::uint64_t>(q.nranks);
          return q.coll == collective::broadcast ? (nn - 1) * c : nn * (nn - 1) * c;
        };
        check_case<one_shot>(p, count, sm, order, vol, st);
      }
    }
  }
  MESSAGE("one_shot: " << st.cases << " cases, " << st.replays << " replays");
}

TEST_CASE("two_shot: all-reduce and reduce-scatter fold in canonical rank order under every split") {
  split_maker sm{std::mt19937_64{0x5eed07}};
  std::mt19937_64 rng{0x5eed08};
  case_stats st;
  for (collective coll : {collective::all_reduce, collective::reduce_scatter}) {
    for (int n : rank_counts) {
      params p;
      p.coll = coll;
      p.nranks = n;
      for (std::uint64_t count : counts_for(n, 1, per_segment(p.coll), rng)) {
        volume_fn vol = [](params const& q, std::uint64_t c, split const&) {
          std::uint64_t const nn = static_cast<std::uint64_t>(q.nranks);
          return q.coll == collective::all_reduce ? 2 * (nn - 1) * c : nn * (nn - 1) * c;
        };
        check_case<two_shot>(p, count, sm, left_fold, vol, st);
      }
    }
  }
  MESSAGE("two_shot: " << st.cases << " cases, " << st.replays << " replays");
}

TEST_CASE("all_to_all: direct and relayed, every element delivered exactly once") {
  split_maker sm{std::mt19937_64{0x5eed09}};
  std::mt19937_64 rng{0x5eed0a};
  case_stats st;
  for (int n : rank_counts) {
    // node sizes to try: one node, and (when n has one) a proper divisor
    std::vector<int> groups = {0};
    for (int g = 2; g < n; ++g)
      if (n % g == 0) {
        groups.push_back(g);
        break;
      }
    for (int g : groups) {
      for (int with_relays = 0; with_relays < 2; ++with_relays) {
        params p;
        p.coll = collective::all_to_all;
        p.nranks = n;
        p.ranks_per_node = g;
        int const gs = g > 0 ? g : n;
        if (with_relays && gs >= 2 && n >= 3) {
          int const want = 1 + static_cast<int>(rng() % max_relays);
          for (int tries = 0; tries < 64 && p.n_relays < want; ++tries) {
            int const src = static_cast<int>(rng() % n);
            int const dst = static_cast<int>(rng() % n);
            int const via = (src / gs) * gs + static_cast<int>(rng() % gs);
            if (src == dst || via == src || via == dst) continue;
            bool dup = false;
            for (int k = 0; k < p.n_relays; ++k) dup |= p.relays[k].src == src && p.relays[k].dst == dst;
            if (dup) continue;
            static constexpr std::uint32_t ppms[] = {0, 1, 1000000, 250000, 999999};
            std::uint32_t const ppm = rng() % 2 ? ppms[rng() % 5] : static_cast<std::uint32_t>(rng() % 1000001);
            p.relays[p.n_relays++] = {static_cast<std::int16_t>(src), static_cast<std::int16_t>(dst),
                                      static_cast<std::int16_t>(via), ppm};
          }
        }
        if (with_relays && p.n_relays == 0) continue;
        REQUIRE_MESSAGE(all_to_all::check(p).ok(), describe(p, 0) << ": " << all_to_all::check(p).reason);
        for (std::uint64_t count : counts_for(n, 1, per_segment(p.coll), rng)) {
          volume_fn vol = [](params const& q, std::uint64_t c, split const& sp) {
            std::uint64_t const nn = static_cast<std::uint64_t>(q.nranks);
            std::uint64_t v = nn * (nn - 1) * c;
            for (int k = 0; k < q.n_relays; ++k)
              for (int i = 0; i < sp.n_vts; ++i) v += all_to_all::relayed(sp.count[i], q.relays[k].share_ppm);
            return v;
          };
          check_case<all_to_all>(p, count, sm, order_fn{}, vol, st);
        }
      }
    }
  }
  MESSAGE("all_to_all: " << st.cases << " cases, " << st.replays << " replays");
}

TEST_CASE("multirail_broadcast: every node size, every root, every element once") {
  split_maker sm{std::mt19937_64{0x5eed0b}};
  std::mt19937_64 rng{0x5eed0c};
  case_stats st;
  for (int n : rank_counts) {
    std::vector<int> groups = {0, 1};
    int lo = 0, hi = 0;
    for (int g = 2; g < n; ++g)
      if (n % g == 0) {
        if (!lo) lo = g;
        hi = g;
      }
    if (lo) groups.push_back(lo);
    if (hi && hi != lo) groups.push_back(hi);
    for (int g : groups) {
      params p;
      p.coll = collective::broadcast;
      p.nranks = n;
      p.ranks_per_node = g;
      p.root = static_cast<int>(rng() % n);
      for (std::uint64_t count : counts_for(n, 1, per_segment(p.coll), rng)) {
        volume_fn vol = [](params const& q, std::uint64_t c, split const&) {
          return static_cast<std::uint64_t>(q.nranks - 1) * c;
        };
        check_case<multirail_broadcast>(p, count, sm, order_fn{}, vol, st);
      }
    }
  }
  MESSAGE("multirail_broadcast: " << st.cases << " cases, " << st.replays << " replays");
}
