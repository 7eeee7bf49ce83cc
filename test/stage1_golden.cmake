# Stage-1 golden replay: mm3-stage1 --golden over the tiny-a directory (skipped without it).
# stage1_golden_detects: the same check on case0 with a wrong CFG scale must report the
# case as failed and exit 1 (the replay can fail).
if(TARGET mm3-stage1)
  if(EXISTS ${MM3_GOLDEN_DIR}/manifest.json)
    add_test(NAME stage1_golden COMMAND mm3-stage1 --golden ${MM3_GOLDEN_DIR})
    set(neg ${CMAKE_BINARY_DIR}/test-tmp/stage1_golden_neg)
    add_test(NAME stage1_golden_detects COMMAND sh -c "rm -rf '${neg}' && mkdir -p '${neg}' && \
ln -s '${MM3_GOLDEN_DIR}/checkpoint' '${neg}/checkpoint' && \
ln -s '${MM3_GOLDEN_DIR}/case0.safetensors' '${neg}/case0.safetensors' && \
echo '{\"checkpoint\": \"checkpoint\", \"cases\": [{\"file\": \"case0.safetensors\", \"num_inference_steps\": 4, \"guidance_scale_dit\": 1.2}]}' > '${neg}/manifest.json' && \
{ $<TARGET_FILE:mm3-stage1> --golden '${neg}' > '${neg}/out.txt'; rc=$?; cat '${neg}/out.txt'; \
  test $rc -eq 1 && grep -q 'FAIL' '${neg}/out.txt' && grep -q '^0 passed, 1 failed$' '${neg}/out.txt'; }")
    # Render mode: case0's 50 frames -> 172 latents -> 88,064 stereo PCM16 frames after a
    # 44-byte header; the same seed twice gives the same file, another seed another file.
    set(ren ${CMAKE_BINARY_DIR}/test-tmp/stage1_render)
    set(cmd "$<TARGET_FILE:mm3-stage1> --model '${MM3_GOLDEN_DIR}/checkpoint' --frames '${MM3_GOLDEN_DIR}/case0.safetensors' --steps 2")
    add_test(NAME stage1_render_cli COMMAND sh -c "rm -rf '${ren}' && mkdir -p '${ren}' && \
${cmd} --seed 11 -o '${ren}/a.wav' && ${cmd} --seed 11 -o '${ren}/b.wav' && ${cmd} --seed 12 -o '${ren}/c.wav' && \
test $(stat -c %s '${ren}/a.wav') -eq 352300 && cmp '${ren}/a.wav' '${ren}/b.wav' && ! cmp -s '${ren}/a.wav' '${ren}/c.wav'")
  else()
    add_test(NAME stage1_golden COMMAND sh -c "exit 77")
    add_test(NAME stage1_golden_detects COMMAND sh -c "exit 77")
    add_test(NAME stage1_render_cli COMMAND sh -c "exit 77")
  endif()
  set_tests_properties(stage1_golden stage1_golden_detects stage1_render_cli PROPERTIES
    ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 900)
endif()
