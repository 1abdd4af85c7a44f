# The PyTorch that `python3` imports: the one the torch tests run and the C++ code built against PyTorch
# (bench/peers_c10, python/ shim) must match. Asked once per configure; graphalloc_find_torch() sets, in
# the caller's scope, GRAPHALLOC_TORCH_DIR (torch's package folder, with include/ and lib/; empty when
# python3 cannot import torch), GRAPHALLOC_TORCH_CXX11_ABI (0 or 1, torch's _GLIBCXX_USE_CXX11_ABI) and
# GRAPHALLOC_TORCH_VERSION (torch.__version__).
include_guard(GLOBAL)

function(graphalloc_find_torch)
  get_property(_probed GLOBAL PROPERTY GRAPHALLOC_TORCH_PROBED)
  if(NOT _probed)
    set(_dir "")
    set(_abi "")
    set(_version "")
    execute_process(
      COMMAND python3 -c "import torch,os;print(os.path.dirname(torch.__file__));print(int(torch._C._GLIBCXX_USE_CXX11_ABI));print(torch.__version__)"
      OUTPUT_VARIABLE _out ERROR_QUIET RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_rc STREQUAL "0")
      string(REPLACE "\n" ";" _out "${_out}")
      list(LENGTH _out _lines)
      if(_lines GREATER_EQUAL 3)
        # Import-time chatter (warnings printed to stdout) comes first: the last three lines are ours.
        list(GET _out -3 _dir)
        list(GET _out -2 _abi)
        list(GET _out -1 _version)
      endif()
    endif()
    set_property(GLOBAL PROPERTY GRAPHALLOC_TORCH_DIR_FOUND "${_dir}")
    set_property(GLOBAL PROPERTY GRAPHALLOC_TORCH_ABI_FOUND "${_abi}")
    set_property(GLOBAL PROPERTY GRAPHALLOC_TORCH_VERSION_FOUND "${_version}")
    set_property(GLOBAL PROPERTY GRAPHALLOC_TORCH_PROBED TRUE)
  endif()
  get_property(_dir GLOBAL PROPERTY GRAPHALLOC_TORCH_DIR_FOUND)
  get_property(_abi GLOBAL PROPERTY GRAPHALLOC_TORCH_ABI_FOUND)
  get_property(_version GLOBAL PROPERTY GRAPHALLOC_TORCH_VERSION_FOUND)
  set(GRAPHALLOC_TORCH_DIR "${_dir}" PARENT_SCOPE)
  set(GRAPHALLOC_TORCH_CXX11_ABI "${_abi}" PARENT_SCOPE)
  set(GRAPHALLOC_TORCH_VERSION "${_version}" PARENT_SCOPE)
endfunction()
