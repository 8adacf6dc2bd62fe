# reccl::nccl -- the NCCL the NVLink path is compiled and linked against (headers as system headers:
# NCCL's own headers warn under -Wall -Wextra). Looks in the CUDA toolkit first, then the system.
if(NOT TARGET reccl::nccl)
  find_path(RECCL_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATHS /usr/include /usr/local/cuda/include REQUIRED)
  find_library(RECCL_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
               PATHS /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 REQUIRED)
  add_library(reccl_nccl INTERFACE)
  target_include_directories(reccl_nccl SYSTEM INTERFACE ${RECCL_NCCL_INCLUDE_DIR})
  target_link_libraries(reccl_nccl INTERFACE ${RECCL_NCCL_LIBRARY})
  add_library(reccl::nccl ALIAS reccl_nccl)
  message(STATUS "reccl: NCCL ${RECCL_NCCL_INCLUDE_DIR} ${RECCL_NCCL_LIBRARY}")
endif()
