# The GPU kit's build and tests (bench/gpu/run_h200.sh builds the target `gpu_kit` and runs
# `ctest -L gpu_kit -LE gpu_kit_host`), declared here rather than as a hand list in the script, so
# that a CUDA test or benchmark added to the tree is in the kit once its CMakeLists marks it.
#
# mixtrain_gpu_kit(<target>...)   puts targets in the kit (a CUDA benchmark, a test program).
#                                 Test programs also give their tests the ctest label gpu_kit:
#                                 mixtrain_add_test(... GPU_KIT) does both.
# mixtrain_define_gpu_kit()       called once, last, by the top-level CMakeLists: defines
#                                 `gpu_kit` (only when the CUDA backend is built) over mixtrain,
#                                 every target of every in-tree plugin folder, and the marked ones;
#                                 and labels the kit's host-only test programs gpu_kit_host (below).
function(mixtrain_gpu_kit)
  set_property(GLOBAL APPEND PROPERTY MIXTRAIN_GPU_KIT_TARGETS ${ARGN})
endfunction()

# _mixtrain_gpu_kit_reaches_cuda(<target> <out>): <out> is TRUE when <target> links a CUDA library
# (CUDA::*) or the CUDA backend (mixtrain_backend_cuda*), directly or through any library it links
# (private links included: a shared library's CUDA is mapped into the program all the same), or
# depends on the CUDA plugin (add_dependencies: test_conformance loads it at run time).
function(_mixtrain_gpu_kit_reaches_cuda target out)
  set(stack ${target})
  set(seen "")
  while(stack)
    list(POP_FRONT stack t)
    if(t IN_LIST seen)
      continue()
    endif()
    list(APPEND seen "${t}")
    # Generator expressions ($<LINK_ONLY:CUDA::cudart>) are matched as text.
    if(t MATCHES "CUDA::|mixtrain_backend_cuda")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    string(REGEX REPLACE "^\\$<(LINK_ONLY|BUILD_INTERFACE|BUILD_LOCAL_INTERFACE):(.*)>$" "\\2" t "${t}")
    if(NOT TARGET "${t}")
      continue()
    endif()
    get_target_property(aliased "${t}" ALIASED_TARGET)
    if(aliased)
      list(APPEND stack "${aliased}")
      continue()
    endif()
    foreach(prop INTERFACE_LINK_LIBRARIES LINK_LIBRARIES MANUALLY_ADDED_DEPENDENCIES)
      get_target_property(items "${t}" ${prop})
      if(items)
        list(APPEND stack ${items})
      endif()
    endforeach()
  endwhile()
  set(${out} FALSE PARENT_SCOPE)
endfunction()

# The kit's host-only test programs: a marked test program that reaches no CUDA library (above)
# cannot touch a GPU (the element math, the GEMM routes, the block-scaled rules, ...). CI runs them
# on every push; on the lent GPU, whose minutes are counted, they only cost time, so their tests
# are relabelled "gpu_kit;gpu_kit_host" and the kit's test stage leaves them out (-LE gpu_kit_host).
# The relabelling runs when ctest reads the tests: gtest_discover_tests lists a program's tests in
# <program>_TESTS (discovery at build time or, under PRE_TEST, at ctest's start), and a file
# appended to the folder's TEST_INCLUDE_FILES after discovery's own include sets their LABELS.
function(_mixtrain_label_gpu_kit_host_tests targets)
  set(host_only "")
  set(dirs "")
  foreach(t IN LISTS targets)
    if(NOT TARGET ${t})
      continue()
    endif()
    get_target_property(type ${t} TYPE)
    if(NOT type STREQUAL "EXECUTABLE")
      continue()
    endif()
    _mixtrain_gpu_kit_reaches_cuda(${t} reaches)
    if(NOT reaches)
      list(APPEND host_only ${t})
      get_target_property(dir ${t} SOURCE_DIR)
      string(MD5 key "${dir}")
      list(APPEND dirs "${dir}")
      list(APPEND programs_${key} ${t})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  foreach(dir IN LISTS dirs)
    # One file per folder, naming only that folder's programs: ctest reads each folder's tests
    # apart, and set_tests_properties fails on a test it does not know.
    string(MD5 key "${dir}")
    set(programs ${programs_${key}})
    list(REMOVE_DUPLICATES programs)
    set(file "${CMAKE_BINARY_DIR}/gpu_kit/host_labels_${key}.cmake")
    set(text "# Written by cmake/MixtrainGpuKit.cmake: these programs reach no CUDA library.\n")
    foreach(p IN LISTS programs)
      string(APPEND text "if(${p}_TESTS)\n"
                         "  set_tests_properties(\${${p}_TESTS} PROPERTIES LABELS \"gpu_kit;gpu_kit_host\")\n"
                         "endif()\n")
    endforeach()
    file(WRITE "${file}" "${text}")
    set_property(DIRECTORY "${dir}" APPEND PROPERTY TEST_INCLUDE_FILES "${file}")
  endforeach()
  list(JOIN host_only " " shown)
  message(STATUS "mixtrain: GPU kit test programs that reach no CUDA library (label gpu_kit_host, "
                 "left out on the GPU): ${shown}")
endfunction()

function(mixtrain_define_gpu_kit)
  if(NOT TARGET mixtrain_backend_cuda)
    return()
  endif()
  get_property(targets GLOBAL PROPERTY MIXTRAIN_GPU_KIT_TARGETS)
  _mixtrain_label_gpu_kit_host_tests("${targets}")
  get_property(plugin_dirs DIRECTORY ${PROJECT_SOURCE_DIR}/plugins PROPERTY SUBDIRECTORIES)
  foreach(dir IN LISTS plugin_dirs)
    get_property(plugin_targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    list(APPEND targets ${plugin_targets})
  endforeach()
  add_custom_target(gpu_kit COMMENT "The GPU kit's build: mixtrain, the plugins, the CUDA tests and benchmarks")
  add_dependencies(gpu_kit mixtrain ${targets})
endfunction()
