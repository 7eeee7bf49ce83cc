# The include graph keeps its layers (scripts/check-layers.sh): no include cycle, no
# folder including one above it (common/ < shmconn/ < pipe/ < stage0/, stage1/), no
# room of stage0/ including the core loop or a room above it.
add_test(NAME check_layers COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/check-layers.sh ${CMAKE_SOURCE_DIR})
