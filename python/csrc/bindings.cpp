// python/csrc/bindings.cpp -- reccl._C: the communicator for Python (pybind11) and the reccl::*
// operators for torch (TORCH_LIBRARY schemas, CUDA implementations). The fake (meta)
// implementations that torch.compile traces with live in python/reccl/torch.py.
//
// An operator names its communicator by an integer handle (Comm.handle()), as a schema cannot
// name a Python object; a handle that is not a live communicator is refused. Operators are
// stream-ordered on the current CUDA stream and never synchronise the host, so they can be
// captured in CUDA graphs.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include <reccl/error.hpp>
#include <reccl/host/error.hpp>

#include "comm.hpp"

// The measurement helper below times graphs as reccl_loopback_perf does; here a CUDA error throws
// (reccl::error, then a Python exception) rather than ending the process.
#define CK(x) RECCL_CUDA_CHECK(x)
#include "bench/perf/graph_timing.hpp"

namespace py = pybind11;

namespace reccl_torch {
namespace {

// ---- handles -------------------------------------------------------------------------------------

std::mutex registry_mutex;
std::unordered_set<comm*> live;

void add_live(comm* c) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  live.insert(c);
}
void drop_live(comm* c) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  live.erase(c);
}
comm& from_handle(std::int64_t h) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto* c = reinterpret_cast<comm*>(static_cast<std::intptr_t>(h));
  if (live.count(c) == 0) throw reccl::error(reccl::status::invalid_argument, "handle " + std::to_string(h) + " is not a live communicator (closed?)");
  return *c;
}

// ---- errors --------------------------------------------------------------------------------------

// The last reccl::error an operator raised on this thread: the dispatcher turns exceptions into a
// plain RuntimeError, so reccl.torch fetches the structured error here to raise reccl.Error.
struct error_record {
  int code, rank, vt;
  std::int64_t epoch;
  std::string what, detail;
};
thread_local std::optional<error_record> last_error;

template <class F>
auto recorded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (reccl::error const& e) {
    last_error = error_record{static_cast<int>(e.code()), e.rank(), e.vt(), e.epoch(), e.what(), e.detail()};
    throw std::runtime_error(e.what());
  }
}

py::object to_python_error(error_record const& e) {
  py::object cls = py::module_::import("reccl._errors").attr("Error");
  return cls(e.what, e.code, e.rank, e.vt, e.epoch, e.detail);
}

// ---- tensors -------------------------------------------------------------------------------------

std::optional<reccl::dtype> reducing_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return reccl::dtype::float32;
    case at::kHalf: return reccl::dtype::float16;
    case at::kBFloat16: return reccl::dtype::bfloat16;
    case at::kInt: return reccl::dtype::int32;
    default: return std::nullopt;
  }
}

/// The element type a data-moving collective copies `t` as, and the factor its count shrinks by
/// (one-byte types move as pairs).
struct moved_as {
  reccl::dtype type;
  int per_element;
};
moved_as moving_dtype(at::ScalarType t, std::int64_t count) {
  switch (c10::elementSize(t)) {
    case 2: return {reccl::dtype::float16, 1};
    case 4: return {reccl::dtype::int32, 1};
    case 8: return {reccl::dtype::int64, 1};
    case 1:
      if (count % 2 == 0) return {reccl::dtype::float16, 2};
      throw reccl::error(reccl::status::invalid_argument, "one-byte tensors move as pairs: the element count per rank must be even");
    default: throw reccl::error(reccl::status::invalid_argument, std::string("dtype ") + c10::toString(t) + " is not supported");
  }
}

reccl::redop parse_op(std::string const& op) {
  if (op == "sum") return reccl::redop::sum;
  if (op == "prod") return reccl::redop::prod;
  if (op == "min") return reccl::redop::min;
  if (op == "max") return reccl::redop::max;
  if (op == "avg") return reccl::redop::avg;
  throw reccl::error(reccl::status::invalid_argument, "op must be sum, prod, min, max or avg, not '" + op + "'");
}

void check_tensor(comm const& c, at::Tensor const& x, char const* name) {
  auto bad = [&](std::string const& why) {
    throw reccl::error(reccl::status::invalid_argument, std::string("") + name + " " + why, c.rank());
  };
  if (!x.is_cuda()) bad("must be a CUDA tensor");
  if (x.get_device() != c.device()) bad("is on cuda:" + std::to_string(x.get_device()) + ", the communicator on cuda:" + std::to_string(c.device()));
  if (!x.is_contiguous()) bad("must be contiguous");
}

reccl::dtype reduce_type(comm const& c, at::Tensor const& x) {
  auto t = reducing_dtype(x.scalar_type());
  if (!t) throw reccl::error(reccl::status::invalid_argument, std::string("reductions take float32, float16, bfloat16 or int32, not ") +
                                                                  c10::toString(x.scalar_type()), c.rank());
  return *t;
}

cudaStream_t stream_of(at::Tensor const& x) { return at::cuda::getCurrentCUDAStream(x.get_device()).stream(); }

std::int64_t first_dim(at::Tensor const& x) { return x.dim() == 0 ? 1 : x.size(0); }

/// x's shape with its first dimension replaced (a 0-d tensor counts as [1]).
std::vector<std::int64_t> with_first(at::Tensor const& x, std::int64_t d0) {
  std::vector<std::int64_t> s(x.sizes().begin(), x.sizes().end());
  if (s.empty()) s.push_back(d0);
  else s[0] = d0;
  return s;
}

std::int64_t split_first(comm const& c, at::Tensor const& x, char const* op) {
  std::int64_t const d0 = first_dim(x);
  if (d0 % c.size() != 0)
    throw reccl::error(reccl::status::invalid_argument, std::string("") + op + ": the first dimension (" + std::to_string(d0) +
                                                            ") must be a multiple of the rank count (" + std::to_string(c.size()) + ")", c.rank());
  return d0 / c.size();
}

// ---- operators -----------------------------------------------------------------------------------

at::Tensor all_reduce_on(comm& c, at::Tensor const& x, std::string const& op) {
  return recorded([&] {
    check_tensor(c, x, "input");
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
    c.all_reduce(x.data_ptr(), out.data_ptr(), static_cast<std::size_t>(x.numel()), reduce_type(c, x), parse_op(op), stream_of(x));
    return out;
  });
}

void all_reduce_inplace_on(comm& c, at::Tensor& x, std::string const& op) {
  recorded([&] {
    check_tensor(c, x, "input");
    c10::cuda::CUDAGuard guard(x.device());
    c.all_reduce(x.data_ptr(), x.data_ptr(), static_cast<std::size_t>(x.numel()), reduce_type(c, x), parse_op(op), stream_of(x));
  });
}

at::Tensor reduce_scatter_on(comm& c, at::Tensor const& x, std::string const& op) {
  return recorded([&] {
    check_tensor(c, x, "input");
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor out = at::empty(with_first(x, split_first(c, x, "reduce_scatter")), x.options());
    c.reduce_scatter(x.data_ptr(), out.data_ptr(), static_cast<std::size_t>(out.numel()), reduce_type(c, x), parse_op(op),
                     stream_of(x));
    return out;
  });
}

at::Tensor all_gather_on(comm& c, at::Tensor const& x) {
  return recorded([&] {
    check_tensor(c, x, "input");
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor out = at::empty(with_first(x, first_dim(x) * c.size()), x.options());
    moved_as const m = moving_dtype(x.scalar_type(), x.numel());
    c.all_gather(x.data_ptr(), out.data_ptr(), static_cast<std::size_t>(x.numel() / m.per_element), m.type, stream_of(x));
    return out;
  });
}

at::Tensor all_to_all_on(comm& c, at::Tensor const& x) {
  return recorded([&] {
    check_tensor(c, x, "input");
    split_first(c, x, "all_to_all");
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
    std::int64_t const per_pair = x.numel() / c.size();
    moved_as const m = moving_dtype(x.scalar_type(), per_pair);
    c.all_to_all(x.data_ptr(), out.data_ptr(), static_cast<std::size_t>(per_pair / m.per_element), m.type, stream_of(x));
    return out;
  });
}

void broadcast_into(comm& c, at::Tensor const& x, at::Tensor& out, std::int64_t root) {
  if (root < 0 || root >= c.size())
    throw reccl::error(reccl::status::invalid_argument, "broadcast root " + std::to_string(root) + " is not a rank", c.rank());
  moved_as const m = moving_dtype(x.scalar_type(), x.numel());
  c.broadcast(x.data_ptr(), out.data_ptr(), static_cast<std::size_t>(x.numel() / m.per_element), m.type, static_cast<int>(root),
              stream_of(x));
}

at::Tensor broadcast_on(comm& c, at::Tensor const& x, std::int64_t root) {
  return recorded([&] {
    check_tensor(c, x, "input");
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
    broadcast_into(c, x, out, root);
    return out;
  });
}

void broadcast_inplace_on(comm& c, at::Tensor& x, std::int64_t root) {
  recorded([&] {
    check_tensor(c, x, "input");
    c10::cuda::CUDAGuard guard(x.device());
    broadcast_into(c, x, x, root);
  });
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_all_reduce_on(comm& c, at::Tensor const& x, at::Tensor const& residual,
                                                                 at::Tensor const& weight, double eps) {
  return recorded([&] {
    check_tensor(c, x, "x");
    check_tensor(c, residual, "residual");
    check_tensor(c, weight, "weight");
    auto bad = [&](std::string const& why) {
      throw reccl::error(reccl::status::invalid_argument, "fused_add_rms_norm_all_reduce: " + why, c.rank());
    };
    if (x.scalar_type() != at::kBFloat16 || residual.scalar_type() != at::kBFloat16 || weight.scalar_type() != at::kBFloat16)
      bad("x, residual and weight must be bfloat16");
    if (x.dim() != 2 || !residual.sizes().equals(x.sizes()) || weight.dim() != 1 || weight.size(0) != x.size(1))
      bad("x and residual must be [tokens, hidden] and weight [hidden]");
    c10::cuda::CUDAGuard guard(x.device());
    at::Tensor out = at::empty_like(x);
    at::Tensor res = at::empty_like(x);
    c.fused_add_rms_norm_all_reduce(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), res.data_ptr(), out.data_ptr(),
                                    static_cast<std::uint32_t>(x.size(0)), static_cast<std::uint32_t>(x.size(1)),
                                    static_cast<float>(eps), stream_of(x));
    return std::make_tuple(out, res);
  });
}

// The operators as the dispatcher calls them: the communicator named by its handle.
at::Tensor all_reduce(std::int64_t h, at::Tensor const& x, std::string const& op) {
  return recorded([&] { return all_reduce_on(from_handle(h), x, op); });
}
void all_reduce_(std::int64_t h, at::Tensor& x, std::string const& op) {
  recorded([&] { all_reduce_inplace_on(from_handle(h), x, op); });
}
at::Tensor reduce_scatter(std::int64_t h, at::Tensor const& x, std::string const& op) {
  return recorded([&] { return reduce_scatter_on(from_handle(h), x, op); });
}
at::Tensor all_gather(std::int64_t h, at::Tensor const& x) {
  return recorded([&] { return all_gather_on(from_handle(h), x); });
}
at::Tensor all_to_all(std::int64_t h, at::Tensor const& x) {
  return recorded([&] { return all_to_all_on(from_handle(h), x); });
}
at::Tensor broadcast(std::int64_t h, at::Tensor const& x, std::int64_t root) {
  return recorded([&] { return broadcast_on(from_handle(h), x, root); });
}
void broadcast_(std::int64_t h, at::Tensor& x, std::int64_t root) {
  recorded([&] { broadcast_inplace_on(from_handle(h), x, root); });
}
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm_all_reduce(std::int64_t h, at::Tensor const& x, at::Tensor const& residual,
                                                                 at::Tensor const& weight, double eps) {
  return recorded([&] { return fused_add_rms_norm_all_reduce_on(from_handle(h), x, residual, weight, eps); });
}

// ---- Python objects ------------------------------------------------------------------------------

/// The Python-side owner of a comm: the handle stays live until close() or destruction.
struct py_comm {
  std::unique_ptr<comm> c;
  explicit py_comm(std::unique_ptr<comm> p) : c(std::move(p)) { add_live(c.get()); }
  ~py_comm() {
    if (c) drop_live(c.get());
  }
  comm& get() const {
    if (!c || c->closed()) throw reccl::error(reccl::status::invalid_argument, "the communicator is closed");
    return *c;
  }
};

std::int64_t handle_of(py_comm const& p) { return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(&p.get())); }

/// The creation options as Python passes them (keyword names of reccl.torch.Communicator).
options make_options(py::dict const& kw) {
  options o;
  for (auto item : kw) {
    std::string const k = item.first.cast<std::string>();
    py::handle v = item.second;
    if (k == "max_ctas") o.max_ctas = v.cast<std::int32_t>();
    else if (k == "timeout") {
      double const t = v.cast<double>();
      if (!(t > 0)) throw reccl::error(reccl::status::invalid_argument, "timeout must be > 0 seconds");
      o.timeout_ns = static_cast<std::uint64_t>(t * 1e9);
    } else if (k == "fused_max_tokens") o.fused_max_tokens = v.cast<std::uint32_t>();
    else if (k == "fused_max_hidden") o.fused_max_hidden = v.cast<std::uint32_t>();
    else if (k == "allocator") o.allocator = v.cast<std::string>();
    else if (k == "telemetry") o.telemetry = v.cast<std::string>();
    else if (k == "vts") o.vts = v.cast<std::int32_t>();
    else if (k == "transport") o.transport = v.cast<std::string>();
    else throw reccl::error(reccl::status::invalid_argument, "unknown option '" + k + "'");
  }
  return o;
}

std::vector<int> bits(std::uint32_t mask) {
  std::vector<int> out;
  for (int i = 0; i < 32; ++i)
    if ((mask >> i) & 1u) out.push_back(i);
  return out;
}

/// One adaptive collective's report as a dict (docs/pytorch.md lists the keys).
py::dict report_dict(reccl::epoch_report const& r) {
  py::dict d;
  auto const n = static_cast<std::size_t>(r.n_vts);
  std::vector<double> share(n), gbps(n);
  std::vector<std::uint64_t> bytes(n), stalls(n), time_ns(n), count(n);
  for (std::size_t i = 0; i < n; ++i) {
    share[i] = static_cast<double>(r.share[i]) / static_cast<double>(reccl::share_one);
    bytes[i] = r.bytes[i];
    stalls[i] = r.stalls[i];
    time_ns[i] = r.time_ns[i];
    gbps[i] = static_cast<double>(r.bw_mbps[i]) / 1000.0;
    count[i] = r.split.count[i];
  }
  d["epoch"] = r.epoch;
  d["status"] = std::string(reccl::name(r.st));
  d["vts"] = r.n_vts;
  d["ranks"] = r.nranks;
  d["share"] = share;
  d["elements"] = count;  // bytes for the data-moving collectives (they split raw bytes)
  d["bytes"] = bytes;
  d["stalls"] = stalls;
  d["time_ns"] = time_ns;
  d["gbps"] = gbps;
  d["masked"] = bits(r.masked_mask);
  d["faulted"] = bits(r.fault_mask);
  d["probed"] = bits(r.probe_mask);
  d["rejoined"] = bits(r.rejoined_mask);
  return d;
}

}  // namespace
}  // namespace reccl_torch

TORCH_LIBRARY(reccl, m) {
  m.def("all_reduce(int comm, Tensor x, str op='sum') -> Tensor");
  m.def("all_reduce_(int comm, Tensor(a!) x, str op='sum') -> ()");
  m.def("reduce_scatter(int comm, Tensor x, str op='sum') -> Tensor");
  m.def("all_gather(int comm, Tensor x) -> Tensor");
  m.def("all_to_all(int comm, Tensor x) -> Tensor");
  m.def("broadcast(int comm, Tensor x, int root) -> Tensor");
  m.def("broadcast_(int comm, Tensor(a!) x, int root) -> ()");
  m.def("fused_add_rms_norm_all_reduce(int comm, Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
}

#define RECCL_TORCH_IMPLS(m)                                                                  \
  m.impl("all_reduce", &reccl_torch::all_reduce);                                             \
  m.impl("all_reduce_", &reccl_torch::all_reduce_);                                           \
  m.impl("reduce_scatter", &reccl_torch::reduce_scatter);                                     \
  m.impl("all_gather", &reccl_torch::all_gather);                                             \
  m.impl("all_to_all", &reccl_torch::all_to_all);                                             \
  m.impl("broadcast", &reccl_torch::broadcast);                                               \
  m.impl("broadcast_", &reccl_torch::broadcast_);                                             \
  m.impl("fused_add_rms_norm_all_reduce", &reccl_torch::fused_add_rms_norm_all_reduce)

TORCH_LIBRARY_IMPL(reccl, CUDA, m) { RECCL_TORCH_IMPLS(m); }
// CPU tensors reach the same functions, which refuse them with a reccl error naming the tensor
// (rather than the dispatcher's "no kernel for this backend").
TORCH_LIBRARY_IMPL(reccl, CPU, m) { RECCL_TORCH_IMPLS(m); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace reccl_torch;
  m.doc() = "reccl's communicator and operators for PyTorch (see reccl.torch)";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (reccl::error const& e) {
      error_record const r{static_cast<int>(e.code()), e.rank(), e.vt(), e.epoch(), e.what(), e.detail()};
      py::object err = to_python_error(r);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
    }
  });

  m.def("take_last_error", []() -> py::object {
    if (!last_error) return py::none();
    py::object e = to_python_error(*last_error);
    last_error.reset();
    return e;
  }, "The reccl error the last failing operator on this thread raised (then forgets it), or None.");

  m.def("memory_bound", [](int nranks, py::kwargs kw) { return memory_bound(nranks, make_options(kw)); });

  py::class_<py_comm>(m, "Comm")
      .def("handle", [](py_comm const& p) { return handle_of(p); })
      .def("rank", [](py_comm const& p) { return p.get().rank(); })
      .def("size", [](py_comm const& p) { return p.get().size(); })
      .def("device", [](py_comm const& p) { return p.get().device(); })
      .def("loopback", [](py_comm const& p) { return p.get().loopback(); })
      .def("memory_bytes", [](py_comm const& p) { return p.c ? p.c->memory_bytes() : 0; })
      .def("fused_max_tokens", [](py_comm const& p) { return p.get().fused_max_tokens(); })
      .def("fused_max_hidden", [](py_comm const& p) { return p.get().fused_max_hidden(); })
      .def("check", [](py_comm const& p) { p.get().check(); })
      .def("allocate", [](py_comm& p, std::size_t bytes) {
        return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(p.get().allocate(bytes)));
      })
      .def("tensor_at", [](py_comm const& p, std::int64_t ptr, std::vector<std::int64_t> const& shape, at::Tensor const& like) {
        // A view of registered memory the communicator owns (freed by free() or close(), not by torch).
        (void)p.get();
        return at::from_blob(reinterpret_cast<void*>(static_cast<std::intptr_t>(ptr)), shape, like.options());
      })
      .def("free", [](py_comm& p, std::int64_t ptr) { p.get().free(reinterpret_cast<void*>(static_cast<std::intptr_t>(ptr))); })
      .def("is_registered", [](py_comm const& p, std::int64_t ptr, std::size_t bytes) {
        return p.c && p.c->is_registered(reinterpret_cast<void const*>(static_cast<std::intptr_t>(ptr)), bytes);
      })
      .def("closed", [](py_comm const& p) { return !p.c || p.c->closed(); })
      .def("adaptive", [](py_comm const& p) { return p.get().adaptive(); })
      .def("adaptive_epoch", [](py_comm const& p) { return p.get().adaptive_epoch(); })
      .def("recovered", [](py_comm const& p) { return p.get().recovered(); })
      .def("reports", [](py_comm const& p, std::uint64_t from, std::uint64_t to) {
        py::list out;
        for (auto const& r : p.get().reports(from, to)) out.append(report_dict(r));
        return out;
      })
      // The operators' implementations called straight from Python, without the dispatcher: what
      // reccl.torch's methods use eagerly on plain tensors (torch.compile and tensor subclasses go
      // through torch.ops.reccl). Same checks, same errors (take_last_error), same launches.
      .def("all_reduce", [](py_comm& p, at::Tensor const& x, std::string const& op) { return all_reduce_on(p.get(), x, op); })
      .def("all_reduce_", [](py_comm& p, at::Tensor& x, std::string const& op) { all_reduce_inplace_on(p.get(), x, op); })
      .def("reduce_scatter", [](py_comm& p, at::Tensor const& x, std::string const& op) { return reduce_scatter_on(p.get(), x, op); })
      .def("all_gather", [](py_comm& p, at::Tensor const& x) { return all_gather_on(p.get(), x); })
      .def("all_to_all", [](py_comm& p, at::Tensor const& x) { return all_to_all_on(p.get(), x); })
      .def("broadcast", [](py_comm& p, at::Tensor const& x, std::int64_t root) { return broadcast_on(p.get(), x, root); })
      .def("broadcast_", [](py_comm& p, at::Tensor& x, std::int64_t root) { broadcast_inplace_on(p.get(), x, root); })
      .def("fused_add_rms_norm_all_reduce", [](py_comm& p, at::Tensor const& x, at::Tensor const& residual, at::Tensor const& weight,
                                               double eps) { return fused_add_rms_norm_all_reduce_on(p.get(), x, residual, weight, eps); })
      .def("close", [](py_comm& p) {
        if (!p.c) return;
        drop_live(p.c.get());
        p.c->close();
      });

  m.def("create", [](int rank, int nranks, py::function exchange, py::kwargs kw) {
    // Called with the GIL held (pybind11), and so is every exchange: creation and close() run the
    // callable on this thread. exchange(mine: bytes) -> bytes of every rank's `mine`, rank order.
    exchange_fn ex = [exchange, nranks](void const* mine, void* all, std::size_t bytes) {
      py::gil_scoped_acquire gil;
      py::bytes got = exchange(py::bytes(static_cast<char const*>(mine), bytes));
      std::string const s = got;
      if (s.size() != bytes * static_cast<std::size_t>(nranks))
        throw reccl::error(reccl::status::internal, "the exchange returned " + std::to_string(s.size()) + " bytes, not ranks x " +
                                                        std::to_string(bytes));
      std::memcpy(all, s.data(), s.size());
    };
    return std::make_unique<py_comm>(comm::create(rank, nranks, std::move(ex), make_options(kw)));
  });

  // Measurement helpers (bench/perf/torch_ops.py): the same collective called from C++, and one
  // replay loop for graphs from either side.
  // _CppGraphs(comms, xs, iters): per rank, one graph of `iters` in-place all-reduces captured from
  // C++ on its own stream. _CppGraphs.adopt(execs, iters): graphs captured elsewhere (torch's
  // CUDAGraph.raw_cuda_graph_exec(); not owned). time(reps) replays every rank's graph together
  // reps + 1 times and returns microseconds per call of each replay but the first --
  // bench/perf/graph_timing.hpp, the small-message tools' own timing, with CUDA errors thrown
  // instead of exiting.
  struct cpp_graphs {
    std::vector<cudaStream_t> streams;
    std::vector<cudaGraphExec_t> exec;
    int iters = 0;
    bool owned = true;
    cpp_graphs(std::size_t ranks, int n_iters) : streams(ranks), iters(n_iters) {
      for (auto& s : streams) RECCL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }
    cpp_graphs(py::list comms, std::vector<at::Tensor> const& xs, int n_iters) : cpp_graphs(xs.size(), n_iters) {
      std::vector<comm*> cs;
      for (auto h : comms) cs.push_back(&h.cast<py_comm&>().get());
      exec = reccl_bench::capture_per_rank(streams, iters, [&](int r) {
        at::Tensor const& x = xs[static_cast<std::size_t>(r)];
        cs[static_cast<std::size_t>(r)]->all_reduce(x.data_ptr(), x.data_ptr(), static_cast<std::size_t>(x.numel()),
                                                    *reducing_dtype(x.scalar_type()), reccl::redop::sum, streams[static_cast<std::size_t>(r)]);
      });
    }
    static std::unique_ptr<cpp_graphs> adopt(std::vector<std::int64_t> const& execs, int n_iters) {
      auto g = std::make_unique<cpp_graphs>(execs.size(), n_iters);
      for (auto e : execs) g->exec.push_back(reinterpret_cast<cudaGraphExec_t>(static_cast<std::intptr_t>(e)));
      g->owned = false;
      return g;
    }
    ~cpp_graphs() {
      if (owned)
        for (auto e : exec) RECCL_CUDA_REPORT(cudaGraphExecDestroy(e));
      for (auto s : streams) RECCL_CUDA_REPORT(cudaStreamDestroy(s));
    }
    std::vector<double> time(int reps) const { return reccl_bench::replay_graphs(streams, exec, iters, reps); }
  };
  py::class_<cpp_graphs>(m, "_CppGraphs")
      .def(py::init<py::list, std::vector<at::Tensor> const&, int>())
      .def_static("adopt", &cpp_graphs::adopt)
      .def("time", &cpp_graphs::time);

  m.def("_host_us_cpp", [](py::list comms, std::vector<at::Tensor> const& xs, int calls, int chunk) {
    // Host microseconds per eager in-place all-reduce issued from C++, the launches only: ranks take
    // turns issuing `chunk` calls each on their own streams (bench/perf/torch_ops.py's order), the
    // clock runs only inside the turns, and the device is synchronised after the last.
    if (chunk < 1 || calls < 1) throw reccl::error(reccl::status::invalid_argument, "_host_us_cpp: calls and chunk must be >= 1");
    std::size_t const n = xs.size();
    std::vector<comm*> cs;
    for (auto h : comms) cs.push_back(&h.cast<py_comm&>().get());
    std::vector<cudaStream_t> streams(n);
    for (auto& s : streams) RECCL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::chrono::duration<double, std::micro> total{0};
    int done = 0;
    while (done < calls) {
      int const k = std::min(chunk, calls - done);
      for (std::size_t r = 0; r < n; ++r) {
        auto const t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < k; ++i)
          cs[r]->all_reduce(xs[r].data_ptr(), xs[r].data_ptr(), static_cast<std::size_t>(xs[r].numel()),
                            *reducing_dtype(xs[r].scalar_type()), reccl::redop::sum, streams[r]);
        total += std::chrono::steady_clock::now() - t0;
      }
      done += k;
    }
    RECCL_CUDA_CHECK(cudaDeviceSynchronize());
    for (auto& s : streams) RECCL_CUDA_CHECK(cudaStreamDestroy(s));
    return total.count() / (static_cast<double>(calls) * static_cast<double>(n));
  });

  m.def("_empty_launch_us", &empty_launch_us, "Host us per empty-kernel launch (the floor under the eager host time).");

  m.def("create_loopback", [](int nranks, int device, py::kwargs kw) {
    auto comms = comm::create_loopback(nranks, device, make_options(kw));
    py::list out;
    for (auto& c : comms) out.append(py::cast(std::make_unique<py_comm>(std::move(c))));
    return out;
  });
}
