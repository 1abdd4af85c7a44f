# `cmake --install` layout and the package config that find_package(graphalloc CONFIG) reads.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS graphalloc graphalloc_static graphalloc_shared EXPORT graphallocTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Headers as users include them, <graphalloc/allocator/...>, <graphalloc/graph/...>, <graphalloc/rng/...>;
# the C ABI also as <graphalloc/graphalloc.h>. The devices' internals (sim/, cuda/) and the headers internal
# to one layer's sources are not installed: no installed header includes them.
install(DIRECTORY allocator graph rng DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/graphalloc
        FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh"
        REGEX "allocator/device/(sim|cuda)/" EXCLUDE REGEX "_internal\\.h$" EXCLUDE)
install(FILES allocator/c_api/graphalloc.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/graphalloc)
install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/graphalloc)
install(EXPORT graphallocTargets NAMESPACE graphalloc:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/graphalloc)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/graphallocConfig.cmake.in
  ${PROJECT_BINARY_DIR}/graphallocConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/graphalloc)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/graphallocConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/graphallocConfig.cmake ${PROJECT_BINARY_DIR}/graphallocConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/graphalloc)
