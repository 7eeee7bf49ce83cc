# shmconn: the benchmark as a smoke test, and a final check that no test of this
# group left a segment in /dev/shm. Test segments are named mm3t<pid>-*, mm3f<pid>-*,
# mm3b<pid>-*; one whose process is gone is a leak (concurrent runs of other
# build directories are alive, so they do not count).
if(TARGET mm3-bench-shm)
  add_test(NAME shmconn_bench_quick COMMAND mm3-bench-shm --quick)
  set_tests_properties(shmconn_bench_quick PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77
    TIMEOUT 120 FIXTURES_REQUIRED shmconn_segments)
endif()
set_tests_properties(test_shmconn test_shmconn_fork test_pipe_codec PROPERTIES FIXTURES_REQUIRED shmconn_segments)
# The mark dates the group's start: a dead process's segment older than it is a
# leftover of an earlier run (a fuzzer killed on its timeout, say), removed but
# not this run's leak.
add_test(NAME shmconn_dev_shm_mark COMMAND sh -c "touch '${CMAKE_CURRENT_BINARY_DIR}/shmconn_segments.mark'")
set_tests_properties(shmconn_dev_shm_mark PROPERTIES FIXTURES_SETUP shmconn_segments)
add_test(NAME shmconn_dev_shm_clean COMMAND sh -c [=[
mark=$1 rc=0
for f in /dev/shm/mm3[tfb][0-9]*-*; do
  [ -e "$f" ] || continue
  p=${f#/dev/shm/mm3?}; p=${p%%-*}
  kill -0 "$p" 2>/dev/null && continue
  if [ -e "$mark" ] && [ ! "$f" -nt "$mark" ]; then
    echo "removed a leftover of an earlier run: $f"
  else
    echo "left behind: $f"; rc=1
  fi
  rm -f "$f"
done
exit $rc]=] sh "${CMAKE_CURRENT_BINARY_DIR}/shmconn_segments.mark")
set_tests_properties(shmconn_dev_shm_clean PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" FIXTURES_CLEANUP shmconn_segments)
