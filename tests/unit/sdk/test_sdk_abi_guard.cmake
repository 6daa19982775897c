# The ABI guard (cmake/MixtrainSdkAbi.cmake) run on an edited copy of the SDK headers with its own
# record: comment and layout edits pass, a declaration edit fails with the bump message, the
# update refuses to rewrite a recorded version and records a bumped one.
#
#   cmake -D MIXTRAIN_SOURCE_DIR=<checkout> -D WORK_DIR=<scratch folder> -P test_sdk_abi_guard.cmake

set(guard "${MIXTRAIN_SOURCE_DIR}/cmake/MixtrainSdkAbi.cmake")
set(record "${WORK_DIR}/declarations.txt")
set(sdk "${WORK_DIR}/include/mixtrain/sdk")

function(fresh_copy)
  file(REMOVE_RECURSE "${WORK_DIR}/include")
  file(COPY "${MIXTRAIN_SOURCE_DIR}/sdk/include" DESTINATION "${WORK_DIR}")
endfunction()

# Replaces `from` by `to` in the copy's `header`; `from` must occur, so no case passes vacuously.
function(edit header from to)
  file(READ "${sdk}/${header}" text)
  string(FIND "${text}" "${from}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "test setup: '${from}' is not in ${header}")
  endif()
  string(REPLACE "${from}" "${to}" text "${text}")
  file(WRITE "${sdk}/${header}" "${text}")
endfunction()

# Runs the guard in `mode`; `outcome` is pass or fail, and its output must contain `expected`.
function(expect label mode outcome expected)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -D MIXTRAIN_ABI_MODE=${mode} -D "MIXTRAIN_SDK_HEADERS=${WORK_DIR}/include"
            -D "MIXTRAIN_ABI_RECORD=${record}" -P "${guard}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if((outcome STREQUAL "pass") AND NOT rc EQUAL 0)
    message(FATAL_ERROR "${label}: ${mode} should pass but failed:\n${out}")
  endif()
  if((outcome STREQUAL "fail") AND rc EQUAL 0)
    message(FATAL_ERROR "${label}: ${mode} should fail but passed:\n${out}")
  endif()
  string(REGEX REPLACE "[ \n]+" " " flat "${out}")  # CMake wraps long messages
  string(FIND "${flat}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${label}: expected '${expected}' in the ${mode} output:\n${out}")
  endif()
  message(STATUS "ok: ${label}")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
fresh_copy()
file(STRINGS "${MIXTRAIN_SOURCE_DIR}/sdk/include/mixtrain/sdk/version.h" line
     REGEX "kSdkAbiVersion = [0-9]+;")
string(REGEX MATCH "kSdkAbiVersion = ([0-9]+)" _ "${line}")
set(version "${CMAKE_MATCH_1}")
math(EXPR next "${version} + 1")

expect("first record" update pass "recorded kSdkAbiVersion ${version}")
expect("unchanged headers" check pass "match kSdkAbiVersion ${version}")

# Comments, blank lines, indentation and line breaks are not declarations.
edit(device_backend.h "#pragma once" "#pragma once\n// A comment the test adds.\n/* And a\n   block one. */")
edit(tensor_view.h "namespace mixtrain::sdk {" "namespace   mixtrain::sdk\n{\n\n")
edit(dtype.h "// " "//  reworded: ")
expect("comment and whitespace edits" check pass "match kSdkAbiVersion ${version}")

# A declaration edit without a bump fails, and the update will not paper over it.
fresh_copy()
edit(device_backend.h "#pragma once" "#pragma once\nstruct AddedByTheAbiTest { int x; };")
expect("new declaration" check fail
       "SDK public declarations changed without a kSdkAbiVersion bump: bump it to ${next}")
expect("new declaration" check fail "MIXTRAIN_ABI_MODE=update")
expect("rewriting a recorded version" update fail
       "refusing to rewrite the record of kSdkAbiVersion ${version}")

# So does a changed value, a string literal's text and a new header.
fresh_copy()
edit(version.h "kSdkVersion = \"" "kSdkVersion = \"x")
expect("changed string literal" check fail "changed without a kSdkAbiVersion bump")
fresh_copy()
file(WRITE "${sdk}/added_by_the_abi_test.h" "#pragma once\nint f();\n")
expect("new header" check fail "changed without a kSdkAbiVersion bump")

# Bumped: no record yet until the update appends one, leaving the old record as it was.
edit(version.h "kSdkAbiVersion = ${version};" "kSdkAbiVersion = ${next};")
expect("bumped, not recorded" check fail "kSdkAbiVersion ${next} has no record")
file(READ "${record}" before)
expect("record the bump" update pass "recorded kSdkAbiVersion ${next}")
expect("bumped and recorded" check pass "match kSdkAbiVersion ${next}")
file(READ "${record}" after)
string(FIND "${after}" "${before}" at)
if(NOT at EQUAL 0)
  message(FATAL_ERROR "the update rewrote earlier records:\n${before}\n->\n${after}")
endif()

# Going back below a recorded version is refused too.
edit(version.h "kSdkAbiVersion = ${next};" "kSdkAbiVersion = 1;")
expect("version below the records" update fail "not above the highest recorded version ${next}")
