# Fuzzing build (docs/testing.md): -DMM3_FUZZ=ON with clang instruments every
# library for libFuzzer (coverage feedback) plus ASan and UBSan, so test/fuzz.cmake
# can link real fuzzers fuzz-<target>. A separate build directory (scripts/fuzz.sh
# uses build-fuzz): the flags apply to everything configured after this file.
# Included from the top-level CMakeLists.txt before the libraries are defined
# (scripts/fuzz.sh also passes it as CMAKE_PROJECT_INCLUDE; the guard makes the
# second inclusion a no-op).
include_guard(GLOBAL)
option(MM3_FUZZ "Build the libFuzzer targets fuzz-<target> (clang only)" OFF)
if(MM3_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MM3_FUZZ=ON needs clang (CC=clang), not ${CMAKE_C_COMPILER_ID}")
  endif()
  if(MM3_SANITIZE)
    message(FATAL_ERROR "MM3_FUZZ=ON sets its own sanitizers; leave MM3_SANITIZE empty")
  endif()
  # C only: CUDA sources (if any) keep their own flags.
  add_compile_options("$<$<COMPILE_LANGUAGE:C>:-fsanitize=fuzzer-no-link,address,undefined>"
                      "$<$<COMPILE_LANGUAGE:C>:-fno-sanitize-recover=undefined>"
                      "$<$<COMPILE_LANGUAGE:C>:-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=address,undefined)
endif()
