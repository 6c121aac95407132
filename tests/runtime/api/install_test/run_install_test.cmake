# Runs as `cmake -P`: install the kdajit build tree into WORK_DIR/prefix, then
# configure, build and run the consumer project against that prefix only.
foreach(var KDAJIT_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR C_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_install_test.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${WORK_DIR})

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: ${what} failed (${rc})\n${out}\n${err}")
  endif()
  message(STATUS "install test: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("cmake --install" ${CMAKE_COMMAND} --install ${KDAJIT_BUILD_DIR} --prefix ${prefix})

# What a package consumer relies on being there.
file(GLOB_RECURSE configs ${prefix}/*/kdajitConfig.cmake)
file(GLOB_RECURSE libs ${prefix}/*/libkdajit.so)
foreach(f ${prefix}/include/kdajit/kdajit.h ${prefix}/bin/kdajit)
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "install test: ${f} was not installed")
  endif()
endforeach()
if(NOT configs OR NOT libs)
  message(FATAL_ERROR "install test: kdajitConfig.cmake or libkdajit.so missing under ${prefix}")
endif()

# Only the prefix: no CUDA toolkit, no build tree on the consumer's paths.
step("configure consumer" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build} -G ${GENERATOR}
     -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
     -DCMAKE_BUILD_TYPE=Release)
step("build consumer" ${CMAKE_COMMAND} --build ${consumer_build})
step("run consumer" ${consumer_build}/kdajit_consumer)
message(STATUS "${step_output}")
