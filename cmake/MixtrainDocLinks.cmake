# Run at install time (install(CODE) in MixtrainInstall.cmake), after the documentation is
# installed: rewrites each installed document's links into the source tree's header folders
# (sdk/include/..., core/include/...) to the installed headers under <includedir>, where an
# install puts them. The documents are written for the source tree, where those links work as
# written; elsewhere in an install the source tree's layout is kept (docs/, samples/, plugins/),
# so their other relative links work unchanged. tests/install/docs_links_resolve.py checks both.
#
# In: MIXTRAIN_DOC_DIR and MIXTRAIN_INCLUDE_DIR, each relative to the install prefix or absolute.
foreach(var MIXTRAIN_DOC_DIR MIXTRAIN_INCLUDE_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "MixtrainDocLinks.cmake: ${var} is not set")
  endif()
endforeach()

function(mixtrain_installed_path out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "$ENV{DESTDIR}${dir}" PARENT_SCOPE)
  else()
    set(${out} "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${dir}" PARENT_SCOPE)
  endif()
endfunction()

mixtrain_installed_path(doc_dir "${MIXTRAIN_DOC_DIR}")
mixtrain_installed_path(include_dir "${MIXTRAIN_INCLUDE_DIR}")
file(GLOB_RECURSE documents "${doc_dir}/*.md")
foreach(document IN LISTS documents)
  file(RELATIVE_PATH from_doc_dir "${doc_dir}" "${document}")  # docs/writing-plugins.md
  get_filename_component(folder "${from_doc_dir}" DIRECTORY)  # docs
  # How the source tree's links climb from the document's folder to the tree's root: "../" per
  # level ("" for README.md at the root).
  set(up "")
  if(folder)
    string(REGEX REPLACE "[^/]+" ".." up "${folder}")
    string(APPEND up "/")
  endif()
  file(RELATIVE_PATH to_include "${doc_dir}/${folder}" "${include_dir}")
  file(READ "${document}" text)
  set(before "${text}")
  foreach(headers sdk/include core/include)
    string(REPLACE "](${up}${headers}/" "](${to_include}/" text "${text}")
  endforeach()
  if(NOT text STREQUAL before)
    file(WRITE "${document}" "${text}")
  endif()
endforeach()
