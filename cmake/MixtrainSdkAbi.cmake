# The SDK's ABI guard: a declaration change is a version step, of the core boundary or of one facet.
#
# Two kinds of record in sdk/abi/declarations.txt (docs/architecture.md, "Plugins and the ABI"):
#   core <kSdkAbiVersion> <sha256>     every public header under sdk/include/mixtrain/sdk but the
#                                      facets' (backend_*.h, policy_*.h, optimizer_*.h, format_*.h),
#                                      the facet
#                                      list and support/: the
#                                      descriptor, the factories, the component interfaces and the
#                                      types they use. A change breaks every plugin.
#   facet <kName> <major.minor> <sha256>  one facet header (backend_<facet>.h, or policy_<facet>.h
#                                      / optimizer_<facet>.h / format_<facet>.h for a facet a
#                                      precision policy / an optimizer / a checkpoint format
#                                      offers): its kName and
#                                      kVersion are read from it. A change is a minor step (methods
#                                      appended) or a major one (anything else), for that facet only,
#                                      except that a facet header a core header includes (optimizer.h
#                                      takes ParamTensors from backend_optimizer_updates.h) holds
#                                      core types: its major step needs a core bump too.
# support/ (helpers a plugin compiles in) and facet_list.h are in no record. Lines of the form
# "<n> <sha256>" are the records of the scheme before core 14 (one digest of every header), kept.
# The record is append-only, and its own git history holds it to that: every version of it
# committed since the scheme began (MIXTRAIN_ABI_HISTORY_SINCE, 0fc9ddf) must be in the record
# checked, its lines in its order (a prefix, unless a merge put another branch's appended lines
# between them), so a rewritten or removed line fails even when no header asks for its digest.
# Outside a git checkout (a tarball) that part is skipped, saying so.
#
# Script mode (cmake -P); MIXTRAIN_ABI_MODE picks what it does:
#   check   (default) every subject's digest is the one recorded for its version, and every
#           committed version of the record is in it, in order. Fails, saying which version step to
#           take or which line was rewritten, otherwise.
#   update  appends a record for each subject whose version has none. Refuses to
#           rewrite a recorded version, and a version not above that subject's recorded ones.
#   digest  prints each subject's version and digest.
#
#   cmake -D MIXTRAIN_ABI_MODE=update -P cmake/MixtrainSdkAbi.cmake   (or: ninja -C build sdk_abi_record)
#
# MIXTRAIN_SDK_HEADERS (the folder holding mixtrain/sdk) and MIXTRAIN_ABI_RECORD default to this
# checkout's; the guard's own test points them at an edited copy in a git repository of its own.
# MIXTRAIN_ABI_HISTORY_SINCE: the oldest commit whose record must still be held (empty: every
# commit that touched the record).
#
# Normalisation: comments become whitespace (string and character literals are kept verbatim, so
# a "//" inside a string is not a comment); a backslash-newline joins lines; whitespace between two
# tokens counts only where both neighbours are identifier or number characters; preprocessor
# directives keep their own lines. What it does not see: a change to a header outside
# mixtrain/sdk, and whitespace whose meaning C++ cares about outside identifiers (a space between a
# macro's name and "(" in #define, "> >" against ">>"). The guard is a tripwire, not a proof: a
# change in meaning with unchanged declarations (what a function does) still needs a step by hand.

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

# The SHA-256 of `files` (paths relative to <headers>/mixtrain/sdk): each one's path, then its
# normalised text, in path order.
function(mixtrain_abi_digest headers files out_var)
  set(sdk_dir "${headers}/mixtrain/sdk")
  list(SORT files)
  set(all "")
  foreach(file IN LISTS files)
    mixtrain_abi_normalise("${sdk_dir}/${file}" text)
    string(APPEND all "== ${file}\n${text}\n")
  endforeach()
  string(SHA256 digest "${all}")
  set(${out_var} "${digest}" PARENT_SCOPE)
endfunction()

# The subjects of the record: <out>_SUBJECTS (core, facet:<name>...), and per subject
# <out>_<subject>_VERSION, _DIGEST and _WHAT (the header or "the core boundary").
function(mixtrain_abi_subjects headers out)
  set(sdk_dir "${headers}/mixtrain/sdk")
  file(GLOB_RECURSE all RELATIVE "${sdk_dir}" "${sdk_dir}/*")
  set(core_files "")
  set(subjects core)
  foreach(file IN LISTS all)
    if(file MATCHES "^support/" OR file STREQUAL "facet_list.h")
      continue()
    elseif(file MATCHES "^(backend|policy|optimizer|format)_[a-z_]+\\.h$")
      mixtrain_abi_normalise("${sdk_dir}/${file}" text)
      if(NOT text MATCHES "kName=\"([a-z_]+)\"")
        message(FATAL_ERROR "${sdk_dir}/${file}: a facet header declares kName = \"<name>\"")
      endif()
      set(name "${CMAKE_MATCH_1}")
      if(NOT text MATCHES "kVersion{([0-9]+),([0-9]+)}")
        message(FATAL_ERROR "${sdk_dir}/${file}: a facet header declares kVersion{<major>, <minor>}")
      endif()
      set(version "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
      mixtrain_abi_digest("${headers}" "${file}" digest)
      list(APPEND subjects "facet:${name}")
      set(${out}_facet:${name}_VERSION "${version}" PARENT_SCOPE)
      set(${out}_facet:${name}_DIGEST "${digest}" PARENT_SCOPE)
      set(${out}_facet:${name}_WHAT "${file}" PARENT_SCOPE)
    else()
      list(APPEND core_files "${file}")
    endif()
  endforeach()
  # A facet header a core header includes (optimizer.h takes ParamTensors from the optimizer
  # facet's header) carries types of the core boundary: its major step is a core change too.
  foreach(file IN LISTS core_files)
    file(STRINGS "${sdk_dir}/${file}" includes REGEX "^#include \"mixtrain/sdk/(backend|policy|optimizer|format)_[a-z_]+\\.h\"")
    foreach(line IN LISTS includes)
      string(REGEX MATCH "mixtrain/sdk/([a-z_]+\\.h)" _ "${line}")
      set(included "${CMAKE_MATCH_1}")
      mixtrain_abi_normalise("${sdk_dir}/${included}" text)
      if(text MATCHES "kName=\"([a-z_]+)\"")
        set(${out}_facet:${CMAKE_MATCH_1}_CORE_INCLUDER "${file}" PARENT_SCOPE)
      endif()
    endforeach()
  endforeach()
  mixtrain_abi_normalise("${sdk_dir}/version.h" text)  # a comment may quote it
  if(NOT text MATCHES "kSdkAbiVersion=([0-9]+);")
    message(FATAL_ERROR "no 'kSdkAbiVersion = <n>;' in ${sdk_dir}/version.h")
  endif()
  set(${out}_core_VERSION "${CMAKE_MATCH_1}" PARENT_SCOPE)
  mixtrain_abi_digest("${headers}" "${core_files}" digest)
  set(${out}_core_DIGEST "${digest}" PARENT_SCOPE)
  set(${out}_core_WHAT "the core boundary" PARENT_SCOPE)
  set(${out}_SUBJECTS "${subjects}" PARENT_SCOPE)
endfunction()

# A subject's record line, without the digest: "core 14", "facet gemm 1.0".
function(mixtrain_abi_key subject version out_var)
  if(subject STREQUAL "core")
    set(${out_var} "core ${version}" PARENT_SCOPE)
  else()
    string(REPLACE "facet:" "facet " key "${subject}")
    set(${out_var} "${key} ${version}" PARENT_SCOPE)
  endif()
endfunction()

# From the record: <digest_var> the digest of `subject` at `version` (empty when none), <max_var>
# its highest recorded version (empty when none).
function(mixtrain_abi_read_record record subject version digest_var max_var)
  set(found "")
  set(max "")
  mixtrain_abi_key("${subject}" "${version}" wanted)
  string(REGEX REPLACE " [^ ]+$" "" prefix "${wanted}")
  if(EXISTS "${record}")
    file(STRINGS "${record}" lines REGEX "^(core|facet) ")
    foreach(line IN LISTS lines)
      if(NOT line MATCHES "^(.*) ([^ ]+) ([0-9a-f]+)$")
        message(FATAL_ERROR "${record}: malformed record line '${line}'")
      endif()
      if(NOT CMAKE_MATCH_1 STREQUAL prefix)
        continue()
      endif()
      set(v "${CMAKE_MATCH_2}")
      set(d "${CMAKE_MATCH_3}")
      if(v VERSION_EQUAL version)
        if(NOT found STREQUAL "" AND NOT found STREQUAL d)
          message(FATAL_ERROR "${record} records ${wanted} twice, with different digests")
        endif()
        set(found "${d}")
      endif()
      if(max STREQUAL "" OR v VERSION_GREATER max)
        set(max "${v}")
      endif()
    endforeach()
  endif()
  set(${digest_var} "${found}" PARENT_SCOPE)
  set(${max_var} "${max}" PARENT_SCOPE)
endfunction()

# What to do when `subject`'s declarations changed at a recorded version.
function(mixtrain_abi_step_advice subject version out_var)
  if(subject STREQUAL "core")
    math(EXPR next "${version} + 1")
    set(${out_var} "bump kSdkAbiVersion to ${next} in sdk/include/mixtrain/sdk/version.h" PARENT_SCOPE)
  else()
    string(REPLACE "." ";" parts "${version}")
    list(GET parts 0 major)
    list(GET parts 1 minor)
    math(EXPR minor1 "${minor} + 1")
    math(EXPR major1 "${major} + 1")
    set(${out_var}
        "step its kVersion: {${major}, ${minor1}} when it only appends methods after the last one, {${major1}, 0} for anything else (a changed signature or struct, or add a new facet beside this one)"
        PARENT_SCOPE)
  endif()
endfunction()

# Every committed version of `record` since `since` is in `record` now, line for line and in its
# order: a recorded line is never rewritten or removed. On one line of history that makes each
# version a prefix; where two branches each appended a record and merged, the merged record holds
# both in turn (the target's first), so neither branch's versions are prefixes of it, and each is
# held to its lines in order instead. Every commit that touched the record counts (git log
# --full-history: a merge that took one side's record must not hide the other side's commits).
# Git's history is the record's seal; without git or a repository the check is skipped with a note.
function(mixtrain_abi_check_history record since)
  find_program(MIXTRAIN_GIT git)
  get_filename_component(dir "${record}" DIRECTORY)
  if(NOT MIXTRAIN_GIT)
    message(STATUS "append-only check skipped: git is not installed")
    return()
  endif()
  execute_process(COMMAND "${MIXTRAIN_GIT}" -C "${dir}" rev-parse --show-toplevel
                  RESULT_VARIABLE rc OUTPUT_VARIABLE top ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(STATUS "append-only check skipped: ${record} is not in a git checkout")
    return()
  endif()
  file(REAL_PATH "${record}" real_record)
  file(REAL_PATH "${top}" real_top)
  file(RELATIVE_PATH rel "${real_top}" "${real_record}")
  execute_process(COMMAND "${MIXTRAIN_GIT}" -C "${top}" log --full-history --format=%h HEAD -- "${rel}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE commits ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(STATUS "append-only check skipped: the repository at ${top} has no commits")
    return()
  endif()
  set(now "")
  if(EXISTS "${record}")
    file(STRINGS "${record}" now REGEX "^[a-z0-9]")
  endif()
  list(LENGTH now n_now)
  string(REGEX MATCHALL "[0-9a-f]+" commits "${commits}")
  set(checked 0)
  foreach(commit IN LISTS commits)
    execute_process(COMMAND "${MIXTRAIN_GIT}" -C "${top}" show "${commit}:${rel}"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_QUIET)
    if(rc EQUAL 0)  # else the commit deleted the file: nothing of it to hold
      string(REPLACE ";" "\\;" text "${text}")
      string(REPLACE "\n" ";" then "${text}")
      list(FILTER then INCLUDE REGEX "^[a-z0-9]")
      # The commit's lines, in order, among the record's: lines another branch appended may sit
      # between them once the two branches merged, but none of the commit's is rewritten or gone.
      set(i 0)
      foreach(line IN LISTS then)
        set(found FALSE)
        while(i LESS n_now)
          list(GET now ${i} actual)
          math(EXPR i "${i} + 1")
          if(actual STREQUAL line)
            set(found TRUE)
            break()
          endif()
        endwhile()
        if(NOT found)
          string(REGEX REPLACE " [0-9a-f]+$" "" key "${line}")
          foreach(actual IN LISTS now)
            string(FIND "${actual}" "${key} " at)
            if(at EQUAL 0)
              message(FATAL_ERROR "${record} record '${key}' was rewritten: commit ${commit} recorded '${line}', the record now says '${actual}'; restore it (plugins built against that version rely on its declarations) and record a new version instead")
            endif()
          endforeach()
          message(FATAL_ERROR "${record} lost records: commit ${commit} holds '${line}', which the record no longer has after that commit's earlier lines; restore it (the record is append-only)")
        endif()
      endforeach()
      math(EXPR checked "${checked} + 1")
    endif()
    string(FIND "${commit}" "${since}" at)
    if(NOT since STREQUAL "" AND at EQUAL 0)  # the oldest version held
      break()
    endif()
  endforeach()
  message(STATUS "append-only: the record extends each of its ${checked} committed versions")
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT DEFINED MIXTRAIN_SDK_HEADERS)
    set(MIXTRAIN_SDK_HEADERS "${CMAKE_CURRENT_LIST_DIR}/../sdk/include")
  endif()
  if(NOT DEFINED MIXTRAIN_ABI_RECORD)
    set(MIXTRAIN_ABI_RECORD "${CMAKE_CURRENT_LIST_DIR}/../sdk/abi/declarations.txt")
  endif()
  if(NOT DEFINED MIXTRAIN_ABI_HISTORY_SINCE)
    set(MIXTRAIN_ABI_HISTORY_SINCE 0fc9ddf)  # the commit that began the core/facet records
  endif()
  if(NOT DEFINED MIXTRAIN_ABI_MODE)
    set(MIXTRAIN_ABI_MODE check)
  endif()
  if(NOT MIXTRAIN_ABI_MODE MATCHES "^(check|update|digest)$")
    message(FATAL_ERROR "MIXTRAIN_ABI_MODE must be check, update or digest, not '${MIXTRAIN_ABI_MODE}'")
  endif()

  if(NOT MIXTRAIN_ABI_MODE STREQUAL "digest")
    mixtrain_abi_check_history("${MIXTRAIN_ABI_RECORD}" "${MIXTRAIN_ABI_HISTORY_SINCE}")
  endif()

  mixtrain_abi_subjects("${MIXTRAIN_SDK_HEADERS}" abi)
  set(failures "")
  set(core_stepped FALSE)  # the core's version has no record yet (read before an update adds it)
  foreach(subject IN LISTS abi_SUBJECTS)
    set(version "${abi_${subject}_VERSION}")
    set(digest "${abi_${subject}_DIGEST}")
    set(what "${abi_${subject}_WHAT}")
    mixtrain_abi_key("${subject}" "${version}" key)
    mixtrain_abi_read_record("${MIXTRAIN_ABI_RECORD}" "${subject}" "${version}" recorded max)
    if(subject STREQUAL "core")
      set(core_stepped FALSE)
      if(recorded STREQUAL "")
        set(core_stepped TRUE)
      endif()
      set(next_core "${version}")
      if(NOT max STREQUAL "" AND max GREATER next_core)
        set(next_core "${max}")
      endif()
      math(EXPR next_core "${next_core} + 1")
    endif()
    set(includer "${abi_${subject}_CORE_INCLUDER}")
    if(NOT includer STREQUAL "" AND recorded STREQUAL "" AND NOT max STREQUAL "" AND NOT core_stepped
       AND NOT MIXTRAIN_ABI_MODE STREQUAL "digest")
      string(REGEX MATCH "^[0-9]+" major "${version}")
      string(REGEX MATCH "^[0-9]+" max_major "${max}")
      if(major GREATER max_major)
        list(APPEND failures "${what} is included by ${includer}, a core header: its types are part of the core boundary, so its major step ${key} is a core change too: bump kSdkAbiVersion to ${next_core} in sdk/include/mixtrain/sdk/version.h as well, and run ${_mixtrain_abi_update_command}")
        continue()
      endif()
    endif()
    if(MIXTRAIN_ABI_MODE STREQUAL "digest")
      message("${key} ${digest}")
    elseif(recorded STREQUAL digest)
      if(MIXTRAIN_ABI_MODE STREQUAL "check")
        message(STATUS "${key}: declarations match")
      endif()
    elseif(NOT recorded STREQUAL "")
      mixtrain_abi_step_advice("${subject}" "${version}" advice)
      if(MIXTRAIN_ABI_MODE STREQUAL "update")
        list(APPEND failures "refusing to rewrite the record of ${key}: plugins built against it rely on its declarations; ${advice}, then run this again")
      else()
        list(APPEND failures "${what}: declarations changed without a version step (${key} is recorded as ${recorded}, the header now gives ${digest}): ${advice}, and run ${_mixtrain_abi_update_command}")
      endif()
    elseif(NOT max STREQUAL "" AND NOT version VERSION_GREATER max)
      list(APPEND failures "${key} is below the highest recorded version ${max} of ${what} and has no record: versions only go up")
    elseif(MIXTRAIN_ABI_MODE STREQUAL "update")
      file(APPEND "${MIXTRAIN_ABI_RECORD}" "${key} ${digest}\n")
      message(STATUS "recorded ${key}: ${digest}")
    else()
      list(APPEND failures "${key} has no record in ${MIXTRAIN_ABI_RECORD}: run ${_mixtrain_abi_update_command} to record its declarations")
    endif()
  endforeach()
  if(NOT failures STREQUAL "")
    string(REPLACE ";" "\n" failures "${failures}")
    message(FATAL_ERROR "${failures}")
  endif()
endif()
