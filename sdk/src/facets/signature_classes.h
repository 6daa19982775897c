// The dtype-class rows the facets' signature tables are written with (op_signatures.h's
// OpSignature::positions): private to the SDK library, shared by sdk/src/facets/*.cpp.
#pragma once

#include "mixtrain/sdk/op_signatures.h"

namespace mixtrain::sdk {
// Internal linkage: rows of the library's own tables, never exported.
namespace {

constexpr DTypeClass kF32[] = {DTypeClass::fp32};
constexpr DTypeClass kF32x2[] = {DTypeClass::fp32, DTypeClass::fp32};
constexpr DTypeClass kF32x3[] = {DTypeClass::fp32, DTypeClass::fp32, DTypeClass::fp32};
constexpr DTypeClass kStore[] = {DTypeClass::storage_float};
constexpr DTypeClass kStorex2[] = {DTypeClass::storage_float, DTypeClass::storage_float};
constexpr DTypeClass kStorex3[] = {DTypeClass::storage_float, DTypeClass::storage_float,
                                          DTypeClass::storage_float};
// e.g. {dy, dbias}, {x, y} of axpy
constexpr DTypeClass kStoreF32[] = {DTypeClass::storage_float, DTypeClass::fp32};
// {master, working}
constexpr DTypeClass kF32Store[] = {DTypeClass::fp32, DTypeClass::storage_float};
constexpr DTypeClass kOperandx2Out[] = {DTypeClass::gemm_operand, DTypeClass::gemm_operand,
                                               DTypeClass::storage_float};
constexpr DTypeClass kOperandx2[] = {DTypeClass::gemm_operand, DTypeClass::gemm_operand};

}  // namespace
}  // namespace mixtrain::sdk
