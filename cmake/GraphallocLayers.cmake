# The library's layers (docs/architecture.md). Each is an OBJECT library, graphalloc_<name>, compiled from
# the sources of one folder and linked only to layers defined before it: graphalloc_layer() refuses a
# layer that names one not yet defined, so the order of the add_subdirectory() calls is the layering and
# no dependency can point up. libgraphalloc.{a,so} are made of every layer's objects
# (GraphallocLibrary.cmake).
#
# The compiler enforces the order too. Sources include project headers as "graphalloc/<folder>/<file>.h",
# and each layer has an include root of its own in the build tree, <build>/layers/<name>, holding only its
# own headers (one link per header file, at graphalloc/<folder>/<file>.h): a layer's include path is its
# root and the roots of the layers it links, which it gets from them as usage requirements. A header of a
# layer above, or of one it does not use, is not on the path, so including it is a compile error. The
# project root is on no layer's path, and a relative spelling ("../rng/x.h") is the one the compiler cannot
# refuse: the layering test (tests/layering), which reads the manifest written at the end of configuration,
# reports it, along with every other include against the order.

# The include roots. Programs above the library (tests, tools, benchmarks, examples, python) use all of them,
# through libgraphalloc's usage requirements.
set(GRAPHALLOC_LAYER_ROOTS ${PROJECT_BINARY_DIR}/layers)
file(REMOVE_RECURSE ${GRAPHALLOC_LAYER_ROOTS})

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
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${GRAPHALLOC_LAYER_ROOTS}/${name}>)
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

# After every layer is defined: each layer's include root, and the manifest the layering test reads. A
# layer's headers are those under its folder that are not under the folder of another layer nested in it
# (no layer's folder holds another's today; the rule keeps a nesting honest). CONFIGURE_DEPENDS re-runs the
# configuration when a header is added or removed, so that its link appears or goes.
function(graphalloc_write_layer_manifest)
  get_property(lines GLOBAL PROPERTY GRAPHALLOC_LAYER_MANIFEST)
  set(folders "")
  foreach(line IN LISTS lines)
    string(REPLACE " " ";" fields "${line}")
    list(GET fields 1 folder)
    list(APPEND folders ${folder})
  endforeach()
  set(roots "")
  foreach(line IN LISTS lines)
    string(REPLACE " " ";" fields "${line}")
    list(GET fields 0 name)
    list(GET fields 1 folder)
    list(APPEND roots ${GRAPHALLOC_LAYER_ROOTS}/${name})
    file(MAKE_DIRECTORY ${GRAPHALLOC_LAYER_ROOTS}/${name}/graphalloc)
    file(GLOB_RECURSE headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}
         ${PROJECT_SOURCE_DIR}/${folder}/*.h ${PROJECT_SOURCE_DIR}/${folder}/*.cuh ${PROJECT_SOURCE_DIR}/${folder}/*.inc)
    foreach(header IN LISTS headers)
      set(own TRUE)
      foreach(other IN LISTS folders)
        string(LENGTH "${other}" other_length)
        string(LENGTH "${folder}" folder_length)
        if(other_length GREATER folder_length AND header MATCHES "^${other}/")
          set(own FALSE)
        endif()
      endforeach()
      if(own)
        get_filename_component(dir ${GRAPHALLOC_LAYER_ROOTS}/${name}/graphalloc/${header} DIRECTORY)
        file(MAKE_DIRECTORY ${dir})
        file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${header} ${GRAPHALLOC_LAYER_ROOTS}/${name}/graphalloc/${header}
             SYMBOLIC)
      endif()
    endforeach()
  endforeach()
  set(GRAPHALLOC_ALL_LAYER_ROOTS ${roots} PARENT_SCOPE)
  list(JOIN lines "\n" text)
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/graphalloc_layers.txt CONTENT "${text}\n")
endfunction()
