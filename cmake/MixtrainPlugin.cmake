# mixtrain_add_plugin(<name> SOURCES <src>... [LIBRARIES <lib>...] [OUTPUT_DIRECTORY <dir>]
#                     [NO_INSTALL])
#
# Builds libmixtrain_<name>.so as a MODULE against mixtrain::sdk (and its static support library,
# mixtrain::sdk_support) and returns nothing; the target is
# named mixtrain_<name>. The same function serves mixtrain's own plugins (in-tree) and plugins built
# against an installed SDK (find_package(mixtrain CONFIG) includes this file), so a plugin behaves
# the same wherever it is built:
# - hidden visibility: of the plugin's own code only the Boost.DLL descriptor alias
#   (MIXTRAIN_PLUGIN) is exported, so two plugins never interpose each other's functions (weak and
#   unique symbols of inline header code still are, as in any GCC shared library);
# - -Wl,--no-undefined: a missing symbol is a link error here rather than a load failure later;
# - RPATH $ORIGIN and $ORIGIN/../..: installed in <prefix>/<libdir>/mixtrain/plugins, the plugin
#   finds libmixtrain_sdk in <prefix>/<libdir>;
# - output into OUTPUT_DIRECTORY, else the in-tree plugin folder (build/lib/mixtrain/plugins, which
#   build/bin/mixtrain scans), else the current binary folder;
# - install() into MIXTRAIN_INSTALL_PLUGIN_DIR (mixtrain's own <libdir>/mixtrain/plugins, which
#   the package config sets, relative to the install prefix) unless NO_INSTALL (test plugins).
# Warnings become errors only in-tree (mixtrain_set_warnings exists there); out-of-tree authors
# choose their own flags.
function(mixtrain_add_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIRECTORY" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "mixtrain_add_plugin(${name}): SOURCES is required")
  endif()
  if(NOT TARGET mixtrain::sdk OR NOT TARGET mixtrain::sdk_support)
    message(FATAL_ERROR "mixtrain_add_plugin(${name}): mixtrain::sdk or mixtrain::sdk_support is not defined; call "
                        "find_package(mixtrain CONFIG REQUIRED) first")
  endif()
  set(target mixtrain_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE mixtrain::sdk mixtrain::sdk_support ${ARG_LIBRARIES})
  # The SDK's fingerprint assumes C++20 on both sides of the boundary.
  target_compile_features(${target} PRIVATE cxx_std_20)
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    BUILD_RPATH "$ORIGIN;$ORIGIN/../..;$ORIGIN/.."
    INSTALL_RPATH "$ORIGIN;$ORIGIN/../..")
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  elseif(DEFINED MIXTRAIN_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${MIXTRAIN_PLUGIN_OUTPUT_DIR})
  endif()
  # Unresolved symbols are load-time errors the registry reports, but catch them at link time.
  target_link_options(${target} PRIVATE -Wl,--no-undefined)
  if(COMMAND mixtrain_set_warnings)
    mixtrain_set_warnings(${target})
  endif()
  if(NOT ARG_NO_INSTALL)
    if(DEFINED MIXTRAIN_INSTALL_PLUGIN_DIR)
      set(plugin_dir ${MIXTRAIN_INSTALL_PLUGIN_DIR})
    else()
      # Out of tree: the layout the `mixtrain` executable scans, relative to the consumer's prefix.
      include(GNUInstallDirs)
      set(plugin_dir ${CMAKE_INSTALL_LIBDIR}/mixtrain/plugins)
    endif()
    install(TARGETS ${target} LIBRARY DESTINATION ${plugin_dir})
  endif()
endfunction()
