# Run by ctest after test discovery (TEST_INCLUDE_FILES, tests/CMakeLists.txt): tests that take about 15 s or more
# each under the sanitizers (whole trainings, whole-step sweeps, the largest shapes) get the extra label `long`. The
# debug-asan test preset leaves the label out, which keeps the CI run (Release suite + sanitizer suite) within its
# time; the Release suite runs every one of them. Each excluded path keeps sanitizer coverage through smaller tests
# of the same layer (OomEveryAllocation mlp/cnn/gpt first step, EstimateAccuracy mlp/cnn, the bench train fp32 runs,
# BiasGeluTest and BiasGeluBackwardTest's other cases, FusedAttention's finite differences, the emulated flash
# attention's one-tile shapes).
# The patterns match ctest's names, which for named parameters end in "  # GetParam() = ...".
set(_ember_long_tests
  "^CheckpointMemory\\.(GptSqrtAndBudgets|DeepMlpSqrtAndBudgets|DeepGeluMlpSqrtAndBudgets)$"
  "^cpu/BiasGeluBackwardTest\\.MatchesReference/cpu( |$)"
  "^cpu/AttentionCudaTest\\.MatchesFloat64Reference/cpu( |$)"
  "^Engine\\.DeepChainDoesNotRecurse$"
  "^StandardConfigs/OomEveryAllocation\\.EveryRequestOfAStep/gpt_warm( |$)"
  "^StandardConfigs/EstimateAccuracy\\.PredictsTheMeasuredPeaks/gpt "
  "^MemoryPlan\\.RanksCandidatesAndTheBestFitsWhenRun$"
  "^BatchFinder\\.FindsTheLargestBatchOnA512MiBDeviceAndRestoresTheState$"
  "^TimelineHtml\\.LongTraceGivesABoundedPageAndKeepsThePeak$"
  "^TrainingCheckpoint\\.TrainRunnerResumesBitExactly$"
  "^BenchTrain\\.TrainsAndReportsJson$"
  "^cpu/ReduceTest\\.LargeReductionsSplitOverBlocks/"
  "^FlashAttentionEmulatedTest\\.SeveralTilesMatchFloat64Reference$")
# test list variable (gtest_discover_tests' TEST_LIST) -> the layer label its tests carry
set(_ember_test_lists memory core kernels autograd nn optim data dist train tools train_device)
foreach(_list IN LISTS _ember_test_lists)
  string(REGEX REPLACE "_device$" "" _layer "${_list}")
  foreach(_t IN LISTS test_${_list}_TESTS)
    foreach(_re IN LISTS _ember_long_tests)
      if(_t MATCHES "${_re}")
        set_tests_properties("${_t}" PROPERTIES LABELS "${_layer};long")
        break()
      endif()
    endforeach()
  endforeach()
endforeach()
