# The SDK's ABI guard: kSdkAbiVersion must change whenever a public SDK header's declarations do.
#
# sdk/abi/declarations.txt records, per kSdkAbiVersion, the SHA-256 of the SDK's public
# declarations: every header under sdk/include/mixtrain/sdk, in path order, with comments removed
# and whitespace normalised, so that comment and formatting edits leave the digest alone and
# anything else (a new virtual, a reordered member, a changed default, a new header) changes it.
#
# Script mode (cmake -P); MIXTRAIN_ABI_MODE picks what it does:
#   check   (default) the tree's digest must be the one recorded for the tree's kSdkAbiVersion.
#           Fails, saying what to do, when the declarations changed without a bump or when the
#           bumped version has no record yet. ctest runs this (sdk_abi_declarations).
#   update  appends a record for the tree's kSdkAbiVersion. Refuses to rewrite a version that
#           already has a different digest, and a version not above every recorded one: a released
#           version's declarations are what plugins built against it rely on.
#   digest  prints the tree's version and digest.
#
#   cmake -D MIXTRAIN_ABI_MODE=update -P cmake/MixtrainSdkAbi.cmake   (or: ninja -C build sdk_abi_record)
#
# MIXTRAIN_SDK_HEADERS (the folder holding mixtrain/sdk) and MIXTRAIN_ABI_RECORD default to this
# checkout's; the guard's own test points them at an edited copy.
#
# Normalisation: comments become whitespace (string and character literals are kept verbatim, so
# a "//" inside a string is not a comment); a backslash-newline joins lines; whitespace between two
# tokens counts only where both neighbours are identifier or number characters; preprocessor
# directives keep their own lines. What it does not see: a change to a header outside
# mixtrain/sdk, and whitespace whose meaning C++ cares about outside identifiers (a space between a
# macro's name and "(" in #define, "> >" against ">>"). The guard is a tripwire, not a proof: a
# change in meaning with unchanged declarations (what a function does) still needs a bump by hand.

cmake_minimum_required(VERSION 3.25)

set(_mixtrain_abi_update_command
    "`cmake -D MIXTRAIN_ABI_MODE=update -P cmake/MixtrainSdkAbi.cmake` in the checkout (or `ninja -C build sdk_abi_record`)")

# The text of `path` with comments removed and whitespace normalised (see above).
function(mixtrain_abi_normalise path out_var)
  file(READ "${path}" text)
  string(ASCII 1 kept_space)  # a space inside a literal: survives the whitespace rules below
  set(out "")
  while(NOT text STREQUAL "")
    if(text MATCHES "^[^\"'/]+")
      set(token "${CMAKE_MATCH_0}")
      string(APPEND out "${token}")
    elseif(text MATCHES "^\"([^\"\\\\\n]|\\\\.)*\"")
      set(token "${CMAKE_MATCH_0}")
      string(REPLACE " " "${kept_space}" literal "${token}")
      string(APPEND out "${literal}")
    elseif(text MATCHES "^'([^'\\\\\n]|\\\\.)*'")
      set(token "${CMAKE_MATCH_0}")
      string(REPLACE " " "${kept_space}" literal "${token}")
      string(APPEND out "${literal}")
    elseif(text MATCHES "^//")
      string(FIND "${text}" "\n" end)
      if(end EQUAL -1)
        string(LENGTH "${text}" end)
      endif()
      string(SUBSTRING "${text}" 0 ${end} token)
      string(APPEND out " ")
    elseif(text MATCHES "^/\\*")
      string(FIND "${text}" "*/" end)
      if(end EQUAL -1)
        message(FATAL_ERROR "${path}: unterminated /* comment")
      endif()
      math(EXPR end "${end} + 2")
      string(SUBSTRING "${text}" 0 ${end} token)
      string(APPEND out " ")
    else()
      # A lone '/', '"' or '\'' that starts no literal or comment (a division, a digit separator).
      string(SUBSTRING "${text}" 0 1 token)
      string(APPEND out "${token}")
    endif()
    string(LENGTH "${token}" length)
    string(SUBSTRING "${text}" ${length} -1 text)
  endwhile()

  string(REPLACE "\\\n" " " out "${out}")
  string(REGEX REPLACE "[ \t\r]+" " " out "${out}")
  # Directives end at their line's end: mark their lines, fold every other line break.
  string(REGEX REPLACE "(^|\n) ?(#[^\n]*)" "\\1<mixtrain-directive>\\2</mixtrain-directive>" out
                       "${out}")
  string(REPLACE "\n" " " out "${out}")
  string(REPLACE "<mixtrain-directive>" "\n" out "${out}")
  string(REPLACE "</mixtrain-directive>" "\n" out "${out}")
  string(REGEX REPLACE " +" " " out "${out}")
  string(REGEX REPLACE "([^A-Za-z0-9_]) " "\\1" out "${out}")
  string(REGEX REPLACE " ([^A-Za-z0-9_])" "\\1" out "${out}")
  string(REGEX REPLACE "\n+" "\n" out "${out}")
  string(STRIP "${out}" out)
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# The SHA-256 of every header under <headers>/mixtrain/sdk: each file's path relative to that
# folder, then its normalised text, in path order.
function(mixtrain_abi_digest headers out_var)
  set(sdk_dir "${headers}/mixtrain/sdk")
  file(GLOB_RECURSE files RELATIVE "${sdk_dir}" "${sdk_dir}/*")
  list(SORT files)
  set(all "")
  foreach(file IN LISTS files)
    mixtrain_abi_normalise("${sdk_dir}/${file}" text)
    string(APPEND all "== ${file}\n${text}\n")
  endforeach()
  string(SHA256 digest "${all}")
  set(${out_var} "${digest}" PARENT_SCOPE)
endfunction()

function(mixtrain_abi_version headers out_var)
  mixtrain_abi_normalise("${headers}/mixtrain/sdk/version.h" text)  # a comment may quote it
  if(NOT text MATCHES "kSdkAbiVersion=([0-9]+);")
    message(FATAL_ERROR "no 'kSdkAbiVersion = <n>;' in ${headers}/mixtrain/sdk/version.h")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# <version_var>_DIGEST: the recorded digest of `version` (empty when none); <max_var>: the highest
# recorded version (0 when none).
function(mixtrain_abi_read_record record version digest_var max_var)
  set(found "")
  set(max 0)
  if(EXISTS "${record}")
    file(STRINGS "${record}" lines REGEX "^[0-9]+ [0-9a-f]+$")
    foreach(line IN LISTS lines)
      string(REGEX MATCH "^([0-9]+) ([0-9a-f]+)$" _ "${line}")
      if(CMAKE_MATCH_1 EQUAL version)
        if(NOT found STREQUAL "" AND NOT found STREQUAL CMAKE_MATCH_2)
          message(FATAL_ERROR "${record} records version ${version} twice, with different digests")
        endif()
        set(found "${CMAKE_MATCH_2}")
      endif()
      if(CMAKE_MATCH_1 GREATER max)
        set(max "${CMAKE_MATCH_1}")
      endif()
    endforeach()
  endif()
  set(${digest_var} "${found}" PARENT_SCOPE)
  set(${max_var} "${max}" PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT DEFINED MIXTRAIN_SDK_HEADERS)
    set(MIXTRAIN_SDK_HEADERS "${CMAKE_CURRENT_LIST_DIR}/../sdk/include")
  endif()
  if(NOT DEFINED MIXTRAIN_ABI_RECORD)
    set(MIXTRAIN_ABI_RECORD "${CMAKE_CURRENT_LIST_DIR}/../sdk/abi/declarations.txt")
  endif()
  if(NOT DEFINED MIXTRAIN_ABI_MODE)
    set(MIXTRAIN_ABI_MODE check)
  endif()

  mixtrain_abi_version("${MIXTRAIN_SDK_HEADERS}" version)
  mixtrain_abi_digest("${MIXTRAIN_SDK_HEADERS}" digest)
  mixtrain_abi_read_record("${MIXTRAIN_ABI_RECORD}" ${version} recorded max)
  math(EXPR next "${version} + 1")

  if(MIXTRAIN_ABI_MODE STREQUAL "digest")
    message("${version} ${digest}")
  elseif(MIXTRAIN_ABI_MODE STREQUAL "check")
    if(recorded STREQUAL digest)
      message(STATUS "SDK public declarations match kSdkAbiVersion ${version}")
    elseif(NOT recorded STREQUAL "")
      message(FATAL_ERROR
        "SDK public declarations changed without a kSdkAbiVersion bump: bump it to ${next} in "
        "sdk/include/mixtrain/sdk/version.h and run ${_mixtrain_abi_update_command}\n"
        "(version ${version} is recorded as ${recorded}, the headers now give ${digest})")
    elseif(version GREATER max)
      message(FATAL_ERROR
        "kSdkAbiVersion ${version} has no record in ${MIXTRAIN_ABI_RECORD}: run "
        "${_mixtrain_abi_update_command} to record its declarations")
    else()
      message(FATAL_ERROR
        "kSdkAbiVersion ${version} is below the highest recorded version ${max} and has no "
        "record: versions only go up; set it to ${max} + 1 and run ${_mixtrain_abi_update_command}")
    endif()
  elseif(MIXTRAIN_ABI_MODE STREQUAL "update")
    if(recorded STREQUAL digest)
      message(STATUS "kSdkAbiVersion ${version} is already recorded with these declarations")
    elseif(NOT recorded STREQUAL "")
      message(FATAL_ERROR
        "refusing to rewrite the record of kSdkAbiVersion ${version}: plugins built against it "
        "rely on its declarations. Bump kSdkAbiVersion to ${next} in "
        "sdk/include/mixtrain/sdk/version.h, then run this again")
    elseif(NOT version GREATER max)
      message(FATAL_ERROR
        "refusing to record kSdkAbiVersion ${version}: it is not above the highest recorded "
        "version ${max}")
    else()
      file(APPEND "${MIXTRAIN_ABI_RECORD}" "${version} ${digest}\n")
      message(STATUS "recorded kSdkAbiVersion ${version}: ${digest}")
    endif()
  else()
    message(FATAL_ERROR "MIXTRAIN_ABI_MODE must be check, update or digest, not '${MIXTRAIN_ABI_MODE}'")
  endif()
endif()
