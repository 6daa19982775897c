// `mixtrain describe [SECTION]`: the sections a config may hold, or the keys of one, from the
// schemas that validate configs (core/config/section_catalog.h).
#include "cli_registry.h"
#include "commands.h"
#include "mixtrain/core/config/section_catalog.h"
#include "section_description.h"

namespace mixtrain::cli {

int run_describe(const std::string& section) {
  auto registry = make_registry(nullptr);
  const auto sections = core::config_sections(*registry);
  if (section.empty())
    print_section_index(sections);
  else
    print_section(sections, core::find_config_section(sections, section));
  return 0;
}

}  // namespace mixtrain::cli
