"""PyTorch's own make_graphed_callables tests (test/test_cuda.py: test_graph_make_graphed_callables*, the
same_pool and parameterless variants) run against graphalloc.torch.make_graphed_callables: torch.cuda's
function is replaced by graphalloc's before the test file is imported, so the tests call ours unchanged.

The test file is not part of the repository: --tests-dir (or $PYTORCH_TESTS_DIR, ./.pytorch-tests,
../shared/pytorch-tests) names the folder that holds PyTorch's test_cuda.py. Skips (77) without it.
Prints each test's outcome; exits 1 if any failed (an expected failure that fails counts as passed, as in
PyTorch's own run)."""
import argparse
import importlib.util
import os
import sys
import unittest
from pathlib import Path

import _common

PATTERNS = ("test_graph_make_graphed_callables",)


def find_tests_dir(explicit):
    for c in (explicit, os.environ.get("PYTORCH_TESTS_DIR"), _common.REPO / ".pytorch-tests",
              _common.REPO.parent / "shared" / "pytorch-tests"):
        if c and (Path(c) / "test_cuda.py").is_file():
            return Path(c)
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tests-dir")
    parser.add_argument("--impl", choices=("graphalloc", "torch"), default="graphalloc")
    args = parser.parse_args()
    _common.require_torch()
    tests_dir = find_tests_dir(args.tests_dir)
    if tests_dir is None:
        _common.skip("PyTorch's test_cuda.py not found (--tests-dir, $PYTORCH_TESTS_DIR)")
    import _backend_common
    _backend_common.require_backend_build()
    gat, torch = _backend_common.install_backend()
    if args.impl == "graphalloc":
        torch.cuda.make_graphed_callables = gat.make_graphed_callables
        torch.cuda.graphs.make_graphed_callables = gat.make_graphed_callables
    sys.path.insert(0, str(_common.REPO / "scripts"))
    # A stand-in for expecttest, which the test file imports and the GPU machine lacks.
    sys.path.insert(0, str(_common.REPO / "scripts" / "pytorch_suite" / "stubs"))
    sys.path.insert(0, str(tests_dir))
    from pytorch_suite import worker  # noqa: E402: defines what this PyTorch's testing modules lack
    test_file = str(tests_dir / "test_cuda.py")
    sys.argv = [test_file]
    print("patched:", worker.patch_missing_imports(test_file), flush=True)
    spec = importlib.util.spec_from_file_location("test_cuda", test_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules["test_cuda"] = module
    spec.loader.exec_module(module)
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for test in worker.flatten(loader.loadTestsFromModule(module)):
        name = getattr(test, "_testMethodName", "")
        if any(name.startswith(p) for p in PATTERNS):
            suite.addTest(test)
    print(f"running {suite.countTestCases()} tests with {args.impl}'s make_graphed_callables", flush=True)
    if suite.countTestCases() == 0:
        print("no test matched", PATTERNS)
        return 1
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
