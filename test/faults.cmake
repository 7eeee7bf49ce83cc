# Fault tests (test/faults/*.sh): tiny-a on the CPU through scripts/launch.sh or the
# stages on their own; each is bounded (< 60 s) and skips (77) without the golden
# checkpoint. faults_gpu_oom also skips without a CUDA build and a GPU.
if(TARGET mm3-stage0 AND TARGET mm3-stage1 AND TARGET mm3 AND TARGET mm3-load)
  foreach(t slow_stage1 kill_stage0 client_output gpu_oom)
    add_test(NAME faults_${t}
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/${t}.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/bin
              ${MM3_GOLDEN_DIR}/checkpoint ${CMAKE_BINARY_DIR}/test-tmp)
    set_tests_properties(faults_${t} PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 120)
  endforeach()
  # Under sanitizers faults_slow_stage1's seven songs (8 flow steps each, stage 1 one
  # request at a time) take 11-14 s of compute apiece on 2 shared cores: 101 s in the
  # eighteenth session's CI, past its 100 s watchdog. There it gets 300 s (its checks are
  # the same).
  if(MM3_SANITIZE)
    set_tests_properties(faults_slow_stage1 PROPERTIES ENVIRONMENT "${MM3_TEST_ENV};MM3_TEST_WATCHDOG_S=300"
                                                       TIMEOUT 360)
  endif()
endif()
