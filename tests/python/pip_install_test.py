"""`pip install --no-build-isolation --no-index ./python` into a fresh virtual environment, offline: the
installed package imports, finds the built libgraphalloc.so (copied beside it, GRAPHALLOC_LIBRARY unset)
and reports statistics on the simulated device; graphalloc.torch without PyTorch raises an ImportError
that says PyTorch is needed. Exits 77 (skipped) when no interpreter here can make a virtual environment
(venv/ensurepip missing) with setuptools and wheel to build with."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = 77


def _can_build(python: str) -> bool:
    """The interpreter has venv, ensurepip, setuptools and wheel (the venv sees the last two through
    --system-site-packages)."""
    probe = "import venv, ensurepip, setuptools, wheel"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def _interpreter():
    # This interpreter first; Debian's own python3 where this one lacks something (a pyenv Python without
    # wheel, say), as scripts/setup.sh installs python3-venv, python3-setuptools and python3-wheel there.
    for python in (sys.executable, "/usr/bin/python3"):
        if Path(python).exists() and _can_build(python):
            return python
    return None


class PipInstallTest(unittest.TestCase):
    python = None

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="graphalloc_pip_")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_checked(self, args, env=None, cwd=None):
        r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd)
        self.assertEqual(r.returncode, 0, f"{args}:\n{r.stdout}\n{r.stderr}")
        return r

    def test_offline_install_finds_the_library(self):
        venv = Path(self.dir) / "venv"
        self.run_checked([self.python, "-m", "venv", "--system-site-packages", str(venv)])
        # Build from a copy: pip builds in the source folder, and the test must not leave build/ there.
        source = Path(self.dir) / "src"
        shutil.copytree(ROOT / "python", source / "python", ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                                        "*.egg-info"))
        env = dict(os.environ)
        library = env.pop("GRAPHALLOC_LIBRARY")  # setup.py takes it from here; the installed package must not
        env["GRAPHALLOC_LIBRARY"] = library
        env.pop("PYTHONPATH", None)
        env["PIP_NO_INDEX"] = "1"
        self.run_checked([str(venv / "bin/pip"), "install", "--no-build-isolation", "--no-index",
                          str(source / "python")], env=env)

        run_env = {k: v for k, v in env.items() if k != "GRAPHALLOC_LIBRARY"}
        run_env["GRAPHALLOC_DEVICE"] = "sim"
        code = ("import graphalloc, os; p = graphalloc.library_path(); "
                "assert os.path.dirname(p) == os.path.dirname(graphalloc.__file__), p; "
                "print(graphalloc.__version__ == graphalloc._VERSION, "
                "graphalloc.stats(0)['allocated_bytes.all.current'])")
        r = self.run_checked([str(venv / "bin/python"), "-c", code], env=run_env, cwd=self.dir)
        self.assertEqual(r.stdout.strip(), "True 0")

        probe = ("import importlib.util, sys\n"
                 "if importlib.util.find_spec('torch') is not None: print('has torch'); sys.exit(0)\n"
                 "try:\n import graphalloc.torch\nexcept ImportError as e:\n print(e)\n")
        r = self.run_checked([str(venv / "bin/python"), "-c", probe], env=run_env, cwd=self.dir)
        if r.stdout.strip() != "has torch":
            self.assertIn("graphalloc.torch needs PyTorch", r.stdout)


if __name__ == "__main__":
    PipInstallTest.python = _interpreter()
    if PipInstallTest.python is None:
        print("skipped: no python3 here has venv, ensurepip, setuptools and wheel "
              "(Debian: apt-get install python3-venv python3-setuptools python3-wheel)")
        sys.exit(SKIP)
    unittest.main()
