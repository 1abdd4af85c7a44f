"""Runs a Python file (one of PyTorch's test files, or the suite's worker) with a chosen CUDA allocator, as a
user's program would get it:

    python3 scripts/pytorch_suite/run_with.py graphalloc|native FILE [its arguments, e.g. -v -k TestMemPool]

`graphalloc` calls graphalloc.torch.install() before FILE imports torch (PYTHONPATH must reach the project's
python/ folder and GRAPHALLOC_LIBRARY its libgraphalloc.so); `native` leaves PyTorch's allocator. Where the
`expecttest` package is missing (the GPU machine), put scripts/pytorch_suite/stubs on PYTHONPATH too.
"""
import os
import runpy
import sys

if len(sys.argv) < 3 or sys.argv[1] not in ("graphalloc", "native"):
    sys.exit(__doc__)
test_file = sys.argv[2]
# As `python3 FILE` would have it: FILE's folder first, not this one (whose module names could shadow others).
sys.path[0] = os.path.dirname(os.path.abspath(test_file))
if sys.argv[1] == "graphalloc":
    import graphalloc.torch as gat

    gat.install()
sys.argv = [test_file] + sys.argv[3:]
runpy.run_path(test_file, run_name="__main__")
