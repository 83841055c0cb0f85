# Tokenizer, token store and loader tests.
meshtrain_test(test_data SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_data.cpp LIBS meshtrain_data)
# Byte-level BPE (tokenizer.json, tiktoken) on hand-made models, and the corpus readers.
meshtrain_test(test_tokenizer SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_tokenizer.cpp LIBS meshtrain_data)
meshtrain_test(test_corpus_reader SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_corpus_reader.cpp LIBS meshtrain_data)
