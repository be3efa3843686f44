# The CUDA backend under the host harness (tests/support/cuda_emu): the backend's own .cu sources,
# compiled by the host C++ compiler with the harness prelude force-included, linked against the
# harness's implementations of the CUDA runtime, cuBLASLt and cuBLAS instead of the vendor
# libraries. tests/cuda/*.cpp run on it as CTest label cuda-emu (and, with sanitizers, cuda-emu-sanitize).
find_package(CUDAToolkit QUIET)
find_package(Boost QUIET COMPONENTS context)
if(NOT CUDAToolkit_FOUND OR NOT Boost_CONTEXT_FOUND)
  message(STATUS "CUDA host harness: off (needs the CUDA toolkit headers and libboost-context-dev)")
  return()
endif()
message(STATUS "CUDA host harness: on")

file(GLOB _emu_kernel_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu)
set(_emu_dir ${CMAKE_SOURCE_DIR}/tests/support/cuda_emu)  # test support: nothing under src/ includes it
file(GLOB _emu_srcs CONFIGURE_DEPENDS ${_emu_dir}/*.cpp)
# emu_nccl.cpp (NCCL over MPI) goes into qlora_nccl_emu below, for the ranks that use it.
list(FILTER _emu_srcs EXCLUDE REGEX "emu_nccl\\.cpp$")
# cuDNN: the real frontend graph descriptions (validated with libcudnn, which needs no device for
# that); emu_cudnn.cpp stands in for cudnn_sdpa_exec.cpp (building and running plans).
if(NOT DEFINED QLORA_HAVE_CUDNN)
  include(${CMAKE_SOURCE_DIR}/cmake/cudnn_frontend.cmake)
endif()
if(QLORA_HAVE_CUDNN)
  list(APPEND _emu_srcs ${CMAKE_SOURCE_DIR}/src/backend/cuda/cudnn_sdpa_graph.cpp)
else()
  list(FILTER _emu_srcs EXCLUDE REGEX "emu_cudnn\\.cpp$")
endif()
set(_emu_units)
foreach(_cu ${_emu_kernel_srcs})
  get_filename_component(_n ${_cu} NAME_WE)
  set(_unit ${CMAKE_BINARY_DIR}/cuda_emu/${_n}.cpp)
  # The real source, included: the harness compiles the same file nvcc compiles.
  file(CONFIGURE OUTPUT ${_unit} CONTENT "#include \"backend/cuda/${_n}.cu\"\n")
  list(APPEND _emu_units ${_unit})
endforeach()
# The harness's self-test kernels (tests/cuda_emu/*.cu), compiled the same way, for the tests only.
file(GLOB _emu_test_kernels CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda_emu/*.cu)
set(_emu_test_units)
foreach(_cu ${_emu_test_kernels})
  get_filename_component(_n ${_cu} NAME_WE)
  set(_unit ${CMAKE_BINARY_DIR}/cuda_emu/test_${_n}.cpp)
  file(CONFIGURE OUTPUT ${_unit} CONTENT "#include \"${_cu}\"\n")
  list(APPEND _emu_test_units ${_unit})
endforeach()
set_source_files_properties(${_emu_units} ${_emu_test_units} PROPERTIES
  COMPILE_OPTIONS "-include;${_emu_dir}/cuda_emu.h;-Wno-unknown-pragmas")

# qlora_cuda_emu(SUFFIX FLAGS...): the harness library and test_cuda_emu${SUFFIX}, compiled with FLAGS.
function(qlora_cuda_emu suffix)
  set(lib qlora_backend_cuda_emu${suffix})
  add_library(${lib} STATIC ${_emu_units} ${_emu_srcs})
  target_include_directories(${lib} PUBLIC ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests/support ${CUDAToolkit_INCLUDE_DIRS}
                                    PRIVATE ${CBLAS_INCLUDE_DIR})
  target_compile_definitions(${lib} PUBLIC QLORA_HAVE_CUDA=1 PRIVATE QLORA_CUDA_ARCHS="host harness")
  target_compile_options(${lib} PRIVATE ${ARGN})
  target_link_options(${lib} PUBLIC ${ARGN})
  target_link_libraries(${lib} PUBLIC qlora_quant Boost::context Threads::Threads ${BLAS_LIBRARIES})
  qlora_use_cudnn(${lib})
  if(QLORA_TESTS)
    file(GLOB tsrcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda/*.cpp ${CMAKE_SOURCE_DIR}/tests/cuda_emu/*.cpp)
    set(t test_cuda_emu${suffix})
    add_executable(${t} ${tsrcs} ${_emu_test_units})
    target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/tests/cuda_emu)
    target_compile_options(${t} PRIVATE ${ARGN})
    target_link_libraries(${t} PRIVATE ${lib} qlora_tasks qlora_backend_cpu qlora_quant qlora_test_main)
    target_compile_definitions(${t} PRIVATE QLORA_FIXTURES="${CMAKE_SOURCE_DIR}/tests/fixtures"
                                            QLORA_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  endif()
endfunction()

find_package(Threads REQUIRED)
qlora_cuda_emu("")

# NCCL under the harness (emu_nccl.cpp: NCCL's calls by their documented semantics, over MPI)
# and the real DeviceReducer built on it; qlora_emu is the qlora command on the harness backend
# with it, which tests/dist/nccl_emu and test_nccl_emu_ranks run under mpirun (docs/distributed.md).
add_library(qlora_nccl_emu STATIC ${_emu_dir}/emu_nccl.cpp
                                  ${CMAKE_SOURCE_DIR}/src/dist/nccl/nccl_reducer.cpp)
target_link_libraries(qlora_nccl_emu PUBLIC qlora_backend_cuda_emu qlora_dist)
target_compile_definitions(qlora_nccl_emu PUBLIC QLORA_HAVE_NCCL=1)
add_executable(qlora_emu ${cli_srcs})
target_link_libraries(qlora_emu PRIVATE qlora_tasks CLI11::CLI11 qlora_nccl_emu)
if(QLORA_TESTS)
  add_executable(test_nccl_emu_ranks ${CMAKE_SOURCE_DIR}/tests/dist/ranks/test_nccl_emu_ranks.cpp)
  target_link_libraries(test_nccl_emu_ranks PRIVATE qlora_nccl_emu GTest::gtest)
  foreach(np 2 3)
    add_test(NAME nccl_emu_ranks_np${np} COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${np}
             $<TARGET_FILE:test_nccl_emu_ranks>)
    set_tests_properties(nccl_emu_ranks_np${np} PROPERTIES LABELS "mpi;cuda-emu" TIMEOUT 120
                         ENVIRONMENT "${QLORA_MPI_ENV}" ENVIRONMENT_MODIFICATION "ASAN_OPTIONS=string_append::detect_leaks=0")
  endforeach()
  file(GLOB _mpi_emu_srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/dist/nccl_emu/*.cpp)
  add_executable(test_mpi_emu ${_mpi_emu_srcs})
  target_link_libraries(test_mpi_emu PRIVATE qlora_train qlora_test_main)
  target_compile_definitions(test_mpi_emu PRIVATE QLORA_BIN="$<TARGET_FILE:qlora_emu>" QLORA_MPIEXEC="${MPIEXEC_EXECUTABLE}"
                                                  QLORA_SOURCE_DIR="${CMAKE_SOURCE_DIR}" QLORA_FIXTURES="${CMAKE_SOURCE_DIR}/tests/fixtures")
  add_dependencies(test_mpi_emu qlora_emu)
  # Named tests (gtest discovery in CMake 3.25 cannot give a test two labels).
  foreach(_t TwoGpuRanksEqualOneProcessAndRerunsRepeatEveryBit ThreeGpuRanksEqualOneProcess RanksOnOneDeviceAreRefusedAtTheBootstrap
             FsdpTwoGpuRanksGatherThroughNcclAndEqualOneProcess FsdpThreeGpuRanksGatherThroughNcclAndEqualOneProcess)
    add_test(NAME NcclEmuTrain.${_t} COMMAND test_mpi_emu --gtest_filter=NcclEmuTrain.${_t} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(NcclEmuTrain.${_t} PROPERTIES LABELS "mpi;cuda-emu" TIMEOUT 900)
  endforeach()
endif()
if(QLORA_TESTS)
  # The FP4 GEMM test needs sm_100's block-scaled tensor cores: it runs in cuda_emu_sm100 below,
  # not as a skip at the default sm_90 (where matmul_fp4.refused_below_sm100 checks the refusal).
  gtest_discover_tests(test_cuda_emu DISCOVERY_TIMEOUT 60 WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                       TEST_FILTER "-CudaOps.matmul_fp4_equals_cpu_semantics*" PROPERTIES LABELS cuda-emu)
  # The other architectures' limits (sm_80: 163 KiB of shared memory, no FP8 GEMMs; sm_100) on the
  # kernels they constrain, small shapes. The default run above emulates sm_90.
  foreach(_arch 80 100)
    set(_f CudaOps.attention*:CudaOps.matmul*:CudaOps.rope*:CudaEmuTraining.*:Harness.LaunchLimits*)
    if(_arch EQUAL 80)
      # FP8 GEMMs need sm_89+ (EmuCublasLt.FP8NeedsAda checks cuBLASLt's refusal) and FP4 sm_100
      # (matmul_fp4_refused_below_sm100 runs here); their products run at sm_90 and sm_100.
      set(_f "${_f}-CudaOps.matmul_fp4_equals_cpu_semantics:CudaOps.matmul_fp8_equals_cpu_semantics*:CudaOps.matmul_fp8_unsupported_shape*")
    endif()
    add_test(NAME cuda_emu_sm${_arch} COMMAND test_cuda_emu --gtest_filter=${_f}
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(cuda_emu_sm${_arch} PROPERTIES LABELS cuda-emu
                         ENVIRONMENT "QLORA_CUDA_EMU_ARCH=${_arch};QLORA_CUDA_TEST_SMALL=1")
  endforeach()
  # cuBLASLt's heuristic finding no algorithm (as the real one does for shapes it has no kernel
  # for): every bf16/f32 GEMM of the matmul tests and of a training run through the cublasGemmEx
  # fallback (FP8/FP4 GEMMs have none: they are refused, CudaOps.matmul_fp8_unsupported_shape_*).
  add_test(NAME cuda_emu_lt_no_algorithm COMMAND test_cuda_emu
           --gtest_filter=CudaOps.matmul*:CudaEmuTraining.LoraBf16StepsMatchTheCpu-CudaOps.matmul_fp8*:CudaOps.matmul_fp4*
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(cuda_emu_lt_no_algorithm PROPERTIES LABELS cuda-emu
                       ENVIRONMENT "QLORA_CUDA_EMU_LT_HEURISTIC=none;QLORA_CUDA_TEST_SMALL=1")
endif()

# The kernels with shared memory, on small shapes, with each CUDA thread an OS thread: under
# ThreadSanitizer (a race between warps that no barrier orders is a report) and AddressSanitizer
# (shared and device buffers are exact-size allocations). OpenMP stays at one thread so the
# uninstrumented CPU reference adds no threads of its own.
if(QLORA_TESTS AND NOT QLORA_NO_SANITIZE_TESTS)
  qlora_cuda_emu("_tsan" -fsanitize=thread -g)
  qlora_cuda_emu("_asan" -fsanitize=address -fno-omit-frame-pointer -g)
  set(_san_filter "CudaOps.attention*:CudaOps.cross_entropy*:CudaOps.rmsnorm*:CudaOps.rope*:CudaOps.sumsq*:CudaOps.embedding*:CudaDequant.*:CudaOps.matmul_fp8*:CudaEmuFp8.ActivationCodes*:CudaEmuFp4.ActivationCodes*:CudaEmuCudnn.PackedForwardBackward*")
  foreach(_s tsan asan)
    add_test(NAME cuda_emu_${_s} COMMAND test_cuda_emu_${_s} --gtest_filter=${_san_filter}
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(cuda_emu_${_s} PROPERTIES LABELS cuda-emu-sanitize ENVIRONMENT
      "QLORA_CUDA_TEST_SMALL=1;OMP_NUM_THREADS=1;TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1;ASAN_OPTIONS=detect_leaks=1:halt_on_error=1")
  endforeach()
endif()
