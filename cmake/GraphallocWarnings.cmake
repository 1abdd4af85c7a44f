# Warning flags and sanitizers applied to every target the project builds.
function(graphalloc_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${GRAPHALLOC_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${GRAPHALLOC_WERROR}>>:-Werror=all-warnings>)
endfunction()

if(GRAPHALLOC_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${GRAPHALLOC_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${GRAPHALLOC_SANITIZE})
endif()
