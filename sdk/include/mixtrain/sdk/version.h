// SDK version, ABI version and build fingerprint.
//
// kSdkAbiVersion is the version of the core boundary: what every plugin depends on (the
// descriptor, the factory signatures, the component interfaces and the types they use). It
// changes whenever one of those changes layout or meaning, and the registry refuses a plugin of
// another. The facets (backend_*.h) are versioned on their own, major.minor (facet.h), and the
// helpers of support/ are compiled into each plugin: neither moves this number. The fingerprint
// captures what else must match for C++ objects to cross a shared-library boundary.
//
// The test sdk_abi_declarations fails when a core header changes a declaration (comments and
// whitespace aside) while kSdkAbiVersion stays, or a facet header while its kVersion stays: step
// the version, add its line below (core) or in the facet's contract (facets), and run
// `cmake -D MIXTRAIN_ABI_MODE=update -P cmake/MixtrainSdkAbi.cmake` (or `ninja -C build
// sdk_abi_record`), which appends the new record to sdk/abi/declarations.txt. A change in meaning
// that leaves every declaration alone needs the step by hand: the guard only sees text.
#pragma once

#include <cstdint>

#define MIXTRAIN_STRINGIFY_IMPL(x) #x
#define MIXTRAIN_STRINGIFY(x) MIXTRAIN_STRINGIFY_IMPL(x)

#if defined(__clang__)
#define MIXTRAIN_COMPILER_ID \
  "clang-" MIXTRAIN_STRINGIFY(__clang_major__) "." MIXTRAIN_STRINGIFY(__clang_minor__)
#elif defined(__GNUC__)
#define MIXTRAIN_COMPILER_ID "gcc-" MIXTRAIN_STRINGIFY(__GNUC__)
#else
#define MIXTRAIN_COMPILER_ID "unknown-compiler"
#endif

#if defined(_GLIBCXX_USE_CXX11_ABI)
#define MIXTRAIN_STDLIB_ID "libstdc++-cxx11abi" MIXTRAIN_STRINGIFY(_GLIBCXX_USE_CXX11_ABI)
#elif defined(_LIBCPP_VERSION)
#define MIXTRAIN_STDLIB_ID "libc++"
#else
#define MIXTRAIN_STDLIB_ID "unknown-stdlib"
#endif

// Debug and release builds are compatible (no layout differs with NDEBUG in the SDK), so the
// build type is not part of the fingerprint.
#define MIXTRAIN_BUILD_FINGERPRINT MIXTRAIN_COMPILER_ID "/" MIXTRAIN_STDLIB_ID "/c++20"

namespace mixtrain::sdk {

// 2: PrecisionPolicy::adapt_to, 3: wants_current_amax, 4: GemmArgs activation epilogue,
// 5: PrecisionPolicy::resolved_name, 6: DeviceBackend split into a core and versioned facets;
// PrecisionPolicy::plan(OpDescription) -> OpPrecision (no fp32_pinned: the host pins
// precision-sensitive ops), operand scaling per OperandSlot, 7: attention and embedding facets,
// 8: facets found by name (DeviceBackend::find_facet replaces the per-facet getters, whose slots
// moved when convolution_facet() was added), elementwise and normalization split into
// activation, residual, gradient_check, foreach, layer_norm and batch_norm facets; the
// op-signature table; the helpers the plugins share (unique_fd.h, gemm_plan_key.h,
// float_format_rules.h); from 8 on, sdk/abi/declarations.txt records each version's digest,
// 9: the dropout facet (backend_dropout.h: DropoutFacet, DropoutKey, the shared mask function),
// 10: the step-graph facet (backend_step_graph.h: StepGraphFacet, CUDA graphs of a static step),
// 11: BackendArgumentChecks takes the facets' and layers' shape, geometry and overlap checks,
// 12: LossFacet 2: softmax_cross_entropy takes label_smoothing (and its argument check),
// 13: the sixth interface, Communicator (communicator.h: collectives, handles, ReduceOp,
// CommunicationError; ComponentKind::communicator), and the native-stream facet
// (backend_native_stream.h) a device-stream communicator orders its work with; BatchNormFacet 2:
// the split ops of synchronized batch norm,
// 14: the core boundary alone: facets versioned major.minor on their own (Facet::version() is a
// FacetVersion; facets' records start at their versions here: batch_norm 1.1, loss 2.0, every other
// 1.0), the helpers moved to the static support library (mixtrain/sdk/support), device_backend.h
// no longer includes the facets (facet_list.h lists them), op_signature declared by each facet
inline constexpr std::uint32_t kSdkAbiVersion = 14;
inline constexpr const char* kSdkVersion = "0.1.0";
inline constexpr const char* kBuildFingerprint = MIXTRAIN_BUILD_FINGERPRINT;

}  // namespace mixtrain::sdk
