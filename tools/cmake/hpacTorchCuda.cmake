# hpac_torch_cuda_hints(<python>): before find_package(Torch), for a torch that is a CUDA build (PyPI's default
# wheels), point its CMake config at what that torch brings with it. Included by CMakeLists.txt where it finds
# torch through HPAC_TORCH_PYTHON (tools/build.sh --torch pip, and `pip install .`, which passes the installing Python).
#
# Why: TorchConfig of a CUDA wheel runs FindCUDA + enable_language(CUDA) even for a project without CUDA code
# (hpac has none). With no toolkit in a standard place it stops ("Your installed Caffe2 version uses CUDA but I
# cannot find the CUDA libraries"), and a toolkit without libnvrtc (one assembled from NVIDIA's wheels, or a
# partial install) stops at CUDA_nvrtc_LIBRARY-NOTFOUND. The wheel's own libnvrtc lies in site-packages/nvidia/
# (cu13/lib/ for CUDA 13 wheels, cuda_nvrtc/lib/ for CUDA 12), next to torch; it is the one torch loads anyway.
#
# What it sets, only where the caller did not (a -D value or the cache wins):
#   CUDA_TOOLKIT_ROOT_DIR  a toolkit with bin/nvcc and include/cuda.h: $CUDA_HOME, $CUDA_PATH,
#                          /usr/local/cuda-<torch's X.Y>, /usr/local/cuda-<X>.*, /usr/local/cuda, nvcc on PATH
#                          (same major version as torch's CUDA first)
#   CMAKE_CUDA_COMPILER    that toolkit's nvcc (so that enable_language(CUDA) and FindCUDA agree)
#   CUDA_nvrtc_LIBRARY     the toolkit's libnvrtc.so if it has one, else the wheel's libnvrtc.so.<X>
# A CPU torch (torch.version.cuda is None: the 2.13.0 CPU wheel) and Debian's libtorch (no HPAC_TORCH_PYTHON) are
# left alone: nothing is set.
function(hpac_torch_cuda_hints python)
  execute_process(
    COMMAND "${python}" -c [=[
import glob, os, torch
cuda = torch.version.cuda or ""
print(cuda)
site = os.path.dirname(os.path.dirname(torch.__file__))
major = cuda.split(".")[0]
found = sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so*")))
# libnvrtc.so.<torch's major> first (the soname torch_cuda needs), then any other; never libnvrtc-builtins.
found.sort(key=lambda p: 0 if os.path.basename(p) == "libnvrtc.so." + major else 1)
print(found[0] if found else "")
]=]
    OUTPUT_VARIABLE _out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    return()  # the import error is reported by CMakeLists.txt's own query of the same Python
  endif()
  string(REPLACE "\n" ";" _out "${_out}")
  list(LENGTH _out _n)
  if(_n LESS 1)
    return()
  endif()
  list(GET _out 0 _cuda)
  if(NOT _cuda)
    return()  # a CPU build of torch: its CMake config looks for no CUDA
  endif()
  set(_wheel_nvrtc "")
  if(_n GREATER 1)
    list(GET _out 1 _wheel_nvrtc)
  endif()
  string(REGEX MATCH "^[0-9]+" _major "${_cuda}")

  # The toolkit: the caller's, else the first candidate with nvcc and cuda.h, same major version first.
  set(_root "")
  if(DEFINED CUDA_TOOLKIT_ROOT_DIR AND CUDA_TOOLKIT_ROOT_DIR)
    set(_root "${CUDA_TOOLKIT_ROOT_DIR}")
    set(_root_from "given")
  else()
    set(_candidates "")
    foreach(_var CUDA_HOME CUDA_PATH)
      if(DEFINED ENV{${_var}} AND NOT "$ENV{${_var}}" STREQUAL "")
        list(APPEND _candidates "$ENV{${_var}}")
      endif()
    endforeach()
    list(APPEND _candidates "/usr/local/cuda-${_cuda}")
    file(GLOB _same_major LIST_DIRECTORIES true "/usr/local/cuda-${_major}.*")
    list(SORT _same_major COMPARE NATURAL ORDER DESCENDING)
    list(APPEND _candidates ${_same_major} "/usr/local/cuda")
    # nvcc on PATH, through its symbolic links (a wrapper script's folder is no toolkit and is skipped below).
    string(REPLACE ":" ";" _path "$ENV{PATH}")
    foreach(_dir IN LISTS _path)
      if(_dir AND EXISTS "${_dir}/nvcc")
        get_filename_component(_nvcc_real "${_dir}/nvcc" REALPATH)
        get_filename_component(_nvcc_bin "${_nvcc_real}" DIRECTORY)
        get_filename_component(_nvcc_root "${_nvcc_bin}" DIRECTORY)
        list(APPEND _candidates "${_nvcc_root}")
      endif()
    endforeach()
    file(GLOB _any_cuda LIST_DIRECTORIES true "/usr/local/cuda-*")
    list(SORT _any_cuda COMPARE NATURAL ORDER DESCENDING)
    list(APPEND _candidates ${_any_cuda})
    foreach(_candidate IN LISTS _candidates)
      if(EXISTS "${_candidate}/bin/nvcc" AND EXISTS "${_candidate}/include/cuda.h")
        get_filename_component(_root "${_candidate}" REALPATH)
        set(_root_from "found")
        break()
      endif()
    endforeach()
    if(NOT _root)
      list(REMOVE_DUPLICATES _candidates)
      string(REPLACE ";" ", " _tried "${_candidates}")
      message(FATAL_ERROR
        "hpac: torch at ${python} is a CUDA ${_cuda} build; its CMake config (TorchConfig) needs a CUDA toolkit with "
        "nvcc and the CUDA headers even though hpac compiles no CUDA code, and none was found (tried: ${_tried}). "
        "Install one (e.g. NVIDIA's CUDA ${_major}.x toolkit) or name it: -DCUDA_TOOLKIT_ROOT_DIR=/path/to/cuda "
        "(or CUDA_HOME=/path/to/cuda); or build against torch's CPU wheel (tools/requirements.txt's torch).")
    endif()
    set(CUDA_TOOLKIT_ROOT_DIR "${_root}" CACHE PATH "CUDA toolkit for the CUDA build of torch (tools/cmake/hpacTorchCuda.cmake)")
  endif()
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS "${_root}/bin/nvcc")
    set(CMAKE_CUDA_COMPILER "${_root}/bin/nvcc" CACHE FILEPATH "nvcc of CUDA_TOOLKIT_ROOT_DIR (tools/cmake/hpacTorchCuda.cmake)")
  endif()

  # libnvrtc: the toolkit's when it has one (FindCUDA finds it there by itself), else the wheel's.
  set(_nvrtc_from "toolkit")
  if(NOT CUDA_nvrtc_LIBRARY)
    file(GLOB _toolkit_nvrtc "${_root}/lib64/libnvrtc.so" "${_root}/lib/libnvrtc.so"
         "${_root}/targets/*/lib/libnvrtc.so")
    if(NOT _toolkit_nvrtc)
      if(NOT _wheel_nvrtc)
        message(FATAL_ERROR
          "hpac: torch at ${python} is a CUDA ${_cuda} build; the CUDA toolkit at ${_root} has no libnvrtc.so and "
          "no libnvrtc.so.* was found among the nvidia wheels beside torch (site-packages/nvidia/*/lib). "
          "Name one: -DCUDA_nvrtc_LIBRARY=/path/to/libnvrtc.so.${_major}")
      endif()
      set(CUDA_nvrtc_LIBRARY "${_wheel_nvrtc}" CACHE FILEPATH "libnvrtc for the CUDA build of torch (tools/cmake/hpacTorchCuda.cmake)")
      set(_nvrtc_from "torch's nvidia wheel")
    endif()
  else()
    set(_nvrtc_from "given")
  endif()
  if(CUDA_nvrtc_LIBRARY)
    set(_nvrtc_shown "${CUDA_nvrtc_LIBRARY}")
  else()
    set(_nvrtc_shown "found by FindCUDA in the toolkit")
  endif()
  message(STATUS "hpac: torch is a CUDA ${_cuda} build (hpac compiles no CUDA code; TorchConfig needs these): "
                 "toolkit ${CUDA_TOOLKIT_ROOT_DIR} (${_root_from}), libnvrtc ${_nvrtc_shown} (${_nvrtc_from})")
endfunction()
