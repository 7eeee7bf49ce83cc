# Fuzz targets (test/fuzz/fuzz_<target>.c, see docs/testing.md).
# Every build: fuzz_replay_<target> = the target + test/fuzz/replay_main.c, run by
# CTest over test/fuzz/corpus/<target>/ and test/fuzz/regressions/<target>/ (so the
# ASan+UBSan suite replays them). With -DMM3_FUZZ=ON (clang, cmake/fuzz.cmake):
# also the libFuzzer binaries fuzz-<target> and the target `mm3_fuzzers`.
set(MM3_FUZZ_DIR ${CMAKE_CURRENT_SOURCE_DIR}/fuzz)
file(GLOB MM3_FUZZ_SOURCES CONFIGURE_DEPENDS ${MM3_FUZZ_DIR}/fuzz_*.c)
list(REMOVE_ITEM MM3_FUZZ_SOURCES ${MM3_FUZZ_DIR}/fuzz_support.c)
set(MM3_FUZZ_LIBS mm3_stage0 mm3_stage1 mm3_pipe mm3_shmconn mm3_common)

add_library(mm3_fuzz_support STATIC ${MM3_FUZZ_DIR}/fuzz_support.c)
target_include_directories(mm3_fuzz_support PUBLIC ${CMAKE_SOURCE_DIR})
target_compile_definitions(mm3_fuzz_support PRIVATE MM3_FUZZ_SOURCE_DIR="${CMAKE_SOURCE_DIR}")

if(MM3_FUZZ)
  add_custom_target(mm3_fuzzers)
endif()
foreach(src ${MM3_FUZZ_SOURCES})
  get_filename_component(stem ${src} NAME_WE)
  string(REGEX REPLACE "^fuzz_" "" target ${stem})
  add_executable(fuzz_replay_${target} ${src} ${MM3_FUZZ_DIR}/replay_main.c)
  target_link_libraries(fuzz_replay_${target} PRIVATE mm3_fuzz_support ${MM3_FUZZ_LIBS})
  add_test(NAME fuzz_replay_${target}
           COMMAND fuzz_replay_${target} ${MM3_FUZZ_DIR}/corpus/${target} ${MM3_FUZZ_DIR}/regressions/${target})
  set_tests_properties(fuzz_replay_${target} PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77
                       TIMEOUT 300 LABELS fuzz)
  if(MM3_FUZZ)
    add_executable(fuzz-${target} ${src})
    target_link_libraries(fuzz-${target} PRIVATE mm3_fuzz_support ${MM3_FUZZ_LIBS})
    target_link_options(fuzz-${target} PRIVATE -fsanitize=fuzzer)
    add_dependencies(mm3_fuzzers fuzz-${target})
  endif()
endforeach()
if(TARGET test_shmconn)
  # Its segments are /dev/shm/mm3f<pid>-*: the leak check of test/shmconn.cmake covers them.
  set_tests_properties(fuzz_replay_shmconn PROPERTIES FIXTURES_REQUIRED shmconn_segments)
endif()
