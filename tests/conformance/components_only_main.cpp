// A program that tests only a scaler with the component kit, as docs/writing-plugins.md §10 shows:
// it registers no backend, and must still exit 0 when the scaler passes (GoogleTest fails a
// program whose parameterized suite, the backend kit's here, has no instantiation, unless the
// kit allows it).
#include <gtest/gtest.h>

#include "mixtrain/conformance/component_conformance.h"

int main(int argc, char** argv) {
  namespace kit = mixtrain::conformance;
  kit::add_scaler("dynamic", kit::scaler_from_plugin({MIXTRAIN_PLUGIN_DIR}, "dynamic"));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
