# Deck parsing, validation, registry and flavor tests (test_config_registry.cpp also checks that
# doc/deck-reference.md equals the registry's rendering); the CLI check below does the same
# through the real binary when the whole project is built.
meshtrain_test(test_config
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_config.cpp ${CMAKE_CURRENT_SOURCE_DIR}/test_config_registry.cpp
  LIBS meshtrain_config)
add_test(NAME deck_reference_is_current
  COMMAND sh -c "$<TARGET_FILE:meshtrain> deck reference --markdown | diff -u ${PROJECT_SOURCE_DIR}/doc/deck-reference.md - && echo 'doc/deck-reference.md is current'")
