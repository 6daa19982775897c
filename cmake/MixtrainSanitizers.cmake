# MIXTRAIN_SANITIZE: every C++ target of the build with AddressSanitizer + UndefinedBehaviorSanitizer,
# and any finding aborts (-fno-sanitize-recover=all). The CI's sanitizer leg (tests/sanitize/run.sh).
# MIXTRAIN_BUILD_FUZZERS: the libFuzzer harnesses of tests/fuzz (clang only). It implies
# MIXTRAIN_SANITIZE and adds libFuzzer's coverage instrumentation to every target, so coverage
# reaches into the core and the plugins the harnesses load (all but the CPU backend's element
# and tile kernels, which no harness runs: plugins/backend_cpu/CMakeLists.txt). Such a build
# still runs the test suites: the sanitizer runtime provides the coverage callbacks outside a
# fuzzer.
option(MIXTRAIN_SANITIZE "Build everything with ASan + UBSan (halt on the first finding)" OFF)
option(MIXTRAIN_BUILD_FUZZERS "Build the libFuzzer harnesses in tests/fuzz (clang; implies MIXTRAIN_SANITIZE)" OFF)

if(MIXTRAIN_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "MIXTRAIN_BUILD_FUZZERS needs clang (libFuzzer), e.g. "
                        "-DCMAKE_CXX_COMPILER=clang++-14; this build uses ${CMAKE_CXX_COMPILER_ID}")
  endif()
  set(MIXTRAIN_SANITIZE ON)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()

if(MIXTRAIN_SANITIZE)
  set(mixtrain_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=all)
  foreach(flag IN LISTS mixtrain_sanitize_flags ITEMS -fno-omit-frame-pointer)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:${flag}>)
  endforeach()
  add_link_options(${mixtrain_sanitize_flags})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    # clang links its sanitizer runtime statically into executables only, and plugins link with
    # -Wl,--no-undefined: every binary uses the shared runtime instead, found through an RPATH.
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libclang_rt.asan-x86_64.so
                    OUTPUT_VARIABLE mixtrain_asan_runtime OUTPUT_STRIP_TRAILING_WHITESPACE)
    get_filename_component(mixtrain_asan_runtime_dir "${mixtrain_asan_runtime}" DIRECTORY)
    add_link_options(-shared-libsan "LINKER:-rpath,${mixtrain_asan_runtime_dir}")
    # ASan's checks inside `#pragma omp simd` loops stop clang vectorizing them, and clang
    # warns that the requested transformation failed: true, and harmless in this build.
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-pass-failed>)
  endif()
endif()
