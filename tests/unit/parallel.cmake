# Sharding building blocks of the parallel module.
meshtrain_test(test_dim0_shard SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_dim0_shard.cpp LIBS meshtrain_parallel)
# Pipeline schedules as data: generators, validity checks, unit-cost simulation.
meshtrain_test(test_pp_schedule SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_pp_schedule.cpp LIBS meshtrain_pipeline)
# Every point-to-point exchange the trainer posts (schedules, the tied embedding's gradient sum)
# under the stream-ordered model of NCCL, recorded from the real code.
meshtrain_test(test_stream_exchanges SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_stream_exchanges.cpp LIBS meshtrain_train)
