# Tokenizer, token store and loader tests.
meshtrain_test(test_data SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_data.cpp LIBS meshtrain_data)
