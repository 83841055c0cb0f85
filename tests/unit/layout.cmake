# Topology parsing and the pure rank layout.
meshtrain_test(test_layout SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_layout.cpp LIBS meshtrain_layout)
