# qlora_pip_nvidia_roots(OUT): the folders of the nvidia-* wheels of the Python CMake finds (e.g.
# site-packages/nvidia/cudnn, nvidia/nccl, nvidia/cu13), each with lib/ and include/. GPU images
# that come with PyTorch keep cuDNN and NCCL there only. In the CUDA 13 wheels `nvidia.cudnn` is a
# namespace package without __file__, so the folders come from the import system's search
# locations. Empty when there is no Python or no such wheel.
function(qlora_pip_nvidia_roots out)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  set(_roots "")
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c
        "import importlib.util as u\nfor m in ('nvidia.cudnn', 'nvidia.nccl', 'nvidia.cu13'):\n    try: s = u.find_spec(m)\n    except Exception: s = None\n    for p in (s.submodule_search_locations or []) if s else []: print(p)"
      OUTPUT_VARIABLE _txt ERROR_QUIET TIMEOUT 30)
    string(REPLACE "\n" ";" _roots "${_txt}")
    list(FILTER _roots EXCLUDE REGEX "^$")
  endif()
  set(${out} "${_roots}" PARENT_SCOPE)
endfunction()
