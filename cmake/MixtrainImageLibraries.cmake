# The image folders' decoders (core/src/data/image_folder/), as imported targets the core and the
# tests that write images link: mixtrain::jpeg (libjpeg-turbo's libjpeg API) and PNG::PNG.
#
# libjpeg is found by its headers and library rather than by CMake's FindJPEG, for two reasons:
# jpeglib.h includes jconfig.h, which Debian keeps in the multiarch folder
# (/usr/include/x86_64-linux-gnu) that FindJPEG does not add, and which a compiler searches by
# itself only under /usr; and a prefix unpacked anywhere else (the GPU kit's, bench/gpu/
# run_h200.sh, on a machine with nothing of Debian's) is searched through CMAKE_PREFIX_PATH, its
# multiarch folder included, by find_path and find_library.
find_path(MIXTRAIN_JPEG_INCLUDE_DIR jpeglib.h)
find_path(MIXTRAIN_JCONFIG_INCLUDE_DIR jconfig.h)
find_library(MIXTRAIN_JPEG_LIBRARY NAMES jpeg)
if(NOT MIXTRAIN_JPEG_INCLUDE_DIR OR NOT MIXTRAIN_JCONFIG_INCLUDE_DIR OR NOT MIXTRAIN_JPEG_LIBRARY)
  message(FATAL_ERROR
    "libjpeg (jpeglib.h, jconfig.h and libjpeg) not found: image folders decode JPEGs with it. "
    "Install libjpeg62-turbo-dev (bash cmake/setup-debian.sh does), or point CMAKE_PREFIX_PATH "
    "at a libjpeg-turbo install.")
endif()
add_library(mixtrain::jpeg UNKNOWN IMPORTED GLOBAL)
set_target_properties(mixtrain::jpeg PROPERTIES
  IMPORTED_LOCATION "${MIXTRAIN_JPEG_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${MIXTRAIN_JPEG_INCLUDE_DIR};${MIXTRAIN_JCONFIG_INCLUDE_DIR}")
find_package(PNG REQUIRED)
set_target_properties(PNG::PNG PROPERTIES IMPORTED_GLOBAL TRUE)
