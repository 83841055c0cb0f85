# Deck parsing, validation and flavor tests; the committed deck reference must match the registry.
meshtrain_test(test_config SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_config.cpp LIBS meshtrain_config)
add_test(NAME deck_reference_is_current
  COMMAND sh -c "$<TARGET_FILE:meshtrain> deck reference --markdown | diff -u ${PROJECT_SOURCE_DIR}/doc/deck-reference.md - && echo 'doc/deck-reference.md is current'")
