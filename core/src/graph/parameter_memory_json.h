// ParameterMemory as summary.json records it (mixtrain/core/graph/parameter_memory.h says what the
// names mean). Inside the core: the installed headers name no JSON library.
#pragma once

#include <nlohmann/json.hpp>

#include "mixtrain/core/graph/parameter_memory.h"

namespace mixtrain::core {

nlohmann::json parameter_memory_json(const ParameterMemory& m);

}  // namespace mixtrain::core
