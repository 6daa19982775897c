// How `mixtrain describe` and `mixtrain plugins --describe` print a config section
// (core/config/section_catalog.h): a header saying where the section is used, then one row per
// key (name, type, default, range, doc) in aligned columns on stdout.
#pragma once

#include <vector>

#include "mixtrain/core/config/section_catalog.h"

namespace mixtrain::cli {

void print_section_keys(const std::vector<core::SectionKey>& keys);
// `all`: the catalog `section` belongs to (a component table names the section selecting it).
void print_section(const std::vector<core::ConfigSection>& all, const core::ConfigSection& section);
// Every section, one line each: what bare `mixtrain describe` prints.
void print_section_index(const std::vector<core::ConfigSection>& sections);

}  // namespace mixtrain::cli
