#!/usr/bin/env python3
"""PyTorch's own test files with PyTorch's allocator and with graphalloc side by side: `--help`, or the
package beside this file (pytorch_suite/, its __init__.py describes it), which holds the code."""
import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # a launcher that runs this file with runpy (a worker's) does not put its folder there
    sys.path.insert(0, HERE)

from pytorch_suite.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
