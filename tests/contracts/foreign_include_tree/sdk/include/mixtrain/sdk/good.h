#pragma once
#include <unistd.h>
#include <boost/config.hpp>
#include <cstdint>
