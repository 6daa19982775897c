# mixtrain_add_plugin(<name> SOURCES <src>... [LIBRARIES <lib>...] [OUTPUT_DIRECTORY <dir>])
#
# Builds libmixtrain_<name>.so as a MODULE against mixtrain::sdk with hidden visibility (only the
# Boost.DLL descriptor alias is exported), an $ORIGIN RPATH, and places it in the plugin folder
# the `mixtrain` executable scans (or OUTPUT_DIRECTORY). Works in-tree and from an installed SDK.
function(mixtrain_add_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIRECTORY" "SOURCES;LIBRARIES" ${ARGN})
  set(target mixtrain_${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE mixtrain::sdk ${ARG_LIBRARIES})
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
  if(NOT ARG_NO_INSTALL AND DEFINED MIXTRAIN_INSTALL_PLUGIN_DIR)
    install(TARGETS ${target} LIBRARY DESTINATION ${MIXTRAIN_INSTALL_PLUGIN_DIR})
  endif()
endfunction()
