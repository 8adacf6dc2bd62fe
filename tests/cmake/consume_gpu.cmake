# Installs reccl into a scratch prefix and builds tests/cmake/gpu_consumer against it with
# find_package, for CUDA_ARCH (default 90). Runs nothing: the CTest test that depends on this one
# runs the program (skipped without a GPU).
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK_DIR})
if(NOT CUDA_ARCH)
  set(CUDA_ARCH 90)
endif()
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
run(${CMAKE_COMMAND} -S ${RECCL_SOURCE_DIR} -B ${WORK_DIR}/reccl-build -G ${GENERATOR}
    -DRECCL_BUILD_TESTS=OFF -DRECCL_BUILD_EXAMPLES=OFF -DRECCL_BUILD_BENCH=OFF -DRECCL_INSTALL=ON
    -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --install ${WORK_DIR}/reccl-build)
run(${CMAKE_COMMAND} -S ${RECCL_SOURCE_DIR}/tests/cmake/gpu_consumer -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
