#!/usr/bin/env python3
"""Runs every `gpu`-labelled test of a build under compute-sanitizer memcheck, on the GPU machine.

    python3 scripts/gpu_memcheck.py BUILD_DIR OUT_DIR [NAME_REGEX]

Each test runs as CTest would run it (its command, environment and working directory, read from
`ctest --show-only=json-v1`), with GRAPHALLOC_TEST_SCALE=0.1 (a short run: memcheck slows every kernel and
driver call), four at a time; the soak and the PyTorch tests, which watch device memory, run alone
afterwards. graphalloc's own binaries also get `--leak-check full`: every device allocation they made must
be gone at exit (the PyTorch tests are left out of it, PyTorch keeps its own). Each test's log goes to
OUT_DIR/<name>.log, one summary line per test to stdout; the exit status is 1 if any test failed or
reported an error.

API errors are not reported: the tests that provoke them (a bad map, capture misuse, invalidated captures,
a graph update the driver refuses) do so on purpose. DriverTest.UnmappedAccessFaults is left out: it reads
unmapped memory on purpose, which memcheck turns into a sticky fault that skips every later test.
"""
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import time

TIMEOUT_S = 330
SANITIZER = "compute-sanitizer"
DELIBERATE_FAULTS = {"driver_test_gpu": "--gtest_filter=-DriverTest.UnmappedAccessFaults"}


def gpu_tests(build: str, only):
    listing = json.loads(subprocess.check_output(["ctest", "--test-dir", build, "-L", "gpu", "--show-only=json-v1"]))
    for test in listing["tests"]:
        if only is not None and not only.search(test["name"]):
            continue
        env = dict(os.environ, GRAPHALLOC_TEST_SCALE="0.1")
        cwd = build
        for prop in test.get("properties", []):
            if prop["name"] == "ENVIRONMENT":
                env.update(kv.split("=", 1) for kv in prop["value"])
            elif prop["name"] == "WORKING_DIRECTORY":
                cwd = prop["value"]
        command = list(test["command"])
        if test["name"] in DELIBERATE_FAULTS:
            command.append(DELIBERATE_FAULTS[test["name"]])
        yield test["name"], command, env, cwd


def find_sanitizer() -> str:
    found = shutil.which("compute-sanitizer") or shutil.which("compute-sanitizer", path="/usr/local/cuda/bin")
    if found is None:
        sys.exit("gpu_memcheck: compute-sanitizer is neither on PATH nor in /usr/local/cuda/bin")
    return found


def run(out: str, name: str, command, env, cwd):
    sanitizer = [SANITIZER, "--tool", "memcheck", "--error-exitcode", "99", "--target-processes", "all",
                 "--report-api-errors", "no"]
    if "torch" not in name:
        sanitizer += ["--leak-check", "full"]
    log_path = os.path.join(out, f"{name}.log")
    start = time.time()
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(sanitizer + command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                timeout=TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    with open(log_path, errors="replace") as log:
        lines = [line.strip() for line in log
                 if re.search(r"ERROR SUMMARY|LEAK SUMMARY|PASSED|FAILED|^OK|^Ran ", line.strip())]
    return rc == 0, f"{name}: rc={rc} {time.time() - start:.0f} s | " + " | ".join(lines[-4:])


def main() -> int:
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    build, out = sys.argv[1], sys.argv[2]
    only = re.compile(sys.argv[3]) if len(sys.argv) == 4 else None
    global SANITIZER
    SANITIZER = find_sanitizer()
    os.makedirs(out, exist_ok=True)
    tests = list(gpu_tests(build, only))
    alone = [t for t in tests if "soak" in t[0] or "torch" in t[0]]
    together = [t for t in tests if t not in alone]
    all_ok = True
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for ok, line in pool.map(lambda t: run(out, *t), together):
            all_ok &= ok
            print(line, flush=True)
    for test in alone:
        ok, line = run(out, *test)
        all_ok &= ok
        print(line, flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
