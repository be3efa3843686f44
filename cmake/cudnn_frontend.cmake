# cuDNN for the CUDA backend's fused attention on sm_90/sm_100 (src/backend/cuda/cudnn_*):
# libcudnn from the CUDA toolkit (or CUDNN_ROOT), and the header-only cuDNN frontend, fetched at
# configure time from its PyPI wheel (a zip; only include/ is kept) by package name and pinned
# version with `python -m pip download` (the Python3 interpreter CMake finds, so the configured
# index or mirror applies), sha256-checked, into the cache (QLORA_CACHE_DIR, default .cache/qlora).
# Offline: -DQLORA_CUDNN_FRONTEND_WHEEL=path to the same wheel file (hash-checked too). Sets
# QLORA_HAVE_CUDNN, QLORA_CUDNN_LIBRARY, QLORA_CUDNN_INCLUDE_DIR, QLORA_CUDNN_FRONTEND_INCLUDE_DIR;
# without any of them the backend is built without the cuDNN path (its own attention kernel
# everywhere) and says so here.
set(QLORA_CUDNN_FRONTEND_VERSION 1.32.0)
# The wheel is platform-tagged for its Python module; its headers are the same on every platform,
# so pip is asked for the one pinned here (CPython 3.11, x86_64) whatever the local Python and CPU.
set(_cfe_wheel nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl)
set(_cfe_pip_target --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp --abi cp311)
set(_cfe_sha256 c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0)
if(NOT QLORA_CACHE_DIR)
  set(QLORA_CACHE_DIR ${CMAKE_SOURCE_DIR}/.cache/qlora)
endif()
set(QLORA_CUDNN_FRONTEND_WHEEL "" CACHE FILEPATH "Local copy of ${_cfe_wheel} (no download)")
set(_cfe_dir ${QLORA_CACHE_DIR}/cudnn-frontend-${QLORA_CUDNN_FRONTEND_VERSION})

# _qlora_cfe_pip_download(DEST): pip downloads nvidia-cudnn-frontend==QLORA_CUDNN_FRONTEND_VERSION
# into a folder beside DEST; the wheel becomes DEST if its sha256 is the pinned one. Otherwise a
# warning says why and DEST is absent.
function(_qlora_cfe_pip_download dest)
  set(_pkg nvidia-cudnn-frontend==${QLORA_CUDNN_FRONTEND_VERSION})
  set(_hint "pass -DQLORA_CUDNN_FRONTEND_WHEEL=<${_cfe_wheel}>")
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    set(_py ${Python3_EXECUTABLE})
  else()
    set(_py python3)  # from PATH
  endif()
  execute_process(COMMAND ${_py} -m pip --version RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    message(WARNING "cuDNN frontend: fetching PyPI ${_pkg} needs pip (${_py} -m pip; Debian: python3-pip); ${_hint}")
    return()
  endif()
  string(RANDOM LENGTH 8 _r)
  set(_tmp ${dest}.pip.${_r})
  file(MAKE_DIRECTORY ${_tmp})
  message(STATUS "cuDNN frontend: fetching PyPI ${_pkg} with ${_py} -m pip")
  execute_process(
    COMMAND ${_py} -m pip download -q --no-deps --only-binary=:all: --no-cache-dir --disable-pip-version-check
            ${_cfe_pip_target} -d ${_tmp} ${_pkg}
    RESULT_VARIABLE _rc ERROR_VARIABLE _err OUTPUT_QUIET TIMEOUT 600)
  file(GLOB _got_whl ${_tmp}/*.whl)
  list(LENGTH _got_whl _n)
  if(NOT _rc EQUAL 0 OR NOT _n EQUAL 1)
    string(STRIP "${_err}" _err)
    message(WARNING "cuDNN frontend: pip download of ${_pkg} failed (${_rc}: ${_err}); ${_hint}")
  else()
    file(SHA256 ${_got_whl} _got)
    if(_got STREQUAL _cfe_sha256)
      file(RENAME ${_got_whl} ${dest})
    else()
      get_filename_component(_got_name ${_got_whl} NAME)
      message(WARNING "cuDNN frontend: pip gave ${_got_name} with sha256 ${_got}, expected ${_cfe_sha256}; not used")
    endif()
  endif()
  file(REMOVE_RECURSE ${_tmp})
endfunction()

if(NOT EXISTS ${_cfe_dir}/include/cudnn_frontend.h)
  set(_whl ${_cfe_dir}/${_cfe_wheel})
  file(MAKE_DIRECTORY ${_cfe_dir})
  if(QLORA_CUDNN_FRONTEND_WHEEL)
    file(SHA256 ${QLORA_CUDNN_FRONTEND_WHEEL} _got)
    if(_got STREQUAL _cfe_sha256)
      file(COPY_FILE ${QLORA_CUDNN_FRONTEND_WHEEL} ${_whl}.part)
      file(RENAME ${_whl}.part ${_whl})
    else()
      message(WARNING "cuDNN frontend: ${QLORA_CUDNN_FRONTEND_WHEEL} has sha256 ${_got}, expected ${_cfe_sha256}; not used")
    endif()
  else()
    _qlora_cfe_pip_download(${_whl})
  endif()
  if(EXISTS ${_whl})
    file(REMOVE_RECURSE ${_cfe_dir}/unpack)
    file(ARCHIVE_EXTRACT INPUT ${_whl} DESTINATION ${_cfe_dir}/unpack PATTERNS "include/*")
    file(RENAME ${_cfe_dir}/unpack/include ${_cfe_dir}/include)
    file(REMOVE_RECURSE ${_cfe_dir}/unpack)
    file(REMOVE ${_whl})  # the headers are all we keep
  endif()
endif()

set(QLORA_HAVE_CUDNN OFF)
# The pip wheel (nvidia-cudnn-cu13) has only libcudnn.so.9, no unversioned name.
include(${CMAKE_CURRENT_LIST_DIR}/pip_nvidia.cmake)
qlora_pip_nvidia_roots(_pip_nvidia)
find_library(QLORA_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${CUDNN_ROOT}/lib ${CUDNN_ROOT}/lib64
             ${CUDAToolkit_LIBRARY_DIR} PATHS ${_pip_nvidia} PATH_SUFFIXES lib)
find_path(QLORA_CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS}
          PATHS ${_pip_nvidia} PATH_SUFFIXES include)
if(EXISTS ${_cfe_dir}/include/cudnn_frontend.h AND QLORA_CUDNN_LIBRARY AND QLORA_CUDNN_INCLUDE_DIR)
  set(QLORA_HAVE_CUDNN ON)
  set(QLORA_CUDNN_FRONTEND_INCLUDE_DIR ${_cfe_dir}/include)
  message(STATUS "cuDNN: ${QLORA_CUDNN_LIBRARY}, frontend ${QLORA_CUDNN_FRONTEND_VERSION} headers in ${_cfe_dir}/include")
else()
  message(STATUS "cuDNN: off (libcudnn, cudnn_graph.h or the frontend headers missing): the CUDA backend uses its own attention kernel on every GPU")
endif()

# qlora_use_cudnn(TARGET): compile TARGET with the cuDNN path and link libcudnn.
function(qlora_use_cudnn target)
  if(QLORA_HAVE_CUDNN)
    target_include_directories(${target} SYSTEM PUBLIC ${QLORA_CUDNN_FRONTEND_INCLUDE_DIR} ${QLORA_CUDNN_INCLUDE_DIR})
    target_compile_definitions(${target} PUBLIC QLORA_HAVE_CUDNN=1)
    # The frontend's plan building references NVRTC (its runtime-compiled engines) and cudart.
    target_link_libraries(${target} PUBLIC ${QLORA_CUDNN_LIBRARY} ${ARGN})
  endif()
endfunction()
