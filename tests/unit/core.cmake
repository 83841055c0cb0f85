# Unit tests of the core modules: tensor/allocator, CPU kernels, model, executor, optimizer.
meshtrain_test(test_kernels SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_kernels.cpp LIBS meshtrain_device)
meshtrain_test(test_block_attention SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_block_attention.cpp LIBS meshtrain_device)
meshtrain_test(test_context_parallel SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_context_parallel.cpp LIBS meshtrain_context)
meshtrain_test(test_model SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_model.cpp LIBS meshtrain_graph)
meshtrain_test(test_optim SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_optim.cpp LIBS meshtrain_optim)
meshtrain_test(test_safetensors_export SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_safetensors_export.cpp LIBS meshtrain_checkpoint)
meshtrain_test(test_weight_grad_queue SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_weight_grad_queue.cpp LIBS meshtrain_model)
meshtrain_test(test_moe SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_moe.cpp LIBS meshtrain_model)
