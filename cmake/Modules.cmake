# meshtrain_module(NAME DEPS ...): a static library (shared under MESHTRAIN_SHARED_LIBS) from
# src/NAME/**.cpp, depending on the modules above it in DESIGN.md's order.
function(meshtrain_module name)
  cmake_parse_arguments(M "" "" "DEPS;SOURCES" ${ARGN})
  if(NOT M_SOURCES)
    file(GLOB_RECURSE M_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${name}/*.cpp)
  endif()
  if(M_SOURCES)
    add_library(meshtrain_${name} ${MESHTRAIN_LIBRARY_TYPE} ${M_SOURCES})
    target_include_directories(meshtrain_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(meshtrain_${name} PUBLIC ${M_DEPS})
  else()  # header-only so far
    add_library(meshtrain_${name} INTERFACE)
    target_include_directories(meshtrain_${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(meshtrain_${name} INTERFACE ${M_DEPS})
  endif()
endfunction()

# meshtrain_test(NAME SOURCES ... LIBS ... [NP n] [LABELS ...]): a Boost.Test executable in ctest,
# run under mpirun (oversubscribed) when NP is given.
function(meshtrain_test name)
  cmake_parse_arguments(T "" "NP;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} Boost::unit_test_framework)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE BOOST_TEST_DYN_LINK
    MESHTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}" MESHTRAIN_BINARY_DIR="${PROJECT_BINARY_DIR}")
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  if(T_NP)
    add_test(NAME ${name} COMMAND ${MPIEXEC_BIN} --allow-run-as-root --oversubscribe -np ${T_NP}
      $<TARGET_FILE:${name}>)
  else()
    add_test(NAME ${name} COMMAND ${name})
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
