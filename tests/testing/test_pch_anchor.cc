// The target that compiles the tests' precompiled header (tests/CMakeLists.txt, GRAPHALLOC_TEST_PCH): every
// test binary reuses it, so its flags are the tests' own. It has no tests of its own.
int main() { return 0; }
