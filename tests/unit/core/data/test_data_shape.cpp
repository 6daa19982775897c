// DataShape (data_shape.h): the record of a table or image model's input that checkpoints keep.
// A shape round-trips through its JSON, its rowless Dataset has the pixel table a loaded and
// normalised byte dataset has (so a batch of that form decodes through the same table), and a
// damaged record is refused naming the checkpoint and the entry, never read out of range.
#include "mixtrain/core/data/data_shape.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

Dataset byte_images() {
  SyntheticSpec spec;
  spec.kind = "images";
  spec.rows = 12;
  spec.channels = 3;
  spec.height = 6;
  spec.width = 5;
  spec.max_shift = 1;
  spec.classes = 4;
  spec.byte_pixels = true;
  return make_synthetic(spec);
}

TEST(DataShape, RoundTripsThroughItsRecord) {
  const Dataset images = byte_images();
  ASSERT_TRUE(images.is_bytes());
  Dataset table;
  table.rows = 2;
  table.features = 7;
  table.classes = 3;
  for (const Dataset* d : {&images, static_cast<const Dataset*>(&table)}) {
    const DataShape shape = data_shape_of(*d);
    EXPECT_EQ(shape.features, d->features);
    EXPECT_EQ(shape.sample_shape, d->sample_shape);
    EXPECT_EQ(shape.classes, d->classes);
    EXPECT_EQ(shape.bytes, d->is_bytes());
    EXPECT_EQ(parse_data_shape(data_shape_json(shape), "ckpt"), shape);
  }
  Dataset tokens;
  tokens.stride = 1;
  EXPECT_THROW(data_shape_of(tokens), std::logic_error);
  // An image folder's class names ride along, in label order (not sorted again), and come back
  // in the rowless Dataset; a record without them has none.
  Dataset named = images;
  named.class_names = {"zebra", "ant", "Bee"};
  const DataShape shape = parse_data_shape(data_shape_json(data_shape_of(named)), "ckpt");
  EXPECT_EQ(shape.class_names, named.class_names);
  EXPECT_EQ(dataset_of_shape(shape, {}).class_names, named.class_names);
  EXPECT_EQ(data_shape_json(data_shape_of(images)).find("class_names"), std::string::npos);
}

TEST(DataShape, ItsDatasetDecodesBytesThroughTheLoadedTable) {
  Dataset loaded = byte_images();
  const ChannelStats stats = channel_statistics(loaded);
  const Dataset plain = dataset_of_shape(data_shape_of(loaded), {});
  EXPECT_EQ(plain.rows, 0);
  EXPECT_TRUE(plain.pixels.empty());
  EXPECT_EQ(plain.pixel_values, loaded.pixel_values);
  normalize_channels(loaded, stats);
  const Dataset normalised = dataset_of_shape(data_shape_of(byte_images()), stats);
  EXPECT_EQ(normalised.pixel_values, loaded.pixel_values);
  EXPECT_EQ(normalised.sample_shape, loaded.sample_shape);
  EXPECT_EQ(normalised.classes, loaded.classes);
  EXPECT_NE(normalised.pixel_values, plain.pixel_values);
}

TEST(DataShape, ADamagedRecordIsRefusedNamingTheEntry) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "is not a JSON object"},
      {"{", "is not a JSON object"},
      {R"({"sample_shape": [], "classes": 2, "pixels": "float32"})", "no whole number 'features'"},
      {R"({"features": 1.5, "sample_shape": [], "classes": 2, "pixels": "float32"})",
       "no whole number 'features'"},
      {R"({"features": 0, "sample_shape": [], "classes": 2, "pixels": "float32"})",
       "'features' 0, outside [1, "},
      {R"({"features": 4, "sample_shape": [], "classes": 0, "pixels": "float32"})",
       "'classes' 0, outside [1, "},
      {R"({"features": 4, "sample_shape": [], "classes": 3000000000, "pixels": "float32"})",
       "'classes' 3000000000, outside"},
      {R"({"features": 4, "sample_shape": [2, 2], "classes": 2, "pixels": "float32"})",
       "'sample_shape' of none or three dimensions"},
      {R"({"features": 4, "sample_shape": [1, 2, 0], "classes": 2, "pixels": "float32"})",
       "dimension that is not a whole number"},
      {R"({"features": 4, "sample_shape": [1, 2, 3], "classes": 2, "pixels": "float32"})",
       "whose product is not 'features' (4)"},
      // Each dimension in range, their product past 2^63: refused, not wrapped.
      {R"({"features": 8, "sample_shape": [1099511627776, 1099511627776, 8], "classes": 2,
           "pixels": "float32"})",
       "whose product is not 'features' (8)"},
      {R"({"features": 4, "sample_shape": [], "classes": 2, "pixels": "u8"})",
       "no 'pixels' of \"uint8\" or \"float32\""},
      {R"({"features": 4, "sample_shape": [], "classes": 2, "pixels": "uint8"})",
       "keeps bytes of data that are not images"},
      {R"({"features": 4, "sample_shape": [], "classes": 2, "pixels": "float32",
           "class_names": ["a", "b", "c"]})",
       "'class_names' that are not a list of at most 'classes' names"},
      {R"({"features": 4, "sample_shape": [], "classes": 2, "pixels": "float32",
           "class_names": "a"})",
       "'class_names' that are not a list"},
      {R"({"features": 4, "sample_shape": [], "classes": 2, "pixels": "float32",
           "class_names": ["a", 3]})",
       "a class name that is not a non-empty string"},
      {R"({"features": 4, "sample_shape": [], "classes": 2, "pixels": "float32",
           "class_names": ["a", "a"]})",
       "names a class twice"},
  };
  for (const auto& [text, part] : cases) {
    try {
      parse_data_shape(text, "run/step-1.mxt");
      ADD_FAILURE() << "accepted " << text;
    } catch (const sdk::CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("run/step-1.mxt: the 'data_shape' entry"), std::string::npos) << what;
      EXPECT_NE(what.find(part), std::string::npos) << text << ": " << what;
      EXPECT_FALSE(e.hint().empty());
    }
  }
}

}  // namespace
}  // namespace mixtrain::core
