#include "train/host_tensor.h"

#include <cstring>

#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/tensor.h"

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

sdk::HostTensor to_host_fp32(const std::shared_ptr<sdk::DeviceBackend>& b, const std::string& name,
                             sdk::TensorView v) {
  if (v.dtype == sdk::DType::fp32) return to_host(*b, name, v);
  sdk::HostTensor h;
  h.name = name;
  h.dtype = sdk::DType::fp32;
  h.shape = v.shape.to_vector();
  h.bytes.resize(static_cast<std::size_t>(v.numel()) * 4);
  Tensor scratch;
  copy_to_host_fp32(b, v, reinterpret_cast<float*>(h.bytes.data()), scratch);
  return h;
}

sdk::HostTensor parameter_to_host(const std::shared_ptr<sdk::DeviceBackend>& b,
                                  const std::string& name, const ModelParameter& p) {
  if (!p.quantized()) return to_host_fp32(b, name, p.value());
  const std::vector<float> values = parameter_to_host_fp32(b, p);
  sdk::HostTensor h;
  h.name = name;
  h.dtype = sdk::DType::fp32;
  h.shape = p.shape().to_vector();
  h.bytes.resize(values.size() * sizeof(float));
  std::memcpy(h.bytes.data(), values.data(), h.bytes.size());
  return h;
}

}  // namespace mixtrain::core
