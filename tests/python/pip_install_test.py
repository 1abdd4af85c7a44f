"""`pip install --no-build-isolation --no-index ./python` into a fresh virtual environment, offline, nothing
installed first (a plain venv has pip and no `wheel`, which setuptools needed: "invalid command
'bdist_wheel'"): the install leaves the checkout as it was (no build/ or egg-info in python/), and the
installed package imports, finds the built libgraphalloc.so (packed beside it, GRAPHALLOC_LIBRARY unset) and
the `graphalloc` CLI (packed in its bin/, GRAPHALLOC_CLI unset; graphalloc.torch.export_torch() runs it),
and reports statistics on the simulated device; graphalloc.torch without PyTorch raises an ImportError that
says PyTorch is needed. Exits 77 (skipped) when no interpreter here can make a virtual environment with pip
(Debian: python3-venv)."""
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
    return subprocess.run([python, "-c", "import venv, ensurepip"], capture_output=True).returncode == 0


def _interpreter():
    # This interpreter first; Debian's own python3 where this one lacks venv or ensurepip (scripts/setup.sh
    # installs python3-venv there).
    for python in (sys.executable, "/usr/bin/python3"):
        if Path(python).exists() and _can_build(python):
            return python
    return None


def _listing(folder: Path):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts)


class PipInstallTest(unittest.TestCase):
    python = None

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="graphalloc_pip_")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def run_checked(self, args, env=None, cwd=None):
        r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd)
        self.assertEqual(r.returncode, 0, f"{args}:\n{r.stdout}\n{r.stderr}")
        return r

    def test_offline_install_into_a_fresh_venv_finds_the_library_and_the_cli(self):
        venv = Path(self.dir) / "venv"
        self.run_checked([self.python, "-m", "venv", str(venv)])  # plain: no system site-packages
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env["PIP_NO_INDEX"] = "1"
        before = _listing(ROOT / "python")
        r = self.run_checked([str(venv / "bin/pip"), "install", "--no-build-isolation", "--no-index",
                              str(ROOT / "python")], env=env, cwd=self.dir)
        self.assertNotIn("bdist_wheel", r.stdout + r.stderr)
        self.assertEqual(_listing(ROOT / "python"), before, "pip install left files in python/")

        run_env = {k: v for k, v in env.items() if k not in ("GRAPHALLOC_LIBRARY", "GRAPHALLOC_CLI")}
        run_env["GRAPHALLOC_DEVICE"] = "sim"
        code = ("import graphalloc, os; p = graphalloc.library_path(); "
                "assert os.path.dirname(p) == os.path.dirname(graphalloc.__file__), p; "
                "cli = graphalloc.cli_path(); "
                "assert cli == os.path.join(os.path.dirname(graphalloc.__file__), 'bin', 'graphalloc'), cli; "
                "print(graphalloc.__version__ == graphalloc._VERSION, "
                "graphalloc.stats(0)['allocated_bytes.all.current'], graphalloc.run_cli('--version').stdout.strip())")
        r = self.run_checked([str(venv / "bin/python"), "-c", code], env=run_env, cwd=self.dir)
        self.assertEqual(r.stdout.strip(), "True 0 graphalloc 0.1.0")
        license_code = ("import importlib.metadata as m; d = m.distribution('graphalloc'); "
                        "print(d.metadata['License'], any(f.name == 'LICENSE' for f in d.files))")
        r = self.run_checked([str(venv / "bin/python"), "-c", license_code], env=run_env, cwd=self.dir)
        self.assertEqual(r.stdout.strip(), "BSD-3-Clause True")

        probe = ("import importlib.util, sys\n"
                 "if importlib.util.find_spec('torch') is not None: print('has torch'); sys.exit(0)\n"
                 "try:\n import graphalloc.torch\nexcept ImportError as e:\n print(e)\n")
        r = self.run_checked([str(venv / "bin/python"), "-c", probe], env=run_env, cwd=self.dir)
        if r.stdout.strip() != "has torch":
            self.assertIn("graphalloc.torch needs PyTorch", r.stdout)

    def test_editable_install_uses_the_checkout(self):
        venv = Path(self.dir) / "venv"
        self.run_checked([self.python, "-m", "venv", str(venv)])
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env["PIP_NO_INDEX"] = "1"
        before = _listing(ROOT / "python")
        self.run_checked([str(venv / "bin/pip"), "install", "--no-build-isolation", "--no-index", "-e",
                          str(ROOT / "python")], env=env, cwd=self.dir)
        self.assertEqual(_listing(ROOT / "python"), before, "pip install -e left files in python/")
        r = self.run_checked([str(venv / "bin/python"), "-c", "import graphalloc; print(graphalloc.__file__)"],
                             env=env, cwd=self.dir)
        self.assertEqual(Path(r.stdout.strip()), ROOT / "python" / "graphalloc" / "__init__.py")


if __name__ == "__main__":
    PipInstallTest.python = _interpreter()
    if PipInstallTest.python is None:
        print("skipped: no python3 here has venv and ensurepip (Debian: apt-get install python3-venv)")
        sys.exit(SKIP)
    unittest.main()
