# Helpers shared by every component's CMakeLists.txt.

# tandem_test(NAME SOURCES... [LIBS libs...] [TIMEOUT s] [LABELS l...])
# One CUnit executable and one ctest entry per test file (after nng's nng_test()).
function(tandem_test name)
    cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
    if(NOT T_SOURCES)
        set(T_SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/${name}.c)
    endif()
    if(NOT T_TIMEOUT)
        set(T_TIMEOUT 120)
    endif()
    if(NOT T_LABELS)
        set(T_LABELS unit)
    endif()
    add_executable(${name} ${T_SOURCES})
    target_link_libraries(${name} PRIVATE ${T_LIBS} PkgConfig::CUNIT tandem_warnings)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}"
        ENVIRONMENT "TANDEM_BIN_DIR=${CMAKE_BINARY_DIR}/bin;TANDEM_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endfunction()
