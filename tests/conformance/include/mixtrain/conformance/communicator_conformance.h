// The communicator conformance kit: the GoogleTest suite a Communicator (sdk/communicator.h) must
// pass, whatever its library or transport. It checks what the host's data parallel relies on
// (docs/architecture.md, "Data parallel"), on two or more ranks.
//
// Contract
// - Before RUN_ALL_TESTS, a program calls add_communicator() once per communicator under test;
//   each becomes one instantiation of every test ("communicator/<name>"). The program is launched
//   as the plugin's ranks are (`mpirun -np 2 PROGRAM` for an MPI-based one): every test fails on
//   a world of one rank, saying how to launch, since a collective of one proves nothing.
// - Each communicator is made once per process, on its first test, bound to one backend (the
//   host's rule: one bind, before any collective), and kept until the last test ends: libraries
//   such as MPI initialise once per process. That backend is the one the kit's training config
//   makes (the CPU backend from set_plugin_search_path()'s folders, backend_conformance.h) after
//   `config_overrides` (e.g. "backend.type=cuda" for a communicator of device memory). A factory
//   that throws fails each of that communicator's tests with its message.
// - Every rank runs every test and calls the same collectives in the same order; an assertion
//   that fails on one rank fails that rank's test (mpirun's exit status reports it) and never
//   skips a collective the other ranks wait in. Open MPI's `--tag-output` prefixes each line with
//   its rank. A fault that leaves one rank waiting in a collective the others never join (the
//   host's agreement checks throw on one rank) ends the program through the communicator's own
//   timeout, with its line naming the collective.
// - What passes (CommunicatorConformance for the collectives, CommunicatorTraining for the
//   host's training through them):
//   - ranks are 0..world−1, each once, and every rank sees the same world size;
//   - all-reduce of fp32 sums, averages (within one rounding of sum / world) and takes the max
//     element-wise, at 1 to 2^20 + 3 elements, and carries inf and NaN through as IEEE does (an
//     overflowed gradient must stay non-finite on every rank); a dtype other than fp32 reduces
//     as exactly or is a BackendError naming it, never a wrong number;
//   - reduce-scatter gives rank r the reduction of every rank's piece r; all-gather puts rank r's
//     send at piece r, and broadcast copies the root's data, for every dtype, bit for bit;
//   - the host collectives reduce doubles (inf and NaN included), broadcast 0 to 1 MiB bytes
//     from every root, resizing the others' vectors, and barrier;
//   - operations started together complete in any order of wait(), test() or a dropped handle,
//     with progress() between them; a completed handle's test() stays true;
//   - mismatched sizes are a BackendError on every rank before any transfer (the ranks then
//     agree on what comes next), and so is a root outside the world;
//   - the host trains the kit's MLP through the communicator: every rank logs the same losses,
//     bit for bit, within 1e-5 (relative) of one process on the same global batch, with the
//     optimizer's state sharded or not and with backward overlapped or not; a run resumed from
//     its checkpoint on the same ranks repeats the losses bit for bit;
//   - with `short_timeout` given: a collective that one rank joins late ends the others' wait()
//     with a CommunicationError naming the operation within short_timeout_s (and a bounded
//     slack), and still completes once that rank joins. Without it the test is skipped, saying so.
// - add_communicator() takes a test name of letters, digits and '_', once each
//   (std::invalid_argument otherwise).
// - communicator_from_plugin(): a communicator of a plugin library as a [distributed] table
//   would make it, unbound (the kit binds it): a registry of its own scans `folders_or_files`,
//   and the options are `options` over the schema's defaults (sdk::ConfigError for a wrong one).
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::conformance {

using CommunicatorFactory = std::function<std::shared_ptr<sdk::Communicator>()>;

struct CommunicatorKitOptions {
  // `--set` overrides of the kit's training config: the backend the communicator is bound to.
  std::vector<std::string> config_overrides;
  // Optional: another communicator of the same plugin, made after the first in the same process,
  // whose waits end within short_timeout_s seconds (MPI's timeout_s = 0.5, say).
  CommunicatorFactory short_timeout;
  double short_timeout_s = 0;
};

struct CommunicatorUnderTest {
  std::string name;  // test-name suffix
  CommunicatorFactory make;
  CommunicatorKitOptions options;
};
inline void PrintTo(const CommunicatorUnderTest& c, std::ostream* os) {
  *os << c.name;
}

void add_communicator(std::string name, CommunicatorFactory make,
                      CommunicatorKitOptions options = {});
const std::vector<CommunicatorUnderTest>& registered_communicators();

CommunicatorFactory communicator_from_plugin(std::vector<std::filesystem::path> folders_or_files,
                                             std::string name,
                                             std::map<std::string, sdk::OptionValue> options = {});

}  // namespace mixtrain::conformance
