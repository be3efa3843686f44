# Static gates on what nvcc produced for qlora_backend_cuda (docs/cuda_backend.md, "Static gates").
# Included by CMakeLists.txt right after the qlora_backend_cuda target exists.
#  - ptxas warns on any register spill or local memory, and every CUDA compile warning is an error.
#  - test_cuda_static (CTest label cuda-static) reads the built library with cuobjdump, per built
#    architecture: launch bounds, registers x threads, no stack or local memory, shared memory
#    within the opt-in limit, tensor-core MMA and ldmatrix in the attention kernels. cuobjdump is
#    not in nvcc-only toolkits: tests/fetch_cuobjdump.sh (run by `make test`) puts it in build/tools.

option(QLORA_CUDA_WERROR "CUDA backend: ptxas spill/local-memory warnings on, all CUDA warnings errors" ON)
if(QLORA_CUDA_WERROR)
  target_compile_options(qlora_backend_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-warn-spills,-warn-lmem-usage -Werror=all-warnings>)
endif()

if(QLORA_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
  # The architectures with SASS in the library, as cuobjdump names them: 80 -> sm_80, 90a-real ->
  # sm_90a; -virtual entries have no SASS; all / all-major / native -> sm_* (whatever is there).
  get_target_property(_qlora_static_archs qlora_backend_cuda CUDA_ARCHITECTURES)
  set(_qlora_static_sm)
  foreach(_a IN LISTS _qlora_static_archs)
    if(_a MATCHES "^([0-9]+[af]?)(-real)?$")
      list(APPEND _qlora_static_sm sm_${CMAKE_MATCH_1})
    elseif(NOT _a MATCHES "-virtual$")
      list(APPEND _qlora_static_sm "sm_*")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _qlora_static_sm)
  string(JOIN " " _qlora_static_sm ${_qlora_static_sm})

  add_executable(test_cuda_static ${CMAKE_SOURCE_DIR}/tests/cuda_static/test_cuda_static.cpp
                                  ${CMAKE_SOURCE_DIR}/tests/cuda_static/dynamic_smem.cu)
  target_include_directories(test_cuda_static PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(test_cuda_static PRIVATE GTest::gtest GTest::gtest_main)
  target_compile_definitions(test_cuda_static PRIVATE
    QLORA_CUDA_STATIC_LIB="$<TARGET_FILE:qlora_backend_cuda>"
    QLORA_CUOBJDUMP="${CMAKE_BINARY_DIR}/tools/cuobjdump"
    QLORA_CUDA_STATIC_ARCHS="${_qlora_static_sm}")
  # dynamic_smem.cu is host code only (it reads the attention tile traits): one architecture will do.
  list(GET _qlora_static_archs 0 _qlora_static_first)
  set_target_properties(test_cuda_static PROPERTIES CUDA_ARCHITECTURES ${_qlora_static_first})
  add_dependencies(test_cuda_static qlora_backend_cuda)  # it reads the library, it does not link it
  gtest_discover_tests(test_cuda_static DISCOVERY_TIMEOUT 60 PROPERTIES LABELS cuda-static)
endif()
