# Unit tests of the core modules: tensor/allocator, CPU kernels, model, executor, optimizer.
meshtrain_test(test_kernels SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_kernels.cpp LIBS meshtrain_device)
meshtrain_test(test_block_attention SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_block_attention.cpp LIBS meshtrain_device)
meshtrain_test(test_context_parallel SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_context_parallel.cpp LIBS meshtrain_context)
meshtrain_test(test_model SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_model.cpp LIBS meshtrain_graph)
meshtrain_test(test_optim SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_optim.cpp LIBS meshtrain_optim)
meshtrain_test(test_muon SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_muon.cpp LIBS meshtrain_optim)
meshtrain_test(test_safetensors_export SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_safetensors_export.cpp LIBS meshtrain_checkpoint)
meshtrain_test(test_weight_grad_queue SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_weight_grad_queue.cpp LIBS meshtrain_model)
meshtrain_test(test_moe SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_moe.cpp LIBS meshtrain_model)
meshtrain_test(test_gemm_plan_cache SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gemm_plan_cache.cpp LIBS meshtrain_device)
# The output head with PaLM's z-loss, unchunked and chunked (256 of 600 tokens), against an
# independent float64 PyTorch formula (validation/check_z_loss.py): loss, z-loss, dx, dnorm, dW.
add_executable(dump_output_head ${CMAKE_CURRENT_SOURCE_DIR}/dump_output_head.cpp)
target_link_libraries(dump_output_head PRIVATE meshtrain_model nlohmann_json::nlohmann_json)
set_target_properties(dump_output_head PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
foreach(chunk 0 256)
  set(dump ${PROJECT_BINARY_DIR}/tests/output_head_chunk${chunk})
  add_test(NAME validation_torch_z_loss_chunk${chunk}
    COMMAND sh -c "mkdir -p ${dump} && $<TARGET_FILE:dump_output_head> ${dump} --chunk ${chunk} --zeta 0.05 && ${MESHTRAIN_PYTHON} ${PROJECT_SOURCE_DIR}/validation/check_z_loss.py ${dump} --tol 1e-5")
  set_tests_properties(validation_torch_z_loss_chunk${chunk} PROPERTIES TIMEOUT 120 LABELS validation
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endforeach()
meshtrain_test(test_float8 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_float8.cpp LIBS meshtrain_tensor)
meshtrain_test(test_float8_linear SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_float8_linear.cpp LIBS meshtrain_model)
# Float8 emulation (tensor/float8.hpp) against an independent NumPy emulation
# (validation/check_float8.py): rounding of both formats and the six scaled casts, bit for bit.
add_executable(dump_float8 ${CMAKE_CURRENT_SOURCE_DIR}/dump_float8.cpp)
target_link_libraries(dump_float8 PRIVATE meshtrain_tensor)
set_target_properties(dump_float8 PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
add_test(NAME validation_numpy_float8
  COMMAND ${MESHTRAIN_PYTHON} ${PROJECT_SOURCE_DIR}/validation/check_float8.py --dump $<TARGET_FILE:dump_float8>
    --out ${PROJECT_BINARY_DIR}/tests/float8)
set_tests_properties(validation_numpy_float8 PROPERTIES TIMEOUT 120 LABELS validation)
# A Float8 linear layer's forward and two gradient GEMMs (model/layers/primitives.cpp, the CPU
# device's casts) under each TorchAO recipe against NumPy (validation/check_float8_linear.py).
add_executable(dump_float8_linear ${CMAKE_CURRENT_SOURCE_DIR}/dump_float8_linear.cpp)
target_link_libraries(dump_float8_linear PRIVATE meshtrain_model)
set_target_properties(dump_float8_linear PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
add_test(NAME validation_numpy_float8_linear
  COMMAND ${MESHTRAIN_PYTHON} ${PROJECT_SOURCE_DIR}/validation/check_float8_linear.py
    --dump $<TARGET_FILE:dump_float8_linear> --out ${PROJECT_BINARY_DIR}/tests/float8_linear)
set_tests_properties(validation_numpy_float8_linear PROPERTIES TIMEOUT 120 LABELS validation)
