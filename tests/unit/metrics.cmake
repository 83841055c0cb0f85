# Profiling traces and TensorBoard event files (src/util/trace, src/metrics).
meshtrain_test(test_trace SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_trace.cpp LIBS meshtrain_metrics)
meshtrain_test(test_tensorboard SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_tensorboard.cpp LIBS meshtrain_metrics)
# Event files decoded by validation/read_tfevents.py (python3-protobuf, python3-crc32c), an
# implementation independent of the writer, and checked against the metrics.jsonl written beside them.
add_executable(write_tfevents ${CMAKE_CURRENT_SOURCE_DIR}/write_tfevents.cpp)
target_link_libraries(write_tfevents PRIVATE meshtrain_metrics)
set_target_properties(write_tfevents PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
set(tfevents_dir ${PROJECT_BINARY_DIR}/tests/tfevents)
add_test(NAME tensorboard_events_decode
  COMMAND sh -c "rm -rf ${tfevents_dir} && mkdir -p ${tfevents_dir} && $<TARGET_FILE:write_tfevents> ${tfevents_dir} && ${MESHTRAIN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/check_tfevents.py ${tfevents_dir} ${PROJECT_SOURCE_DIR}")
set_tests_properties(tensorboard_events_decode PROPERTIES TIMEOUT 120 LABELS validation)
# The executor's, ShardedDataParallel's and MpiCommunicator's spans in one ZeRO-3 step on 2 ranks.
meshtrain_test(test_trace_fsdp SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_trace_fsdp.cpp
  LIBS meshtrain_parallel meshtrain_metrics NP 2 TIMEOUT 120)
