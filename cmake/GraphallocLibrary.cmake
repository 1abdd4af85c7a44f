# libgraphalloc.a and libgraphalloc.so, each made of every layer's objects (GraphallocLayers.cmake), with the
# same usage requirements.
get_property(_graphalloc_layers GLOBAL PROPERTY GRAPHALLOC_LAYER_NAMES)
foreach(kind STATIC SHARED)
  string(TOLOWER ${kind} suffix)
  set(target graphalloc_${suffix})
  add_library(${target} ${kind})
  foreach(layer IN LISTS _graphalloc_layers)
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:graphalloc_${layer}>)
  endforeach()
  add_library(graphalloc::graphalloc_${suffix} ALIAS ${target})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME graphalloc EXPORT_NAME graphalloc_${suffix}
                                             VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
  # Users write #include <graphalloc/...>. In the build tree that is every layer's include root
  # (GraphallocLayers.cmake); the project's own programs (tests, tools, benchmarks, examples) also include
  # their own headers by path from the project root.
  foreach(root IN LISTS GRAPHALLOC_ALL_LAYER_ROOTS)
    target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${root}>)
  endforeach()
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${target} PUBLIC ${GRAPHALLOC_PUBLIC_DEPS})
  if(GRAPHALLOC_HAVE_CUDA_COMPILER)
    # The CUDA runtime is linked statically; it loads libcuda itself, lazily, like the CudaDriver.
    target_link_libraries(${target} PUBLIC CUDA::cudart_static)
  endif()
  target_compile_features(${target} PUBLIC cxx_std_20)
endforeach()
# zlib (the trace layer's): passed on to users of the static library, private to the shared one.
target_link_libraries(graphalloc_static PUBLIC ZLIB::ZLIB)
target_link_libraries(graphalloc_shared PRIVATE ZLIB::ZLIB)

target_link_options(graphalloc_shared PRIVATE "-Wl,--version-script=${PROJECT_SOURCE_DIR}/cmake/graphalloc.map")
set_property(TARGET graphalloc_shared APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/graphalloc.map)

# graphalloc::graphalloc is the shared library: the one PyTorch loads and C++ users link.
add_library(graphalloc INTERFACE)
target_link_libraries(graphalloc INTERFACE graphalloc_shared)
add_library(graphalloc::graphalloc ALIAS graphalloc)
