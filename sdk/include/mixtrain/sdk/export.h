// Symbol visibility for SDK types.
//
// Plugins are built with hidden visibility; the SDK's polymorphic types must keep one default-
// visibility type_info (anchored in libmixtrain_sdk by their out-of-line destructors) so that
// dynamic_cast and exceptions work across the host / plugin boundary.
#pragma once

#define MIXTRAIN_SDK_API __attribute__((visibility("default")))
