# Deck parsing, validation, registry and flavor tests, and the pipeline plan of pp decks
# (test_config_pipeline.cpp). test_config_registry.cpp also checks that doc/deck-reference.md
# equals the registry's rendering, test_config_torchtitan.cpp the same of doc/torchtitan-compat.md;
# the CLI checks below do the same through the real binary when the whole project is built.
meshtrain_test(test_config
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_config.cpp ${CMAKE_CURRENT_SOURCE_DIR}/test_config_registry.cpp
    ${CMAKE_CURRENT_SOURCE_DIR}/test_config_torchtitan.cpp ${CMAKE_CURRENT_SOURCE_DIR}/test_config_pipeline.cpp
  LIBS meshtrain_config)
add_test(NAME deck_reference_is_current
  COMMAND sh -c "$<TARGET_FILE:meshtrain> deck reference --markdown | diff -u ${PROJECT_SOURCE_DIR}/doc/deck-reference.md - && echo 'doc/deck-reference.md is current'")
add_test(NAME torchtitan_compat_is_current
  COMMAND sh -c "$<TARGET_FILE:meshtrain> deck torchtitan --markdown | diff -u ${PROJECT_SOURCE_DIR}/doc/torchtitan-compat.md - && echo 'doc/torchtitan-compat.md is current'")
