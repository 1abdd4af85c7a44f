// The C ABI of sharing blocks with other processes (graphalloc.h): one BlockExporter per device's
// process-wide allocator, made on the first export, and imports as opaque handles.
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/c_api/c_api_internal.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/core/default_allocator.h"
#include "graphalloc/allocator/ipc/block_exporter.h"
#include "graphalloc/allocator/ipc/block_importer.h"

struct graphalloc_import {
  graphalloc::ipc::ImportedBlock block;
};

namespace graphalloc::c_api {
namespace {

// The exporter of `device`'s allocator. Exporters live as long as the process, like the allocators they
// export from (a server thread per device that exported something).
absl::StatusOr<ipc::BlockExporter*> ExporterOf(int device) {
  static std::mutex mu;
  static auto* exporters = new std::map<int, std::unique_ptr<ipc::BlockExporter>>();
  absl::StatusOr<CachingAllocator*> allocator = DefaultAllocator(device);
  if (!allocator.ok()) return allocator.status();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<ipc::BlockExporter>& exporter = (*exporters)[device];
  if (exporter == nullptr) {
    absl::StatusOr<std::unique_ptr<ipc::BlockExporter>> made = ipc::BlockExporter::Create(**allocator);
    if (!made.ok()) return made.status();
    exporter = *std::move(made);
  }
  return exporter.get();
}

}  // namespace
}  // namespace graphalloc::c_api

using graphalloc::c_api::Guarded;

extern "C" {

int graphalloc_export_block(void* ptr, int device, char* token, size_t token_size) {
  bool too_small = false;
  const int code = Guarded([&]() -> absl::Status {
    if (token == nullptr) return absl::InvalidArgumentError("graphalloc_export_block: token is NULL");
    absl::StatusOr<graphalloc::ipc::BlockExporter*> exporter = graphalloc::c_api::ExporterOf(device);
    if (!exporter.ok()) return exporter.status();
    absl::StatusOr<graphalloc::ipc::ExportToken> exported =
        (*exporter)->Export(reinterpret_cast<graphalloc::DevicePtr>(ptr));
    if (!exported.ok()) return exported.status();
    const std::string text = exported->ToString();
    if (text.size() + 1 > token_size) {
      // The export stands (a retry with a larger buffer gets the same token).
      too_small = true;
      return absl::OutOfRangeError(absl::StrCat("graphalloc_export_block: the token needs ", text.size() + 1,
                                                " bytes, the buffer has ", token_size));
    }
    std::memcpy(token, text.c_str(), text.size() + 1);
    return absl::OkStatus();
  });
  return too_small ? GRAPHALLOC_BUFFER_TOO_SMALL : code;
}

int graphalloc_export_revoke(void* ptr, int device) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::ipc::BlockExporter*> exporter = graphalloc::c_api::ExporterOf(device);
    if (!exporter.ok()) return exporter.status();
    return (*exporter)->Revoke(reinterpret_cast<graphalloc::DevicePtr>(ptr));
  });
}

int graphalloc_import_block(int device, const char* token, void** ptr, graphalloc_import_t** out) {
  return Guarded([&]() -> absl::Status {
    if (token == nullptr || ptr == nullptr || out == nullptr) {
      return absl::InvalidArgumentError("graphalloc_import_block: token, ptr and out must not be NULL");
    }
    *ptr = nullptr;
    *out = nullptr;
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    absl::StatusOr<graphalloc::ipc::ExportToken> parsed = graphalloc::ipc::ExportToken::Parse(token);
    if (!parsed.ok()) return parsed.status();
    absl::StatusOr<graphalloc::ipc::ImportedBlock> block =
        graphalloc::ipc::ImportBlock((*allocator)->driver(), *parsed);
    if (!block.ok()) return block.status();
    auto import = std::make_unique<graphalloc_import>();
    import->block = *std::move(block);
    *ptr = reinterpret_cast<void*>(import->block.ptr());
    *out = import.release();
    return absl::OkStatus();
  });
}

int graphalloc_import_close(graphalloc_import_t* import) {
  return Guarded([&]() -> absl::Status {
    if (import == nullptr) return absl::OkStatus();
    std::unique_ptr<graphalloc_import> owned(import);
    return owned->block.Close();
  });
}

}  // extern "C"
