# Bounded load test on loopback (test/load/load_test.sh, driven by mm3-load): tiny-a on
# the CPU through scripts/launch.sh; skips (77) without the golden checkpoint. About
# 35 s alone, 100 s under ASan on 2 cores; run alone (RUN_SERIAL) because beside another
# heavy test under ASan it reached its own 150 s watchdog (CI, sixteenth session).
if(TARGET mm3-stage0 AND TARGET mm3-stage1 AND TARGET mm3 AND TARGET mm3-load)
  add_test(NAME load_loopback
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/load/load_test.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/bin
            ${MM3_GOLDEN_DIR}/checkpoint ${CMAKE_BINARY_DIR}/test-tmp 20)
  set_tests_properties(load_loopback PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 180 RUN_SERIAL TRUE)
endif()
