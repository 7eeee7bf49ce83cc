# The include graph keeps its layers (scripts/check-layers.sh): no include cycle,
# no room of stage0/ including the core loop or a room above it.
add_test(NAME check_layers COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/check-layers.sh ${CMAKE_SOURCE_DIR})
