# Stage-0 replay check on the golden directory (skipped, exit 77, when it is absent),
# and the program's handling of bad arguments (exit status 2, never a crash).
if(TARGET mm3-stage0)
  add_test(NAME stage0_golden
    COMMAND sh -c "test -d \"$1\" || exit 77; exec \"$0\" --golden \"$1\""
            $<TARGET_FILE:mm3-stage0> ${MM3_GOLDEN_DIR})
  set_tests_properties(stage0_golden PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 900)

  add_test(NAME stage0_bad_args
    COMMAND sh -c "
      \"$0\" --golden /nonexistent-golden-dir >/dev/null 2>&1; test $? -eq 2 || exit 1
      \"$0\" --golden \"$1\" --backend tpu >/dev/null 2>&1; test $? -eq 2 || exit 1
      \"$0\" --golden >/dev/null 2>&1; test $? -eq 2 || exit 1
      \"$0\" --model \"$1/checkpoint\" --caption x >/dev/null 2>&1; test $? -eq 2 || exit 1
      \"$0\" --model \"$1/checkpoint\" --caption x --lyrics-file /dev/null --frames-out /dev/null --seed -1 >/dev/null 2>&1; test $? -eq 2 || exit 1
      \"$0\" --frobnicate 1 >/dev/null 2>&1; test $? -eq 2 || exit 1
      exit 0"
            $<TARGET_FILE:mm3-stage0> ${MM3_GOLDEN_DIR})
  set_tests_properties(stage0_bad_args PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" TIMEOUT 60)

  # Standalone generation: a seeded song written with --frames-out replays
  # (--replay) to a byte-identical file; another seed gives another song.
  add_test(NAME stage0_generate_replay
    COMMAND sh -c "test -d \"$1\" || exit 77
      bin=\"$0\"; golden=\"$1\"; d=\"$2/stage0_generate_replay\"; rm -rf \"$d\"; mkdir -p \"$d\" || exit 1
      printf '[verse]\\nhello world\\n[chorus]\\nsing with me\\n' > \"$d/lyrics.txt\"
      gen() { \"$bin\" --model \"$golden/checkpoint\" --caption 'a bright synth pop song' --lyrics-file \"$d/lyrics.txt\" --duration 3 \"$@\"; }
      gen --seed 9 --frames-out \"$d/a.st\" || exit 1
      gen --replay \"$d/a.st\" --frames-out \"$d/b.st\" || exit 1
      gen --seed 10 --frames-out \"$d/c.st\" || exit 1
      cmp \"$d/a.st\" \"$d/b.st\" || exit 1
      if cmp -s \"$d/a.st\" \"$d/c.st\"; then exit 1; fi
      rm -rf \"$d\""
            $<TARGET_FILE:mm3-stage0> ${MM3_GOLDEN_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
  set_tests_properties(stage0_generate_replay PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
