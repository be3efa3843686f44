# The CTest label blas-variants: the numerics-sensitive tests again under the other choice of OpenBLAS
# kernels than the environment's (tests/blas_variant.sh: the native kernels where the environment
# sets OPENBLAS_CORETYPE, the AVX2 "Haswell" ones where it does not; docs/cpu_backend.md). They
# compare two paths through the same math (the engine against transformers + PEFT and TRL fixtures,
# ranks against one process, a GGUF against its checkpoint, a precomputed reference against the
# in-step one) at bounds derived from the arithmetic, which must hold for either kernel set.
# OpenBLAS's kernel cores are x86-64 names.
if(NOT QLORA_TESTS OR NOT CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  return()
endif()
function(qlora_blas_variant binary filter)
  if(TARGET ${binary})
    add_test(NAME blas_variant.${binary}
             COMMAND bash ${CMAKE_SOURCE_DIR}/tests/blas_variant.sh $<TARGET_FILE:${binary}> --gtest_filter=${filter}
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(blas_variant.${binary} PROPERTIES LABELS blas-variants TIMEOUT 900)
  endif()
endfunction()
qlora_blas_variant(test_backend "CpuBlasCheck.*:CpuOps.matmul*:CpuOps.attention*")
qlora_blas_variant(test_model "*HfParity.*:*QloraParity.*:GgufModel.*MatchesHf:*GenerateParity.*:*MergeParity.*:LoraGradients.*:QloraCheckpoint.*")
qlora_blas_variant(test_train "*PreferenceParity.*")
qlora_blas_variant(test_cli "TrainMoe.*Gguf*:TrainPreference.PrecomputedReferenceTrainsAsTheInStepOne")
qlora_blas_variant(test_mpi "MpiTrain.*EqualOneProcess*:MpiFsdp.ThreeRanksEqualOneProcess*:MpiZero1.ThreeRanksEqualOneProcess*:*MpiPreference.*")
qlora_blas_variant(test_mpi_emu "NcclEmuTrain.ThreeGpuRanksEqualOneProcess")
