# The library's layers (docs/architecture.md). Each is an OBJECT library, graphalloc_<name>, compiled from
# the sources of one folder and linked only to layers defined before it: graphalloc_layer() refuses a
# layer that names one not yet defined, so the order of the add_subdirectory() calls is the layering and
# no dependency can point up. libgraphalloc.{a,so} are made of every layer's objects
# (GraphallocLibrary.cmake). Sources include project headers as "graphalloc/<folder>/<file>.h" through one
# include root in the build tree; the project root itself is on no layer's include path, so nothing else
# reaches them. The layering test (tests/layering) reads the manifest written at the end of configuration
# and fails on any include that runs against the order.

# The include root: <build>/include/graphalloc/{allocator,graph,rng} link to the source folders, as
# <prefix>/include/graphalloc/... holds the installed headers.
set(GRAPHALLOC_INCLUDE_ROOT ${PROJECT_BINARY_DIR}/include)
file(MAKE_DIRECTORY ${GRAPHALLOC_INCLUDE_ROOT}/graphalloc)
foreach(folder allocator graph rng)
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${GRAPHALLOC_INCLUDE_ROOT}/graphalloc/${folder} SYMBOLIC)
endforeach()

# What every layer and the installed libraries use publicly (base carries it to every other layer).
set(GRAPHALLOC_PUBLIC_DEPS
  absl::status absl::statusor absl::strings absl::str_format absl::synchronization absl::flat_hash_map
  absl::flat_hash_set absl::inlined_vector absl::span absl::time Threads::Threads CUDA::toolkit
  ${CMAKE_DL_LIBS})

# graphalloc_layer(<name> SOURCES <files...> [LAYERS <layers below...>] [PUBLIC <libs...>] [PRIVATE <libs...>])
# A layer of the folder of the calling CMakeLists.txt. LAYERS are the layers it uses directly; it may
# include their headers and those of every layer they use in turn.
function(graphalloc_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;LAYERS;PUBLIC;PRIVATE" ${ARGN})
  set(target graphalloc_${name})
  add_library(${target} OBJECT ${L_SOURCES})
  graphalloc_set_warnings(${target})
  # Position-independent code (for libgraphalloc.so) lets another library interpose any global function,
  # so GCC would neither inline nor specialise one inside its own translation unit and would call it
  # through the PLT: the hot path's small steps (a free's statistics, a split) became calls of their own
  # once the core was split into parts. Nothing may interpose graphalloc's internals (the version script
  # exports only the API), so the compiler may treat each definition as final.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang>:-fno-semantic-interposition>)
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${GRAPHALLOC_INCLUDE_ROOT}>)
  target_compile_features(${target} PUBLIC cxx_std_20)
  get_property(defined GLOBAL PROPERTY GRAPHALLOC_LAYER_NAMES)
  foreach(layer IN LISTS L_LAYERS)
    if(NOT layer IN_LIST defined)
      message(FATAL_ERROR "graphalloc layer '${name}' uses '${layer}', which is not a layer below it "
                          "(defined so far: ${defined}); see docs/architecture.md")
    endif()
    target_link_libraries(${target} PUBLIC graphalloc_${layer})
  endforeach()
  target_link_libraries(${target} PUBLIC ${L_PUBLIC} PRIVATE ${L_PRIVATE})
  file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  string(REPLACE ";" "," deps "${L_LAYERS}")
  if(deps STREQUAL "")
    set(deps "-")
  endif()
  set_property(GLOBAL APPEND PROPERTY GRAPHALLOC_LAYER_NAMES ${name})
  set_property(GLOBAL APPEND PROPERTY GRAPHALLOC_LAYER_MANIFEST "${name} ${folder} ${deps}")
endfunction()

# After every layer is defined: the manifest the layering test reads.
function(graphalloc_write_layer_manifest)
  get_property(lines GLOBAL PROPERTY GRAPHALLOC_LAYER_MANIFEST)
  list(JOIN lines "\n" text)
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/graphalloc_layers.txt CONTENT "${text}\n")
endfunction()
