# mm3-flow-fast on tiny-a (skipped without it): a repeat of the reference setting is
# "inf" dB and 0 log-mel away, a shifted schedule with fewer steps is finitely far;
# a setting out of range is refused with exit 2.
if(TARGET mm3-flow-fast AND EXISTS ${MM3_GOLDEN_DIR}/manifest.json)
  set(ff ${CMAKE_BINARY_DIR}/test-tmp/flow_fast)
  add_test(NAME flow_fast_table COMMAND sh -c "rm -rf '${ff}' && mkdir -p '${ff}' && \
$<TARGET_FILE:mm3-flow-fast> --model '${MM3_GOLDEN_DIR}/checkpoint' --seconds 4 --settings 4/1.0,4/1.0,2/2.0 \
> '${ff}/out.md' 2> '${ff}/err.txt'; rc=$?; cat '${ff}/out.md'; test $rc -eq 0 && \
grep -q '^| 4 | 1.00 | (reference) |' '${ff}/out.md' && grep -q '^| 4 | 1.00 | inf | 0.0000 |' '${ff}/out.md' && \
grep -Eq '^\\| 2 \\| 2.00 \\| [0-9]+\\.[0-9] \\| 0\\.[0-9]+ \\|' '${ff}/out.md' && \
! grep -q '^| 2 | 2.00 | [0-9.]* | 0.0000 |' '${ff}/out.md' && \
{ $<TARGET_FILE:mm3-flow-fast> --model '${MM3_GOLDEN_DIR}/checkpoint' --settings 30/0 2> '${ff}/bad.txt'; \
  test $? -eq 2 && grep -q 'shift (0, 20]' '${ff}/bad.txt'; }")
  set_tests_properties(flow_fast_table PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" TIMEOUT 300)
endif()
