// The NCCL shim's decisions (shim/include/reccl_shim/dispatch.hpp) against a fake backend: when
// state is built, which calls are served, deferred or forwarded, and in which order.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <reccl_shim/dispatch.hpp>

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using reccl::collective;
using reccl::shim::comm_state;
using reccl::shim::request;

/// Records every event in one trace: "create:1,2", "run:1", "fwd:1", "gs", "ge", "log".
struct fake_backend {
  using comm_type = int;
  struct state_type {
    int comm;
  };
  std::vector<std::string> trace;
  std::vector<int> fail_create;     // communicators whose creation throws
  std::vector<void*> capturing_on;  // streams being captured
  int run_result = 0;

  std::vector<std::unique_ptr<state_type>> create(std::vector<int> const& cs) {
    std::string t = "create:";
    for (std::size_t i = 0; i < cs.size(); ++i) t += (i ? "," : "") + std::to_string(cs[i]);
    trace.push_back(t);
    for (int c : cs)
      for (int f : fail_create)
        if (c == f) throw std::runtime_error("no symmetric memory");
    std::vector<std::unique_ptr<state_type>> v;
    for (int c : cs) v.push_back(std::make_unique<state_type>(state_type{c}));
    return v;
  }
  int run(state_type& s, request const& r) {
    trace.push_back("run:" + std::to_string(s.comm) + ":" + std::to_string(r.count));
    return run_result;
  }
  bool capturing(void* stream) {
    for (void* s : capturing_on)
      if (s == stream) return true;
    return false;
  }
  int real_group_start() {
    trace.push_back("gs");
    return 0;
  }
  int real_group_end() {
    trace.push_back("ge");
    return 0;
  }
  void log(std::string const&) { trace.push_back("log"); }
};

request req(std::size_t count, void* stream = nullptr) {
  request r;
  r.coll = collective::all_reduce;
  r.count = count;
  r.stream = stream;
  return r;
}

struct fixture {
  fake_backend b;
  reccl::shim::dispatcher<fake_backend> d{b};
  int submit(int comm, std::size_t count, void* stream = nullptr) {
    return d.submit(comm, req(count, stream), [this, comm, count] {
      b.trace.push_back("fwd:" + std::to_string(comm) + ":" + std::to_string(count));
      return 0;
    });
  }
  void group_start() {
    b.trace.push_back("gs");
    d.group_start();
  }
  using trace = std::vector<std::string>;
};

}  // namespace

TEST_CASE_FIXTURE(fixture, "shim dispatch: the first call builds the state once, later calls are served") {
  CHECK(d.state_of(7) == comm_state::unknown);
  CHECK(submit(7, 10) == 0);
  CHECK(submit(7, 11) == 0);
  CHECK(b.trace == trace{"create:7", "run:7:10", "run:7:11"});
  CHECK(d.state_of(7) == comm_state::ready);
  REQUIRE(d.served(7) != nullptr);
  CHECK(d.served(7)->comm == 7);
}

TEST_CASE_FIXTURE(fixture, "shim dispatch: a failed creation forwards that communicator for good, and says so") {
  b.fail_create = {3};
  submit(3, 1);
  submit(3, 2);
  submit(4, 5);
  CHECK(b.trace == trace{"create:3", "log", "fwd:3:1", "fwd:3:2", "create:4", "run:4:5"});
  CHECK(d.state_of(3) == comm_state::forwarded);
  CHECK(d.served(3) == nullptr);
}

TEST_CASE_FIXTURE(fixture, "shim dispatch: a group builds all its new communicators together after the real group end") {
  group_start();
  submit(1, 100);
  submit(2, 100);
  submit(1, 200);
  CHECK(b.trace == trace{"gs"});  // nothing happens until the group ends
  CHECK(d.group_end() == 0);
  CHECK(b.trace == trace{"gs", "ge", "create:1,2", "run:1:100", "run:2:100", "run:1:200"});
}

TEST_CASE_FIXTURE(fixture, "shim dispatch: inside a group, ready communicators launch at once; nesting counts") {
  submit(1, 1);
  submit(2, 1);
  b.trace.clear();
  group_start();
  group_start();
  submit(1, 5);
  submit(2, 6);
  CHECK(d.group_depth() == 2);
  CHECK(d.group_end() == 0);  // inner end: only the real one
  CHECK(d.group_end() == 0);
  CHECK(b.trace == trace{"gs", "gs", "run:1:5", "run:2:6", "ge", "ge"});
  CHECK(d.group_depth() == 0);
}

TEST_CASE_FIXTURE(fixture, "shim dispatch: calls behind a deferred creation keep their order, a ready one does not wait") {
  submit(1, 1);
  b.trace.clear();
  group_start();
  submit(2, 10);  // new: deferred
  submit(1, 11);  // ready: launched now
  submit(2, 12);  // behind the deferred one
  d.group_end();
  CHECK(b.trace == trace{"gs", "run:1:11", "ge", "create:2", "run:2:10", "run:2:12"});
}

TEST_CASE_FIXTURE(fixture, "shim dispatch: when a group's creation fails, its calls go to NCCL inside one real group") {
  b.fail_create = {9};
  group_start();
  submit(9, 1);
  submit(9, 2);
  d.group_end();
  CHECK(b.trace == trace{"gs", "ge", "create:9", "log", "gs", "fwd:9:1", "fwd:9:2", "ge"});
  CHECK(d.state_of(9) == comm_state::forwarded);
}

TEST_CASE_FIXTURE(fixture, "shim dispatch: a first call under graph capture is forwarded and creates nothing") {
  int s = 0;
  b.capturing_on = {&s};
  submit(5, 1, &s);
  CHECK(b.trace == trace{"fwd:5:1"});
  CHECK(d.state_of(5) == comm_state::unknown);
  submit(5, 2, nullptr);  // eager: creates
  submit(5, 3, &s);       // captured, but ready: served (the kernels are capturable)
  CHECK(b.trace == trace{"fwd:5:1", "create:5", "run:5:2", "run:5:3"});
}

TEST_CASE_FIXTURE(fixture, "shim dispatch: destroy drops the state; a communicator at the same address starts over") {
  submit(4, 1);
  d.destroy(4);
  CHECK(d.state_of(4) == comm_state::unknown);
  submit(4, 2);
  CHECK(b.trace == trace{"create:4", "run:4:1", "create:4", "run:4:2"});
  d.destroy(12345);  // unknown: nothing happens
}

TEST_CASE_FIXTURE(fixture, "shim dispatch: a launch error is returned, in a group at group end") {
  submit(1, 1);
  b.run_result = 4;  // ncclInvalidArgument
  CHECK(submit(1, 2) == 4);
  b.run_result = 0;
  group_start();
  submit(2, 3);
  b.run_result = 4;
  CHECK(d.group_end() == 4);
}

TEST_CASE("shim dispatch: group nesting and deferred calls are per thread") {
  fake_backend b;
  reccl::shim::dispatcher<fake_backend> d{b};
  d.group_start();
  auto fwd = [] { return 0; };
  d.submit(1, req(1), fwd);
  int other_depth = -1;
  std::thread t([&] {
    other_depth = d.group_depth();
    d.submit(2, req(2), fwd);  // this thread is in no group: created and served now
  });
  t.join();
  CHECK(other_depth == 0);
  CHECK(d.state_of(2) == comm_state::ready);
  CHECK(d.state_of(1) == comm_state::unknown);
  d.group_end();
  CHECK(d.state_of(1) == comm_state::ready);
}

TEST_CASE_FIXTURE(fixture, "shim dispatch: with_served reaches a ready communicator's state only") {
  int seen = -1;
  CHECK_FALSE(d.with_served(6, [&](fake_backend::state_type& st) { seen = st.comm; }));
  submit(6, 1);
  CHECK(d.with_served(6, [&](fake_backend::state_type& st) { seen = st.comm; }));
  CHECK(seen == 6);
  d.destroy(6);
  CHECK_FALSE(d.with_served(6, [&](fake_backend::state_type&) { seen = 0; }));
  CHECK(seen == 6);
}

TEST_CASE_FIXTURE(fixture, "shim dispatch: forget unlinks the state without destroying it") {
  submit(8, 1);
  std::unique_ptr<fake_backend::state_type> kept = d.forget(8);
  REQUIRE(kept != nullptr);
  CHECK(kept->comm == 8);
  CHECK(d.state_of(8) == comm_state::unknown);
  CHECK(d.forget(8) == nullptr);
}
