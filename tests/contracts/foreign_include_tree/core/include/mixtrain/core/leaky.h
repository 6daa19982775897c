#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>
#include "graph/private.h"
#include "mixtrain/sdk/good.h"
#include "mixtrain/sdk/missing.h"
