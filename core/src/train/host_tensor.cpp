#include "train/host_tensor.h"

namespace mixtrain::core {

sdk::HostTensor to_host(sdk::DeviceBackend& b, const std::string& name, sdk::TensorView v) {
  sdk::HostTensor h;
  h.name = name;
  h.dtype = v.dtype;
  h.shape = v.shape.to_vector();
  h.bytes.resize(v.bytes());
  b.copy_to_host(h.bytes.data(), v);
  return h;
}

}  // namespace mixtrain::core
