// Counts the threads a test binary starts and fails the binary when that contradicts its `threads` label.
//
// The TSan stage of the test command builds and runs only the tests labelled `threads` (a data race needs
// two threads, and compiling every other test under TSan costs minutes of CI); this check is what keeps
// that label true. CMake links it into every test binary of a build without sanitizers and sets
// GRAPHALLOC_TEST_STARTS_THREADS to 1 or 0 on the simulated-device entry; a binary told 0 that started a
// thread fails, and so does one told 1 that started none, so a test that begins to start threads (itself
// or through the library) is moved into the TSan stage by its first normal run, not silently left out.
// Only the simulated device is checked: a real device's driver starts threads of its own.
//
// The count comes from this executable's own definition of pthread_create, which the dynamic linker binds
// before the C library's for every caller in the process (std::thread included); it forwards to the C
// library's. Sanitizer runtimes define pthread_create themselves, so sanitizer builds do not link it.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

std::atomic<int> threads_started{0};

using CreateFunction = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);

// Fails the program at its end when the label in the environment and what the tests did disagree.
class ThreadLabelCheck : public ::testing::Environment {
 public:
  void TearDown() override {
    const char* expected = std::getenv("GRAPHALLOC_TEST_STARTS_THREADS");
    const char* device = std::getenv("GRAPHALLOC_TEST_DEVICE");
    if (expected == nullptr || device == nullptr || std::strcmp(device, "sim") != 0) return;
    const int started = threads_started.load();
    if (std::strcmp(expected, "0") == 0 && started > 0) {
      ADD_FAILURE() << "this test binary started " << started
                    << " thread(s) but is not labelled `threads`: give its graphalloc_test() THREADS so "
                       "that the TSan stage runs it (tests/testing/thread_census.cc)";
    } else if (std::strcmp(expected, "1") == 0 && started == 0) {
      ADD_FAILURE()
          << "this test binary is labelled `threads` but started none: remove THREADS from its "
             "graphalloc_test(), the TSan stage builds it for nothing (tests/testing/thread_census.cc)";
    }
  }
};

[[maybe_unused]] const ::testing::Environment* const kCheck =
    ::testing::AddGlobalTestEnvironment(new ThreadLabelCheck);

}  // namespace

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attributes, void* (*start)(void*),
                              void* argument) {
  static const auto next = reinterpret_cast<CreateFunction>(dlsym(RTLD_NEXT, "pthread_create"));
  if (next == nullptr) {
    std::fprintf(stderr, "thread_census: the C library's pthread_create was not found\n");
    std::abort();
  }
  threads_started.fetch_add(1);
  return next(thread, attributes, start, argument);
}
