# The ABI guard (cmake/MixtrainSdkAbi.cmake) run on an edited copy of the SDK headers with its own
# record, in a git repository of its own: comment and layout edits pass; a core declaration edit
# asks for a kSdkAbiVersion bump, a facet's for a step of that facet alone; support/ is outside
# every record; a facet header a core header includes needs a core bump for its major step; the
# update refuses to rewrite a recorded version and records a stepped one; a committed record line rewritten or removed fails, also across a merge of two branches that each
# appended one (without git that last part is skipped).
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
            -D "MIXTRAIN_ABI_RECORD=${record}" -D MIXTRAIN_ABI_HISTORY_SINCE= -P "${guard}"
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

# `text` must (or, with NOT, must not) occur in the file at `path`.
function(expect_in path text)
  file(READ "${path}" content)
  string(FIND "${content}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "expected '${text}' in ${path}:\n${content}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
# The copy's record gets a history of its own (WORK_DIR is under the build folder, which may be
# inside the checkout: its repository must not be the one consulted).
find_program(GIT git)
function(git)
  execute_process(COMMAND "${GIT}" -C "${WORK_DIR}" -c user.name=abi-test -c user.email=abi@test
                          ${ARGN} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "test setup: git ${ARGN} failed: ${err}")
  endif()
endfunction()
if(GIT)
  git(init -q)
endif()
fresh_copy()
file(STRINGS "${MIXTRAIN_SOURCE_DIR}/sdk/include/mixtrain/sdk/version.h" line
     REGEX "kSdkAbiVersion = [0-9]+;")
string(REGEX MATCH "kSdkAbiVersion = ([0-9]+)" _ "${line}")
set(version "${CMAKE_MATCH_1}")
math(EXPR next "${version} + 1")
# The facet the facet cases step: residual, at whatever version it is today.
file(STRINGS "${MIXTRAIN_SOURCE_DIR}/sdk/include/mixtrain/sdk/backend_residual.h" line
     REGEX "kVersion{[0-9]+, [0-9]+}")
string(REGEX MATCH "kVersion{([0-9]+), ([0-9]+)}" _ "${line}")
set(fmajor "${CMAKE_MATCH_1}")
set(fminor "${CMAKE_MATCH_2}")
math(EXPR fminor1 "${fminor} + 1")
math(EXPR fmajor1 "${fmajor} + 1")

expect("first record" update pass "recorded core ${version}")
expect("first record of a facet" check pass "facet residual ${fmajor}.${fminor}: declarations match")
expect("unchanged headers" check pass "core ${version}: declarations match")

# Comments, blank lines, indentation and line breaks are not declarations.
edit(device_backend.h "#pragma once" "#pragma once\n// A comment the test adds.\n/* And a\n   block one. */")
edit(tensor_view.h "namespace mixtrain::sdk {" "namespace   mixtrain::sdk\n{\n\n")
edit(dtype.h "// " "//  reworded: ")
edit(backend_gemm.h "// " "//  reworded: ")
expect("comment and whitespace edits" check pass "core ${version}: declarations match")

# The support library is compiled into each plugin: no record covers it.
edit(support/unique_fd.h "#pragma once" "#pragma once\nstruct AddedByTheAbiTest { int x; };")
expect("a support helper's declarations" check pass "core ${version}: declarations match")

# A core declaration edit without a bump fails, and the update will not paper over it.
fresh_copy()
edit(device_backend.h "#pragma once" "#pragma once\nstruct AddedByTheAbiTest { int x; };")
expect("new core declaration" check fail
       "the core boundary: declarations changed without a version step")
expect("new core declaration" check fail "bump kSdkAbiVersion to ${next}")
expect("rewriting a recorded version" update fail
       "refusing to rewrite the record of core ${version}")

# So does a changed value, a string literal's text and a new header.
fresh_copy()
edit(version.h "kSdkVersion = \"" "kSdkVersion = \"x")
expect("changed string literal" check fail "the core boundary: declarations changed")
fresh_copy()
file(WRITE "${sdk}/added_by_the_abi_test.h" "#pragma once\nint f();\n")
expect("new header" check fail "the core boundary: declarations changed")

# Bumped: no record yet until the update appends one, leaving the old records as they were.
edit(version.h "kSdkAbiVersion = ${version};" "kSdkAbiVersion = ${next};")
expect("bumped, not recorded" check fail "core ${next} has no record")
file(READ "${record}" before)
expect("record the bump" update pass "recorded core ${next}")
expect("bumped and recorded" check pass "core ${next}: declarations match")
file(READ "${record}" after)
string(FIND "${after}" "${before}" at)
if(NOT at EQUAL 0)
  message(FATAL_ERROR "the update rewrote earlier records:\n${before}\n->\n${after}")
endif()

# A facet's method appended: that facet alone asks for a minor step; the core is untouched.
fresh_copy()
edit(backend_residual.h "  virtual void add(std::span<const TensorView> xs, bool relu, TensorView y) = 0;"
     "  virtual void add(std::span<const TensorView> xs, bool relu, TensorView y) = 0;\n  virtual void added_by_the_abi_test() = 0;")
expect("a facet method appended" check fail "backend_residual.h: declarations changed without a version step")
expect("a facet method appended" check fail "step its kVersion: {${fmajor}, ${fminor1}} when it only appends methods")
expect("a facet method appended" check fail "{${fmajor1}, 0} for anything else")
expect("a facet method appended, core untouched" check fail "core ${version}: declarations match")
edit(backend_residual.h "kVersion{${fmajor}, ${fminor}}" "kVersion{${fmajor}, ${fminor1}}")
expect("a facet stepped, not recorded" check fail "facet residual ${fmajor}.${fminor1} has no record")
expect("record the facet step" update pass "recorded facet residual ${fmajor}.${fminor1}")
expect("a facet stepped and recorded" check pass "facet residual ${fmajor}.${fminor1}: declarations match")
expect_in("${record}" "facet residual ${fmajor}.${fminor} ")
expect_in("${record}" "facet residual ${fmajor}.${fminor1} ")

# A facet version below its recorded ones is refused.
edit(backend_residual.h "kVersion{${fmajor}, ${fminor1}}" "kVersion{0, 9}")
expect("facet version below the records" update fail
       "facet residual 0.9 is below the highest recorded version ${fmajor}.${fminor1}")

# Going back below a recorded core version is refused too.
fresh_copy()
edit(version.h "kSdkAbiVersion = ${version};" "kSdkAbiVersion = 1;")
expect("version below the records" update fail "core 1 is below the highest recorded version ${next}")

# A facet header a core header includes (optimizer.h takes ParamTensors from the optimizer
# facet's) holds core types: appending a method is that facet's minor step alone, but its major
# step is a core change too, and passes only with a core bump.
file(STRINGS "${MIXTRAIN_SOURCE_DIR}/sdk/include/mixtrain/sdk/backend_optimizer_updates.h" line
     REGEX "kVersion{[0-9]+, [0-9]+}")
string(REGEX MATCH "kVersion{([0-9]+), ([0-9]+)}" _ "${line}")
set(omajor "${CMAKE_MATCH_1}")
set(ominor "${CMAKE_MATCH_2}")
math(EXPR ominor1 "${ominor} + 1")
math(EXPR omajor1 "${omajor} + 1")
math(EXPR next2 "${next} + 1")
fresh_copy()
edit(backend_optimizer_updates.h " protected:\n  ~OptimizerFacet() override;"
     "  virtual void added_by_the_abi_test() = 0;\n\n protected:\n  ~OptimizerFacet() override;")
edit(backend_optimizer_updates.h "kVersion{${omajor}, ${ominor}}" "kVersion{${omajor}, ${ominor1}}")
expect("a core-included facet's minor step" update pass "recorded facet optimizer ${omajor}.${ominor1}")
expect("a core-included facet's minor step" check pass "core ${version}: declarations match")
fresh_copy()
edit(backend_optimizer_updates.h "struct ParamTensors {" "struct ParamTensors {\n  int added_by_the_abi_test = 0;")
expect("a core type in a facet header" check fail
       "backend_optimizer_updates.h: declarations changed without a version step")
edit(backend_optimizer_updates.h "kVersion{${omajor}, ${ominor}}" "kVersion{${omajor1}, 0}")
expect("its major step alone" check fail
       "backend_optimizer_updates.h is included by optimizer.h, a core header")
expect("its major step alone" update fail "bump kSdkAbiVersion to ${next2}")
edit(version.h "kSdkAbiVersion = ${version};" "kSdkAbiVersion = ${next2};")
expect("its major step with a core bump" update pass "recorded facet optimizer ${omajor1}.0")
expect("its major step with a core bump" check pass "core ${next2}: declarations match")

# A committed record line rewritten, or removed, by hand fails the check through the record's
# history, whatever the headers say.
if(NOT GIT)
  message(STATUS "skipped: the rewritten-record cases need git")
  return()
endif()
git(add declarations.txt)
git(commit -q -m "the records so far")
fresh_copy()
file(READ "${record}" text)
string(REGEX REPLACE "facet residual ${fmajor}\\.${fminor} [0-9a-f]+" "facet residual ${fmajor}.${fminor} 0123abcd"
       rewritten "${text}")
if(rewritten STREQUAL text)
  message(FATAL_ERROR "test setup: no 'facet residual ${fmajor}.${fminor}' line in ${record}")
endif()
file(WRITE "${record}" "${rewritten}")
expect("a rewritten record line" check fail "was rewritten: commit ")
expect("a rewritten record line" check fail "recorded 'facet residual ${fmajor}.${fminor} ")
string(REGEX REPLACE "facet residual ${fmajor}\\.${fminor1} [0-9a-f]+\n" "" removed "${text}")
if(removed STREQUAL text)
  message(FATAL_ERROR "test setup: no 'facet residual ${fmajor}.${fminor1}' line in ${record}")
endif()
file(WRITE "${record}" "${removed}")
expect("a removed record line" check fail "lost records: commit ")
file(WRITE "${record}" "${text}")
expect("the record restored" check pass "append-only: the record extends each of its 1 committed versions")

# Two branches that each appended a record, merged: the merged record holds both (the target's
# first), so the branch's committed version is no prefix of it, yet no line of it is gone. A merge
# that drops either branch's line fails.
git(commit -q --allow-empty -m "the records restored")
git(checkout -q -b side)
file(APPEND "${record}" "facet merged_side 1.0 aaaa\n")
git(commit -q -a -m "the side branch appends a record")
git(checkout -q -)
file(APPEND "${record}" "facet merged_main 1.0 bbbb\n")
git(commit -q -a -m "the target appends a record")
# The merge commit keeps the target's record, so what holds the side's line below is the side
# branch's own commit; the working tree then holds the merged record.
git(merge -q -s ours -m "merge the side branch" side)
file(WRITE "${record}" "${text}facet merged_main 1.0 bbbb\nfacet merged_side 1.0 aaaa\n")
expect("two branches' records merged" check pass "append-only: the record extends each of its 4 committed versions")
file(WRITE "${record}" "${text}facet merged_main 1.0 bbbb\n")
expect("a merge that drops the branch's record" check fail "lost records: commit ")
file(WRITE "${record}" "${text}facet merged_side 1.0 aaaa\n")
expect("a merge that drops the target's record" check fail "lost records: commit ")
file(WRITE "${record}" "${text}facet merged_main 1.0 bbbb\nfacet merged_side 1.0 cccc\n")
expect("a merge that rewrites the branch's record" check fail "recorded 'facet merged_side 1.0 aaaa'")
