"""What runs inside a worker process: loads one of PyTorch's test files (after defining the names this PyTorch
lacks), runs its shard of test ids with unittest and writes one JSON line per test event for the scheduler."""
from __future__ import annotations

import ast
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List

from pytorch_suite import SPEC_ENV


def _emit(fh, **event) -> None:
    event.setdefault("t", time.time())
    fh.write(json.dumps(event, default=str) + "\n")
    fh.flush()


def _passthrough(*args, **kwargs):
    """Stands for a missing decorator or decorator factory: returns the function unchanged."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


def _default_for(name: str):
    if name == "TEST_CUDAMALLOCASYNC":
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
        return "backend:cudaMallocAsync" in conf
    if name.isupper() or name.startswith(("TEST_", "IS_", "PLATFORM_", "SM")):
        return False  # a capability flag: off
    if name[:1].islower():
        return _passthrough  # a function: most likely a decorator (factory)
    return None


def patch_missing_imports(path: str) -> List[str]:
    """Defines, in torch.testing._internal.* modules, the names that `path` imports from them and this
    PyTorch lacks (the test files are newer or older than the installed PyTorch). Returns what was defined."""
    import importlib
    patched = []
    tree = ast.parse(Path(path).read_text(), filename=path)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and
                node.module.startswith("torch.testing._internal")):
            continue
        try:
            mod = importlib.import_module(node.module)
        except Exception as e:  # noqa: BLE001 - the file's own import will report it
            patched.append(f"{node.module}: cannot import ({type(e).__name__}: {e})")
            continue
        for alias in node.names:
            if alias.name != "*" and not hasattr(mod, alias.name):
                value = _default_for(alias.name)
                setattr(mod, alias.name, value)
                shown = "passthrough decorator" if value is _passthrough else repr(value)
                patched.append(f"{node.module}.{alias.name} = {shown}")
    return patched


def flatten(suite) -> list:
    out = []
    for t in suite:
        if hasattr(t, "__iter__") and not hasattr(t, "_testMethodName"):
            out.extend(flatten(t))
        else:
            out.append(t)
    return out


def _short_id(test) -> str:
    parts = test.id().split(".")
    return ".".join(parts[-2:])


def _fmt_err(err) -> str:
    return "".join(traceback.format_exception(*err))[-8000:]


def worker_main() -> int:
    """Runs inside run_with.py (graphalloc installed already, or not): spec from $GRAPHALLOC_SUITE_WORKER_SPEC."""
    import importlib.util
    import unittest

    spec = json.loads(Path(os.environ[SPEC_ENV]).read_text())
    fh = open(spec["events"], "a", buffering=1)
    info: Dict[str, Any] = {"pid": os.getpid(), "allocator": spec.get("allocator")}
    try:
        if spec.get("allocator") == "graphalloc":
            import graphalloc.torch as gat
        if spec.get("allocator") == "graphalloc" and gat.is_installed():
            h = gat.hooks()
            info["backend"] = h.get("backend", "(no 'backend' in hooks(): the pluggable glue)")
            if hasattr(gat, "backend"):
                info["backend_kind"] = gat.backend()
    except Exception as e:  # noqa: BLE001 - native runs may not find graphalloc at all
        info["graphalloc_import"] = f"{type(e).__name__}: {e}"[:200]
    test_file = spec["file"]
    sys.argv = [test_file]  # PyTorch's common_utils parses sys.argv at import
    sys.path.insert(0, str(Path(test_file).parent))
    try:
        info["patched"] = patch_missing_imports(test_file) if spec.get("patch", True) else []
        mod_spec = importlib.util.spec_from_file_location(spec["module"], test_file)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[spec["module"]] = module
        mod_spec.loader.exec_module(module)
    except unittest.SkipTest as e:
        _emit(fh, ev="import_skip", msg=str(e), info=info)
        return 0
    except BaseException:  # noqa: BLE001
        _emit(fh, ev="import_error", msg=traceback.format_exc()[-6000:], info=info)
        return 3
    try:
        import torch
        info["torch"] = torch.__version__
        if spec.get("allocator") and torch.cuda.is_available():
            try:
                info["allocator_backend"] = torch.cuda.get_allocator_backend()
            except Exception as e:  # noqa: BLE001
                info["allocator_backend"] = f"({type(e).__name__}: {e})"[:200]
    except Exception:  # noqa: BLE001
        pass
    _emit(fh, ev="info", info=info)
    loader = unittest.TestLoader()
    if spec.get("list"):
        ids = sorted({_short_id(t) for t in flatten(loader.loadTestsFromModule(module))
                      if hasattr(t, "_testMethodName") and type(t).__name__ != "_FailedTest"})
        _emit(fh, ev="list", ids=ids)
        return 0

    tests = []
    for tid in spec["ids"]:
        try:
            tests.extend(flatten(loader.loadTestsFromName(tid, module)))
        except Exception:  # noqa: BLE001
            _emit(fh, ev="start", id=tid)
            _emit(fh, ev="outcome", id=tid, outcome="error", msg="cannot load: " + traceback.format_exc()[-3000:])
            _emit(fh, ev="stop", id=tid)

    class EventResult(unittest.TestResult):
        def startTest(self, test):
            super().startTest(test)
            _emit(fh, ev="start", id=_short_id(test))

        def stopTest(self, test):
            super().stopTest(test)
            _emit(fh, ev="stop", id=_short_id(test))

        def _out(self, test, outcome, msg=""):
            if hasattr(test, "_testMethodName") and test.id() != "unittest.case._SubTest":
                _emit(fh, ev="outcome", id=_short_id(test), outcome=outcome, msg=msg)
            else:  # setUpClass / tearDownClass / module fixtures: an _ErrorHolder
                _emit(fh, ev="fixture_error", desc=str(getattr(test, "description", test)), outcome=outcome,
                      msg=msg)

        def addSuccess(self, test):
            super().addSuccess(test)
            self._out(test, "passed")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._out(test, "failed", _fmt_err(err))

        def addError(self, test, err):
            super().addError(test, err)
            self._out(test, "error", _fmt_err(err))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._out(test, "skipped", str(reason))

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._out(test, "passed", "expected failure")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._out(test, "failed", "unexpected success (the test is marked expectedFailure)")

        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is not None:
                failed = issubclass(err[0], test.failureException)
                _emit(fh, ev="outcome", id=_short_id(test), outcome="failed" if failed else "error",
                      msg=f"subtest {subtest._subDescription()}: " + _fmt_err(err))

    result = EventResult()
    unittest.TestSuite(tests).run(result)
    _emit(fh, ev="done", stopped=bool(result.shouldStop))
    fh.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (CUDA / inductor atexit work can hang or crash)

