// In-memory datasets: classification tables (synthetic generators, .npy / IDX / CIFAR-10 loaders,
// seeded held-out split, per-channel normalisation and training-batch augmentation of images) and
// token streams for language models (llm.c token files, byte-level text, tail split), and
// load_train_and_eval() that builds both splits from a [data] section.
//
// Contract:
// - A Dataset lives in host memory and owns its data, in one of two forms:
//   table: x is row-major float32 [rows, features], y is int32 [rows] with every label in
//     [0, classes); tokens empty, stride 0. `sample_shape` is the shape of one row of x,
//     channels-first: empty means plain features ([features]); an image is {C, H, W} with
//     C·H·W = features, so x is NCHW, row r holding channel c's H×W plane at
//     r·features + c·H·W, row-major. Every loader, split and gather keeps it.
//   token: stride > 0, x and y empty, `tokens` int32 in [0, classes) (classes = vocabulary V),
//     features = block size T. Row r is the window tokens[r·stride, r·stride + T + 1): its
//     inputs are the first T tokens, its targets (next-token labels) the last T, so
//     rows = (tokens.size() − T − 1) / stride + 1. sample_shape is empty.
//   byte images: a table of images whose pixels are bytes keeps them so (a quarter of the
//     memory, and a batch travels to the device as bytes: sdk/backend_image_input.h): `pixels`
//     uint8 [rows, features] in x's layout, x empty, and `pixel_values` fp32 [C, 256], the value
//     byte b of channel c stands for (b / 255 when loaded; normalize_channels rewrites this
//     table, never the pixels). Every function below that reads features decodes through it, so
//     gather_batch() gives the same floats as the same data held as floats.
//   image files: byte images whose pixels stay in their files until a batch needs them (an
//     image folder: data/image_folder/): `image_files` [rows] names each row's file, `pixels` is
//     empty, `pixel_values` the table as above, sample_shape {3, H, W} the crops' shape and
//     `image_spec` how a batch is cut from the files (image_spec.resize > 0 marks the form).
//     gather_pixels() and gather_batch() decode a row by the held-out transform (Resize, then
//     CenterCrop); training batches are RandomResizedCrops (data/image_folder/image_batch.h).
//     A file that cannot be decoded there is an sdk::DataError naming it.
//   Every Dataset returned below passes check_dataset() (rows > 0, features > 0, sizes
//   consistent, sample_shape's dimensions >= 1 with product = features, labels / tokens in
//   range, every feature finite) — except a deliberately empty
//   eval set (eval_fraction 0 and no eval file), which has rows = 0 but keeps the form, features
//   and classes of its training set.
// - Malformed input (missing / unreadable / truncated file, bad magic or header, unsupported
//   dtype or rank, mismatched row counts, bad labels or tokens, non-finite features, too few
//   tokens for one window, bad spec values) throws sdk::DataError whose message names the file
//   (or the spec field) and, for file contents, the byte offset; says what was expected and what
//   was found; and whose hint says how to fix it. Loaders never read past the end of a file and
//   never allocate more than the file can hold.
// - Everything seeded is bit-identical for a given seed on any IEEE-754 machine and compiler:
//   DataRng and the generators use only integer ops and correctly rounded +,-,*,/,sqrt (no libm,
//   no <random> distributions, whose output differs between standard libraries).
// - Functions are thread-compatible: distinct objects may be used from distinct threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mixtrain::sdk {
struct SourceLocation;
}

namespace mixtrain::core {

struct DataSettings;  // config/experiment.h: the [data] section

// How an image-file split cuts its batches from the files (torchvision's ImageNet transforms).
struct ImageFileSpec {
  // Batches outside training: the shorter side resized to this, then the center H×W crop; > 0.
  std::int64_t resize = 0;
  // Training batches: RandomResizedCrop's area fraction and aspect-ratio (width / height) ranges.
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  unsigned threads = 1;  // threads decoding one batch
};

struct Dataset {
  std::int64_t rows = 0, features = 0;  // token form: features = block size T
  std::int32_t classes = 0;             // labels (tokens) are in [0, classes)
  std::vector<float> x;                 // table: [rows, features], row-major
  std::vector<std::int32_t> y;          // table: [rows]
  std::vector<std::int32_t> tokens;     // token form: the stream the windows are cut from
  std::vector<std::uint8_t> pixels;     // byte images: [rows, features], row-major
  std::vector<float> pixel_values;      // byte images: [C, 256], what each byte stands for
  std::vector<std::filesystem::path> image_files;  // image files: [rows], each row's file
  ImageFileSpec image_spec;                        // image files: how batches are cut
  // What each class is called, in label order (an image folder's class folders); empty when the
  // data do not say. At most `classes` names (a config may pad the head past them).
  std::vector<std::string> class_names;
  std::int64_t stride = 0;              // token form: > 0, tokens between window starts
  // The shape of one sample of x, channels-first: {} = [features]; {C, H, W} an image (NCHW x).
  // Models read it to shape their input node; its product is `features` when non-empty.
  std::vector<std::int64_t> sample_shape;

  bool is_tokens() const { return stride > 0; }
  bool is_image() const { return sample_shape.size() == 3; }
  bool is_bytes() const { return !pixel_values.empty(); }
  bool is_image_files() const { return image_spec.resize > 0; }
  // Image dimensions (valid when is_image()).
  std::int64_t channels() const { return sample_shape[0]; }
  std::int64_t height() const { return sample_shape[1]; }
  std::int64_t width() const { return sample_shape[2]; }
  // Labels one row holds: 1 (its class) for a table, T (one next token per position) for tokens.
  std::int64_t labels_per_row() const { return is_tokens() ? features : 1; }
};

// Throws sdk::DataError (naming `origin`, e.g. a file or "synthetic data") unless `data` keeps
// the Dataset contract above.
void check_dataset(const Dataset& data, std::string_view origin);

// ---- seeded randomness ----------------------------------------------------------------------

// xoshiro256** whose state is filled by splitmix64 from (seed, stream). The algorithms are part
// of the contract: changing them changes every seeded dataset and shuffle order. Distinct
// streams of one seed are independent sequences (used so that, e.g., asking for more rows does
// not move the class centres).
class DataRng {
 public:
  explicit DataRng(std::uint64_t seed, std::uint64_t stream = 0);
  std::uint64_t next_u64();
  double uniform();                      // [0, 1), 53 random bits
  std::uint64_t below(std::uint64_t n);  // uniform in [0, n), unbiased; n > 0
  double normal();                       // N(0, 1) by Box–Muller with portable log / sin / cos
  // out[i] = float(scale · normal()) for each i in order: the values, and the state after, of
  // out.size() calls. The draws stay in order on the caller's thread; the Box–Muller transforms
  // (the log, sine and cosine: nearly all the time) run on up to `threads` threads, each on its
  // own pairs, so the values do not depend on `threads`.
  void normals(std::span<float> out, double scale, unsigned threads);

 private:
  std::uint64_t state_[4];
  double spare_normal_ = 0.0;
  bool has_spare_normal_ = false;
};

// Fisher–Yates with rng.below(): the same permutation for the same rng state everywhere.
void seeded_shuffle(std::span<std::int64_t> values, DataRng& rng);

// ---- synthetic data -------------------------------------------------------------------------

struct SyntheticSpec {
  // "clusters": class c has a centre at distance `separation` from the origin in a random
  //   direction; a point is centre + noise·N(0, I). Defaults are > 90% learnable (~98%).
  // "teacher": x ~ N(0, I); y = argmax of a fixed random teacher MLP
  //   (features → teacher_hidden ReLU → classes, logits centred per class) applied to x.
  // "images": [channels, height, width] images (sample_shape {C, H, W}; `features` is unused
  //   and set to C·H·W). Class c has a fixed random template — three strokes per channel (bars
  //   two pixels thick in one of four orientations), pixel values in [0, 1] — that each sample
  //   places at a uniform random shift of up to max_shift pixels in each direction (zeros enter
  //   at the border), plus noise·N(0, 1) per pixel. With 1×16×16, max_shift 3, noise 0.4 and 10
  //   classes, a CNN of two 3×3 convolutions with pooling reaches ~96% held-out accuracy after
  //   two passes over 4800 rows (86% after one), where softmax regression on the raw pixels
  //   stays near 42%.
  std::string kind = "clusters";
  std::int64_t rows = 8192, features = 32;
  std::int64_t channels = 1, height = 16, width = 16;  // images
  std::int64_t max_shift = 3;                          // images: in [0, min(H, W) / 2)
  std::int32_t classes = 10;
  std::uint64_t seed = 0;
  double noise = 1.0;                // clusters: standard deviation around the centres
  double separation = 4.0;           // clusters: distance of each centre from the origin
  std::int64_t teacher_hidden = 64;  // teacher: hidden width
  double label_noise = 0.0;          // both: probability a label is replaced by a uniform class
  // Every kind: multiplies each feature after the labels are drawn (raw, unnormalised
  // measurements: 1e4 puts them in the tens of thousands, past what fp16 can hold).
  double feature_scale = 1.0;
  // images: each pixel rounded to a byte, round(clamp(v, 0, 1)·255), and kept as bytes (the
  // byte-image form), as image files hold them; feature_scale must then be 1.
  bool byte_pixels = false;
};

// Throws sdk::DataError on an unknown kind or out-of-range field.
Dataset make_synthetic(const SyntheticSpec& spec);

// ---- files ----------------------------------------------------------------------------------

// NumPy .npy (format 1.0 / 2.0 / 3.0, little-endian, C order). Features: float32 or float64
// (converted), or uint8 (scaled to [0, 1] by /255, as image files are stored); shape [N, D]
// (sample_shape {}), [N, H, W] (a one-channel image: {1, H, W}), [N, C, H, W] (channels-first
// images: {C, H, W}) or [N, d1, ..., dk] with k > 3 (flattened to D = d1·…·dk, sample_shape {}).
// Labels: any integer dtype of 1, 2, 4 or 8 bytes, shape [N] or [N, 1]. `classes` = 0 infers
// max label + 1; otherwise every label must be below it (the error names the row and its byte
// offset in the labels file).
// `channels_last`: a rank-4 features array is [N, H, W, C] (sample_shape {C, H, W} after the
// permutation to channels-first); other ranks are unaffected.
// `keep_bytes`: uint8 images stay bytes (the byte-image form above) instead of floats.
Dataset load_npy(const std::filesystem::path& features, const std::filesystem::path& labels,
                 std::int32_t classes = 0, bool channels_last = false, bool keep_bytes = false);
// The features half of load_npy (the same dtypes, shapes and checks) for data without labels
// (`mixtrain predict`): y is empty and classes 0, so the result is not a complete Dataset until
// the caller gives it labels. `keep_bytes` as for load_npy.
Dataset load_npy_features(const std::filesystem::path& features, bool keep_bytes = false);

// MNIST IDX: images u8 [N, H, W] (magic 0x00000803) become N one-channel images (sample_shape
// {1, H, W}) scaled to [0, 1]; [N, D] gives plain features (sample_shape {}) and [N, H, W, C]
// channels-last images, which are permuted to channels-first ({C, H, W}). Labels u8 [N] (magic
// 0x00000801). `classes` as for load_npy. A gzip-compressed file (recognised by its magic bytes
// 1f 8b, whatever its name) is decompressed while read, never beyond the data size its IDX
// header declares.
// `keep_bytes`: images ([N, H, W] or [N, H, W, C]) stay bytes (the byte-image form above).
Dataset load_idx(const std::filesystem::path& images, const std::filesystem::path& labels,
                 std::int32_t classes = 0, bool keep_bytes = false);
// The images half of load_idx, for data without labels: y empty, classes 0 (as load_npy_features).
Dataset load_idx_images(const std::filesystem::path& images, bool keep_bytes = false);

// CIFAR-10 binary batches (data_batch_1.bin … data_batch_5.bin, test_batch.bin): records of one
// label byte (0..9) and 3072 pixel bytes — the 32×32 red plane, then green, then blue, each
// row-major — so a record is already channels-first. Every record of every file, in order,
// becomes an image (sample_shape {3, 32, 32}) scaled to [0, 1]; classes = 10. Any whole number
// of records is accepted. Errors name the file: missing, empty, a size that is not a multiple
// of 3073 (with the offset where the partial record starts), a label >= 10 (with the record
// index and its byte offset); an empty list names what was looked for.
// `keep_bytes`: the pixels stay bytes (the byte-image form above).
Dataset load_cifar10(std::span<const std::filesystem::path> files, bool keep_bytes = false);

// The CIFAR-10 files in `dir`: (the data_batch_1.bin … data_batch_5.bin present, in that order;
// test_batch.bin). Throws sdk::DataError naming the folder and the file names looked for when
// the folder is missing, holds none of the five training batches, or lacks test_batch.bin.
std::pair<std::vector<std::filesystem::path>, std::vector<std::filesystem::path>> cifar10_files(
    const std::filesystem::path& dir);
// {dir / "test_batch.bin"} alone, with cifar10_files()' errors for a missing folder or file: the
// training batches need not be there.
std::vector<std::filesystem::path> cifar10_held_out_files(const std::filesystem::path& dir);

// ---- images: normalisation and augmentation ---------------------------------------------------

// Per-channel mean and (population) standard deviation of an image dataset's pixels, summed in
// double. std::logic_error unless data.is_image(). Image files: over at most
// kImageStatisticsSample of them, evenly spaced, cut by the held-out transform (decoding a whole
// ImageNet for four numbers would take longer than an epoch).
struct ChannelStats {
  std::vector<double> mean, std;
};
inline constexpr std::int64_t kImageStatisticsSample = 1024;
ChannelStats channel_statistics(const Dataset& data);

// One pixel normalised as torchvision's Normalize computes it: mean and std rounded to float32,
// then (x − mean) / std in float32, each operation rounded.
inline float normalized_pixel(float x, double mean, double std) {
  const auto m = static_cast<float>(mean), s = static_cast<float>(std);
  const float centred = x - m;
  return centred / s;
}

// x = normalized_pixel(x, mean[c], std[c]) for every pixel of channel c; byte images get the same
// function applied to their table, so their pixels decode to the same floats.
// std::invalid_argument unless data is an image dataset with one mean and one std > 0 per
// channel (callers validate user input first); an empty dataset is left as it is.
void normalize_channels(Dataset& data, const ChannelStats& stats);

// Images read as [N, d1, d2, d3] whose samples are channels-last ([H, W, C], as torchvision's
// CIFAR-10 `.data` and most image arrays outside PyTorch): sample_shape {d1, d2, d3} is taken as
// {H, W, C} and x is permuted in place to channels-first, sample_shape {C, H, W}.
// std::invalid_argument when sample_shape does not have three dimensions.
void channels_last_to_first(Dataset& data);

// Whether `data`'s images read as {C, H, W} look like the other layout's: C not 1, 3 or 4 while H
// or W is 4 pixels or fewer, as a channels-last [N, 32, 32, 3] array read channels-first is (32
// channels of 32×3 pixels). false for plain features.
bool implausible_image_layout(const Dataset& data);

// Throws sdk::ConfigError at `where` (key `key`, e.g. "data.npy.layout") when
// implausible_image_layout(data), naming the shape found and, by `channels_last` (how the data
// were read), the other layout. Plain features and plausible images pass.
void check_image_plausible(const Dataset& data, const std::string& origin, bool channels_last,
                           const sdk::SourceLocation& where, const std::string& key);

// Training-time augmentation of image batches (torchvision's RandomCrop(padding) and
// RandomHorizontalFlip on the [0, 1] image, before Normalize).
struct AugmentSpec {
  std::int64_t crop_padding = 0;  // pad each side by p, then take a random H×W window; 0 = off
  bool horizontal_flip = false;   // mirror left-right with probability 1/2
  bool enabled() const { return crop_padding > 0 || horizontal_flip; }
};

// Augments the `rows` images of batch `x` [rows, C, H, W] in place. The randomness of sample i
// is DataRng(seed, augment_stream(batch_index, first_row + i)) alone — a pure function of (seed,
// batch index, position in the batch), so a batch is reproduced exactly from those three (a
// resumed run needs no saved generator state). `first_row` is x's first row's position in the
// batch the sampler drew: a data-parallel rank augments its share as one process augments
// those rows, so the data a step sees does not depend on the number of ranks. Sample i draws, in
// order: the crop offsets dy, dx in [0, 2p] (when crop_padding = p > 0), then the flip (uniform() <
// 0.5, when horizontal_flip). The window is rows dy − p … dy − p + H − 1 and columns dx − p … of
// the image; a pixel outside the image is `fill[c]`, the value a raw 0 (black) pixel has after
// normalisation: −mean[c] / std[c], or 0 without normalisation — exactly torchvision's zero padding
// before Normalize. The flip applies to the cropped window. std::invalid_argument when shape is not
// {C, H, W}, fill has not C values, or crop_padding is negative.
void augment_batch(const AugmentSpec& spec, std::span<const std::int64_t> shape,
                   std::span<const float> fill, float* x, std::int64_t rows, std::uint64_t seed,
                   std::uint64_t batch_index, std::uint64_t first_row = 0);
// The same on a batch of byte images [rows, C, H, W], filling with byte 0 (what decodes to a raw 0
// pixel normalised): decoded afterwards, it equals the float batch augmented above.
void augment_batch(const AugmentSpec& spec, std::span<const std::int64_t> shape, std::uint8_t* x,
                   std::int64_t rows, std::uint64_t seed, std::uint64_t batch_index,
                   std::uint64_t first_row = 0);
std::uint64_t augment_stream(std::uint64_t batch_index, std::uint64_t position);

// ---- splitting and batching -----------------------------------------------------------------

// (train, eval): rows are shuffled with DataRng(seed) before round(rows·eval_fraction) of them
// (at least one when eval_fraction > 0) go to eval. eval_fraction = 0 gives an empty eval set
// (rows = 0) and leaves the training rows in their order. Both keep all.classes, all.features
// and all.sample_shape. Throws sdk::DataError when eval_fraction is outside [0, 1) or no
// training row would remain, std::logic_error for a token dataset (its windows overlap, so a
// shuffled split would leak text into evaluation: split_token_tail).
std::pair<Dataset, Dataset> split_holdout(Dataset all, double eval_fraction, std::uint64_t seed);

// Copies the given rows of a table dataset into x_out [rows.size(), features] and y_out
// [rows.size()] (y_out may be null). Throws std::out_of_range on an index outside [0, data.rows)
// and std::logic_error on a token dataset (use gather_tokens) — caller bugs.
// Byte images are decoded through their table; image files decoded from their files first
// (gather_pixels).
void gather_batch(const Dataset& data, std::span<const std::int64_t> rows, float* x_out,
                  std::int32_t* y_out);
// The bytes of the given rows of byte images into pixels_out [rows.size(), features], with y_out
// as gather_batch's. std::logic_error unless data.is_bytes(). Image files are decoded by the
// held-out transform (an sdk::DataError naming a file that cannot be).
void gather_pixels(const Dataset& data, std::span<const std::int64_t> rows,
                   std::uint8_t* pixels_out, std::int32_t* y_out);
// Byte images decoded in place into the float form (pixels and table dropped); any other form is
// left as it is (image files too: their pixels are read per batch). What data.pixels = "float32"
// does at load.
void decode_pixels(Dataset& data);

// ---- token data (language models) -----------------------------------------------------------

// llm.c token file (dev/data/data_common.py): a header of 256 little-endian int32 — header[0] =
// 20240520 (magic), header[1] = 1 (version: uint16 tokens), header[2] = N tokens — then exactly
// N little-endian uint16 tokens. Returns them as int32; each must be below vocab_size (GPT-2's
// files: 50257). Errors name the file and the byte offset of what is wrong: bad magic or
// version, a negative count, a file shorter than its header or than the count says (or longer),
// a token >= vocab_size (its value, index and offset). The vector has room for one token more
// (capacity > size), for a placeholder appended without copying the stream.
std::vector<std::int32_t> load_token_file(const std::filesystem::path& file,
                                          std::int32_t vocab_size);

// Byte-level tokens (vocabulary 256): every byte of `files`, one file after another, as a token
// in [0, 256). An empty file (or an empty list) is a DataError. Room for one more, as above.
std::vector<std::int32_t> load_text_tokens(std::span<const std::filesystem::path> files);

// The token dataset of windows of block_size + 1 tokens every `stride` tokens (see Dataset).
// Throws sdk::DataError naming `origin` when the stream holds fewer than block_size + 1 tokens
// (both numbers in the message) or a token outside [0, vocab_size); std::invalid_argument on
// block_size, vocab_size or stride < 1.
Dataset make_token_dataset(std::vector<std::int32_t> tokens, std::int64_t block_size,
                           std::int32_t vocab_size, std::int64_t stride, std::string_view origin);

// The token dataset a session that feeds the model windows of its own (sample, predict) runs:
// features = block_size, classes = vocab_size, stride 1, and no rows or stream. Checks as
// make_token_dataset() does.
Dataset token_data_shape(std::int64_t block_size, std::int32_t vocab_size);

// (train, eval) from one stream, never shuffled (overlapping windows would leak between the
// splits): eval is the tail, round(N·eval_fraction) tokens, cut into non-overlapping windows
// (stride block_size: each held-out token is predicted at most once); train is the rest, a window
// at every start (stride 1). eval_fraction = 0 gives an empty eval set. Throws sdk::DataError,
// naming `origin` and the numbers, when eval_fraction is outside [0, 1), when the tail holds
// fewer than block_size + 1 tokens although eval_fraction > 0, or when the rest does.
std::pair<Dataset, Dataset> split_token_tail(std::vector<std::int32_t> tokens,
                                             std::int64_t block_size, std::int32_t vocab_size,
                                             double eval_fraction, std::string_view origin);

// Copies the windows `rows` of a token dataset: ids_out [rows.size(), T] gets each window's
// first T tokens, targets_out [rows.size(), T] its last T (the next token at every position;
// may be null). Throws std::out_of_range on an index outside [0, data.rows) and
// std::logic_error on a table dataset (use gather_batch) — caller bugs.
void gather_tokens(const Dataset& data, std::span<const std::int64_t> rows, std::int32_t* ids_out,
                   std::int32_t* targets_out);

// ---- from the config ------------------------------------------------------------------------

// The (train, eval) datasets a [data] section describes, with the normalisation applied to both
// (`normalization` empty when none). Tables (synthetic, npy, idx, cifar10): loaded, classes
// raised to settings.classes when that is larger, then split_holdout(…, seed) — except cifar10,
// whose eval set is its own file(s) (test_batch.bin), never a split of the training files; then
// [data.normalize]: given mean / std, or computed by channel_statistics() on the training split
// only, applied to train and eval alike. A normalisation whose count differs from the images'
// channels, or any [data.normalize] / [data.augment] on data that are not images, is an
// sdk::ConfigError at the key's config location (crop_padding >= half a side: a warning). Tokens
// (tokens: an llm.c file; text: bytes of one or more files): the training stream with a window
// at every start; eval from the eval file(s) in non-overlapping windows when given, else the
// stream's tail (split_token_tail; eval_fraction). `seed` only matters for tables.
struct LoadedData {
  Dataset train, eval;
  ChannelStats normalization;  // the mean / std applied (computed ones included); empty: none
  // The value each channel's raw 0 pixel has after normalisation (augment_batch's fill): C
  // values for images, empty otherwise.
  std::vector<float> black;
};
LoadedData load_data(const DataSettings& settings, std::uint64_t seed);
// load_data() for a session that evaluates a trained model and trains nothing (eval): a token
// source with held-out files of its own opens only those (train is token_data_shape()); every
// other source, and tokens held out as the training stream's tail, loads as load_data() does.
LoadedData load_held_out_data(const DataSettings& settings, std::uint64_t seed);
// A cifar10 source's held-out files alone (data.cifar10.eval, else the folder's test_batch.bin),
// for an evaluation whose model takes its input from a checkpoint's record (data/data_shape.h):
// the training batches are neither needed nor opened. `model_input` is the form the record gives
// (dataset_of_shape()): images of another sample shape are an sdk::DataError naming `origin` (the
// checkpoint); classes are its (a label at or past them is an sdk::DataError naming the file).
// Pixels as data.pixels keeps them, then `normalization` applied (empty: none). A named file that
// does not exist is an sdk::ConfigError at its key, as load_data() says it; the loader's
// sdk::DataError otherwise.
Dataset load_cifar10_held_out(const DataSettings& settings, const Dataset& model_input,
                              const std::string& origin, const ChannelStats& normalization);
// An image folder's held-out folder alone (data.image_folder.eval), for an evaluation whose model
// takes its input from a checkpoint's record, as load_cifar10_held_out(): labelled by the class
// names `model_input` records (data/data_shape.h), so the training folder is not opened (a
// record without names takes the training folder's, which must then be there). Crops of a size
// other than the record's are an sdk::DataError naming `origin`; the folder's own errors are the
// loaders'. `normalization` as for load_cifar10_held_out().
Dataset load_image_folder_held_out(const DataSettings& settings, const Dataset& model_input,
                                   const std::string& origin, const ChannelStats& normalization);
// The checks load_data() makes of the [data] keys against the training split's form, also run by
// a session that builds the model from a checkpoint's record of it (data/data_shape.h) and loads
// nothing: data.pixels = "uint8" on data that are not byte images, [data.normalize] on data that
// are not images or with a mean or std per channel of another count, [data.augment] on data that
// are not images; each an sdk::ConfigError at its key.
void check_data_settings_fit(const DataSettings& settings, const Dataset& train);
// "mean [0.49, 0.48, 0.45], std [0.25, 0.24, 0.26]": for the run's log.
std::string describe_normalization(const ChannelStats& stats);
// load_data() without the normalisation record.
std::pair<Dataset, Dataset> load_train_and_eval(const DataSettings& settings, std::uint64_t seed);

}  // namespace mixtrain::core
