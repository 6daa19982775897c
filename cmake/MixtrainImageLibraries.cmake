# The image folders' decoders (core/src/data/image_folder/), as imported targets the core and the
# tests that write images link: mixtrain::turbojpeg (libjpeg-turbo's TurboJPEG API) and PNG::PNG.
#
# TurboJPEG is found by its header and library, not through libjpeg-turbo's own CMake package:
# Debian's names /usr/include and /usr/lib/<arch> absolutely, so a prefix unpacked anywhere else
# (the GPU kit's, bench/gpu/run_h200.sh, on a machine with nothing of Debian's) would send the
# build to files that machine lacks. find_path and find_library search CMAKE_PREFIX_PATH.
find_path(MIXTRAIN_TURBOJPEG_INCLUDE_DIR turbojpeg.h)
find_library(MIXTRAIN_TURBOJPEG_LIBRARY NAMES turbojpeg)
if(NOT MIXTRAIN_TURBOJPEG_INCLUDE_DIR OR NOT MIXTRAIN_TURBOJPEG_LIBRARY)
  message(FATAL_ERROR
    "TurboJPEG (turbojpeg.h and libturbojpeg) not found: image folders decode JPEGs with it. "
    "Install libturbojpeg0-dev (bash cmake/setup-debian.sh does), or point CMAKE_PREFIX_PATH at "
    "a libjpeg-turbo install.")
endif()
add_library(mixtrain::turbojpeg UNKNOWN IMPORTED GLOBAL)
set_target_properties(mixtrain::turbojpeg PROPERTIES
  IMPORTED_LOCATION "${MIXTRAIN_TURBOJPEG_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${MIXTRAIN_TURBOJPEG_INCLUDE_DIR}")
find_package(PNG REQUIRED)
set_target_properties(PNG::PNG PROPERTIES IMPORTED_GLOBAL TRUE)
