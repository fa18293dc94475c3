# Fails if a binary contains the test-only fault switches of core (setFaultsForTesting exists
# only in tally_core_testing, built with TALLY_TEST_FAULTS).
#   -DBINARIES=a;b;c   the binaries to inspect
#   -DEXPECT=absent    (default) every binary must be free of them
#   -DEXPECT=present   every binary must contain them: proves this check can fail
if(NOT DEFINED EXPECT)
  set(EXPECT absent)
endif()
find_program(NM nm REQUIRED)
set(failures "")
foreach(binary IN LISTS BINARIES)
  execute_process(COMMAND ${NM} -C ${binary} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc
                  ERROR_VARIABLE nm_error)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nm ${binary} failed: ${nm_error}")
  endif()
  string(REGEX MATCHALL "[^\n]*FaultsForTesting[^\n]*" found "${symbols}")
  list(LENGTH found count)
  if(EXPECT STREQUAL "absent" AND count GREATER 0)
    string(APPEND failures "\n  ${binary}: ${found}")
  elseif(EXPECT STREQUAL "present" AND count EQUAL 0)
    string(APPEND failures "\n  ${binary}: no FaultsForTesting symbol")
  endif()
endforeach()
if(failures)
  message(FATAL_ERROR "test-only faults check (expect ${EXPECT}) failed:${failures}")
endif()
message(STATUS "no_test_faults: ${BINARIES} (${EXPECT})")
