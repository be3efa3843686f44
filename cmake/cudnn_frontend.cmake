# cuDNN for the CUDA backend's fused attention on sm_90/sm_100 (src/backend/cuda/cudnn_*):
# libcudnn from the CUDA toolkit (or CUDNN_ROOT), and the header-only cuDNN frontend, fetched at
# configure time from its PyPI wheel (a zip; only include/ is kept), pinned and sha256-checked,
# into the cache (QLORA_CACHE_DIR, default .cache/qlora). Offline: -DQLORA_CUDNN_FRONTEND_WHEEL=path
# to the same wheel file (hash-checked too). Sets QLORA_HAVE_CUDNN, QLORA_CUDNN_LIBRARY,
# QLORA_CUDNN_INCLUDE_DIR, QLORA_CUDNN_FRONTEND_INCLUDE_DIR; without any of them the backend is
# built without the cuDNN path (its own attention kernel everywhere) and says so here.
set(QLORA_CUDNN_FRONTEND_VERSION 1.32.0)
# The wheel is platform-tagged for its Python module; its headers are the same on every platform.
set(_cfe_wheel nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl)
set(_cfe_url https://files.pythonhosted.org/packages/11/02/660e2dd9f9d9f940e1641443771730612c3aadaafbc5ef7a93cc313d519d/${_cfe_wheel})
set(_cfe_sha256 c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0)
if(NOT QLORA_CACHE_DIR)
  set(QLORA_CACHE_DIR ${CMAKE_SOURCE_DIR}/.cache/qlora)
endif()
set(QLORA_CUDNN_FRONTEND_WHEEL "" CACHE FILEPATH "Local copy of ${_cfe_wheel} (no download)")
set(_cfe_dir ${QLORA_CACHE_DIR}/cudnn-frontend-${QLORA_CUDNN_FRONTEND_VERSION})

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
    message(STATUS "cuDNN frontend: downloading ${_cfe_url}")
    file(DOWNLOAD ${_cfe_url} ${_whl} EXPECTED_HASH SHA256=${_cfe_sha256} TIMEOUT 120 STATUS _st)
    list(GET _st 0 _code)
    if(NOT _code EQUAL 0)
      list(GET _st 1 _msg)
      message(WARNING "cuDNN frontend: download of ${_cfe_url} failed (${_msg}); pass -DQLORA_CUDNN_FRONTEND_WHEEL=<the wheel>")
      file(REMOVE ${_whl})
    endif()
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
find_library(QLORA_CUDNN_LIBRARY cudnn HINTS ${CUDNN_ROOT}/lib ${CUDNN_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR})
find_path(QLORA_CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
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
