# ctest -P script: installs the build tree into a fresh prefix, then configures,
# builds and runs tests/install against it. Arguments: BUILD_DIR, SOURCE_DIR,
# WORK_DIR, GENERATOR.
file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix"
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
foreach(f include/attnprof/runner.h lib/cmake/attnprof/attnprofConfig.cmake bin/attnprof)
  if(NOT EXISTS "${WORK_DIR}/prefix/${f}")
    message(FATAL_ERROR "the install lacks ${f}")
  endif()
endforeach()
# A CUDA build installs its GPU half as lib/libattnprof_cuda.so, which the
# installed command finds from bin/ (the loader's words when it cannot load
# it here, never "looked in ...").
if(EXISTS "${BUILD_DIR}/libattnprof_cuda.so")
  if(NOT EXISTS "${WORK_DIR}/prefix/lib/libattnprof_cuda.so")
    message(FATAL_ERROR "the install lacks lib/libattnprof_cuda.so")
  endif()
  execute_process(COMMAND "${WORK_DIR}/prefix/bin/attnprof" explain --device cuda --seq 64 RESULT_VARIABLE rc
                  OUTPUT_QUIET ERROR_VARIABLE err)
  if(err MATCHES "looked in")
    message(FATAL_ERROR "the installed attnprof did not find its CUDA plugin: ${err}")
  endif()
  message("installed attnprof --device cuda: ${err}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/install" -B "${WORK_DIR}/build" -G "${GENERATOR}"
                        -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc)
  message(FATAL_ERROR "configuring against the installed attnprof failed:\n${out}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${WORK_DIR}/build" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE out)
if(rc)
  message(FATAL_ERROR "building against the installed attnprof failed:\n${out}")
endif()
execute_process(COMMAND "${WORK_DIR}/build/consumer" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(rc)
  message(FATAL_ERROR "the consumer program failed (${rc})")
endif()
