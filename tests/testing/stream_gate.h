// Holds back the work on a stream until the test opens the gate, on either device: the simulated device
// queues work (manual completion) until RunAllPendingWork; on the real GPU a host function spins on a
// flag, so the stream (and every event recorded after it) stays incomplete.
#ifndef GRAPHALLOC_TESTS_TESTING_STREAM_GATE_H_
#define GRAPHALLOC_TESTS_TESTING_STREAM_GATE_H_

#include <atomic>
#include <memory>

#include "graphalloc/allocator/device/driver.h"
#include "tests/testing/test_device.h"

namespace graphalloc::testing {

class StreamGate {
 public:
  // On the simulated device, `driver` must have been created with manual_completion.
  StreamGate(Driver& driver, Stream stream) : driver_(driver), stream_(stream) {
    if (AsSim(&driver) == nullptr) {
      auto open = open_;
      (void)driver.LaunchHostFunction(stream, [open] {
        while (!open->load(std::memory_order_acquire)) {
        }
      });
    }
  }
  ~StreamGate() { Open(); }

  // Lets the held-back work run and waits for it.
  void Open() {
    if (opened_) return;
    opened_ = true;
    if (SimDriver* sim = AsSim(&driver_)) {
      sim->RunAllPendingWork();
    } else {
      open_->store(true, std::memory_order_release);
      (void)driver_.StreamSynchronize(stream_);
    }
  }

 private:
  Driver& driver_;
  Stream stream_;
  bool opened_ = false;
  std::shared_ptr<std::atomic<bool>> open_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_TESTING_STREAM_GATE_H_
