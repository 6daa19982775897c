// `mixtrain predict`: a trained model's predictions for new inputs, written as a .npy array
// (core/predict/prediction_file.h), with the loss and accuracy where the inputs have labels.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "mixtrain/core/console/live_line.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/console/progress_report.h"
#include "mixtrain/core/data/prediction_input.h"
#include "mixtrain/core/predict/prediction_file.h"
#include "mixtrain/core/train/interrupt.h"
#include "mixtrain/sdk/support/atomic_file_writer.h"
#include "model_session.h"
#include "output_file.h"

namespace mixtrain::cli {

namespace {

namespace fs = std::filesystem;

// The live progress line of a terminal: rows done, rate, time left; at most five redraws a
// second.
class PredictProgress {
 public:
  PredictProgress(std::int64_t rows, bool live) : rows_(rows), live_(live) {}
  void done(std::int64_t rows_done) {
    if (!live_) return;
    const auto now = Clock::now();
    if (rows_done < rows_ && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(rows_done) / elapsed : 0.0;
    char text[160];
    std::snprintf(
        text, sizeof text, "predict: %lld/%lld rows, %.0f rows/s, elapsed %s, ETA %s",
        static_cast<long long>(rows_done), static_cast<long long>(rows_), rate,
        core::format_duration(elapsed).c_str(),
        core::format_duration(rate > 0 ? static_cast<double>(rows_ - rows_done) / rate : -1.0)
            .c_str());
    core::LiveLine::instance().show(text);
  }
  ~PredictProgress() {
    if (live_) core::LiveLine::instance().finish();
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  std::int64_t rows_;
  bool live_;
  Clock::time_point start_ = Clock::now(), last_{};
};

}  // namespace

int run_predict(const ConfigArgs& cfg, const PredictArgs& args) {
  const fs::path out = args.out, input = args.input;
  for (const auto& [option, path] :
       {std::pair<std::string, std::string>{"--input", args.input}, {"--labels", args.labels}}) {
    if (path.empty()) continue;
    // fs::is_regular_file(path) throws a bare filesystem_error on a loop of symbolic links: asked
    // with an error code, the loop is said as what it is.
    std::error_code ec;
    const auto status = fs::status(path, ec);
    if (ec == std::errc::too_many_symbolic_link_levels)
      throw sdk::DataError(option + " " + path + " is a loop of symbolic links",
                           "point it at the file itself");
    // A folder of images (or of class folders) is an input too, for a model trained on an
    // image folder (data/prediction_input.h says which).
    if (!fs::is_regular_file(status) && !(option == "--input" && fs::is_directory(status)))
      throw sdk::DataError(
          option + " " + path + (fs::exists(status) ? " is not a file" : " does not exist"),
          "check the path; predict reads one file of inputs (and one of labels), or a folder "
          "of images");
  }
  CommandInputs inputs = config_inputs(cfg);
  inputs.insert(inputs.end(),
                {{"--input", input}, {"--labels", args.labels}, {"--checkpoint", args.checkpoint}});
  check_output_file(out, inputs, args.force, "--out", "predictions.npy");
  core::PredictionFormat format;
  format.values = args.values == "probabilities" ? core::PredictionValues::probabilities
                                                 : core::PredictionValues::logits;
  format.top_k = args.top_k;
  format.all_positions = args.positions == "all";

  auto session = open_model_session(
      cfg, SessionWeights::from_checkpoint, /*rehearses=*/false, core::DataSplits::none,
      {.path = args.checkpoint, .layout = args.layout, .records_shape = true, .check_model = {}});
  auto& trainer = *session.trainer;
  const core::Dataset& trained = trainer.train_data();
  const std::int64_t classes = trainer.model().classes();
  if (args.top_k > classes)
    throw sdk::UserError("--top-k " + std::to_string(args.top_k) + " is more than the model's " +
                             std::to_string(classes) + " classes",
                         "give --top-k " + std::to_string(classes) + " or fewer");
  if (format.all_positions && !trained.is_tokens())
    throw sdk::UserError(
        "--positions all is for language models; this model makes one "
        "prediction per input row",
        "leave out --positions");
  if (args.image_layout != "auto" && !trained.is_image())
    throw sdk::UserError("--image-layout " + args.image_layout +
                             " says how images are laid out; this model reads " +
                             (trained.is_tokens() ? "token windows" : "rows of plain features"),
                         "leave out --image-layout");
  if (args.stride != 0 && !trained.is_tokens())
    throw sdk::UserError("--stride " + std::to_string(args.stride) +
                             " spaces a language model's token windows; this model makes one "
                             "prediction per input row",
                         "leave out --stride");
  // A run or checkpoints/ folder names its newest checkpoint as the session opened: the one whose
  // data shape the model was built from.
  refuse_input_as_output("--out", out, {{"--checkpoint", session.checkpoint}});

  core::PredictionInputSpec spec;
  spec.input = input;
  spec.labels = args.labels;
  spec.layout = core::parse_image_layout(args.image_layout);
  spec.stride = args.stride;
  const auto data =
      core::load_prediction_input(spec, session.experiment.data, trained, trainer.normalization());
  auto log = core::core_logger("predict");
  log.info("predicting " + data.description);
  std::string extension = out.extension().string();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (extension != ".npy")
    log.warn("--out " + out.string() +
             " is written as a NumPy .npy array (numpy.load reads it "
             "whatever its name); name it .npy to say so");

  const std::int64_t positions = trained.labels_per_row();
  for (const auto& stale : remove_abandoned_temp_files(out))
    log.info("removed " + stale.string() + ", the temporary file of a writer that was killed");
  // Ctrl-C, SIGTERM or a hang-up stops between batches: the writer unwinds and deletes its
  // temporary file (it was left behind, an output's size each time), and --out stays as it was.
  static constexpr char kStopping[] =
      "\ninterrupted: stopping after this batch; no predictions are written (press Ctrl-C again "
      "to quit at once)\n";
  core::InterruptGuard interrupt_guard(kStopping);
  struct Interrupted {};
  core::PredictionFile file(out, format, data.data.rows, positions, classes);
  core::EvalResult result;
  double seconds = 0.0;
  try {
    PredictProgress progress(data.data.rows, isatty(STDERR_FILENO) != 0);
    std::int64_t done = 0;
    result = trainer.predict(data.data, data.labelled_rows, [&](const core::PredictionBatch& b) {
      if (core::interrupt_requested()) throw Interrupted{};
      file.append(b.rows, b.logits);
      done += b.rows;
      progress.done(done);
    });
    seconds = progress.seconds();
  } catch (const Interrupted&) {
    // Stopped between batches; said below, once the live line has ended.
  }  // the live line ends here, so the log lines below get lines of their own
  // Stopped, or signalled after the last batch: the handler said nothing would be written.
  if (core::interrupt_requested()) {
    log.warn("interrupted after " + std::to_string(file.rows_written()) + " of " +
             std::to_string(data.data.rows) + " rows: " + out.string() + " is not written");
    return core::interrupted_exit_code();
  }
  if (const auto warning = file.commit(); !warning.empty()) log.warn(warning);
  // Image files: which row is which file, one a line, beside the predictions (name.files.txt).
  fs::path row_files;
  if (!data.row_names.empty()) {
    row_files = out.parent_path() / (out.stem().string() + ".files.txt");
    std::string text;
    for (const auto& name : data.row_names) text += name + "\n";
    sdk::AtomicFileWriter names(row_files, /*durable=*/false, "the predicted rows' files");
    names.write(text.data(), text.size());
    if (const auto warning = names.commit(); !warning.empty()) log.warn(warning);
  }
  char elapsed[64];
  std::snprintf(elapsed, sizeof elapsed, "%.1f s", seconds);
  log.info("wrote " + out.string() + " in " + elapsed);

  nlohmann::json j = {{"predictions", out.string()},
                      {"shape", file.shape()},
                      {"values", args.values},
                      {"rows", data.data.rows}};
  if (format.top_k > 0) j["top_k"] = format.top_k;
  if (!row_files.empty()) j["row_files"] = row_files.string();
  if (data.labelled_rows > 0) {
    j["labelled_rows"] = data.labelled_rows;
    j["loss"] = result.loss;
    j["accuracy"] = result.accuracy;
    // eval's numbers for these rows (README), which for a language model cover every position of
    // every window, not only the last positions `--positions last` writes: the line says so.
    j["loss_over"] = trained.is_tokens() ? "all positions" : "rows";
  }
  // A path is bytes: one that is not UTF-8 is written with U+FFFD where a byte is not, rather than
  // failing the command after its file is written.
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  // The predictions are written all the same (they show which rows are not finite).
  if (data.labelled_rows > 0 && !std::isfinite(result.loss)) {
    report_nonfinite_loss(session.experiment.policy_name);
    return kExitDiverged;
  }
  return 0;
}

}  // namespace mixtrain::cli
