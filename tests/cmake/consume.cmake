# Builds and runs an outside project against reccl, either through find_package after installing
# reccl into a scratch prefix (MODE=find_package) or through FetchContent (MODE=fetch_content). The
# project is tests/cmake/consumer/CMakeLists.txt with the README's CPU quick start
# (examples/quickstart/cpu.cpp) as its main.cpp.
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK_DIR})
set(consumer ${WORK_DIR}/src)
file(MAKE_DIRECTORY ${consumer})
file(COPY_FILE ${RECCL_SOURCE_DIR}/tests/cmake/consumer/CMakeLists.txt ${consumer}/CMakeLists.txt)
file(COPY_FILE ${RECCL_SOURCE_DIR}/examples/quickstart/cpu.cpp ${consumer}/main.cpp)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} -S ${RECCL_SOURCE_DIR} -B ${WORK_DIR}/reccl-build -G ${GENERATOR}
      -DRECCL_BUILD_TESTS=OFF -DRECCL_BUILD_EXAMPLES=OFF -DRECCL_BUILD_BENCH=OFF -DRECCL_INSTALL=ON
      -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/reccl-build)
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/build -G ${GENERATOR} -DCONSUME=find_package
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/build -G ${GENERATOR} -DCONSUME=fetch_content
      -DRECCL_SOURCE_DIR=${RECCL_SOURCE_DIR})
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
