# Warnings are errors in mixtrain's own targets (never in third-party code).
function(mixtrain_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-error=deprecated-declarations
    # GCC 12 false positives on std::string concatenation (GCC bug 105329 / 105651).
    $<$<CXX_COMPILER_ID:GNU>:-Wno-restrict -Wno-stringop-overflow>>)
endfunction()
