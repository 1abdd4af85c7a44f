// `graphalloc device [--device auto|cuda|sim] [--json]`: the device self-check.
//
// Finds a device (the real GPU when CudaDriver::Create(0) works; otherwise, with --device auto, the simulated
// one), prints what it is and its memory, and runs one VMM round trip (reserve, create, map, set access,
// write a pattern, read it back, unmap, release, free) so a broken driver setup shows up here rather than
// inside a training job. The allocator configuration (--config, else GRAPHALLOC_CONF) is checked too, so a
// typo in it shows up here: a bad one exits 2 naming the key.
#include "tools/device_command.h"

#include <cstdint>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/device/cuda_driver.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "tools/cli_common.h"
#include "tools/snapshot/snapshot_views.h"

namespace graphalloc::tools {
namespace {

struct DeviceOptions {
  std::string device = "auto";
  std::string config;
  bool json = false;
};

// Reserve, create, map, set access, write a pattern, read it back, then undo it all in reverse order. Undo
// runs also after a failure, so the check leaves nothing behind; the first error is the one reported.
absl::Status VmmRoundTrip(Driver& driver) {
  const std::size_t size = driver.Info().granularity;
  if (size == 0) return absl::FailedPreconditionError("the device reports a VMM granularity of 0");
  absl::Status first;
  auto note = [&first](absl::Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
    return first.ok();
  };
  absl::StatusOr<DevicePtr> va = driver.AddressReserve(size, 0);
  if (!va.ok()) return va.status();
  absl::StatusOr<PhysicalHandle> handle = driver.MemCreate(size);
  bool mapped = false;
  if (note(handle.status())) {
    mapped = note(driver.MemMap(*va, size, *handle));
    if (mapped && note(driver.MemSetAccess(*va, size, {}))) {
      std::vector<std::uint8_t> pattern(size);
      std::vector<std::uint8_t> back(size, 0);
      for (std::size_t i = 0; i < size; ++i) pattern[i] = static_cast<std::uint8_t>((i * 131) ^ (i >> 11));
      if (note(driver.CopyHostToDevice(*va, pattern.data(), size)) &&
          note(driver.CopyDeviceToHost(back.data(), *va, size)) && back != pattern) {
        std::size_t at = 0;
        while (back[at] == pattern[at]) ++at;
        note(
            absl::DataLossError(absl::StrCat("read back differs from what was written, first at byte ", at)));
      }
    }
  }
  if (mapped) note(driver.MemUnmap(*va, size));
  if (handle.ok()) note(driver.MemRelease(*handle));
  note(driver.AddressFree(*va, size));
  return first;
}

// Runs the self-check and prints it; returns the exit code (0 ok, 1 failed check).
int RunDeviceCheck(const DeviceOptions& options) {
  absl::StatusOr<Config> config = ResolveConfig(options.config);
  if (!config.ok()) {
    std::cerr << "graphalloc device: " << config.status().message() << "\n";
    return kExitBadInput;
  }
  std::unique_ptr<Driver> driver;
  std::string no_gpu;  // why the real GPU was not used (with --device auto)
  std::optional<int> device_count;
  if (options.device != "sim") {
    absl::StatusOr<std::unique_ptr<CudaDriver>> cuda = CudaDriver::Create(0);
    if (cuda.ok()) {
      driver = std::move(*cuda);
      if (absl::StatusOr<int> count = CudaDriver::DeviceCount(); count.ok()) device_count = *count;
    } else if (options.device == "cuda") {
      if (options.json) {
        std::cout << nlohmann::json{{"ok", false}, {"error", std::string(cuda.status().message())}}.dump(2)
                  << "\n";
      }
      std::cerr << "graphalloc device: no usable GPU: " << cuda.status().message() << "\n";
      return 1;
    } else {
      no_gpu = std::string(cuda.status().message());
    }
  }
  if (driver == nullptr) {
    absl::StatusOr<std::unique_ptr<SimDriver>> sim = SimDriver::Create();
    if (!sim.ok()) {
      std::cerr << "graphalloc device: the simulated device failed to start: " << sim.status().message()
                << "\n";
      return 1;
    }
    driver = std::move(*sim);
  }

  const DeviceInfo& info = driver->Info();
  absl::StatusOr<MemoryInfo> memory = driver->GetMemoryInfo();
  const absl::Status round_trip = VmmRoundTrip(*driver);
  const bool ok = memory.ok() && round_trip.ok();
  const bool has_cc = info.compute_capability_major > 0;

  if (options.json) {
    nlohmann::json out = {
        {"ok", ok},
        {"kind", std::string(driver->Kind())},
        {"ordinal", info.ordinal},
        {"name", info.name},
        {"total_memory_bytes", info.total_memory},
        {"granularity_bytes", info.granularity},
        {"recommended_granularity_bytes", info.recommended_granularity},
        {"vmm_round_trip", round_trip.ok() ? "ok" : std::string(round_trip.message())},
        {"config", config->ToString()},
    };
    if (memory.ok()) {
      out["free_memory_bytes"] = memory->free;
    } else {
      out["memory_error"] = std::string(memory.status().message());
    }
    if (has_cc) {
      out["compute_capability"] =
          absl::StrCat(info.compute_capability_major, ".", info.compute_capability_minor);
    }
    if (device_count.has_value()) out["device_count"] = *device_count;
    if (!no_gpu.empty()) out["no_gpu_reason"] = no_gpu;
    std::cout << out.dump(2) << "\n";
    return ok ? 0 : 1;
  }

  if (driver->Kind() == "cuda") {
    std::cout << "Device: " << info.name << " (real GPU, device " << info.ordinal;
    if (device_count.has_value()) std::cout << " of " << *device_count;
    std::cout << ")\n";
  } else {
    std::cout << "Device: " << info.name << " (simulated device)\n";
    if (!no_gpu.empty()) std::cout << "No GPU used: " << no_gpu << "\n";
  }
  std::cout << "Compute capability: "
            << (has_cc ? absl::StrCat(info.compute_capability_major, ".", info.compute_capability_minor)
                       : "n/a")
            << "\n";
  if (memory.ok()) {
    std::cout << "Memory: " << FormatBytes(info.total_memory) << " total, " << FormatBytes(memory->free)
              << " free\n";
  } else {
    std::cout << "Memory: " << FormatBytes(info.total_memory) << " total, free unknown ("
              << memory.status().message() << ")\n";
  }
  std::cout << "VMM granularity: " << FormatBytes(info.granularity) << " (recommended "
            << FormatBytes(info.recommended_granularity) << ")\n";
  std::cout << "VMM round trip: " << (round_trip.ok() ? "ok" : std::string(round_trip.message())) << "\n";
  if (!config->DiffFromDefaults().empty())
    std::cout << "Config: " << DescribeConfig(*config, options.config) << "\n";
  return ok ? 0 : 1;
}

}  // namespace

void AddDeviceCommand(CLI::App& app) {
  auto options = std::make_shared<DeviceOptions>();
  CLI::App* command =
      app.add_subcommand("device", "Self-check: find the device, print its memory and run a VMM round trip");
  command
      ->add_option("--device", options->device, "auto (the GPU if there is one, else simulated), cuda or sim")
      ->check(CLI::IsMember({"auto", "cuda", "sim"}))
      ->capture_default_str();
  command->add_option("--config", options->config,
                      "Allocator configuration to check, GRAPHALLOC_CONF syntax; overrides GRAPHALLOC_CONF");
  command->add_flag("--json", options->json, "Print the result as JSON");
  command->callback([options] {
    if (int code = RunDeviceCheck(*options); code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace graphalloc::tools
