// The NCCL runtime library of the plugin: the only code that links libnccl, libcudart and MPI.
// The plugin module opens it on the first communicator it creates, so a process that only scans
// the plugin folder never maps NCCL (218 MB) or initialises MPI's libraries.
#include <cstring>
#include <exception>
#include <type_traits>

#include "mixtrain/sdk/communicator.h"
#include "mixtrain/sdk/error.h"
#include "nccl_communicator.h"
#include "nccl_options.h"

namespace {
void copy_text(char* dst, const char* src, unsigned long size) {
  if (dst == nullptr || size == 0) return;
  std::strncpy(dst, src, size - 1);
  dst[size - 1] = '\0';
}
}  // namespace

extern "C" __attribute__((visibility("default"))) void* mixtrain_nccl_create_v1(
    double timeout_s, const mixtrain::sdk::Logger* logger, int* error_kind, char* error, char* hint,
    unsigned long size) {
  using mixtrain::communicator_nccl::CreateError;
  static_assert(std::is_same_v<decltype(&mixtrain_nccl_create_v1),
                               mixtrain::communicator_nccl::CreateNcclFn>);
  auto set_kind = [&](CreateError kind) {
    if (error_kind != nullptr) *error_kind = static_cast<int>(kind);
  };
  set_kind(CreateError::none);
  try {
    return static_cast<mixtrain::sdk::Communicator*>(
        new mixtrain::communicator_nccl::NcclCommunicator(
            timeout_s, logger != nullptr ? *logger : mixtrain::sdk::Logger{}));
  } catch (const mixtrain::sdk::CommunicationError& e) {
    set_kind(CreateError::communication);
    copy_text(error, e.what(), size);
    copy_text(hint, e.hint().c_str(), size);
  } catch (const mixtrain::sdk::UserError& e) {
    set_kind(CreateError::backend);
    copy_text(error, e.what(), size);
    copy_text(hint, e.hint().c_str(), size);
  } catch (const std::exception& e) {
    set_kind(CreateError::other);
    copy_text(error, e.what(), size);
  } catch (...) {
    set_kind(CreateError::other);
    copy_text(error, "unknown error", size);
  }
  return nullptr;
}
