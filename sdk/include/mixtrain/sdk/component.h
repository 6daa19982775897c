// Common base of every plugin-created object.
//
// Contract: factories return std::unique_ptr<Component>; the host checks the dynamic type
// against the interface of the requested kind. The virtual destructor is defined in
// libmixtrain_sdk so type information is unique across shared libraries.
#pragma once

#include "mixtrain/sdk/export.h"

namespace mixtrain::sdk {

class MIXTRAIN_SDK_API Component {
 public:
  virtual ~Component();
  Component() = default;
  Component(const Component&) = delete;
  Component& operator=(const Component&) = delete;
};

}  // namespace mixtrain::sdk
