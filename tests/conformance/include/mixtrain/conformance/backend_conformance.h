// The backend conformance kit: one GoogleTest suite that any DeviceBackend must pass against the
// CPU reference backend.
//
// Contract
// - Before RUN_ALL_TESTS (i.e. in main, before InitGoogleTest), a program calls set_reference()
//   with a factory of the reference backend and add_backend() once per backend under test. Each
//   registered backend becomes one instantiation of every test ("conformance/<name>").
// - A factory that throws (no device, driver missing) makes that backend's tests skip, visibly,
//   with the factory's message — never fail.
// - A facet the backend does not offer skips its cases; a facet of that name at a major this SDK
//   does not speak fails them, naming the facet and both versions (the host refuses it at plan
//   time, sdk/facet.h).
// - Every op of sdk::DeviceBackend is run on the same inputs on both backends and compared with
//   tolerances that follow from the formats: inputs are quantized by the backends' own casts
//   (which must agree bit for bit), so GEMMs differ only by FP32 accumulation order.
// - run_training_parity() (test "Training") trains the quickstart config for 100 steps on both
//   backends through the core API and compares the loss of every step. Its configs name the
//   backends, so it loads them through a PluginRegistry of its own, scanning
//   set_plugin_search_path()'s folders: by default PluginRegistry::default_search_path() (the
//   folder beside the program's executable, then MIXTRAIN_PLUGIN_PATH), which an out-of-tree
//   program does not sit beside; it passes the folders its own registry scanned.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::conformance {

using BackendFactory = std::function<std::shared_ptr<sdk::DeviceBackend>()>;

struct BackendUnderTest {
  std::string name;  // test-name suffix
  BackendFactory make;
  // `--set` overrides that select this backend for the training-parity test; empty: skip it.
  std::vector<std::string> config_overrides;
};
// GoogleTest prints a parameter with this (test listings show the backend's name, not bytes).
inline void PrintTo(const BackendUnderTest& b, std::ostream* os) { *os << b.name; }

void set_reference(BackendFactory make);
void add_backend(std::string name, BackendFactory make,
                 std::vector<std::string> config_overrides = {});
const std::vector<BackendUnderTest>& registered_backends();
void set_plugin_search_path(std::vector<std::filesystem::path> folders_or_files);

}  // namespace mixtrain::conformance
