# Warnings for our own targets (not for third-party code).
function(fopt_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wno-psabi)
  if(FOPT_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
