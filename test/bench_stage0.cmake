# Smoke test of mm3-bench-stage0 (tools/mm3_bench_stage0.c) on the CPU backend with the tiny-a
# checkpoint: the scheduler-driven loop runs 1 and 2 CFG pairs at two contexts, and every
# configuration gives a figure with a floor (one S0BENCH frame line each), plus the time to
# first frame. A time limit of 0.000001 s must skip every configuration with its reason and
# still exit 0. --env-sets runs the grid once per set, each in its own environment: set 1's
# variables restored to what they were at start (or unset) before set 2's are applied, every
# figure labelled with its set; a malformed set is refused (exit 2). Skips (77) without the
# golden directory.
if(TARGET mm3-bench-stage0)
  add_test(NAME bench_stage0_cpu
    COMMAND sh -c "
      ck=\"$MM3_GOLDEN_DIR/checkpoint\"
      [ -f \"$ck/modular_model_index.json\" ] || exit 77
      log=\"$1/bench_stage0_cpu.log\"
      mkdir -p \"$1\"
      \"$0/mm3-bench-stage0\" --ckpt \"$ck\" --backend cpu --pairs 1,2 --contexts 80,160 --frames 3 --warmup 1 \\
        --ttff-tokens 80 --copy-mib 8 > \"$log\" 2>&1 || { cat \"$log\"; exit 1; }
      n=$(grep -c '^S0BENCH kind=frame context=[0-9]* pairs=[12] prompt_tokens=[0-9]* ms_median=[0-9.]* .*floor_ms=[0-9.]* ratio=[0-9.]*' \"$log\")
      [ \"$n\" -eq 4 ] || { cat \"$log\"; echo \"expected 4 frame lines, got $n\"; exit 1; }
      grep -q '^S0BENCH kind=ttff prompt_tokens=80 s=0\\.[0-9]*' \"$log\" || { cat \"$log\"; echo 'no ttff line'; exit 1; }
      grep -q '^| ms per frame | 160 | 2 | [0-9.]* | [0-9.]* |' \"$log\" || { cat \"$log\"; echo 'no table row'; exit 1; }
      \"$0/mm3-bench-stage0\" --ckpt \"$ck\" --backend cpu --pairs 1 --contexts 80 --frames 2 --copy-mib 8 \\
        --time-limit 0.000001 > \"$log\" 2>&1 || { cat \"$log\"; exit 1; }
      grep -q '^S0BENCH kind=skipped context=80 pairs=1 .*reason=\"time limit' \"$log\" || { cat \"$log\"; exit 1; }
      \"$0/mm3-bench-stage0\" --ckpt \"$ck\" --backend cpu --pairs 0 > \"$log\" 2>&1; test $? -eq 2 || exit 1
      MM3_B=orig \"$0/mm3-bench-stage0\" --ckpt \"$ck\" --backend cpu --pairs 1 --contexts 80 --frames 2 --warmup 1 \\
        --ttff-tokens 80 --copy-mib 8 --env-sets 'MM3_A=5,MM3_B=x;MM3_A=6;' > \"$log\" 2>&1 || { cat \"$log\"; exit 1; }
      grep -q '^S0BENCH kind=set index=0 env=\"MM3_A=5,MM3_B=x\" effective=\"MM3_A=5,MM3_B=x\"$' \"$log\" &&
      grep -q '^S0BENCH kind=set index=1 env=\"MM3_A=6\" effective=\"MM3_A=6,MM3_B=orig\"$' \"$log\" &&
      grep -q '^S0BENCH kind=set index=2 env=\"\" effective=\"MM3_A unset,MM3_B=orig\"$' \"$log\" ||
        { cat \"$log\"; echo 'env sets not applied or not restored'; exit 1; }
      n=$(grep -c '^S0BENCH kind=frame context=80 pairs=1 .* env=\"' \"$log\")
      [ \"$n\" -eq 3 ] || { cat \"$log\"; echo \"expected 3 labelled frame lines, got $n\"; exit 1; }
      \"$0/mm3-bench-stage0\" --ckpt \"$ck\" --backend cpu --env-sets 'A=1,,B=2' > \"$log\" 2>&1; test $? -eq 2 || exit 1
      grep -q 'empty assignment' \"$log\" || { cat \"$log\"; exit 1; }
      exit 0"
            ${CMAKE_BINARY_DIR}/bin ${CMAKE_BINARY_DIR}/test-tmp)
  set_tests_properties(bench_stage0_cpu PROPERTIES ENVIRONMENT "${MM3_TEST_ENV}" SKIP_RETURN_CODE 77 TIMEOUT 60)
endif()
