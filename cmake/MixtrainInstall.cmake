# Installs the CMake package of mixtrain: targets export (mixtrain::sdk, mixtrain::core), config,
# version file and MixtrainPlugin.cmake, into <libdir>/cmake/mixtrain; and the documentation
# (README, docs/, configs/, plugin READMEs, samples/) into share/doc/mixtrain. Included once at the end of
# the top-level CMakeLists, after every target with EXPORT mixtrain-targets exists.
include(CMakePackageConfigHelpers)

set(MIXTRAIN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/mixtrain)
set(MIXTRAIN_BOOST_MIN_VERSION 1.74)
if(NOT DEFINED MIXTRAIN_INSTALL_PLUGIN_DIR)
  set(MIXTRAIN_INSTALL_PLUGIN_DIR ${CMAKE_INSTALL_LIBDIR}/mixtrain/plugins)
endif()

install(EXPORT mixtrain-targets
  FILE mixtrainTargets.cmake
  NAMESPACE mixtrain::
  DESTINATION ${MIXTRAIN_INSTALL_CMAKEDIR})

configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/mixtrainConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/mixtrainConfig.cmake
  INSTALL_DESTINATION ${MIXTRAIN_INSTALL_CMAKEDIR}
  PATH_VARS MIXTRAIN_INSTALL_PLUGIN_DIR CMAKE_INSTALL_BINDIR)
# Pre-1.0: a minor release may change the SDK ABI, so only the same major.minor is compatible.
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/mixtrainConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)

install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/mixtrainConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/mixtrainConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/MixtrainPlugin.cmake
  DESTINATION ${MIXTRAIN_INSTALL_CMAKEDIR})

# The documentation, laid out as in the source tree so that its relative links still resolve:
# <docdir>/README.md, docs/, plugins/<name>/README.md and samples/ (sources only, no build output).
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
# The configs the README and the samples run (configs/quickstart.toml, ...), beside them.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/configs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/configs)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
file(GLOB MIXTRAIN_PLUGIN_READMES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/plugins/*/README.md)
foreach(readme IN LISTS MIXTRAIN_PLUGIN_READMES)
  get_filename_component(plugin_dir ${readme} DIRECTORY)
  get_filename_component(plugin_name ${plugin_dir} NAME)
  install(FILES ${readme} DESTINATION ${CMAKE_INSTALL_DOCDIR}/plugins/${plugin_name})
endforeach()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/samples/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/samples
  FILES_MATCHING PATTERN "*.md" PATTERN "*.txt" PATTERN "*.cpp" PATTERN "*.h" PATTERN "*.py"
                 PATTERN "*.toml"
  PATTERN "build*" EXCLUDE)
# The documents' links into the source tree's headers (sdk/include/, core/include/) lead to the
# installed headers instead: an install has no sdk/ folder. Last, after every document is in place.
install(CODE "set(MIXTRAIN_DOC_DIR \"${CMAKE_INSTALL_DOCDIR}\")
set(MIXTRAIN_INCLUDE_DIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
include(\"${CMAKE_CURRENT_LIST_DIR}/MixtrainDocLinks.cmake\")")
