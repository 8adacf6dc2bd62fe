"""Builds reccl._C, the extension behind reccl.torch (see pyproject.toml and docs/pytorch.md).

python/csrc/comm.cu and adaptive_<allocator>.cu hold every CUDA kernel (nvcc, no torch headers;
one adaptive lane per allocator, so that the build compiles them in parallel) and
python/csrc/bindings.cpp the torch operators and the Python communicator (host compiler). The
kernels are built for TORCH_CUDA_ARCH_LIST (default 9.0, Hopper). NCCL's headers and library come
from PyTorch's nvidia-nccl wheel when it is installed (the NCCL torch loads), else the system's.
"""

import os
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")


def nccl_paths():
    try:
        import nvidia.nccl as n

        base = list(n.__path__)[0]
        inc, lib = os.path.join(base, "include"), os.path.join(base, "lib")
        if os.path.exists(os.path.join(inc, "nccl.h")):
            return [inc], [lib]
    except ImportError:
        pass
    return [], []


nccl_inc, nccl_lib = nccl_paths()
# ROOT: bindings.cpp times its measurement helper with bench/perf/graph_timing.hpp
includes = [ROOT, os.path.join(ROOT, "include"), os.path.join(ROOT, "examples", "03_fused_allreduce_rmsnorm")] + nccl_inc
dtypes = "-DRECCL_DTYPES=int32|float16|bfloat16|float32"
# torch's extension flags hide CUDA's half/bfloat16 operators and conversions (for ATen's own
# types); reccl's device code uses them
keep_half = ["-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
             "-U__CUDA_NO_HALF2_OPERATORS__"]

setup(
    package_dir={"": "python"},
    packages=["reccl"],
    ext_modules=[
        CUDAExtension(
            name="reccl._C",
            sources=["python/csrc/comm.cu", "python/csrc/bindings.cpp"]
            + [f"python/csrc/adaptive_{a}.cu" for a in ("equal", "proportional", "texcp", "aimd")],
            include_dirs=includes,
            library_dirs=nccl_lib,
            libraries=[":libnccl.so.2"],
            runtime_library_dirs=nccl_lib,
            extra_compile_args={
                "cxx": ["-std=c++20", "-O2", dtypes],
                "nvcc": ["-std=c++20", "-O2", "--expt-relaxed-constexpr", dtypes] + keep_half,
            },
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    zip_safe=False,
)
