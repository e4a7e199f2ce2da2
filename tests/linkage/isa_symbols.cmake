# ctest -P script: each CPU flash kernel object (src/backends/cpu/isa/) is
# compiled with its level's flags (AVX-512, AMX...), so any function it
# defines outside its own namespace could be picked by the linker for the
# whole program (an inline function or template of a header the others also
# use, such as std::vector's) and run on a CPU without the level: SIGILL.
# Fails naming such a symbol. Arguments: NM, OBJECTS (;-separated).
foreach(obj ${OBJECTS})
  if(NOT obj MATCHES "isa/flash_([a-z0-9]+)\\.cpp\\.o$")
    continue()
  endif()
  set(level ${CMAKE_MATCH_1})
  execute_process(COMMAND "${NM}" -C --defined-only "${obj}" RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "nm ${obj} failed: ${err}")
  endif()
  string(REPLACE "\n" ";" lines "${text}")
  set(count 0)
  foreach(l ${lines})
    # Local symbols (lower-case types: t, r, d, b) cannot be shared.
    if(NOT l MATCHES "^[0-9a-f]+ ([A-Zuvw]) (.*)$")
      continue()
    endif()
    set(name "${CMAKE_MATCH_2}")
    math(EXPR count "${count} + 1")
    if(name MATCHES "^(void |float |long |bool |char const\\* |[a-zA-Z_:<>, ]+ )?attnprof::cpu::flash::${level}::")
      continue()
    endif()
    if(name MATCHES "^attnprof::cpu::flash::kKernels[A-Za-z0-9]+$")
      continue()
    endif()
    message(FATAL_ERROR "${obj} (the ${level} kernels) defines a shared symbol outside attnprof::cpu::flash::${level}: ${l}")
  endforeach()
  if(count EQUAL 0)
    message(FATAL_ERROR "${obj}: no symbols read (nm output changed?)")
  endif()
  message(STATUS "${level}: ${count} shared symbols, all in attnprof::cpu::flash::${level}")
endforeach()
