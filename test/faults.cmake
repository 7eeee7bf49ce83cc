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
endif()
