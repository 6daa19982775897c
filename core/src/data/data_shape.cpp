#include "mixtrain/core/data/data_shape.h"

#include <algorithm>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "byte_images.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace {

using json = nlohmann::json;

constexpr std::int64_t kMaxFeatures = std::int64_t{1} << 40;

}  // namespace

DataShape data_shape_of(const Dataset& data) {
  if (data.is_tokens())
    throw std::logic_error("data_shape_of: token data take their shape from the config");
  return {data.features, data.sample_shape, data.classes, data.is_bytes(), data.class_names};
}

Dataset dataset_of_shape(const DataShape& shape, const ChannelStats& normalization) {
  Dataset d;
  d.features = shape.features;
  d.sample_shape = shape.sample_shape;
  d.classes = shape.classes;
  d.class_names = shape.class_names;
  if (shape.bytes) d.pixel_values = unit_byte_values(d.channels());
  if (!normalization.mean.empty()) normalize_channels(d, normalization);
  return d;
}

std::string data_shape_json(const DataShape& shape) {
  json j = {{"features", shape.features},
            {"sample_shape", shape.sample_shape},
            {"classes", shape.classes},
            {"pixels", shape.bytes ? "uint8" : "float32"}};
  if (!shape.class_names.empty()) j["class_names"] = shape.class_names;
  // A name is bytes (a folder's name need not be UTF-8): written with U+FFFD where a byte is not.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

DataShape parse_data_shape(std::string_view text, const std::string& origin) {
  const auto damaged = [&](const std::string& what) {
    return sdk::CheckpointError(origin + ": the 'data_shape' entry " + what,
                                "the checkpoint is damaged; use an earlier one, or predict with "
                                "the training data present where the config names them");
  };
  const auto j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw damaged("is not a JSON object");
  const auto integer = [&](const char* key, std::int64_t low, std::int64_t high) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer())
      throw damaged(std::string("has no whole number '") + key + "'");
    const auto v = it->get<std::int64_t>();
    if (v < low || v > high)
      throw damaged(std::string("gives '") + key + "' " + std::to_string(v) + ", outside [" +
                    std::to_string(low) + ", " + std::to_string(high) + "]");
    return v;
  };
  DataShape shape;
  shape.features = integer("features", 1, kMaxFeatures);
  shape.classes = static_cast<std::int32_t>(integer("classes", 1, INT32_MAX));
  const auto dims = j.find("sample_shape");
  if (dims == j.end() || !dims->is_array() || !(dims->empty() || dims->size() == 3))
    throw damaged("has no 'sample_shape' of none or three dimensions");
  std::int64_t product = 1;
  for (const auto& d : *dims) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 1 || d.get<std::int64_t>() > kMaxFeatures)
      throw damaged("has a 'sample_shape' dimension that is not a whole number in [1, 2^40]");
    shape.sample_shape.push_back(d.get<std::int64_t>());
    // Checked before multiplying: three dimensions of up to 2^40 would overflow.
    if (product > kMaxFeatures / shape.sample_shape.back())
      product = kMaxFeatures + 1;
    else
      product *= shape.sample_shape.back();
  }
  if (!shape.sample_shape.empty() && product != shape.features)
    throw damaged("gives 'sample_shape' whose product is not 'features' (" +
                  std::to_string(shape.features) + ")");
  const auto pixels = j.find("pixels");
  if (pixels == j.end() || !pixels->is_string() || (*pixels != "uint8" && *pixels != "float32"))
    throw damaged("has no 'pixels' of \"uint8\" or \"float32\"");
  shape.bytes = *pixels == "uint8";
  if (shape.bytes && shape.sample_shape.empty())
    throw damaged("keeps bytes of data that are not images");
  if (const auto names = j.find("class_names"); names != j.end()) {
    if (!names->is_array() || names->size() > static_cast<std::size_t>(shape.classes))
      throw damaged("has 'class_names' that are not a list of at most 'classes' names");
    for (const auto& name : *names) {
      if (!name.is_string() || name.get<std::string>().empty())
        throw damaged("has a class name that is not a non-empty string");
      shape.class_names.push_back(name.get<std::string>());
    }
    std::vector<std::string> sorted = shape.class_names;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      throw damaged("names a class twice in 'class_names'");
  }
  return shape;
}

}  // namespace mixtrain::core
