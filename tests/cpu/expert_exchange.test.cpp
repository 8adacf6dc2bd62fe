// all-to-allv and MoE dispatch/combine on the CPU engine, against single-process references on
// random data: random counts (zeros included), skewed and uniform routing, experts with no token,
// every token to one rank, unused slots; bad input refused on every rank; a VT that dies.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <reccl/cpu/expert_exchange.hpp>

#include "moe_cases.hpp"
#include "support.hpp"

using namespace reccl_test;

namespace {

cpu::config small(int nranks, int n_vts) {
  cpu::config c;
  c.nranks = nranks;
  c.n_vts = n_vts;
  c.arrival_timeout_ns = 2'000'000'000;
  c.wait_timeout_ns = 2'000'000'000;
  return c;
}

bool contains(std::string const& s, std::string const& what) { return s.find(what) != std::string::npos; }

using a2av = reccl::all_to_allv<float, schedule::all_to_all, transport::cpu_threads, telemetry::stalls, allocator::texcp>;

/// counts[s][d]: elements rank s sends to rank d (a random mix with zeros), sent from shuffled,
/// gapped offsets so that packing is checked too.
struct v_case {
  int n;
  std::vector<std::vector<std::int64_t>> counts, offsets;
  std::vector<std::vector<float>> send;
};

v_case make_v_case(int n, std::uint32_t seed, std::int64_t max_count) {
  std::mt19937 rng(seed);
  v_case c{n, {}, {}, {}};
  c.counts.assign(n, std::vector<std::int64_t>(n));
  c.offsets.assign(n, std::vector<std::int64_t>(n));
  c.send.resize(n);
  for (int s = 0; s < n; ++s) {
    std::vector<int> order(n);
    for (int d = 0; d < n; ++d) order[d] = d, c.counts[s][d] = (rng() % 4 == 0) ? 0 : std::int64_t(rng() % (max_count + 1));
    std::shuffle(order.begin(), order.end(), rng);
    std::int64_t at = 0;
    for (int d : order) c.offsets[s][d] = at, at += c.counts[s][d] + std::int64_t(rng() % 3);  // gaps
    c.send[s].resize(static_cast<std::size_t>(at));
    for (float& v : c.send[s]) v = float(rng() % 20000) * 0.25f - 2500.f + 0.125f;
  }
  return c;
}

}  // namespace

TEST_CASE("all_to_allv: random counts with zeros, packed by source, on 1-5 ranks and 1-4 VTs") {
  for (int n : {1, 2, 3, 5})
    for (int vts : {1, 4})
      for (std::int64_t max_count : {1, 7, 300}) {
        CAPTURE(n);
        CAPTURE(vts);
        CAPTURE(max_count);
        v_case const c = make_v_case(n, 1000u * n + vts + std::uint32_t(max_count), max_count);
        cpu::communicator comm(small(n, vts));
        std::vector<std::vector<float>> recv(n);
        std::vector<std::vector<std::int64_t>> rc(n, std::vector<std::int64_t>(n, -7)), ro(n, std::vector<std::int64_t>(n, -7));
        for (int r = 0; r < n; ++r) recv[r].assign(n * max_count + 5, -999.f);  // poison, and room to spare
        for (int round = 0; round < 2; ++round)  // the second call reuses the communicator's state
          comm.run_ranks([&](int r) {
            auto const res = a2av::run(comm, r, {c.send[r].data(), c.send[r].size(), c.counts[r].data(), c.offsets[r].data()},
                                       {recv[r].data(), recv[r].size(), rc[r].data(), ro[r].data()});
            CHECK(res.st == status::ok);
          });
        for (int d = 0; d < n; ++d) {
          std::int64_t at = 0;
          for (int s = 0; s < n; ++s) {
            REQUIRE(rc[d][s] == c.counts[s][d]);
            REQUIRE(ro[d][s] == at);
            for (std::int64_t i = 0; i < c.counts[s][d]; ++i)
              REQUIRE(recv[d][at + i] == c.send[s][c.offsets[s][d] + i]);
            at += c.counts[s][d];
          }
          for (std::size_t i = at; i < recv[d].size(); ++i) REQUIRE(recv[d][i] == -999.f);  // nothing beyond
        }
      }
}

TEST_CASE("all_to_allv: every count zero, and a VT that dies mid-run still delivers everything") {
  int const n = 3;
  {
    cpu::communicator comm(small(n, 2));
    comm.run_ranks([&](int r) {
      std::vector<std::int64_t> z(n, 0), rc(n, -1), ro(n, -1);
      auto const res = a2av::run(comm, r, {nullptr, 0, z.data(), z.data()}, {nullptr, 0, rc.data(), ro.data()});
      CHECK(res.received == 0);
      CHECK(res.block == 0);
      for (int s = 0; s < n; ++s) CHECK((rc[s] == 0 && ro[s] == 0));
    });
  }
  cpu::config cfg = small(n, 4);
  cfg.wait_timeout_ns = 100'000'000;
  cfg.faults.kill(2, 2);  // VT 2 dies at the third collective: the data step of the first call
  cpu::communicator comm(cfg);
  v_case const c = make_v_case(n, 77, 5000);
  std::vector<std::vector<float>> recv(n, std::vector<float>(n * 5000));
  std::vector<std::vector<std::int64_t>> rc(n, std::vector<std::int64_t>(n)), ro(n, std::vector<std::int64_t>(n));
  bool recovered = false;
  comm.run_ranks([&](int r) {
    auto const res = a2av::run(comm, r, {c.send[r].data(), c.send[r].size(), c.counts[r].data(), c.offsets[r].data()},
                               {recv[r].data(), recv[r].size(), rc[r].data(), ro[r].data()});
    if (r == 0) recovered = res.st == status::recovered;
  });
  CHECK(recovered);
  for (int d = 0; d < n; ++d)
    for (int s = 0; s < n; ++s)
      for (std::int64_t i = 0; i < c.counts[s][d]; ++i) REQUIRE(recv[d][ro[d][s] + i] == c.send[s][c.offsets[s][d] + i]);
}

TEST_CASE("all_to_allv: bad counts or a receive buffer too small fail every rank, naming the rank, and the communicator stays usable") {
  int const n = 3;
  cpu::communicator comm(small(n, 2));
  v_case const c = make_v_case(n, 5, 50);
  auto run_all = [&](int bad_rank, int how) {
    std::vector<std::string> what(n);
    std::vector<int> who(n, -2);
    comm.run_ranks([&](int r) {
      std::vector<std::int64_t> counts = c.counts[r], rc(n), ro(n);
      std::vector<float> recv(n * 50);
      std::uint64_t recv_len = recv.size(), send_len = c.send[r].size();
      if (r == bad_rank && how == 0) counts[(r + 1) % n] = -1;
      if (r == bad_rank && how == 1) send_len = 0;
      if (r == bad_rank && how == 2) recv_len = 0;
      try {
        a2av::run(comm, r, {c.send[r].data(), send_len, counts.data(), c.offsets[r].data()}, {recv.data(), recv_len, rc.data(), ro.data()});
      } catch (reccl::error const& e) {
        what[r] = e.what();
        who[r] = e.rank();
      }
    });
    return std::pair{what, who};
  };
  std::int64_t to_1 = 0;  // the bad rank sends and receives something in this case
  for (int s = 0; s < n; ++s) to_1 += c.counts[s][1];
  REQUIRE(to_1 > 0);
  REQUIRE(c.counts[1][(1 + 1) % n] > 0);
  for (int how : {0, 1, 2}) {
    CAPTURE(how);
    int const bad = 1;
    auto const [what, who] = run_all(bad, how);
    for (int r = 0; r < n; ++r) {
      CAPTURE(what[r]);
      CHECK(who[r] == bad);
      CHECK(contains(what[r], "invalid_argument"));
    }
    CHECK(contains(what[bad], how == 0 ? "negative" : how == 1 ? "runs past the send buffer" : "receive buffer holds"));
    CHECK(contains(what[0], "rank 1 refused the call"));
  }
  auto const [what, who] = run_all(-1, -1);  // and a good call afterwards
  for (int r = 0; r < n; ++r) CHECK(what[r].empty());
}

// ---------------------------------------------------------------------------------------------
// MoE dispatch / combine

namespace {

using bf16 = reccl::bfloat16;
template <class Tok>
using exchange = cpu::expert_exchange<Tok, schedule::all_to_all, telemetry::none, allocator::equal>;

/// The expert function the tests apply: y = round(x * (1 + e/8) - e/16), with e the global expert.
template <class Tok>
Tok expert_fn(Tok x, int e) {
  return Tok(static_cast<float>(x) * (1.f + float(e) / 8.f) - float(e) / 16.f);
}

template <class Tok>
bool same_bits(Tok a, Tok b) {
  return std::memcmp(&a, &b, sizeof(Tok)) == 0;
}

template <class Tok>
void check_moe(moe_case<Tok> const& c, std::uint64_t max_tokens, int align, int vts) {
  moe::routing const g = c.g;
  int const n = g.nranks, k = g.top_k, epr = g.experts_per_rank();
  std::uint64_t const H = c.hidden;
  cpu::communicator comm(small(n, vts));
  std::vector<std::vector<Tok>> out(n);
  std::vector<std::vector<Tok>> received(n);
  std::vector<std::vector<std::int32_t>> counts(n), offsets(n);
  for (int r = 0; r < n; ++r) out[r].assign(c.tokens[r] * H, Tok(-12345.f));  // poison
  std::vector<std::uint64_t> bytes(n);
  comm.run_ranks([&](int r) {
    exchange<Tok> ex(comm, r, {g, max_tokens, c.hidden, align});
    // Twice: first with every expert shifted by one (another layout), then the case checked, so
    // the second pair must overwrite all that the first left behind.
    std::vector<std::int32_t> shifted = c.idx[r];
    for (auto& e : shifted) e = e < 0 ? e : (e + 1) % g.n_experts;
    for (int round = 0; round < 2; ++round) {
      auto const d = ex.dispatch(c.x[r].data(), round == 0 ? shifted.data() : c.idx[r].data(), c.tokens[r]);
      CHECK(d.grouped_rows <= ex.capacity().grouped);
      auto const rec = ex.received();
      auto const off = ex.expert_offsets();
      // The experts: row p of y = expert_fn of row p of received(), for the expert p is filed under.
      std::vector<Tok> y(rec.size(), Tok(-777.f));
      for (int l = 0; l < epr; ++l)
        for (std::int64_t p = off[l]; p < off[l] + ex.expert_counts()[l]; ++p)
          for (std::uint64_t h = 0; h < H; ++h) y[p * H + h] = expert_fn(rec[p * H + h], r * epr + l);
      ex.combine(y.data(), c.w[r].data(), out[r].data());
    }
    received[r].assign(ex.received().begin(), ex.received().end());
    counts[r].assign(ex.expert_counts().begin(), ex.expert_counts().end());
    offsets[r].assign(ex.expert_offsets().begin(), ex.expert_offsets().end());
    bytes[r] = ex.memory_bytes();
  });
  // dispatch: the reference layout of every rank
  for (int d = 0; d < n; ++d) {
    std::uint64_t at = 0;
    for (int l = 0; l < epr; ++l) {
      CAPTURE(d);
      CAPTURE(l);
      REQUIRE(offsets[d][l] == std::int64_t(at));
      REQUIRE(offsets[d][l] % align == 0);
      std::uint64_t rows = 0;
      for (int s = 0; s < n; ++s)
        for (std::uint64_t t = 0; t < c.tokens[s]; ++t)
          for (int j = 0; j < k; ++j)
            if (c.idx[s][t * k + j] == d * epr + l) {
              for (std::uint64_t h = 0; h < H; ++h) REQUIRE(same_bits(received[d][(at + rows) * H + h], c.x[s][t * H + h]));
              ++rows;
            }
      REQUIRE(counts[d][l] == std::int32_t(rows));
      for (std::uint64_t p = at + rows; p < moe::align_up(at + rows, align); ++p)
        for (std::uint64_t h = 0; h < H; ++h) REQUIRE(same_bits(received[d][p * H + h], Tok{}));  // padding: zeros
      at = moe::align_up(at + rows, align);
    }
    REQUIRE(offsets[d][epr] == std::int64_t(at));
    REQUIRE(received[d].size() == at * H);
  }
  // combine: fp32 in top-k order, rounded once, bitwise
  for (int s = 0; s < n; ++s)
    for (std::uint64_t t = 0; t < c.tokens[s]; ++t)
      for (std::uint64_t h = 0; h < H; ++h) {
        float acc = 0.f;
        for (int j = 0; j < k; ++j)
          if (int const e = c.idx[s][t * k + j]; e >= 0)
            acc = std::fma(c.w[s][t * k + j], static_cast<float>(expert_fn(c.x[s][t * H + h], e)), acc);
        CAPTURE(s);
        CAPTURE(t);
        REQUIRE(same_bits(out[s][t * H + h], Tok(acc)));
      }
  CHECK(bytes[0] > 0);
}

}  // namespace

TEST_CASE("moe dispatch/combine: uniform, skewed, sparse and one-rank routing, bf16 and float, 1-4 ranks") {
  struct shape {
    int n, experts, k, hidden;
  };
  for (shape sh : {shape{2, 8, 2, 16}, shape{3, 12, 4, 7}, shape{4, 16, 8, 32}, shape{1, 4, 2, 5}, shape{4, 4, 3, 8}})
    for (routing_kind kind : {routing_kind::uniform, routing_kind::skewed, routing_kind::sparse, routing_kind::one_rank}) {
      CAPTURE(sh.n);
      CAPTURE(sh.experts);
      CAPTURE(sh.k);
      CAPTURE(int(kind));
      moe::routing const g{sh.n, sh.experts, sh.k};
      std::uint32_t const seed = 31u * sh.n + 7u * sh.k + std::uint32_t(kind);
      check_moe(make_moe_case<bf16>(g, sh.hidden, 24, kind, seed), 24, 1, 2);
      check_moe(make_moe_case<bf16>(g, sh.hidden, 9, kind, seed + 1), 9, 8, 3);  // aligned for a grouped GEMM
      check_moe(make_moe_case<float>(g, sh.hidden, 5, kind, seed + 2), 5, 4, 1);
    }
}

TEST_CASE("moe dispatch/combine: no tokens anywhere, and one token per rank") {
  moe::routing const g{3, 6, 2};
  check_moe(make_moe_case<bf16>(g, 4, 0, routing_kind::uniform, 3), 0, 1, 1);
  auto one = make_moe_case<bf16>(g, 4, 1, routing_kind::uniform, 4);
  one.tokens.assign(3, 1);
  for (int r = 1; r < 3; ++r) one.x[r] = one.x[0], one.idx[r] = one.idx[0], one.w[r] = one.w[0];
  check_moe(one, 1, 1, 2);
}

TEST_CASE("moe dispatch: an expert index out of range or twice in a token, too many tokens or a null pointer fail every rank, naming the rank") {
  moe::routing const g{3, 6, 2};
  int const n = 3;
  auto c = make_moe_case<bf16>(g, 4, 6, routing_kind::uniform, 9);
  REQUIRE(c.tokens[0] == 6);
  cpu::communicator comm(small(n, 2));
  for (int how : {0, 1, 2, 3, 4}) {
    CAPTURE(how);
    std::vector<std::string> what(n);
    std::vector<int> who(n, -2);
    comm.run_ranks([&](int r) {
      exchange<bf16> ex(comm, r, {g, 6, 4, 1});
      std::vector<std::int32_t> idx = c.idx[r];
      std::uint64_t tokens = c.tokens[r];
      bf16 const* x = c.x[r].data();
      if (r == 0 && how == 0) idx[0] = 6;  // rank 0 has max_tokens (6) tokens
      if (r == 0 && how == 1) idx[tokens * 2 - 1] = -2;
      if (r == 0 && how == 2) tokens = 7;
      if (r == 0 && how == 3) x = nullptr;
      if (r == 0 && how == 4) idx[2] = 5, idx[3] = 5;  // token 1 names expert 5 twice
      try {
        ex.dispatch(x, idx.data(), tokens);
      } catch (reccl::error const& e) {
        what[r] = e.what();
        who[r] = e.rank();
      }
      // and the exchange still works for a good pair of calls afterwards
      ex.dispatch(c.x[r].data(), c.idx[r].data(), c.tokens[r]);
      std::vector<bf16> y(ex.received().begin(), ex.received().end()), out(c.tokens[r] * 4);
      ex.combine(y.data(), c.w[r].data(), out.data());
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(what[r]);
      CHECK(who[r] == 0);
      CHECK(contains(what[r], "rank 0"));
    }
    CHECK(contains(what[0], how < 2 ? "outside [-1, 6)" : how == 2 ? "7 tokens, created for 6" : how == 3 ? "null" : "token 1 names"));
  }
  CHECK_THROWS_AS(exchange<bf16>(comm, 0, {moe::routing{3, 7, 2}, 6, 4, 1}), reccl::error);  // 7 experts on 3 ranks
  CHECK_THROWS_AS(exchange<bf16>(comm, 0, {moe::routing{2, 6, 2}, 6, 4, 1}), reccl::error);  // not the comm's ranks
}

// ---------------------------------------------------------------------------------------------
// fp8 dispatch

TEST_CASE("e4m3: every code round-trips, rounding to nearest with ties to the even code, saturating at 448") {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) {
      CHECK(std::isnan(moe::e4m3_to_float(std::uint8_t(b))));
      continue;
    }
    CAPTURE(b);
    CHECK(moe::e4m3_from_float(moe::e4m3_to_float(std::uint8_t(b))) == b);
  }
  CHECK(moe::e4m3_to_float(0x38) == 1.f);
  CHECK(moe::e4m3_to_float(0x7e) == 448.f);
  CHECK(moe::e4m3_to_float(0x01) == std::ldexp(1.f, -9));
  CHECK(moe::e4m3_to_float(0x08) == std::ldexp(1.f, -6));  // smallest normal
  CHECK(moe::e4m3_from_float(1.f + 1.f / 16) == 0x38);     // tie: 1.0 (even) over 1.125
  CHECK(moe::e4m3_from_float(1.f + 3.f / 16) == 0x3a);     // tie: 1.25 (even) over 1.125
  CHECK(moe::e4m3_from_float(1.f + 1.f / 16 + 1e-6f) == 0x39);
  CHECK(moe::e4m3_from_float(std::ldexp(1.f, -10)) == 0x00);      // tie between 0 and the smallest subnormal
  CHECK(moe::e4m3_from_float(3 * std::ldexp(1.f, -10)) == 0x02);  // tie between codes 1 and 2
  CHECK(moe::e4m3_from_float(1000.f) == 0x7e);
  CHECK(moe::e4m3_from_float(-1000.f) == 0xfe);
  CHECK(moe::e4m3_from_float(-0.f) == 0x80);
  CHECK(moe::e4m3_from_float(std::nanf("")) == 0x7f);
}

namespace {

/// One rank's tokens quantised to fp8 rows (values, scales) from a float case.
struct fp8_rows_of {
  std::vector<std::uint8_t> v;
  std::vector<float> s;
};

fp8_rows_of quantise(std::vector<float> const& x, int hidden) {
  std::uint64_t const T = x.size() / hidden;
  fp8_rows_of q{std::vector<std::uint8_t>(x.size()), std::vector<float>(T * (hidden / 128))};
  for (std::uint64_t t = 0; t < T; ++t) moe::quantize_e4m3_row(x.data() + t * hidden, hidden, q.v.data() + t * hidden, q.s.data() + t * (hidden / 128));
  return q;
}

float dequant(fp8_rows_of const& q, int hidden, std::uint64_t t, std::uint64_t h) {
  return moe::e4m3_to_float(q.v[t * hidden + h]) * q.s[t * (hidden / 128) + h / 128];
}

}  // namespace

TEST_CASE("moe dispatch of fp8 rows: values and scales arrive bit for bit in the grouped layout, within e4m3's quantisation of the tokens") {
  for (int n : {2, 3}) {
    int const H = 256, S = H / 128, k = 4, align = 4;
    std::uint64_t const T = 11;
    moe::routing const g{n, 4 * n, k};
    auto c = make_moe_case<float>(g, H, T, routing_kind::sparse, 77u + n);
    for (auto& x : c.x)  // spread the magnitudes so blocks use e4m3's whole range, subnormals included
      for (std::size_t i = 0; i < x.size(); ++i) x[i] *= std::ldexp(1.f, int(i % 23) - 12);
    std::vector<fp8_rows_of> q;
    for (int r = 0; r < n; ++r) {
      q.push_back(quantise(c.x[r], H));
      for (std::uint64_t i = 0; i < c.x[r].size(); ++i) {  // the quantisation itself
        float const x = c.x[r][i], back = dequant(q[r], H, i / H, i % H), scale = q[r].s[(i / H) * S + (i % H) / 128];
        REQUIRE(std::fabs(back - x) <= std::ldexp(std::fabs(x), -4) + std::ldexp(scale, -10) + 1e-30f);
      }
    }
    int const epr = g.experts_per_rank();
    cpu::communicator comm(small(n, 2));
    std::vector<std::vector<std::uint8_t>> values(n);
    std::vector<std::vector<float>> scales(n);
    std::vector<std::vector<bf16>> out(n);
    std::vector<std::vector<std::int32_t>> offsets(n), counts(n);
    comm.run_ranks([&](int r) {
      exchange<bf16> ex(comm, r, {g, T, H, align, moe::payload::fp8_e4m3});
      ex.dispatch(moe::fp8_tokens{q[r].v.data(), q[r].s.data()}, c.idx[r].data(), c.tokens[r]);
      auto const rec = ex.received_fp8();
      values[r].assign(rec.values.begin(), rec.values.end());
      scales[r].assign(rec.scales.begin(), rec.scales.end());
      offsets[r].assign(ex.expert_offsets().begin(), ex.expert_offsets().end());
      counts[r].assign(ex.expert_counts().begin(), ex.expert_counts().end());
      // the experts dequantise: y = bf16(v * scale * (1 + e / 8))
      std::vector<bf16> y(offsets[r][epr] * std::uint64_t(H));
      for (int l = 0; l < epr; ++l)
        for (std::int64_t p = offsets[r][l]; p < offsets[r][l] + counts[r][l]; ++p)
          for (int h = 0; h < H; ++h)
            y[p * H + h] = bf16(moe::e4m3_to_float(rec.values[p * H + h]) * rec.scales[p * S + h / 128] * (1.f + float(r * epr + l) / 8.f));
      out[r].resize(c.tokens[r] * H);
      ex.combine(y.data(), c.w[r].data(), out[r].data());
      CHECK_THROWS_AS((void)ex.received(), reccl::error);
    });
    for (int d = 0; d < n; ++d)
      for (int l = 0; l < epr; ++l) {
        CAPTURE(d);
        CAPTURE(l);
        std::int64_t p = offsets[d][l];
        for (int s = 0; s < n; ++s)
          for (std::uint64_t t = 0; t < c.tokens[s]; ++t)
            for (int j = 0; j < k; ++j)
              if (c.idx[s][t * k + j] == d * epr + l) {
                REQUIRE(std::memcmp(&values[d][p * H], &q[s].v[t * H], H) == 0);
                REQUIRE(std::memcmp(&scales[d][p * S], &q[s].s[t * S], S * 4) == 0);
                ++p;
              }
        REQUIRE(p == offsets[d][l] + counts[d][l]);
        for (; p < offsets[d][l + 1]; ++p) {  // padding: zero values and scales
          for (int h = 0; h < H; ++h) REQUIRE(values[d][p * H + h] == 0);
          for (int b = 0; b < S; ++b) REQUIRE(scales[d][p * S + b] == 0.f);
        }
      }
    for (int s = 0; s < n; ++s)
      for (std::uint64_t t = 0; t < c.tokens[s]; ++t)
        for (int h = 0; h < H; ++h) {
          float acc = 0.f;
          for (int j = 0; j < k; ++j)
            if (int const e = c.idx[s][t * k + j]; e >= 0)
              acc = std::fma(c.w[s][t * k + j], float(bf16(dequant(q[s], H, t, h) * (1.f + float(e) / 8.f))), acc);
          REQUIRE(same_bits(out[s][t * H + h], bf16(acc)));
        }
  }
}

TEST_CASE("moe dispatch of fp8 rows: the wrong payload fails every rank naming it, and hidden must be a multiple of 128") {
  int const n = 2, H = 128;
  moe::routing const g{n, 4, 2};
  auto c = make_moe_case<bf16>(g, H, 3, routing_kind::uniform, 5);
  cpu::communicator comm(small(n, 1));
  std::vector<std::string> what(n);
  comm.run_ranks([&](int r) {
    exchange<bf16> ex(comm, r, {g, 3, H, 1, moe::payload::fp8_e4m3});
    std::vector<std::uint8_t> v(3 * H, 0x38);
    std::vector<float> s(3, 1.f);
    try {
      if (r == 1) ex.dispatch(c.x[r].data(), c.idx[r].data(), c.tokens[r]);  // token rows on an fp8 exchange
      else ex.dispatch(moe::fp8_tokens{v.data(), s.data()}, c.idx[r].data(), c.tokens[r]);
    } catch (reccl::error const& e) {
      what[r] = e.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(what[r]);
    CHECK(contains(what[r], "rank 1"));
  }
  CHECK(contains(what[1], "token rows dispatched on an exchange created for fp8"));
  CHECK_THROWS_AS(exchange<bf16>(comm, 0, {g, 3, 100, 1, moe::payload::fp8_e4m3}), reccl::error);
}
