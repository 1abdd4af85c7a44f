"""graphalloc.__version__ is the project's version: the constant the package carries (used before the library
is loaded) equals the library's graphalloc_version(), CMakeLists.txt's project(VERSION) and
python/pyproject.toml's version, and after loading the library __version__ is the library's."""
import os
import re
import unittest
from pathlib import Path

import graphalloc

ROOT = Path(__file__).resolve().parents[2]


class VersionTest(unittest.TestCase):
    def test_constant_matches_cmake_and_pyproject(self):
        cmake = re.search(r"project\(graphalloc VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
        pyproject = re.search(r'^version = "([^"]+)"', (ROOT / "python/pyproject.toml").read_text(),
                              re.MULTILINE).group(1)
        self.assertEqual(graphalloc._VERSION, cmake)
        self.assertEqual(pyproject, cmake)
        if "GRAPHALLOC_PROJECT_VERSION" in os.environ:
            self.assertEqual(graphalloc._VERSION, os.environ["GRAPHALLOC_PROJECT_VERSION"])

    def test_loaded_library_reports_the_same_version(self):
        lib = graphalloc.library()
        self.assertEqual(lib.graphalloc_version().decode(), "graphalloc " + graphalloc._VERSION)
        self.assertEqual(graphalloc.__version__, graphalloc._VERSION)


if __name__ == "__main__":
    unittest.main()
