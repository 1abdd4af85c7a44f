# libgraphalloc.a and libgraphalloc.so from the one object library, with the same usage requirements.
set(_graphalloc_public_deps
  absl::status absl::statusor absl::strings absl::str_format absl::synchronization absl::flat_hash_map
  absl::flat_hash_set absl::inlined_vector absl::span absl::time Threads::Threads CUDA::toolkit
  ${CMAKE_DL_LIBS})

foreach(kind STATIC SHARED)
  string(TOLOWER ${kind} suffix)
  set(target graphalloc_${suffix})
  add_library(${target} ${kind} $<TARGET_OBJECTS:graphalloc_objects>)
  add_library(graphalloc::graphalloc_${suffix} ALIAS ${target})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME graphalloc EXPORT_NAME graphalloc_${suffix}
                                             VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/graphalloc>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${_graphalloc_public_deps})
  if(GRAPHALLOC_HAVE_CUDA_COMPILER)
    # The CUDA runtime is linked statically; it loads libcuda itself, lazily, like the CudaDriver.
    target_link_libraries(${target} PUBLIC CUDA::cudart_static)
  endif()
  target_compile_features(${target} PUBLIC cxx_std_20)
endforeach()

target_link_options(graphalloc_shared PRIVATE "-Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/graphalloc.map")
set_property(TARGET graphalloc_shared APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/graphalloc.map)

# graphalloc::graphalloc is the shared library: the one PyTorch loads and C++ users link.
add_library(graphalloc INTERFACE)
target_link_libraries(graphalloc INTERFACE graphalloc_shared)
add_library(graphalloc::graphalloc ALIAS graphalloc)
