// A library named like a plugin that exports no descriptor, only an unrelated function.
extern "C" __attribute__((visibility("default"))) int mixtrain_test_not_a_plugin_answer() {
  return 42;
}
