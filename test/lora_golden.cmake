# Golden replays with LoRA adapters in the manifest (test/lora_golden.sh says what it checks).
if(TARGET mm3-stage0 AND TARGET mm3-stage1 AND TARGET mm3-mkckpt)
  add_test(NAME lora_golden COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/lora_golden.sh ${CMAKE_BINARY_DIR}/bin
           ${MM3_GOLDEN_DIR} ${CMAKE_BINARY_DIR}/test-tmp/lora_golden)
  set_tests_properties(lora_golden PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 900)
endif()
