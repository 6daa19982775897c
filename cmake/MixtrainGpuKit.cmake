# The GPU kit's build and tests (bench/gpu/run_h200.sh builds the target `gpu_kit` and runs
# `ctest -L gpu_kit`), declared here rather than as a hand list in the script, so that a CUDA test
# or benchmark added to the tree is in the kit once its CMakeLists marks it.
#
# mixtrain_gpu_kit(<target>...)   puts targets in the kit (a CUDA benchmark, a test program).
#                                 Test programs also give their tests the ctest label gpu_kit:
#                                 mixtrain_add_test(... GPU_KIT) does both.
# mixtrain_define_gpu_kit()       called once, last, by the top-level CMakeLists: defines
#                                 `gpu_kit` (only when the CUDA backend is built) over mixtrain,
#                                 every target of every in-tree plugin folder, and the marked ones.
function(mixtrain_gpu_kit)
  set_property(GLOBAL APPEND PROPERTY MIXTRAIN_GPU_KIT_TARGETS ${ARGN})
endfunction()

function(mixtrain_define_gpu_kit)
  if(NOT TARGET mixtrain_backend_cuda)
    return()
  endif()
  get_property(targets GLOBAL PROPERTY MIXTRAIN_GPU_KIT_TARGETS)
  get_property(plugin_dirs DIRECTORY ${PROJECT_SOURCE_DIR}/plugins PROPERTY SUBDIRECTORIES)
  foreach(dir IN LISTS plugin_dirs)
    get_property(plugin_targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    list(APPEND targets ${plugin_targets})
  endforeach()
  add_custom_target(gpu_kit COMMENT "The GPU kit's build: mixtrain, the plugins, the CUDA tests and benchmarks")
  add_dependencies(gpu_kit mixtrain ${targets})
endfunction()
