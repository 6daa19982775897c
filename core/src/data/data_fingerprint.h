// data_fingerprint(): a short checksum of a split's values and labels ("crc 1a2b3c4d"): the CRC-32
// (distributed/rank_agreement.h) of up to 64 evenly spaced 64 KiB pieces of each of its vectors
// (all of a small one), so that two loads of different files of the same shape are told apart
// without reading gigabytes. The ranks of a launch compare theirs at start-up; a checkpoint keeps
// its run's, which a resume compares with the data it loaded. Internal to the core.
#pragma once

#include <string>

#include "mixtrain/core/data/dataset.h"

namespace mixtrain::core {

std::string data_fingerprint(const Dataset& d);

}  // namespace mixtrain::core
