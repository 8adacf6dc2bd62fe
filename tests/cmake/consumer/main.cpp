// A consumer of the installed/fetched package: composes policies at compile time and checks a split.
#include <reccl/reccl.hpp>

#include <cstdio>

int main() {
  reccl::split s{};
  s.n_vts = 2;
  s.live_mask = reccl::all_live(2);
  s.count[0] = 3;
  s.count[1] = 4;
  s.total = 7;
  if (s.sum() != s.total || s.offset(1) != 3) return 1;
  std::printf("reccl %d.%d.%d consumer ok\n", RECCL_VERSION_MAJOR, RECCL_VERSION_MINOR, RECCL_VERSION_PATCH);
  return 0;
}
