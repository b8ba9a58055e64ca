# End-to-end tests of `ember train` and `ember info` (label tools). Included from tools/CMakeLists.txt, this file
# registers the tests; run with `cmake -P` it is their checker: it runs `ember` and checks the exit status, the one-line
# error, the JSON object on stdout's last line, output patterns and written files. Every run is a few steps on
# generated data, so the whole file stays within seconds on two cores.
#
# Checker variables (-D...): EMBER (the program), ARGS (its arguments, space-separated), MODE (run | error | resume |
#   exact | ddp),
#   EXPECT  space-separated checks of the JSON's keys: key=number|string|null|bool|any|<exact value>; a dotted key
#           walks into objects (build.cuda=bool)
#   MATCH   a regular expression the combined output must contain
#   FILES   space-separated FILE:TEXT pairs: the file must exist and contain TEXT
#   RESUME_ARGS (resume) the second run's arguments; its JSON is checked with EXPECT
#   REJECT_ARGS, REJECT_MATCH (resume) a third run that must fail with one line matching REJECT_MATCH
#   RUN_MPI, MPIEXEC (ddp) ARGS runs with --ddp under `sh RUN_MPI MPIEXEC 2` and alone: rank 0 alone prints the
#           report and the JSON, whose final_loss equals the single process's within 1e-6; FILES must exist
#   SPLIT_ARGS, RESUME_ARGS, SAME (exact) ARGS runs straight through, SPLIT_ARGS runs the first part and RESUME_ARGS
#           resumes it; SAME names the two files that must be byte-identical (the straight run's and the resumed
#           run's checkpoints: weights, optimizer state, manifest and all)

if(CMAKE_SCRIPT_MODE_FILE)
  separate_arguments(_args UNIX_COMMAND "${ARGS}")
  macro(_run_ember out_var err_var rc_var)
    execute_process(COMMAND ${EMBER} ${ARGN} OUTPUT_VARIABLE ${out_var} ERROR_VARIABLE ${err_var}
                    RESULT_VARIABLE ${rc_var} TIMEOUT 600)
  endmacro()
  function(_check_json out)
    string(STRIP "${out}" _trimmed)
    string(REGEX REPLACE "^.*\n" "" _last "${_trimmed}")
    string(JSON _type ERROR_VARIABLE _jerr TYPE "${_last}")
    if(_jerr OR NOT _type STREQUAL "OBJECT")
      message(FATAL_ERROR "stdout's last line is not a JSON object: '${_last}'")
    endif()
    separate_arguments(_checks UNIX_COMMAND "${EXPECT}")
    foreach(_check IN LISTS _checks)
      string(FIND "${_check}" "=" _eq)
      string(SUBSTRING "${_check}" 0 ${_eq} _key)
      math(EXPR _from "${_eq} + 1")
      string(SUBSTRING "${_check}" ${_from} -1 _want)
      string(REPLACE "." ";" _path "${_key}")
      string(JSON _t ERROR_VARIABLE _jerr TYPE "${_last}" ${_path})
      if(_jerr)
        message(FATAL_ERROR "JSON has no key '${_key}': ${_last}")
      endif()
      if(_want STREQUAL "any")
        continue()
      elseif(_want STREQUAL "number" OR _want STREQUAL "string" OR _want STREQUAL "null" OR _want STREQUAL "bool")
        string(TOUPPER "${_want}" _w)
        if(_w STREQUAL "BOOL")
          set(_w BOOLEAN)
        endif()
        if(NOT _t STREQUAL _w)
          message(FATAL_ERROR "JSON key '${_key}' is ${_t}, expected ${_want}: ${_last}")
        endif()
      else()
        string(JSON _v GET "${_last}" ${_path})
        if(NOT _v STREQUAL _want)
          message(FATAL_ERROR "JSON key '${_key}' is '${_v}', expected '${_want}': ${_last}")
        endif()
      endif()
    endforeach()
  endfunction()

  function(_final_loss out var)
    string(STRIP "${out}" _trimmed)
    string(REGEX REPLACE "^.*\n" "" _last "${_trimmed}")
    string(JSON _v ERROR_VARIABLE _jerr GET "${_last}" final_loss)
    if(_jerr)
      message(FATAL_ERROR "stdout's last line is not the JSON report: '${_last}'")
    endif()
    set(${var} "${_v}" PARENT_SCOPE)
  endfunction()

  if(MODE STREQUAL "ddp")
    execute_process(COMMAND sh ${RUN_MPI} ${MPIEXEC} 2 ${EMBER} ${_args} --ddp OUTPUT_VARIABLE _out
                    ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 600)
    if(_rc STREQUAL "77")
      message(STATUS "${_out}")  # SKIP_REGULAR_EXPRESSION
      return()
    elseif(NOT _rc STREQUAL "0")
      message(FATAL_ERROR "mpirun -np 2 ember ${ARGS} --ddp failed (${_rc}):\n${_out}\n${_err}")
    endif()
    string(REGEX MATCHALL "\"world_size\":2" _reports "${_out}")
    string(REGEX MATCHALL "done \\(2 ranks\\): step" _dones "${_out}${_err}")
    list(LENGTH _reports _n_reports)
    list(LENGTH _dones _n_dones)
    if(NOT _n_reports EQUAL 1 OR NOT _n_dones EQUAL 1)
      message(FATAL_ERROR "expected one JSON report and one 'done:' line (rank 0's), got ${_n_reports} and "
                          "${_n_dones}:\n${_out}\n${_err}")
    endif()
    if(DEFINED MATCH AND NOT "${_out}${_err}" MATCHES "${MATCH}")
      message(FATAL_ERROR "the output does not match '${MATCH}':\n${_out}\n${_err}")
    endif()
    _final_loss("${_out}" _ddp_loss)
    _run_ember(_out1 _err1 _rc1 ${_args})
    if(NOT _rc1 STREQUAL "0")
      message(FATAL_ERROR "`ember ${ARGS}` failed (${_rc1}):\n${_out1}\n${_err1}")
    endif()
    _final_loss("${_out1}" _one_loss)
    # CMake's math is integer: the losses in units of 1e-9, compared within 1e-6.
    foreach(_which ddp one)
      if(NOT "${_${_which}_loss}" MATCHES "^([0-9]+)\\.([0-9]+)$")
        message(FATAL_ERROR "final loss '${_${_which}_loss}' is not a plain decimal")
      endif()
      set(_int "${CMAKE_MATCH_1}")
      string(SUBSTRING "${CMAKE_MATCH_2}000000000" 0 9 _frac)
      string(REGEX REPLACE "^0+([0-9])" "\\1" _frac "${_frac}")
      math(EXPR _${_which}_nano "${_int} * 1000000000 + ${_frac}")
    endforeach()
    math(EXPR _diff "${_ddp_nano} - ${_one_nano}")
    if(_diff GREATER 1000 OR _diff LESS -1000)
      message(FATAL_ERROR "final loss with --ddp on 2 ranks ${_ddp_loss} != one process's ${_one_loss}")
    endif()
    message(STATUS "final loss: 2 ranks ${_ddp_loss}, one process ${_one_loss} (difference ${_diff}e-9)")
    separate_arguments(_files UNIX_COMMAND "${FILES}")
    foreach(_file IN LISTS _files)
      if(NOT EXISTS "${_file}")
        message(FATAL_ERROR "${_file} was not written")
      endif()
    endforeach()
    return()
  endif()

  if(MODE STREQUAL "error")
    _run_ember(_out _err _rc ${_args})
    if(NOT (_rc STREQUAL "1" OR _rc STREQUAL "2"))
      message(FATAL_ERROR "expected exit status 1 or 2, got '${_rc}'\nstdout: ${_out}\nstderr: ${_err}")
    endif()
    if(DEFINED STATUS AND NOT _rc STREQUAL "${STATUS}")
      message(FATAL_ERROR "expected exit status ${STATUS}, got ${_rc}: ${_err}")
    endif()
    if(NOT _err MATCHES "^ember: [^\n]+\n$")
      message(FATAL_ERROR "expected one line 'ember: <message>' on stderr, got:\n${_err}")
    endif()
    if(DEFINED MATCH AND NOT _err MATCHES "${MATCH}")
      message(FATAL_ERROR "the message does not match '${MATCH}': ${_err}")
    endif()
    message(STATUS "${_err}")
  elseif(MODE STREQUAL "exact")
    separate_arguments(_split UNIX_COMMAND "${SPLIT_ARGS}")
    separate_arguments(_resume UNIX_COMMAND "${RESUME_ARGS}")
    separate_arguments(_same UNIX_COMMAND "${SAME}")
    list(GET _same 0 _file_a)
    list(GET _same 1 _file_b)
    file(REMOVE ${_file_a} ${_file_b})
    foreach(_run _args _split _resume)
      _run_ember(_out _err _rc ${${_run}})
      if(NOT _rc STREQUAL "0")
        message(FATAL_ERROR "`ember ${${_run}}` failed (${_rc}):\n${_out}\n${_err}")
      endif()
    endforeach()
    file(SHA256 ${_file_a} _hash_a)
    file(SHA256 ${_file_b} _hash_b)
    if(NOT _hash_a STREQUAL _hash_b)
      message(FATAL_ERROR "${_file_a} and ${_file_b} differ: the resumed run is not bit-identical")
    endif()
    message(STATUS "${_file_a} == ${_file_b} (sha256 ${_hash_a})")
  elseif(MODE STREQUAL "resume")
    _run_ember(_out _err _rc ${_args})
    if(NOT _rc STREQUAL "0")
      message(FATAL_ERROR "the first run failed (${_rc}):\n${_out}\n${_err}")
    endif()
    separate_arguments(_args2 UNIX_COMMAND "${RESUME_ARGS}")
    _run_ember(_out _err _rc ${_args2})
    if(NOT _rc STREQUAL "0")
      message(FATAL_ERROR "the resumed run failed (${_rc}):\n${_out}\n${_err}")
    endif()
    _check_json("${_out}")
    if(DEFINED MATCH AND NOT "${_out}${_err}" MATCHES "${MATCH}")
      message(FATAL_ERROR "the output does not match '${MATCH}':\n${_out}\n${_err}")
    endif()
    if(DEFINED REJECT_ARGS)  # a run that must refuse the checkpoint with one line
      separate_arguments(_args3 UNIX_COMMAND "${REJECT_ARGS}")
      _run_ember(_out _err _rc ${_args3})
      if(NOT _rc STREQUAL "1" OR NOT _err MATCHES "^ember: [^\n]+\n$" OR NOT _err MATCHES "${REJECT_MATCH}")
        message(FATAL_ERROR "expected exit status 1 and one line matching '${REJECT_MATCH}', got ${_rc}: ${_err}")
      endif()
    endif()
  else()
    _run_ember(_out _err _rc ${_args})
    if(NOT _rc STREQUAL "0")
      message(FATAL_ERROR "exit status ${_rc}:\n${_out}\n${_err}")
    endif()
    if(DEFINED EXPECT)
      _check_json("${_out}")
    endif()
    if(DEFINED MATCH AND NOT "${_out}${_err}" MATCHES "${MATCH}")
      message(FATAL_ERROR "the output does not match '${MATCH}':\n${_out}\n${_err}")
    endif()
    separate_arguments(_files UNIX_COMMAND "${FILES}")
    foreach(_pair IN LISTS _files)
      string(REGEX REPLACE ":[^:]*$" "" _file "${_pair}")
      string(REGEX REPLACE "^.*:" "" _text "${_pair}")
      if(NOT EXISTS "${_file}")
        message(FATAL_ERROR "${_file} was not written")
      endif()
      file(READ "${_file}" _content)
      string(FIND "${_content}" "${_text}" _at)
      if(_at LESS 0)
        message(FATAL_ERROR "${_file} does not contain '${_text}'")
      endif()
    endforeach()
  endif()
  return()
endif()

set(_train_dir ${CMAKE_CURRENT_BINARY_DIR}/train_tests)
file(MAKE_DIRECTORY ${_train_dir})
# ember_train_test(NAME MODE ARGS [EXPECT ...] [MATCH ...] [FILES ...] [RESUME_ARGS ...]
#                  [REJECT_ARGS ... REJECT_MATCH ...])
function(ember_train_test name mode args)
  cmake_parse_arguments(T "" "EXPECT;MATCH;FILES;RESUME_ARGS;REJECT_ARGS;REJECT_MATCH;SPLIT_ARGS;SAME;STATUS" ""
                        ${ARGN})
  set(_defs -DEMBER=$<TARGET_FILE:ember_cli> -DMODE=${mode} "-DARGS=${args}")
  foreach(_var EXPECT MATCH FILES RESUME_ARGS REJECT_ARGS REJECT_MATCH SPLIT_ARGS SAME STATUS)
    if(DEFINED T_${_var})
      list(APPEND _defs "-D${_var}=${T_${_var}}")
    endif()
  endforeach()
  add_test(NAME tools.${name} COMMAND ${CMAKE_COMMAND} ${_defs} -P ${CMAKE_CURRENT_FUNCTION_LIST_FILE}
           WORKING_DIRECTORY ${_train_dir})
  set_tests_properties(tools.${name} PROPERTIES LABELS tools)
endfunction()

set(_common_json "peak_allocated_bytes=number peak_reserved_bytes=number samples_per_s=number final_loss=number")
set(_tiny_gpt
  "--model char-gpt --synthetic --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4 --eval-iters 1")

# The two recipes and the standard tasks, a few steps each, with the report's JSON keys.
ember_train_test(train_mnist_cnn_json run
  "train --model mnist-cnn --synthetic --steps 3 --batch-size 16 --max-test 64 --json"
  EXPECT "model=mnist-cnn device=cpu amp=none steps=3 batch_size=16 test_accuracy=number val_loss=null ${_common_json}"
  MATCH "test accuracy .*allocator: allocated .*peak allocated")
ember_train_test(train_char_gpt_json run "train ${_tiny_gpt} --steps 3 --json"
  EXPECT "model=char-gpt steps=3 batch_size=4 val_loss=number train_loss=number test_accuracy=null ${_common_json}"
  MATCH "val loss")
ember_train_test(train_gpt_checkpoint_sqrt run "train --model gpt --steps 2 --checkpoint sqrt --json"
  EXPECT "model=gpt checkpoint=sqrt steps=2 batch_size=12 ${_common_json}"
  MATCH "recompute")
ember_train_test(train_grad_accum run "train --model mlp --steps 2 --batch-size 32 --grad-accum 2 --json"
  EXPECT "model=mlp grad_accum=2 micro_batch=16 batch_size=32 steps=2 ${_common_json}")
ember_train_test(train_amp_bf16 run "train --model gpt --steps 2 --amp bf16 --json"
  EXPECT "model=gpt amp=bf16 steps=2 ${_common_json}")
# --batch-size auto on a simulated 64 MiB device: the search's table and the chosen batch with its reason.
# Three steps: the batch found trains past the second step (Note [Batch headroom] in ember/train/batch_finder.h).
ember_train_test(train_auto_batch run
  "train --model mnist-cnn --synthetic --steps 3 --batch-size auto --max-memory 64MiB --max-test 16 --workers 0 --json"
  EXPECT "batch_search=bool steps=3 batch_size=number"
  MATCH "batch-size search \\(budget 64.00 MiB, trials within 60.80 MiB\\).*batch size [0-9]+ \\(auto\\): \
micro-batches of [0-9]+ rows, the largest whose training step fits 60.80 MiB \\(64.00 MiB less 5% headroom\\)")
# --oom-resilient: a 4096-row mlp step under 64 MiB runs out of memory and goes on in halves (2048, then 1024 rows once
# the optimizer state exists), every step completing.
ember_train_test(train_oom_resilient run
  "train --model mlp --batch-size 4096 --max-memory 64MiB --oom-resilient --steps 3 --json"
  EXPECT "steps=3 ooms_recovered=number micro_batch=number ${_common_json}"
  MATCH "step 1: out of memory in the forward of rows \\[0, 4096\\).*retrying with micro-batches of 2048 rows.*\
out-of-memory error\\(s\\) recovered")
# Progress lines (plain, not a terminal) and the memory report.
ember_train_test(train_progress run "train --model mlp --steps 4 --log-interval 2 --batch-size 16"
  MATCH "step 2/4  loss [0-9.]+  [0-9.]+ samples/s  allocated .*step 4/4 .*done: step 4.*allocator: allocated")
# --save, then --resume continues at the saved step (the shape comes from the checkpoint).
ember_train_test(train_save_resume resume "train ${_tiny_gpt} --steps 2 --save resume.safetensors --json"
  RESUME_ARGS "train --model char-gpt --synthetic --batch-size 4 --eval-iters 1 --steps 4 \
--resume resume.safetensors --json"
  EXPECT "start_step=2 steps=4 model=char-gpt"
  MATCH "resumed from resume.safetensors at step 2"
  REJECT_ARGS "train --model mlp --resume resume.safetensors"
  REJECT_MATCH "holds a char-gpt model, not mlp")
# Bit-exact resume (docs/reliability.md): 20 steps straight, and 10 steps + --save + --resume to step 20, write
# byte-identical checkpoints. The standard tasks' lr is constant, so the first run's shorter --steps changes nothing
# but where it stops.
ember_train_test(train_resume_bit_exact exact "train --model mlp --batch-size 16 --steps 20 --quiet --save exact_a.st"
  SPLIT_ARGS "train --model mlp --batch-size 16 --steps 10 --quiet --save exact_b.st"
  RESUME_ARGS "train --model mlp --batch-size 16 --steps 20 --quiet --resume exact_b.st --save exact_c.st"
  SAME "exact_a.st exact_c.st")
# The trace of the first steps as a Chrome trace and a timeline page.
ember_train_test(train_trace_html run
  "train --model mlp --steps 3 --trace-steps 2 --batch-size 16 --trace trace.json --html timeline.html"
  FILES "timeline.html:<svg trace.json:traceEvents"
  MATCH "trace: [0-9]+ allocator events \\(setup and 2 steps\\) written to trace.json timeline.html")

# --ddp under `mpirun -np 2` (skipped where mpirun cannot start): each rank trains on its half of every batch, rank 0
# alone reports (with the DDP buckets in the memory report) and writes --save; the job's final loss equals one
# process's on the whole batch (the same data, the same initial weights).
if(EMBER_WITH_MPI AND MPIEXEC_EXECUTABLE)
  file(REMOVE ${_train_dir}/ddp.safetensors)
  add_test(NAME tools.train_ddp_mpi_np2
    COMMAND ${CMAKE_COMMAND} -DEMBER=$<TARGET_FILE:ember_cli> -DMODE=ddp
            "-DARGS=train --model mlp --steps 5 --batch-size 32 --grad-accum 2 --json --save ddp.safetensors"
            -DRUN_MPI=${PROJECT_SOURCE_DIR}/tests/dist/run_mpi.sh -DMPIEXEC=${MPIEXEC_EXECUTABLE}
            "-DMATCH=ddp: 2 ranks, 16 rows of each batch per rank.*ddp \\(rank 0 of 2\\): [0-9]+ gradient bucket"
            -DFILES=ddp.safetensors
            -P ${CMAKE_CURRENT_LIST_FILE}
    WORKING_DIRECTORY ${_train_dir})
  # Sanitizer builds: OpenMPI's own leaks are suppressed as for the dist tests (tests/dist/lsan_openmpi.supp).
  set_tests_properties(tools.train_ddp_mpi_np2 PROPERTIES LABELS "tools;dist" PROCESSORS 2
    SKIP_REGULAR_EXPRESSION "mpirun cannot start"
    ENVIRONMENT "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/dist/lsan_openmpi.supp:fast_unwind_on_malloc=0:print_suppressions=0")
endif()

# --resume refuses a text whose vocabulary has as many characters as the checkpoint's but other ones (every token id
# would mean another character). The generated verse has 34 characters; other34.txt has 34 others.
file(WRITE ${_train_dir}/other34.txt "")
foreach(_i RANGE 400)
  file(APPEND ${_train_dir}/other34.txt "abcdefghijklmnopqrstuvwxyzABCDEFGH")
endforeach()
ember_train_test(train_resume_other_vocabulary resume
  "train ${_tiny_gpt} --steps 1 --save vocabulary.safetensors --json"
  RESUME_ARGS "train --model char-gpt --synthetic --batch-size 4 --eval-iters 1 --steps 2 \
--resume vocabulary.safetensors --json"
  EXPECT "start_step=1"
  REJECT_ARGS "train --model char-gpt --data other34.txt --batch-size 4 --eval-iters 1 --steps 2 \
--resume vocabulary.safetensors"
  REJECT_MATCH "vocabulary")

# Bad input: exit status 1 (or 2 for CLI11's usage errors) and one line "ember: ..." on stderr, never a crash.
ember_train_test(train_rejects_unknown_model error "train --model x" MATCH "unknown model 'x'")
ember_train_test(train_rejects_zero_batch error "train --model mlp --batch-size 0" MATCH "--batch-size")
# A value that means "the default" in the library is rejected when given; a flag of another model; an output path
# that is a directory (before training); integers outside their 64-bit type (CLI11 saturates them); a negative seed.
ember_train_test(train_rejects_zero_steps error "train --model mlp --steps 0" MATCH "--steps must be >= 1, got 0"
  STATUS 1)
ember_train_test(train_rejects_zero_max_test error "train --model mnist-cnn --max-test 0" MATCH "--max-test" STATUS 1)
ember_train_test(train_rejects_directory_output error "train --model mlp --steps 1 --save ." MATCH "is a directory"
  STATUS 1)
ember_train_test(train_rejects_flag_of_another_model error "train --model mlp --workers 2" MATCH "applies to mnist-cnn"
  STATUS 1)
ember_train_test(train_rejects_out_of_range_integer error "train --model mlp --steps 99999999999999999999"
  MATCH "--steps: 99999999999999999999 is out of range" STATUS 1)
ember_train_test(train_rejects_negative_seed error "train --model mlp --seed -5" MATCH "--seed: '-5' is not a whole"
  STATUS 1)
# CLI11 reads integers with base 0 ("010" would be 8 steps) and fails on non-numbers with its own exit code.
ember_train_test(train_rejects_leading_zero error "train --model mlp --steps 010" MATCH "without leading zeros"
  STATUS 1)
ember_train_test(train_rejects_non_number error "train --model mlp --lr abc" MATCH "--lr" STATUS 1)
ember_train_test(ember_rejects_unknown_command error "trian --model mlp" MATCH "unknown command 'trian'" STATUS 2)
ember_train_test(bench_rejects_meta_device error "bench train --model mlp --device meta" MATCH "cpu or cuda"
  STATUS 1)
ember_train_test(train_rejects_bad_size error "train --model mlp --max-memory lots" MATCH "--max-memory")
ember_train_test(train_rejects_unknown_amp error "train --model mlp --amp fp8" MATCH "fp8")
ember_train_test(train_rejects_missing_resume error "train --model mlp --resume missing.safetensors"
  MATCH "missing.safetensors")
ember_train_test(train_rejects_checkpoint_without_blocks error "train --model mnist-cnn --checkpoint sqrt"
  MATCH "no block chain")
ember_train_test(train_rejects_missing_data error "train --model mnist-cnn --data no-such-dir" MATCH "no-such-dir")
ember_train_test(train_rejects_epochs_with_steps error "train --model mnist-cnn --epochs 1 --steps 2")
ember_train_test(train_rejects_auto_without_limit error "train --model mlp --batch-size auto" MATCH "memory limit")
set_tests_properties(tools.train_rejects_auto_without_limit
  PROPERTIES ENVIRONMENT_MODIFICATION "EMBER_ALLOC_CONF=unset:")
ember_train_test(train_rejects_indivisible_accumulation error "train --model mlp --batch-size 10 --grad-accum 3")
# --epochs so large that the step count overflows int64.
ember_train_test(train_epochs_overflow error
  "train --model mnist-cnn --synthetic --epochs 9223372036854775807 --max-test 1 --workers 0" MATCH "--epochs")
ember_train_test(train_rejects_corrupt_resume error "train --model mlp --resume ${CMAKE_CURRENT_LIST_FILE}")

# `ember info --json`: the keys docs/cli.md lists.
ember_train_test(info_json run "info --json"
  EXPECT "version=string build.cuda=bool build.cuda_runtime=any build.cuda_driver=any build.cudnn=any build.cublaslt=any build.cusparse=any build.nccl=any build.zlib=bool \
build.compiler=string build.build_type=string cpu.cores=number cpu.memory_total_bytes=number \
cpu.memory_available_bytes=number cuda_devices=any cuda_error=any alloc_conf.env=any alloc_conf.effective=string \
alloc_conf.error=any")
# An EMBER_ALLOC_CONF that is not UTF-8 is reported in the JSON (the byte replaced), not an error.
add_test(NAME tools.info_json_non_utf8_alloc_conf
  COMMAND sh -c "EMBER_ALLOC_CONF=$(printf '\\377') exec \"$0\" info --json" $<TARGET_FILE:ember_cli>)
set_tests_properties(tools.info_json_non_utf8_alloc_conf PROPERTIES LABELS tools
  PASS_REGULAR_EXPRESSION "\"alloc_conf\":{\"env\":")
ember_train_test(info_readable run "info" MATCH "ember [0-9.]+ .*cpu: [0-9]+ cores.*EMBER_ALLOC_CONF")
# A fraction of host memory, which has no capacity: `info` says the setting does nothing there.
add_test(NAME tools.info_notes_inert_cpu_settings
  COMMAND sh -c "EMBER_ALLOC_CONF=per_process_memory_fraction:0.5 exec \"$0\" info" $<TARGET_FILE:ember_cli>)
set_tests_properties(tools.info_notes_inert_cpu_settings PROPERTIES LABELS tools
  PASS_REGULAR_EXPRESSION "note: per_process_memory_fraction has no effect on the CPU allocator")

# An OOM in the traced steps: the trace up to the failure is still written; the one-line error counts only mapped
# bytes in the largest free block and replays the history only under settings that are not on already (expandable
# segments are, on a --max-memory device). The block sizes depend on the step's allocation sequence, so only their
# form is matched here. Batch 9 holds at most 29.83 MiB of tensors at once: a 30 MiB device is too small for the
# allocator's blocks around them.
add_test(NAME tools.train_oom_advice_and_trace
  COMMAND ember_cli train --model gpt --steps 2 --batch-size 9 --max-memory 30MiB --quiet
          --trace ${CMAKE_CURRENT_BINARY_DIR}/oom_trace.json)
set_tests_properties(tools.train_oom_advice_and_trace PROPERTIES LABELS tools
  PASS_REGULAR_EXPRESSION "trace: [0-9]+ allocator events.*written to.*oom_trace.json.*out of memory.*the largest [0-9.]+ [KM]iB.*replaying this allocator's recorded history under max_split_size_mb:128 does not serve"
  FAIL_REGULAR_EXPRESSION "EMBER_ALLOC_CONF=expandable_segments|reduce this are expandable")
