// Schedules: concepts, parameter checks, hand-checked plans, relay and multi-rail arithmetic, data
// replays on random values (bitwise identity across splits, one-shot == two-shot, agreement with
// the straightforward reference), and tests of the replay oracle itself on deliberately broken
// schedules (so the property tests are known to be able to fail).
//
// Data-mode matrix (seeded): nranks {1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64}; per case one odd count
// (3N..11N+40; N/2..N per segment above 16 ranks for reduce-scatter, all-gather, all-to-all), plus
// counts 0 and 1 for nranks <= 8, and 5 splits (1 VT, then VT counts walking 1..16 with random cut
// points, an empty and a 1-element block).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
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

static_assert(Schedule<ring> && Schedule<tree> && Schedule<one_shot> && Schedule<two_shot> && Schedule<all_to_all> &&
              Schedule<multirail_broadcast>);
static_assert(HasOwnPieces<all_to_all> && !HasOwnPieces<ring> && !HasOwnPieces<one_shot>);
// kernels take schedules by value: keep them small
static_assert(sizeof(ring) <= 32 && sizeof(tree) <= 16 && sizeof(one_shot) <= 16 && sizeof(two_shot) <= 8 &&
              sizeof(multirail_broadcast) <= 16 && sizeof(all_to_all) <= 12 + max_relays * sizeof(relay_route));

namespace {

params make(collective c, int n, int root = 0, std::uint64_t tile = 1024, int g = 0) {
  params p;
  p.coll = c;
  p.nranks = n;
  p.root = root;
  p.tile = tile;
  p.ranks_per_node = g;
  return p;
}

split one_vt(std::uint64_t count) {
  split s;
  s.n_vts = 1;
  s.live_mask = 1;
  s.total = count;
  s.count[0] = count;
  return s;
}

/// Random split with nv VTs: random cut points (so empty and 1-element blocks appear for small counts).
split random_split(std::uint64_t count, int nv, std::mt19937_64& rng) {
  split s;
  s.n_vts = nv;
  s.live_mask = all_live(nv);
  s.total = count;
  std::vector<std::uint64_t> cuts;
  for (int i = 0; i + 1 < nv; ++i) cuts.push_back(count == 0 ? 0 : rng() % (count + 1));
  std::sort(cuts.begin(), cuts.end());
  std::uint64_t prev = 0;
  for (int i = 0; i < nv; ++i) {
    std::uint64_t const end = i + 1 < nv ? cuts[i] : count;
    s.count[i] = end - prev;
    prev = end;
  }
  if (nv > 2 && count > 0) {  // one empty and one 1-element block when possible
    s.count[1] += s.count[0];
    s.count[0] = 0;
    if (s.count[1] > 1) {
      s.count[2] += s.count[1] - 1;
      s.count[1] = 1;
    }
  }
  return s;
}

/// Splits for a data case: 1 VT, then 4 random ones with VT counts walking 1..16.
std::vector<split> splits_for(std::uint64_t count, std::mt19937_64& rng, int& walk) {
  std::vector<split> v{one_vt(count)};
  for (int i = 0; i < 4; ++i) v.push_back(random_split(count, 1 + (walk++ % max_vts), rng));
  return v;
}

template <class T>
std::vector<std::vector<T>> random_inputs(int n, std::uint64_t len, std::mt19937_64& rng) {
  std::vector<std::vector<T>> in(static_cast<std::size_t>(n), std::vector<T>(len));
  for (auto& v : in)
    for (auto& x : v) {
      if constexpr (std::is_floating_point_v<T>) {
        // varied magnitudes so that the fold order shows in the bits
        std::uniform_real_distribution<T> u(-1, 1);
        x = std::ldexp(u(rng), static_cast<int>(rng() % 17) - 8);
      } else {
        x = static_cast<T>(rng());
      }
    }
  return in;
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::uint64_t input_len(params const& p, std::uint64_t count) {
  return (p.coll == collective::reduce_scatter || p.coll == collective::all_to_all ? p.nranks : 1) * count;
}

auto const fsum = [](float a, float b) { return a + b; };
auto const usum = [](std::uint32_t a, std::uint32_t b) { return a + b; };
/// Order-sensitive: neither commutative nor associative, so equal results mean equal fold trees.
auto const fingerprint = [](std::uint64_t a, std::uint64_t b) { return a * 0x100000001b3ull + (b ^ (b >> 17)); };

std::vector<int> const data_ranks = {1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64};

/// Counts for a data case: an odd count of 3N..11N+40 (for collectives whose count is one of N
/// segments, N/2..N above 16 ranks), plus 0 and 1 up to 8 ranks.
std::vector<std::uint64_t> data_counts(int n, std::mt19937_64& rng, collective coll = collective::all_reduce) {
  std::uint64_t const nn = static_cast<std::uint64_t>(n);
  bool const per_segment = coll == collective::reduce_scatter || coll == collective::all_gather || coll == collective::all_to_all;
  std::uint64_t const odd = (per_segment && n > 16 ? nn / 2 + rng() % (nn / 2 + 1) : 3 * nn + rng() % (8 * nn + 40)) | 1u;
  if (n <= 8) return {0, 1, odd};
  return {odd};
}

}  // namespace

// ------------------------------------------------------------------------------------------------
TEST_CASE("check(): clear errors for bad parameters, ok for good ones") {
  auto reason = [](check_result c) { return std::string(c.reason); };
  CHECK(ring::check(make(collective::all_reduce, 4)).ok());
  CHECK(ring::check(make(collective::all_reduce, max_ranks)).ok());
  CHECK(reason(ring::check(make(collective::all_reduce, 0))).find("nranks") != std::string::npos);
  CHECK(ring::check(make(collective::all_reduce, max_ranks + 1)).st == status::invalid_argument);
  CHECK(reason(ring::check(make(collective::all_reduce, 4, 0, 0))).find("tile") != std::string::npos);
  CHECK(reason(ring::check(make(collective::broadcast, 4, 4))).find("root") != std::string::npos);
  CHECK(reason(tree::check(make(collective::broadcast, 4, -1))).find("root") != std::string::npos);
  CHECK(reason(ring::check(make(collective::all_to_all, 4))).find("not supported") != std::string::npos);
  CHECK(!tree::check(make(collective::reduce_scatter, 4)).ok());
  CHECK(!two_shot::check(make(collective::all_gather, 4)).ok());
  CHECK(!all_to_all::check(make(collective::all_reduce, 4)).ok());
  CHECK(!multirail_broadcast::check(make(collective::all_reduce, 4)).ok());
  CHECK(one_shot::check(make(collective::all_to_all, 4)).ok());

  CHECK(multirail_broadcast::check(make(collective::broadcast, 16, 3, 1024, 8)).ok());
  CHECK(reason(multirail_broadcast::check(make(collective::broadcast, 12, 0, 1024, 5))).find("divide") != std::string::npos);
  CHECK(!multirail_broadcast::check(make(collective::broadcast, 4, 0, 1024, 8)).ok());
  CHECK(!multirail_broadcast::check(make(collective::broadcast, 4, 0, 1024, -1)).ok());

  params a = make(collective::all_to_all, 8, 0, 1024, 4);
  auto with = [&](relay_route r) {
    params q = a;
    q.n_relays = 1;
    q.relays[0] = r;
    return all_to_all::check(q);
  };
  CHECK(with({0, 5, 1, 500000}).ok());
  CHECK(reason(with({0, 5, 4, 500000})).find("source's node") != std::string::npos);  // via on the other node
  CHECK(reason(with({0, 0, 1, 1})).find("different") != std::string::npos);
  CHECK(reason(with({0, 5, 0, 1})).find("different") != std::string::npos);
  CHECK(reason(with({0, 5, 5, 1})).find("different") != std::string::npos);
  CHECK(reason(with({0, 8, 1, 1})).find("[0, nranks)") != std::string::npos);
  CHECK(reason(with({0, 5, 1, 1000001})).find("share_ppm") != std::string::npos);
  params dup = a;
  dup.n_relays = 2;
  dup.relays[0] = {0, 5, 1, 1};
  dup.relays[1] = {0, 5, 2, 1};
  CHECK(reason(all_to_all::check(dup)).find("one relay per") != std::string::npos);
  dup.n_relays = max_relays + 1;
  CHECK(!all_to_all::check(dup).ok());

  // the replay refuses bad input with the same reason, and refuses bad splits
  expr_arena arena;
  auto r = replay_symbolic<ring>(make(collective::all_reduce, 4, 0, 0), 8, one_vt(8), arena);
  CHECK(r.error.find("tile") != std::string::npos);
  r = replay_symbolic<ring>(make(collective::all_reduce, 4), 8, one_vt(7), arena);
  CHECK(r.error.find("sum to 7") != std::string::npos);
  split none;
  r = replay_symbolic<ring>(make(collective::all_reduce, 4), 0, none, arena);
  CHECK(r.error.find("n_vts") != std::string::npos);
  auto d = replay_data<ring>(make(collective::all_reduce, 4), 8, one_vt(8), std::vector<std::vector<float>>(3), fsum);
  CHECK(d.error.find("inputs has 3 ranks") != std::string::npos);
}

TEST_CASE("ring all-reduce plan matches the table in ring.hpp (N = 4)") {
  ring const s(make(collective::all_reduce, 4, 0, 1));
  REQUIRE(s.num_steps() == 6);
  // chunk each rank sends per step, rows = steps, columns = ranks
  int const table[6][4] = {{3, 0, 1, 2}, {2, 3, 0, 1}, {1, 2, 3, 0}, {0, 1, 2, 3}, {3, 0, 1, 2}, {2, 3, 0, 1}};
  for (int step = 0; step < 6; ++step)
    for (int r = 0; r < 4; ++r) {
      int sends = 0;
      s.for_each_op(r, step, [&](op o) {
        if (o.act != action::send) return;
        ++sends;
        CHECK(o.peer == (r + 1) % 4);
        CHECK(o.chunk == table[step][r]);
        CHECK(o.buf == (step == 0 ? buffer::input : buffer::work));
      });
      CHECK(sends == 1);
    }
  // interleaved chunks: element i belongs to chunk (i / tile) mod N whatever the block
  chunking const ch = s.chunks(buffer::work);
  CHECK(ch.k == chunking::kind::interleaved);
  std::vector<int> owner(40, -1);
  for (int c = 0; c < 4; ++c)
    for_each_piece(ch, c, block{3, 40}, 40, [&](std::uint64_t off, std::uint64_t len) {
      for (std::uint64_t i = off; i < off + len; ++i) owner[i] = c;
    });
  for (int i = 3; i < 40; ++i) CHECK(owner[i] == i % 4);
}

TEST_CASE("step counts and degenerate sizes") {
  CHECK(ring(make(collective::all_reduce, 1)).num_steps() == 1);
  CHECK(ring(make(collective::all_reduce, 8)).num_steps() == 14);
  CHECK(ring(make(collective::all_gather, 8)).num_steps() == 7);
  CHECK(ring(make(collective::broadcast, 8)).num_steps() == ring::broadcast_chunks + 6);
  CHECK(tree(make(collective::all_reduce, 7)).depth() == 2);
  CHECK(tree(make(collective::all_reduce, 8)).depth() == 3);
  CHECK(tree(make(collective::all_reduce, 7)).num_steps() == tree::pipeline_chunks + 3);
  CHECK(tree(make(collective::broadcast, 7)).num_steps() == tree::pipeline_chunks + 1);
  CHECK(one_shot(make(collective::all_to_all, 9)).num_steps() == 1);
  CHECK(two_shot(make(collective::all_reduce, 9)).num_steps() == 2);
  CHECK(two_shot(make(collective::all_reduce, 1)).num_steps() == 1);
  // pipelined: piece p is scattered in step p, crosses the rails in step p+1, is all-gathered in p+2
  CHECK(multirail_broadcast(make(collective::broadcast, 16, 0, 1, 8)).num_steps() == multirail_broadcast::pipeline_chunks + 2);
  CHECK(multirail_broadcast(make(collective::broadcast, 8, 0, 1, 8)).num_steps() == multirail_broadcast::pipeline_chunks + 1);  // one node
  CHECK(multirail_broadcast(make(collective::broadcast, 8, 0, 1, 0)).num_steps() == multirail_broadcast::pipeline_chunks + 1);  // one node
  CHECK(multirail_broadcast(make(collective::broadcast, 8, 0, 1, 1)).num_steps() == 1);  // G = 1: direct
  CHECK(multirail_broadcast(make(collective::broadcast, 1)).num_steps() == 1);
  // G = 1 is the one-shot broadcast: the root sends the whole block to everyone in one step
  multirail_broadcast const m(make(collective::broadcast, 5, 2, 1, 1));
  int sends = 0;
  m.for_each_op(2, 0, [&](op o) { sends += o.act == action::send && o.chunk == 0; });
  CHECK(sends == 4);
}

TEST_CASE("all_to_all relay boundary: integer arithmetic, exact cover of the block") {
  CHECK(all_to_all::relayed(1000, 0) == 0);
  CHECK(all_to_all::relayed(1000, 1000000) == 1000);
  CHECK(all_to_all::relayed(999, 500000) == 499);
  CHECK(all_to_all::relayed(3, 333334) == 1);
  std::uint64_t const big = (std::uint64_t{1} << 63) + 12345;
  CHECK(all_to_all::relayed(big, 500000) == big / 2);
  CHECK(all_to_all::relayed(~std::uint64_t{0}, 1000000) == ~std::uint64_t{0});
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::uint64_t const len = rng() >> (rng() % 64);
    std::uint32_t const ppm = static_cast<std::uint32_t>(rng() % 1000001);
    unsigned __int128 const exact = static_cast<unsigned __int128>(len) * ppm / 1000000u;
    REQUIRE(all_to_all::relayed(len, ppm) == static_cast<std::uint64_t>(exact));
  }

  params p = make(collective::all_to_all, 4);
  p.n_relays = 1;
  p.relays[0] = {1, 3, 0, 250000};
  all_to_all const s(p);
  block const blk{10, 31};  // 21 elements: tail floor(21 * 0.25) = 5
  std::vector<std::pair<std::uint64_t, std::uint64_t>> head, tail, scratch;
  for_each_piece(s, buffer::input, 4 + 0, blk, 100, [&](std::uint64_t o, std::uint64_t l) { head.push_back({o, l}); });
  for_each_piece(s, buffer::input, 4 + 1, blk, 100, [&](std::uint64_t o, std::uint64_t l) { tail.push_back({o, l}); });
  for_each_piece(s, buffer::scratch, 4 + 1, blk, 100, [&](std::uint64_t o, std::uint64_t l) { scratch.push_back({o, l}); });
  REQUIRE(head.size() == 1);
  REQUIRE(tail.size() == 1);
  CHECK(head[0] == std::pair<std::uint64_t, std::uint64_t>{300 + 10, 16});  // input segment dst = 3
  CHECK(tail[0] == std::pair<std::uint64_t, std::uint64_t>{300 + 26, 5});
  CHECK(scratch == decltype(scratch){{0 + 26, 5}});                         // scratch segment k = 0
  CHECK(chunk_length(s, buffer::work, 4, blk, 100) == 16);                  // at dst: work segment src = 1
  CHECK(chunk_length(s, buffer::work, 2, blk, 100) == 21);                  // a pair without relay
  CHECK(chunk_length(s, buffer::work, 4 + 2, blk, 100) == 0);               // no relay 1
}

TEST_CASE("multirail_broadcast: each rail of the root's node carries only its own share") {
  for (int g : {2, 4, 8}) {
    for (int nodes : {2, 3}) {
      int const n = g * nodes;
      for (int root : {0, g + 1 < n ? g + 1 : 1}) {
        multirail_broadcast const s(make(collective::broadcast, n, root, 1, g));
        block const blk{0, 1000};
        std::vector<std::uint64_t> cross(n, 0);  // elements each rank sends to other nodes
        std::uint64_t root_sent = 0;
        for (int step = 0; step < s.num_steps(); ++step)
          for (int r = 0; r < n; ++r)
            s.for_each_op(r, step, [&](op o) {
              if (o.act != action::send) return;
              std::uint64_t const len = chunk_length(s, o.buf, o.chunk, blk, 1000);
              if (r == root) root_sent += len;
              if (o.peer / g == r / g) return;
              CHECK(r / g == root / g);  // only the root's node sends across nodes
              CHECK(o.chunk / s.pieces() == r % g);   // local rank l carries (pieces of) share l
              cross[r] += len;
            });
        std::uint64_t total = 0, most = 0;
        for (auto c : cross) total += c, most = std::max(most, c);
        CHECK(total == static_cast<std::uint64_t>(nodes - 1) * 1000);  // each other node gets the block once
        CHECK(most == static_cast<std::uint64_t>(nodes - 1) * ((1000 + g - 1) / g));  // spread over g rails
        // the root itself sends about one block (scatter + its share), not (N-1) blocks
        CHECK(root_sent <= 1000 + static_cast<std::uint64_t>(nodes - 1 + g - 1) * ((1000 + g - 1) / g));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Data mode

namespace {

template <class S>
void data_identity_case(collective coll, bool exact_reference, std::mt19937_64& rng, int& walk) {
  for (int n : data_ranks) {
    params const p = make(coll, n, static_cast<int>(rng() % n), 1 + rng() % 5);
    for (std::uint64_t count : data_counts(n, rng, coll)) {
      INFO(name(coll) << " nranks=" << n << " count=" << count << " tile=" << p.tile << " root=" << p.root);
      auto const in = random_inputs<float>(n, input_len(p, count), rng);
      auto const fin = random_inputs<std::uint64_t>(n, input_len(p, count), rng);
      auto const uin = random_inputs<std::uint32_t>(n, input_len(p, count), rng);
      std::vector<std::vector<float>> first;
      std::vector<std::vector<std::uint64_t>> first_fp;
      for (split const& sp : splits_for(count, rng, walk)) {
        INFO("n_vts=" << sp.n_vts);
        auto const r = replay_data<S>(p, count, sp, in, fsum, std::numeric_limits<float>::quiet_NaN());
        REQUIRE_MESSAGE(r.ok(), r.error);
        auto const rf = replay_data<S>(p, count, sp, fin, fingerprint, std::uint64_t{0xdeadbeef});
        REQUIRE_MESSAGE(rf.ok(), rf.error);
        auto const ru = replay_data<S>(p, count, sp, uin, usum, std::uint32_t{0xdeadbeef});
        REQUIRE_MESSAGE(ru.ok(), ru.error);
        for (int rank = 0; rank < n; ++rank) {
          auto const out = r.output(rank);
          auto const ref = reference_output(p, count, in, fsum, rank);
          // integers: exact whatever the order
          CHECK(ru.output(rank) == reference_output(p, count, uin, usum, rank));
          if (exact_reference || !reduces(coll)) {
            CHECK(same_bits(out, ref));
            CHECK(rf.output(rank) == reference_output(p, count, fin, fingerprint, rank));
          } else {
            REQUIRE(out.size() == ref.size());
            std::size_t bad = 0;  // elements off the reference by more than the reordering bound
            for (std::size_t i = 0; i < out.size(); ++i) {
              float mag = 0;
              std::uint64_t const base = coll == collective::reduce_scatter ? rank * count : 0;
              for (int j = 0; j < n; ++j) mag += std::fabs(in[j][base + i]);
              bad += !(std::fabs(out[i] - ref[i]) <= 2.0f * n * std::numeric_limits<float>::epsilon() * mag);
            }
            CHECK(bad == 0);
          }
        }
        // every split gives the same bits as the first (1 VT)
        if (first.empty()) {
          for (int rank = 0; rank < n; ++rank) first.push_back(r.output(rank)), first_fp.push_back(rf.output(rank));
        } else {
          for (int rank = 0; rank < n; ++rank) {
            CHECK(same_bits(r.output(rank), first[rank]));
            CHECK(rf.output(rank) == first_fp[rank]);
          }
        }
        // all-reduce: every rank holds the same bits
        if (coll == collective::all_reduce)
          for (int rank = 1; rank < n; ++rank) CHECK(same_bits(r.output(rank), r.output(0)));
      }
    }
  }
}

}  // namespace

TEST_CASE("data: ring, random floats and ints, bitwise identical across splits") {
  std::mt19937_64 rng(101);
  int walk = 0;
  for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast})
    data_identity_case<ring>(c, false, rng, walk);
}

TEST_CASE("data: tree, random floats and ints, bitwise identical across splits") {
  std::mt19937_64 rng(102);
  int walk = 3;
  for (collective c : {collective::all_reduce, collective::broadcast}) data_identity_case<tree>(c, false, rng, walk);
}

TEST_CASE("data: one_shot and two_shot equal the canonical reference exactly") {
  std::mt19937_64 rng(103);
  int walk = 5;
  for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                       collective::all_to_all})
    data_identity_case<one_shot>(c, true, rng, walk);
  for (collective c : {collective::all_reduce, collective::reduce_scatter}) data_identity_case<two_shot>(c, true, rng, walk);
}

TEST_CASE("data: one_shot and two_shot all-reduce give the same bits under every split") {
  std::mt19937_64 rng(104);
  int walk = 0;
  for (int n : data_ranks) {
    params const p = make(collective::all_reduce, n);
    for (std::uint64_t count : data_counts(n, rng)) {
      auto const in = random_inputs<float>(n, count, rng);
      auto const fin = random_inputs<std::uint64_t>(n, count, rng);
      auto const one = replay_data<one_shot>(p, count, one_vt(count), in, fsum);
      auto const one_fp = replay_data<one_shot>(p, count, one_vt(count), fin, fingerprint);
      REQUIRE(one.ok());
      for (split const& sp : splits_for(count, rng, walk)) {
        auto const two = replay_data<two_shot>(p, count, sp, in, fsum);
        auto const two_fp = replay_data<two_shot>(p, count, sp, fin, fingerprint);
        REQUIRE_MESSAGE(two.ok(), two.error);
        for (int rank = 0; rank < n; ++rank) {
          CHECK(same_bits(two.output(rank), one.output(rank)));
          CHECK(two_fp.output(rank) == one_fp.output(rank));
        }
      }
    }
  }
}

TEST_CASE("data: ring and tree fold in their own fixed order, not the canonical one") {
  // Sanity of the order-sensitive op: it tells apart a ring or tree from the left fold, so the
  // bitwise-identity checks above would notice a split-dependent order.
  std::mt19937_64 rng(105);
  for (int n : {5, 8, 13}) {  // (for N = 3 the tree's order (x0 ⊕ x1) ⊕ x2 is the left fold)
    std::uint64_t const count = 64;
    auto const fin = random_inputs<std::uint64_t>(n, count, rng);
    params const p = make(collective::all_reduce, n, 0, 4);
    auto const r = replay_data<ring>(p, count, one_vt(count), fin, fingerprint);
    auto const t = replay_data<tree>(p, count, one_vt(count), fin, fingerprint);
    REQUIRE(r.ok());
    REQUIRE(t.ok());
    auto const ref = reference_output(p, count, fin, fingerprint, 0);
    CHECK(r.output(0) != ref);
    CHECK(t.output(0) != ref);
  }
}

TEST_CASE("data: all_to_all with relays and multirail broadcast deliver exact copies") {
  std::mt19937_64 rng(106);
  int walk = 0;
  for (int n : {3, 4, 6, 8, 16}) {
    params p = make(collective::all_to_all, n, 0, 1, n % 2 == 0 ? 2 : 0);
    p.n_relays = 0;
    for (int src = 0; src < n && p.n_relays < max_relays; ++src) {
      int const via = p.ranks_per_node ? (src ^ 1) : (src + 1) % n;
      int const dst = (src + 2) % n;
      if (dst == src || dst == via) continue;
      p.relays[p.n_relays++] = {static_cast<std::int16_t>(src), static_cast<std::int16_t>(dst),
                                static_cast<std::int16_t>(via), static_cast<std::uint32_t>(rng() % 1000001)};
    }
    REQUIRE_MESSAGE(all_to_all::check(p).ok(), all_to_all::check(p).reason);
    std::uint64_t const count = 37;
    auto const in = random_inputs<float>(n, input_len(p, count), rng);
    for (split const& sp : splits_for(count, rng, walk)) {
      auto const r = replay_data<all_to_all>(p, count, sp, in, fsum, std::numeric_limits<float>::quiet_NaN());
      REQUIRE_MESSAGE(r.ok(), r.error);
      for (int rank = 0; rank < n; ++rank) CHECK(same_bits(r.output(rank), reference_output(p, count, in, fsum, rank)));
    }
    for (int g : {0, 1, 2}) {
      params const b = make(collective::broadcast, n, static_cast<int>(rng() % n), 1, g);
      if (!multirail_broadcast::check(b).ok()) continue;
      auto const bin = random_inputs<float>(n, count, rng);
      for (split const& sp : splits_for(count, rng, walk)) {
        auto const r = replay_data<multirail_broadcast>(b, count, sp, bin, fsum, std::numeric_limits<float>::quiet_NaN());
        REQUIRE_MESSAGE(r.ok(), r.error);
        for (int rank = 0; rank < n; ++rank) CHECK(same_bits(r.output(rank), bin[b.root]));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// The oracle itself: broken schedules must be caught.

namespace {

/// A schedule whose plan is `Base`'s with one edit applied by `Edit::apply(rank, step, op, sink)`.
template <class Base, class Edit>
struct edited : Base {
  using Base::Base;
  template <class Sink>
  void for_each_op(int rank, int step, Sink&& sink) const {
    Base::for_each_op(rank, step, [&](op o) { Edit::apply(rank, step, o, sink); });
  }
};

struct drop_one_recv {  // rank 1 never receives in step 0
  template <class Sink>
  static void apply(int rank, int step, op o, Sink& sink) {
    if (rank == 1 && step == 0 && o.act == action::recv_reduce) return;
    sink(o);
  }
};
struct extra_recv {  // rank 0 expects one more stream from rank 3 in step 0
  template <class Sink>
  static void apply(int rank, int step, op o, Sink& sink) {
    sink(o);
    if (rank == 0 && step == 0 && o.act == action::local_copy) sink(recv_copy(3, 1));
  }
};
struct send_what_it_writes {  // step 1: rank 2 sends chunk 3, which it receives in that same step
  template <class Sink>
  static void apply(int rank, int step, op o, Sink& sink) {
    if (rank == 2 && step == 1 && o.act == action::send) o.chunk = 3;
    sink(o);
  }
};
struct write_input {  // rank 1 receives into its input buffer
  template <class Sink>
  static void apply(int rank, int step, op o, Sink& sink) {
    if (rank == 1 && step == 0 && o.act == action::recv_reduce) o.buf = buffer::input;
    sink(o);
  }
};
struct wrong_length {  // two-shot all-reduce, step 0: rank 0 sends share 1 where rank 2 expects share 2
  template <class Sink>
  static void apply(int rank, int step, op o, Sink& sink) {
    if (rank == 0 && step == 0 && o.act == action::send && o.peer == 2) o.chunk = 1;
    sink(o);
  }
};
struct send_unwritten {  // ring all-gather, step 1: rank 0 forwards segment 1, which it never received
  template <class Sink>
  static void apply(int rank, int step, op o, Sink& sink) {
    if (rank == 0 && step == 1 && o.act == action::send) o.chunk = 1;
    sink(o);
  }
};
struct deliver_twice {  // one-shot all-gather: rank 2's input reaches rank 0 twice
  template <class Sink>
  static void apply(int rank, int step, op o, Sink& sink) {
    sink(o);
    if (rank == 2 && step == 0 && o.act == action::send && o.peer == 0) sink(o);
    if (rank == 0 && step == 0 && o.act == action::recv_copy && o.peer == 2) sink(o);
  }
};

/// Ring all-reduce whose chunks are contiguous shares of each VT's block: correct sums, but an
/// element's fold order now depends on where the VT boundaries are.
struct ring_with_shares : ring {
  using ring::ring;
  constexpr chunking chunks(buffer) const { return {chunking::kind::shares, nranks, 1}; }
};

}  // namespace

TEST_CASE("replay catches broken plans") {
  params const ar = make(collective::all_reduce, 4, 0, 1);
  std::uint64_t const count = 40;
  split sp = one_vt(count);
  expr_arena arena;

  auto r = replay_symbolic<edited<ring, drop_one_recv>>(ar, count, sp, arena);
  CHECK(r.error.find("rank 0 sent 1 stream(s) to rank 1 that it never received") != std::string::npos);
  r = replay_symbolic<edited<ring, extra_recv>>(ar, count, sp, arena);
  CHECK(r.error.find("no matching send from rank 3") != std::string::npos);
  r = replay_symbolic<edited<ring, send_what_it_writes>>(ar, count, sp, arena);
  CHECK(r.error.find("that the same step writes") != std::string::npos);
  r = replay_symbolic<edited<ring, write_input>>(ar, count, sp, arena);
  CHECK(r.error.find("input buffer is read-only") != std::string::npos);

  params const ag = make(collective::all_gather, 4);
  r = replay_symbolic<edited<ring, send_unwritten>>(ag, count, sp, arena);
  CHECK(r.error.find("sends element") != std::string::npos);
  CHECK(r.error.find("never written") != std::string::npos);

  // a double delivery runs, and shows up in the write counts
  r = replay_symbolic<edited<one_shot, deliver_twice>>(ag, count, sp, arena);
  REQUIRE(r.ok());
  CHECK(r.work_writes[0][2 * count] == 2);
  CHECK(r.work_writes[0][1 * count] == 1);

  // shares of 10 elements over 4 ranks are 2, 3, 2, 3 long: share 1 does not fit share 2
  auto d = replay_data<edited<two_shot, wrong_length>>(make(collective::all_reduce, 4), 10, one_vt(10),
                                                        std::vector<std::vector<float>>(4, std::vector<float>(10, 1.f)), fsum);
  CHECK(d.error.find("stream of 3 elements into a chunk of 2") != std::string::npos);

  // a split-dependent fold order replays cleanly but changes expressions when the split moves
  auto const a = replay_symbolic<ring_with_shares>(ar, count, one_vt(count), arena);
  split three;
  three.n_vts = 3;
  three.live_mask = 7;
  three.total = count;
  three.count[0] = 7;
  three.count[1] = 20;
  three.count[2] = 13;
  auto const b = replay_symbolic<ring_with_shares>(ar, count, three, arena);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  int differ = 0;
  for (std::uint64_t i = 0; i < count; ++i) differ += a.work[0][i] != b.work[0][i];
  CHECK(differ > 0);
  // ...while the real ring does not
  auto const c = replay_symbolic<ring>(ar, count, one_vt(count), arena);
  auto const e = replay_symbolic<ring>(ar, count, three, arena);
  CHECK(c.work == e.work);
}
