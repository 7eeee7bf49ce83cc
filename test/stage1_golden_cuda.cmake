# Stage-1 golden replay on the GPU: mm3-stage1 --golden --backend cuda in each matmul
# precision (fp32 at the CPU's 1e-4; tf32 / bf16 / fp16 / fp8 at the bounds of stage1/golden.h).
# Only in CUDA builds; skipped (77) on a machine without a CUDA device.
if(TARGET mm3-stage1 AND MM3_HAVE_CUDA AND EXISTS ${MM3_GOLDEN_DIR}/manifest.json)
  foreach(prec fp32 tf32 bf16 fp16 fp8)
    set(log ${CMAKE_BINARY_DIR}/test-tmp/stage1_golden_cuda_${prec}.txt)
    mm3_add_cuda_replay(stage1_golden_cuda_${prec} ${log}
      $<TARGET_FILE:mm3-stage1> --golden ${MM3_GOLDEN_DIR} --backend cuda --precision ${prec})
    set_tests_properties(stage1_golden_cuda_${prec} PROPERTIES
      ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 900)
  endforeach()
endif()
