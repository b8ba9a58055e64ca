# cmake -DEMBER=<ember> "-DARGS=a|b|c" -P expect_one_line_error.cmake
# Runs ember with ARGS ('|'-separated) and fails unless it exits non-zero with exactly one line on stderr, starting
# "ember: ", and nothing on stdout (a bad flag or file is reported, never a crash or a usage dump).
string(REPLACE "|" ";" _args "${ARGS}")
execute_process(COMMAND ${EMBER} ${_args} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
message(STATUS "exit ${_rc}; stderr: ${_err}")
if(_rc EQUAL 0 OR NOT _rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "expected a non-zero exit status, got \"${_rc}\"")
endif()
if(NOT _out STREQUAL "")
  message(FATAL_ERROR "expected nothing on stdout, got: ${_out}")
endif()
if(NOT _err MATCHES "^ember: [^\n]+\n$")
  message(FATAL_ERROR "expected one line \"ember: ...\" on stderr, got: [${_err}]")
endif()
