// python/csrc/adaptive_lane.cuh -- adaptive_path (adaptive.hpp) on reccl::adaptive_lane<A, M>;
// included by the one translation unit per allocator.
#pragma once

#include <reccl/host/adaptive.hpp>

#include "adaptive.hpp"

namespace reccl_torch {

template <class A, class M>
class adaptive_lane_path final : public adaptive_path {
 public:
  adaptive_lane_path(reccl::nvlink_communicator& c, reccl::adaptive_options const& o)
      : lane_(std::move(reccl::adaptive_lane<A, M>::create_all({&c}, o).front())) {}

  void all_reduce(void const* in, void* out, std::size_t count, reccl::dtype t, reccl::redop op, cudaStream_t s) override {
    lane_.all_reduce(in, out, count, t, op, s);
  }
  void reduce_scatter(void const* in, void* out, std::size_t count, reccl::dtype t, reccl::redop op, cudaStream_t s) override {
    lane_.reduce_scatter(in, out, count, t, op, s);
  }
  void all_gather(void const* in, void* out, std::size_t count, reccl::dtype t, cudaStream_t s) override {
    lane_.all_gather(in, out, count, t, s);
  }
  void broadcast(void const* in, void* out, std::size_t count, reccl::dtype t, int root, cudaStream_t s) override {
    lane_.broadcast(in, out, count, t, root, s);
  }
  void all_to_all(void const* in, void* out, std::size_t count, reccl::dtype t, cudaStream_t s) override {
    lane_.all_to_all(in, out, count, t, s);
  }
  std::uint64_t epoch() const override { return lane_.epoch(); }
  std::uint64_t recovered() const override { return lane_.recovered(); }
  std::uint32_t error_info() const override { return lane_.error_info(); }
  std::vector<reccl::epoch_report> reports(std::uint64_t from, std::uint64_t to) const override { return lane_.reports(from, to); }

 private:
  reccl::adaptive_lane<A, M> lane_;
};

}  // namespace reccl_torch
