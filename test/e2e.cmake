# End-to-end tests of the served pipeline (CPU, tiny-a). test_e2e (test/test_e2e.c)
# drives scripts/launch.sh over HTTP; the shell tests below cover stage 0 on its own
# and the launcher's argument handling. All skip (77) without the golden directory.
if(TARGET mm3-stage0 AND TARGET mm3)
  add_test(NAME e2e_stage0_alone
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/e2e/stage0_alone.sh
            ${CMAKE_BINARY_DIR}/bin ${MM3_GOLDEN_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
  set_tests_properties(e2e_stage0_alone PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 120)

  add_test(NAME e2e_launch_bad_args
    COMMAND sh -c "
      l=\"$0/scripts/launch.sh\"
      MM3_BIN_DIR=\"$1\" bash \"$l\" >/dev/null 2>&1; test $? -eq 2 || exit 1
      MM3_BIN_DIR=\"$1\" bash \"$l\" /nonexistent.yaml >/dev/null 2>&1; test $? -eq 2 || exit 1
      MM3_BIN_DIR=\"$1\" bash \"$l\" \"$0/configs/tiny-cpu.yaml\" --frobnicate >/dev/null 2>&1; test $? -eq 2 || exit 1
      MM3_BIN_DIR=/nonexistent bash \"$l\" \"$0/configs/tiny-cpu.yaml\" >/dev/null 2>&1; test $? -eq 2 || exit 1
      exit 0"
            ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/bin)
  set_tests_properties(e2e_launch_bad_args PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" TIMEOUT 30)

  add_test(NAME e2e_launch_supervision
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/e2e/launch_supervision.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
  set_tests_properties(e2e_launch_supervision PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" TIMEOUT 300)

  add_test(NAME e2e_launch_guard
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/e2e/launch_guard.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
  set_tests_properties(e2e_launch_guard PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" TIMEOUT 300)

  add_test(NAME e2e_launch_mps
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/e2e/launch_mps.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
  set_tests_properties(e2e_launch_mps PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" TIMEOUT 300)

  # The MPS sweep's harness on the CPU pipeline: rows with figures for off and off+prio (the
  # keys reach a valid deploy file), a named arrangement without MPS here fails alone.
  set(sw ${CMAKE_BINARY_DIR}/test-tmp/mps_sweep)
  add_test(NAME bench_mps_sweep_dry_run COMMAND sh -c "rm -rf '${sw}' && \
bash '${CMAKE_SOURCE_DIR}/scripts/bench/mps_sweep.sh' --dry-run --bin '${CMAKE_BINARY_DIR}/bin' --out '${sw}' \
  --arrangements off,off+prio,mps-s1-55,nonsense > '${sw}.out' 2>&1; rc=$?; cat '${sw}.out'; test $rc -eq 0 && \
grep -Eq '^\\| off \\| [0-9.]+ \\| [0-9.]+ \\| [0-9.]+ \\|' '${sw}/table.md' && \
grep -Eq '^\\| off\\+prio \\| [0-9.]+ \\| [0-9.]+ \\| [0-9.]+ \\|' '${sw}/table.md' && \
grep -q 'stream_priority: low' '${sw}/off+prio/deploy.yaml' && \
grep -q '^| nonsense | - | - | - | bad name |' '${sw}/table.md' && \
{ command -v nvidia-cuda-mps-control > /dev/null || grep -q '^| mps-s1-55 | - | - | - | did not start' '${sw}/table.md'; }")
  set_tests_properties(bench_mps_sweep_dry_run PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" TIMEOUT 300)
endif()
# `mm3 rerender` runs mm3-rerender with the same arguments: its own usage text and
# exit status (2 for a bad option) come back through the alias.
if(TARGET mm3 AND TARGET mm3-rerender)
  add_test(NAME e2e_mm3_rerender_alias
    COMMAND sh -c "
      \"$0/mm3\" rerender --frobnicate > /dev/null 2> \"$1/rerender_alias.err\"; rc=$?
      test $rc -eq 2 || { echo \"exit $rc, expected 2\"; exit 1; }
      grep -q 'usage: mm3-rerender' \"$1/rerender_alias.err\" || exit 1
      \"$0/mm3\" rerender --help | grep -q 'mm3-rerender --model' || exit 1
      exit 0"
            ${CMAKE_BINARY_DIR}/bin ${CMAKE_BINARY_DIR})
  set_tests_properties(e2e_mm3_rerender_alias PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" TIMEOUT 30)
endif()
if(TARGET test_e2e)
  set_tests_properties(test_e2e PROPERTIES TIMEOUT 300)
endif()
if(TARGET test_e2e_workers)
  set_tests_properties(test_e2e_workers PROPERTIES TIMEOUT 300)
endif()
# Two replicas behind a real nginx (Debian's `nginx`; skips 77 without it).
if(TARGET test_e2e_router)
  set_tests_properties(test_e2e_router PROPERTIES TIMEOUT 300 LABELS "e2e;router")
endif()
# Under sanitizers the served tests that kill and restart stage 1 take ~250-300 s (test_e2e)
# and ~170-390 s (test_frame_spool) on 2 cores, and beside another heavy test (the render
# tests, a build) their deadlines were missed in CI (seventeenth session: test_e2e at its
# 300 s timeout, a held song's 502): there they run alone, with room.
if(MM3_SANITIZE)
  foreach(t test_e2e test_e2e_workers test_e2e_router test_frame_spool)
    if(TARGET ${t})
      set_tests_properties(${t} PROPERTIES TIMEOUT 900 RUN_SERIAL TRUE)
    endif()
  endforeach()
endif()
