# `cmake --install` layout and the package config that find_package(graphalloc CONFIG) reads.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS graphalloc graphalloc_static graphalloc_shared EXPORT graphallocTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Headers as users include them, <graphalloc/allocator/...>, <graphalloc/graph/...>, <graphalloc/rng/...>;
# the C ABI also as <graphalloc/graphalloc.h>. The public headers (docs/architecture.md, "Public API and
# exported symbols"; cmake/graphalloc.map exports what they declare) and the headers they include, which
# an installed header needs to compile (the members of public classes); every other header is internal and
# stays in the source tree. GraphallocInstallHeaders.cmake follows the includes when installing.
set(GRAPHALLOC_PUBLIC_HEADERS
  allocator/c_api/graphalloc.h
  allocator/core/caching_allocator.h allocator/core/config.h allocator/stats/stats.h allocator/stats/stat_names.h
  allocator/core/private_pool.h allocator/core/pool_handle.h allocator/core/pool_checkpoint.h allocator/core/pool_sleep.h
  allocator/core/mapping_observer.h allocator/core/segment_source.h allocator/snapshot/memory_snapshot.h
  allocator/snapshot/snapshot_json.h
  allocator/history/history_ring.h allocator/core/default_allocator.h
  allocator/device/driver.h allocator/device/driver_error.h allocator/device/forwarding_driver.h
  allocator/device/sim_driver.h allocator/device/cuda_driver.h
  graph/*.h lifetime/*.h rng/*.h)
# The CUDA launchers, plain C++ for nvcc: called by the random ops' sources only.
set(GRAPHALLOC_PRIVATE_HEADERS rng/random_kernels_cuda.h)
install(CODE "set(GRAPHALLOC_SOURCE_DIR \"${PROJECT_SOURCE_DIR}\")
set(GRAPHALLOC_HEADER_DESTINATION \"${CMAKE_INSTALL_INCLUDEDIR}/graphalloc\")
set(GRAPHALLOC_PUBLIC_HEADERS \"${GRAPHALLOC_PUBLIC_HEADERS}\")
set(GRAPHALLOC_PRIVATE_HEADERS \"${GRAPHALLOC_PRIVATE_HEADERS}\")")
install(SCRIPT ${PROJECT_SOURCE_DIR}/cmake/GraphallocInstallHeaders.cmake)
install(FILES allocator/c_api/graphalloc.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/graphalloc)
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/graphalloc)
install(EXPORT graphallocTargets NAMESPACE graphalloc:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/graphalloc)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/graphallocConfig.cmake.in
  ${PROJECT_BINARY_DIR}/graphallocConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/graphalloc)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/graphallocConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/graphallocConfig.cmake ${PROJECT_BINARY_DIR}/graphallocConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/graphalloc)
