#include "runs/csv_sink.h"

#include <cmath>
#include <fstream>

#include "mixtrain/core/runs/summary.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string header_line() {
  std::string line;
  for (const auto& c : csv_columns()) line += (line.empty() ? "" : ",") + c;
  return line;
}

// Empty for null, as the README promises: a record's NaN (a diverged loss) is a double here, which
// dump() would spell "null", a word most CSV readers take for text.
std::string field_of(const json& v) {
  if (v.is_null()) return {};
  if (v.is_number_float() && !std::isfinite(v.get<double>())) return {};
  if (v.is_string()) return csv_field(v.get<std::string>());
  return v.dump();  // numbers and booleans as metrics.jsonl spells them
}

}  // namespace

const std::vector<std::string>& csv_columns() {
  static const std::vector<std::string> columns = {"step",
                                                   "epoch",
                                                   "loss",
                                                   "loss_scale",
                                                   "next_loss_scale",
                                                   "skipped",
                                                   "lr",
                                                   "grad_norm",
                                                   "samples_per_s",
                                                   "device_memory_bytes",
                                                   "device_peak_memory_bytes",
                                                   "host_peak_rss_bytes",
                                                   "nonfinite",
                                                   "eval_loss",
                                                   "eval_accuracy",
                                                   "eval_top_k",
                                                   "eval_top_k_accuracy"};
  return columns;
}

std::string csv_field(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(text);
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string csv_row(const json& record) {
  if (!record.is_object() || !(record.contains("loss") || record.contains("eval_loss"))) return {};
  std::vector<std::string> fields(csv_columns().size());
  auto column = [](const std::string& name) -> std::size_t {
    const auto& cols = csv_columns();
    for (std::size_t i = 0; i < cols.size(); ++i)
      if (cols[i] == name) return i;
    return cols.size();
  };
  for (const auto& [key, value] : record.items()) {
    if (const auto k = top_k_of_accuracy_key(key); k > 0) {
      fields[column("eval_top_k")] = std::to_string(k);
      fields[column("eval_top_k_accuracy")] = field_of(value);
      continue;
    }
    if (const auto i = column(key); i < fields.size()) fields[i] = field_of(value);
  }
  std::string line;
  for (std::size_t i = 0; i < fields.size(); ++i) line += (i ? "," : "") + fields[i];
  return line;
}

namespace {

// The file's header, checked before it is opened for appending: a file of other columns is
// refused before anything is added to it.
const fs::path& checked_header(const fs::path& path) {
  std::error_code ec;
  if (fs::exists(path, ec) && fs::file_size(path, ec) > 0 && !ec) {
    std::ifstream in(path);
    std::string first;
    std::getline(in, first);
    if (first != header_line())
      throw sdk::UserError(
          path.string() + " has other columns than this version writes (" + first + ")",
          "move it aside to continue the run; a new metrics.csv starts");
  }
  return path;
}

}  // namespace

CsvSink::CsvSink(const fs::path& path) : out_(checked_header(path)) {
  // Rows without the header would be refused by the next resume: a header that cannot be written
  // stops the run before it starts.
  if (out_.bytes_on_open() == 0 && !out_.append(header_line() + '\n'))
    throw sdk::UserError("cannot write the header of " + path.string(),
                         "free space on the run folder's disk, or choose another --run-dir");
}

void CsvSink::write(const json& record) {
  const std::string line = csv_row(record);
  if (line.empty()) return;
  out_.append(line + '\n');
}

}  // namespace mixtrain::core
