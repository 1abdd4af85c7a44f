# Run by `cmake --install` (GraphallocInstall.cmake): installs the public headers and every header they
# include, transitively, and nothing else. Computed at install time rather than at configure time, so that
# an edited #include needs no reconfiguration. Input: GRAPHALLOC_SOURCE_DIR, GRAPHALLOC_HEADER_DESTINATION
# (relative to the prefix, or absolute), GRAPHALLOC_PUBLIC_HEADERS (paths or globs relative to the source
# root, as included after "graphalloc/") and GRAPHALLOC_PRIVATE_HEADERS (what the globs must leave out).
cmake_policy(VERSION 3.25)  # a script has no project's policies: IN_LIST, among others

set(_pending "")
foreach(pattern IN LISTS GRAPHALLOC_PUBLIC_HEADERS)
  file(GLOB _matches RELATIVE ${GRAPHALLOC_SOURCE_DIR} ${GRAPHALLOC_SOURCE_DIR}/${pattern})
  if(NOT _matches)
    message(FATAL_ERROR "graphalloc install: no public header matches ${pattern}")
  endif()
  list(REMOVE_ITEM _matches ${GRAPHALLOC_PRIVATE_HEADERS})
  list(APPEND _pending ${_matches})
endforeach()

set(_closure "")
while(_pending)
  list(POP_FRONT _pending _header)
  if(_header IN_LIST _closure)
    continue()
  endif()
  if(NOT EXISTS ${GRAPHALLOC_SOURCE_DIR}/${_header})
    message(FATAL_ERROR "graphalloc install: an installed header includes graphalloc/${_header}, which does not exist")
  endif()
  list(APPEND _closure ${_header})
  file(STRINGS ${GRAPHALLOC_SOURCE_DIR}/${_header} _includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]graphalloc/")
  foreach(_line IN LISTS _includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]graphalloc/([^>\"]+)[>\"].*" "\\1" _included "${_line}")
    list(APPEND _pending ${_included})
  endforeach()
endwhile()

if(IS_ABSOLUTE "${GRAPHALLOC_HEADER_DESTINATION}")
  set(_destination "${GRAPHALLOC_HEADER_DESTINATION}")
else()
  set(_destination "${CMAKE_INSTALL_PREFIX}/${GRAPHALLOC_HEADER_DESTINATION}")
endif()
list(SORT _closure)
foreach(_header IN LISTS _closure)
  get_filename_component(_folder ${_header} DIRECTORY)
  file(INSTALL ${GRAPHALLOC_SOURCE_DIR}/${_header} DESTINATION ${_destination}/${_folder})
endforeach()
