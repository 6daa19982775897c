// CsvSink: metrics.csv, the training-step and evaluation records of metrics.jsonl as one table for
// spreadsheets and pandas.
//
// Contract
// - One fixed header (csv_columns()), so files of every run and every resume line up: a row per
//   step record and a row per evaluation record, in metrics.jsonl's order, each with the columns
//   its record has and the others empty (an evaluation row fills step and eval_*; a step that
//   was also evaluated has two rows). Top-k accuracy, eval_top<k>_accuracy in metrics.jsonl, is
//   the pair eval_top_k, eval_top_k_accuracy. Underflow and FP8 records, per-tensor maps, are
//   not rows (metrics.jsonl and TensorBoard keep them).
// - Values are written as metrics.jsonl spells them (the same JSON number text, true/false); null
//   (a non-finite number) is an empty field. Strings are quoted as RFC 4180 says when they hold a
//   comma, a quote or a line break.
// - A resumed run appends to the file; a file whose header differs (another mixtrain version)
//   is refused with sdk::UserError rather than mixed.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "runs/metrics_sink.h"
#include "runs/record_appender.h"

namespace mixtrain::core {

const std::vector<std::string>& csv_columns();
// A field as RFC 4180 writes it: as is, or in double quotes with inner quotes doubled.
std::string csv_field(std::string_view text);
// The line (without its newline) for a record, or "" when the record is not a row.
std::string csv_row(const nlohmann::json& record);

class CsvSink final : public MetricsSink {
 public:
  explicit CsvSink(const std::filesystem::path& path);
  void write(const nlohmann::json& record) override;

 private:
  RecordAppender out_;
};

}  // namespace mixtrain::core
