# test_e2e_replay (test/test_e2e_replay.c): every golden case replayed through both
# served stages must give the golden audio; skips (77) without the golden directory.
if(TARGET test_e2e_replay)
  set_tests_properties(test_e2e_replay PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()
