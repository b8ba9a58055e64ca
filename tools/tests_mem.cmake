# End-to-end tests of `ember mem` (included from tools/CMakeLists.txt when tests are built). make_test_trace records a
# training-like run and writes trace.json / trace.jsonl with the recording allocator's peaks in expected.json; the
# tests summarise, replay (exactly the recorded peaks), compare and draw it, and check that bad input fails with one
# line on stderr. The rendered page is checked in headless Chromium when one is installed (skipped otherwise).
add_executable(make_test_trace ${CMAKE_CURRENT_SOURCE_DIR}/make_test_trace.cpp)
target_link_libraries(make_test_trace PRIVATE ember::ember nlohmann_json::nlohmann_json)

set(_mem_dir ${CMAKE_CURRENT_BINARY_DIR}/mem_tests)
set(_mem_scripts ${PROJECT_SOURCE_DIR}/tests/tools)
add_test(NAME tools.mem_make_trace COMMAND make_test_trace ${_mem_dir})
set_tests_properties(tools.mem_make_trace PROPERTIES LABELS tools FIXTURES_SETUP mem_trace
  PASS_REGULAR_EXPRESSION "\"peak_reserved_bytes\":[1-9][0-9]*")

function(_mem_test name)
  add_test(NAME tools.mem_${name} ${ARGN})
  set_tests_properties(tools.mem_${name} PROPERTIES LABELS tools FIXTURES_REQUIRED mem_trace)
endfunction()

# summary: the JSON keys (Chrome file: with the recorded configuration; JSON Lines: without).
_mem_test(summary_json COMMAND ember_cli mem summary ${_mem_dir}/trace.json --json)
set_tests_properties(tools.mem_summary_json PROPERTIES PASS_REGULAR_EXPRESSION
  "\"format\":\"chrome\",\"allocator\":\"caching\",\"alloc_conf\":\"max_split_size_mb:40,[^\"]*\",\"events\":[1-9][0-9]*,\"allocs\":[1-9][0-9]*,\"frees\":[1-9][0-9]*,\"ooms\":1,.*\"peak_allocated_bytes\":[1-9][0-9]*,\"peak_reserved_bytes\":[1-9][0-9]*,.*\"top_owners\":\\[{\"owner\":\"[^\"]+\",\"bytes\":[1-9]")
_mem_test(summary_jsonl COMMAND ember_cli mem summary ${_mem_dir}/trace.jsonl --json)
set_tests_properties(tools.mem_summary_jsonl PROPERTIES PASS_REGULAR_EXPRESSION "\"format\":\"jsonl\",\"allocator\":null,\"alloc_conf\":null,")
_mem_test(summary_text COMMAND ember_cli mem summary ${_mem_dir}/trace.json --top 3)
set_tests_properties(tools.mem_summary_text PROPERTIES PASS_REGULAR_EXPRESSION "top owners at the peak:.*and [0-9]+ more owners")

# replay: the recorded configuration (Chrome) or the same one given with --conf (JSON Lines) gives the recorded peaks.
_mem_test(replay_exact COMMAND ${CMAKE_COMMAND} -DEMBER=$<TARGET_FILE:ember_cli> -DTRACE=${_mem_dir}/trace.json
  -DEXPECTED=${_mem_dir}/expected.json -P ${_mem_scripts}/check_mem_replay.cmake)
_mem_test(replay_exact_jsonl COMMAND ${CMAKE_COMMAND} -DEMBER=$<TARGET_FILE:ember_cli> -DTRACE=${_mem_dir}/trace.jsonl
  -DEXPECTED=${_mem_dir}/expected.json -DPASS_CONF=ON -P ${_mem_scripts}/check_mem_replay.cmake)
_mem_test(replay_text COMMAND ember_cli mem replay ${_mem_dir}/trace.json --conf expandable_segments:True --capacity 6GiB)
set_tests_properties(tools.mem_replay_text PROPERTIES PASS_REGULAR_EXPRESSION
  "under expandable_segments:True \\[--conf\\] on a device of 6.00 GiB.*peak reserved.*note: the recording ran out of memory 1 time")
# A device smaller than the run needed: the replay counts the requests that no longer fit.
_mem_test(replay_capacity COMMAND ember_cli mem replay ${_mem_dir}/trace.json --capacity 128MiB --json)
set_tests_properties(tools.mem_replay_capacity PROPERTIES PASS_REGULAR_EXPRESSION
  "\"capacity\":134217728,\"config\":\"max_split_size_mb:40,[^\"]*\",\"config_source\":\"recorded\",\"peak_allocated_bytes\":[1-9][0-9]*,\"peak_reserved_bytes\":[1-9][0-9]*,\"peak_requested_bytes\":[0-9]+,\"fragmentation\":[0-9.e-]+,\"num_ooms\":[1-9][0-9]*,")

# compare: two configurations side by side.
_mem_test(compare_json COMMAND ember_cli mem compare ${_mem_dir}/trace.json --conf expandable_segments:False
  --conf expandable_segments:True --json)
set_tests_properties(tools.mem_compare_json PROPERTIES PASS_REGULAR_EXPRESSION
  "^{\"trace\":\"[^\"]*trace.json\",\"capacity\":null,\"results\":\\[{\"config\":\"expandable_segments:False\",[^]]*},{\"config\":\"expandable_segments:True\",[^]]*\"peak_reserved_bytes\":[1-9][^]]*}\\]}")
_mem_test(compare_table COMMAND ember_cli mem compare ${_mem_dir}/trace.jsonl --conf max_split_size_mb:40
  --conf roundup_power2_divisions:4 --capacity 1GiB)
set_tests_properties(tools.mem_compare_table PROPERTIES PASS_REGULAR_EXPRESSION
  "config +peak allocated +peak reserved.*\n[* ] max_split_size_mb:40,expandable_segments:True .*\n[* ] roundup_power2_divisions:4,expandable_segments:True ")

# html: writes the page (checked in Chromium below).
_mem_test(html COMMAND ember_cli mem html ${_mem_dir}/trace.json -o ${_mem_dir}/timeline.html --title "test <run>" --json)
set_tests_properties(tools.mem_html PROPERTIES FIXTURES_SETUP mem_html
  PASS_REGULAR_EXPRESSION "\"output\":\"[^\"]*timeline.html\",\"bytes\":[1-9][0-9]*,")
_mem_test(html_chromium COMMAND bash ${_mem_scripts}/check_html.sh ${_mem_dir}/timeline.html ${_mem_dir}/chromium)
set_tests_properties(tools.mem_html_chromium PROPERTIES FIXTURES_REQUIRED "mem_trace;mem_html" SKIP_RETURN_CODE 77
  TIMEOUT 300)

# Bad input: exit status non-zero and exactly one line, "ember: ...", on stderr. Arguments are separated by '|'.
foreach(_case
    "missing_file|mem|summary|${_mem_dir}/no_such_trace.json"
    "directory|mem|replay|${_mem_dir}"
    "garbage_file|mem|summary|${_mem_dir}/garbage.json"
    "garbage_replay|mem|replay|${_mem_dir}/garbage.json|--json"
    "bad_capacity|mem|replay|${_mem_dir}/trace.json|--capacity|lots"
    "bad_conf|mem|compare|${_mem_dir}/trace.json|--conf|max_split_size_mb:5|--conf|expandable_segments:True"
    "unknown_subcommand|mem|frobnicate|${_mem_dir}/trace.json"
    "no_subcommand|mem"
    "unknown_flag|mem|summary|${_mem_dir}/trace.json|--bogus"
    "two_traces|mem|summary|${_mem_dir}/trace.json|${_mem_dir}/trace.jsonl"
    "missing_trace|mem|summary|--json"
    "html_without_output|mem|html|${_mem_dir}/trace.json"
    "compare_without_conf|mem|compare|${_mem_dir}/trace.json"
    "bad_top|mem|summary|${_mem_dir}/trace.json|--top|many")
  string(REPLACE "|" ";" _parts "${_case}")
  list(POP_FRONT _parts _name)
  string(REPLACE ";" "|" _args "${_parts}")
  _mem_test(rejects_${_name} COMMAND ${CMAKE_COMMAND} -DEMBER=$<TARGET_FILE:ember_cli> "-DARGS=${_args}"
    -P ${_mem_scripts}/expect_one_line_error.cmake)
endforeach()

# A JSON Lines event whose "id" is an array nested a million deep: exit 1 with one line on stderr, not a stack overflow.
# (add_test directly: the command's ';' would split it into a list through _mem_test's ARGN.)
add_test(NAME tools.mem_deeply_nested_trace
  COMMAND sh -c "d=${_mem_dir}/deep.jsonl; { printf '{\"action\":\"alloc\",\"id\":'; \
head -c 1000000 /dev/zero | tr '\\000' '['; head -c 1000000 /dev/zero | tr '\\000' ']'; \
printf ',\"size\":1,\"stream\":0}\\n'; } > \"$d\" && exec ${CMAKE_COMMAND} -DEMBER=\"$0\" \"-DARGS=mem|summary|$d\" \
-P ${_mem_scripts}/expect_one_line_error.cmake" $<TARGET_FILE:ember_cli>)
set_tests_properties(tools.mem_deeply_nested_trace PROPERTIES LABELS tools)

# A JSON Lines trace without the allocator's totals (as another tool may write): the recorded peaks are null, not 0.
add_test(NAME tools.mem_summary_without_totals
  COMMAND sh -c "d=${_mem_dir}/no_totals.jsonl; printf '%s\\n%s\\n' \
'{\"action\":\"alloc\",\"id\":1,\"size\":512,\"stream\":0}' '{\"action\":\"free\",\"id\":1,\"size\":512,\"stream\":0}' \
> \"$d\" && exec \"$0\" mem summary \"$d\" --json" $<TARGET_FILE:ember_cli>)
set_tests_properties(tools.mem_summary_without_totals PROPERTIES LABELS tools FIXTURES_REQUIRED mem_trace
  PASS_REGULAR_EXPRESSION "\"peak_allocated_bytes\":null,\"peak_reserved_bytes\":null,\"peak_event_index\":0,\"peak_live_bytes\":512")
