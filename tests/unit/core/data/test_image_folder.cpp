// Image folders (core/src/data/image_folder/): torchvision's ImageFolder order and labels, the
// refusals, header checks, and batches cut from the files: held-out batches by Resize then
// CenterCrop, training batches by crops that depend on (seed, batch, position) alone.
#include "data/data_fingerprint.h"
#include "data/image_folder/image_batch.h"
#include "data/image_folder/image_file.h"
#include "data/image_folder/image_folder.h"
#include "data/image_folder/image_resample.h"
#include "data_test_util.h"
#include "image_test_files.h"

#include <sstream>

namespace mixtrain::test {
namespace {

using core::Dataset;
using core::ImageFolderOptions;

// root/a_cat: x.png, notes.txt; root/b_dog: 2.jpg, 10.JPG, z.jpg, sub/1.png; root/c_bird: y.jpeg;
// and a file at the root, which is no class.
void make_folder(const fs::path& root) {
  fs::create_directories(root / "a_cat");
  fs::create_directories(root / "b_dog" / "sub");
  fs::create_directories(root / "c_bird");
  write_png(root / "a_cat" / "x.png", 40, 30, 1);
  write_file(root / "a_cat" / "notes.txt", {'h', 'i'});
  write_jpeg(root / "b_dog" / "2.jpg", 64, 48, 2);
  write_jpeg(root / "b_dog" / "10.JPG", 31, 57, 3);
  write_jpeg(root / "b_dog" / "z.jpg", 50, 50, 4);
  write_png(root / "b_dog" / "sub" / "1.png", 20, 70, 5);
  write_jpeg(root / "c_bird" / "y.jpeg", 90, 33, 6);
  write_file(root / "README.md", {'#'});
}

std::vector<std::string> relative(const core::ImageFolderListing& l) {
  std::vector<std::string> out;
  for (const auto& f : l.files) out.push_back(fs::relative(f, l.root).generic_string());
  return out;
}

ImageFolderOptions options(std::int64_t size, unsigned threads = 1, bool check = true) {
  ImageFolderOptions o;
  o.size = size;
  o.spec.resize = size + size / 7;
  o.spec.threads = threads;
  o.check_files = check;
  return o;
}

template <class F>
std::string data_error_of(F&& f) {
  try {
    f();
  } catch (const sdk::DataError& e) {
    return e.full_message();
  }
  ADD_FAILURE() << "no DataError";
  return {};
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ImageFolder, ListsClassesAndFilesInTorchvisionsOrder) {
  ScratchDir dir;
  make_folder(dir.path());
  const auto l = core::list_image_folder(dir.path());
  EXPECT_EQ(l.classes, (std::vector<std::string>{"a_cat", "b_dog", "c_bird"}));
  // sorted(os.walk()) then sorted names: a folder's own files before its subfolders' (a sort of
  // whole paths would put sub/1.png before z.jpg), names in byte order ("10.JPG" < "2.jpg").
  EXPECT_EQ(relative(l),
            (std::vector<std::string>{"a_cat/x.png", "b_dog/10.JPG", "b_dog/2.jpg", "b_dog/z.jpg",
                                      "b_dog/sub/1.png", "c_bird/y.jpeg"}));
  EXPECT_EQ(l.labels, (std::vector<std::int32_t>{0, 1, 1, 1, 1, 2}));
  EXPECT_EQ(l.skipped, 2);  // notes.txt, and README.md beside the class folders

  const Dataset d = core::load_image_folder(l, options(16));
  core::check_dataset(d, "test");
  EXPECT_TRUE(d.is_image_files());
  EXPECT_TRUE(d.is_bytes());
  EXPECT_EQ(d.rows, 6);
  EXPECT_EQ(d.classes, 3);
  EXPECT_EQ(d.sample_shape, (std::vector<std::int64_t>{3, 16, 16}));
  EXPECT_EQ(d.features, 3 * 16 * 16);
  EXPECT_TRUE(d.pixels.empty());
}

// Python sorts names as str: by code point, a byte that is not UTF-8 decoded to the surrogate
// U+DC00 + byte. For valid UTF-8 that is the bytes' order; such a byte (U+DCFF here) comes after
// U+4E00 and before U+FF21, where the bytes' order puts 0xFF last.
TEST(ImageFolder, ClassesAreInPythonsOrderOfTheirNames) {
  ScratchDir dir;
  const std::vector<std::string> python_order = {"a", "\xe4\xb8\x80", "\xff", "\xef\xbc\xa1"};
  for (std::size_t i = 0; i < python_order.size(); ++i) {
    fs::create_directories(dir / "root" / python_order[i]);
    write_png(dir / "root" / python_order[i] / "x.png", 4, 4, static_cast<int>(i));
  }
  const auto l = core::list_image_folder(dir / "root");
  EXPECT_EQ(l.classes, python_order);
  EXPECT_EQ(l.labels, (std::vector<std::int32_t>{0, 1, 2, 3}));
  // Within a class, file names follow the same rule.
  write_png(dir / "root" / "a" / "\xff.png", 4, 4, 9);
  write_png(dir / "root" / "a" / "\xef\xbc\xa1.png", 4, 4, 9);
  const auto files = core::list_image_folder(dir / "root").files;
  EXPECT_EQ(files[0].filename().string(), "x.png");
  EXPECT_EQ(files[1].filename().string(), "\xff.png");
  EXPECT_EQ(files[2].filename().string(), "\xef\xbc\xa1.png");
}

TEST(ImageFolder, RefusesFoldersItCannotFollowNamingThem) {
  ScratchDir dir;
  EXPECT_TRUE(
      has(data_error_of([&] { core::list_image_folder(dir / "nowhere"); }), "does not exist"));
  write_jpeg(dir / "one.jpg", 8, 8, 0);
  EXPECT_TRUE(has(data_error_of([&] { core::list_image_folder(dir / "one.jpg"); }),
                  "is a file, not a folder"));
  fs::create_directories(dir / "flat");
  write_jpeg(dir / "flat" / "a.jpg", 8, 8, 0);
  EXPECT_TRUE(
      has(data_error_of([&] { core::list_image_folder(dir / "flat"); }), "holds no class folder"));

  fs::create_directories(dir / "root" / "full");
  fs::create_directories(dir / "root" / "hollow");
  write_jpeg(dir / "root" / "full" / "a.jpg", 8, 8, 0);
  write_file(dir / "root" / "hollow" / "list.csv", {'x'});
  const auto empty = data_error_of([&] { core::list_image_folder(dir / "root"); });
  EXPECT_TRUE(has(empty, "'hollow'") && has(empty, "holds no .jpg, .jpeg or .png")) << empty;

  // A format torchvision reads and mixtrain does not: refused, since skipping it would train on
  // other images than torchvision's.
  write_file(dir / "root" / "hollow" / "b.WEBP", {'R', 'I', 'F', 'F'});
  write_file(dir / "root" / "full" / "c.webp", {'R', 'I', 'F', 'F'});
  const auto webp = data_error_of([&] { core::list_image_folder(dir / "root"); });
  EXPECT_TRUE(has(webp, "2 .webp files") && has(webp, "convert them")) << webp;
}

TEST(ImageFolder, HeldOutFolderIsNumberedByTheTrainingClasses) {
  ScratchDir dir;
  make_folder(dir / "train");
  fs::create_directories(dir / "val" / "b_dog");
  write_jpeg(dir / "val" / "b_dog" / "v.jpg", 30, 30, 9);
  const auto train = core::list_image_folder(dir / "train");
  const auto held = core::list_image_folder(dir / "val", &train.classes);
  EXPECT_EQ(held.labels, (std::vector<std::int32_t>{1}));
  EXPECT_EQ(held.classes, train.classes);
  EXPECT_EQ(held.missing_classes, (std::vector<std::string>{"a_cat", "c_bird"}));

  fs::create_directories(dir / "val" / "e_fox");
  write_jpeg(dir / "val" / "e_fox" / "f.jpg", 30, 30, 9);
  const auto foreign = data_error_of([&] { core::list_image_folder(dir / "val", &train.classes); });
  EXPECT_TRUE(has(foreign, "'e_fox'") && has(foreign, "the training folder lacks")) << foreign;
}

TEST(ImageFolder, AFileThatIsNoImageIsNamedAtLoadOrWhenItsBatchIsCut) {
  ScratchDir dir;
  make_folder(dir.path());
  write_file(dir / "b_dog" / "broken.jpg", {'n', 'o', 't', ' ', 'a', ' ', 'j', 'p', 'e', 'g'});
  // macOS's metadata beside a copied file: said as what it is.
  write_file(dir / "c_bird" / "._y.jpeg", {0x00, 0x05, 0x16, 0x07, 0, 2, 0, 0});
  const auto l = core::list_image_folder(dir.path());
  for (const unsigned threads : {1u, 3u}) {
    // Every bad header at once, the first (in row order) with its reason.
    const auto at_load =
        data_error_of([&] { core::load_image_folder(l, options(16, threads, true)); });
    EXPECT_TRUE(has(at_load, "broken.jpg': is neither a JPEG nor a PNG")) << at_load;
    EXPECT_TRUE(has(at_load, "1 more file of the folder cannot be read either: '") &&
                has(at_load, "._y.jpeg'"))
        << at_load;
  }
  const auto apple = data_error_of([&] { core::read_image_header(dir / "c_bird" / "._y.jpeg"); });
  EXPECT_TRUE(has(apple, "macOS AppleDouble file") && has(apple, "find FOLDER -name '._*' -delete"))
      << apple;
  fs::remove(dir / "c_bird" / "._y.jpeg");
  // Unchecked, the file is found when a batch needs it: named, with its row.
  const Dataset d = core::load_image_folder(l, options(16, 2, false));
  // a_cat/x.png, then b_dog's 10.JPG, 2.jpg, broken.jpg
  ASSERT_EQ(d.image_files[3].filename(), "broken.jpg");
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(3 * d.features));
  const std::vector<std::int64_t> rows = {0, 3, 2};
  const auto in_batch =
      data_error_of([&] { core::gather_pixels(d, rows, pixels.data(), nullptr); });
  EXPECT_TRUE(has(in_batch, "broken.jpg") && has(in_batch, "row 3")) << in_batch;
}

TEST(ImageFolder, HeldOutBatchesAreResizeThenCenterCrop) {
  ScratchDir dir;
  make_folder(dir.path());
  const Dataset d = core::load_image_folder(core::list_image_folder(dir.path()), options(24, 2));
  std::vector<std::int64_t> rows(static_cast<std::size_t>(d.rows));
  for (std::size_t i = 0; i < rows.size(); ++i)
    rows[i] = static_cast<std::int64_t>(rows.size() - 1 - i);
  std::vector<std::uint8_t> batch(rows.size() * static_cast<std::size_t>(d.features));
  std::vector<std::int32_t> labels(rows.size());
  core::gather_pixels(d, rows, batch.data(), labels.data());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto r = static_cast<std::size_t>(rows[i]);
    std::vector<std::uint8_t> one(static_cast<std::size_t>(d.features));
    core::resize_then_center_crop(core::decode_image(d.image_files[r]), d.image_spec.resize, 24, 24,
                                  false, one.data());
    EXPECT_TRUE(std::equal(one.begin(), one.end(),
                           batch.begin() + static_cast<std::ptrdiff_t>(i * one.size())))
        << d.image_files[r];
    EXPECT_EQ(labels[i], d.y[r]);
  }
}

std::vector<std::uint8_t> training_batch(const Dataset& d, const std::vector<std::int64_t>& rows,
                                         std::uint64_t batch, std::uint64_t first_row = 0,
                                         std::uint64_t seed = 7) {
  std::vector<std::uint8_t> out(rows.size() * static_cast<std::size_t>(d.features));
  core::decode_image_rows(d, rows, batch, seed, first_row, /*flip=*/true, out.data(), nullptr);
  return out;
}

TEST(ImageFolder, TrainingCropsDependOnSeedBatchAndPositionAlone) {
  ScratchDir dir;
  make_folder(dir.path());
  const auto l = core::list_image_folder(dir.path());
  const Dataset one = core::load_image_folder(l, options(16, 1));
  const Dataset four = core::load_image_folder(l, options(16, 4));
  const std::vector<std::int64_t> rows = {2, 2, 5, 0};
  const auto a = training_batch(one, rows, 3);
  // The thread count and a second call change nothing.
  EXPECT_EQ(a, training_batch(four, rows, 3));
  EXPECT_EQ(a, training_batch(one, rows, 3));
  // Another batch number, or seed, crops otherwise.
  EXPECT_NE(a, training_batch(one, rows, 4));
  EXPECT_NE(a, training_batch(one, rows, 3, 0, 8));
  // The same image twice in a batch is cropped twice, differently.
  const auto sample = static_cast<std::ptrdiff_t>(one.features);
  EXPECT_FALSE(std::equal(a.begin(), a.begin() + sample, a.begin() + sample));
  // A rank's share (rows 2 and 3 of the drawn batch, first_row 2) is what one process cut there.
  const auto share = training_batch(one, {5, 0}, 3, /*first_row=*/2);
  EXPECT_TRUE(std::equal(share.begin(), share.end(), a.begin() + 2 * sample));
  // And a training crop is not the held-out transform.
  std::vector<std::uint8_t> held(a.size());
  core::gather_pixels(one, rows, held.data(), nullptr);
  EXPECT_NE(a, held);
}

TEST(ImageFolder, FloatBatchesAreTheByteBatchesThroughTheTable) {
  ScratchDir dir;
  make_folder(dir.path());
  Dataset d = core::load_image_folder(core::list_image_folder(dir.path()), options(12, 2));
  core::normalize_channels(d, {{0.4, 0.5, 0.6}, {0.2, 0.25, 0.3}});
  const std::vector<std::int64_t> rows = {4, 1, 3};
  const auto bytes = training_batch(d, rows, 11);
  std::vector<float> x(bytes.size());
  core::decode_image_rows_as_floats(d, rows, 11, 7, 0, true, x.data(), nullptr);
  const std::size_t plane = 12 * 12;
  for (std::size_t k = 0; k < x.size(); ++k)
    ASSERT_EQ(x[k], d.pixel_values[((k % (3 * plane)) / plane) * 256 + bytes[k]]) << k;
  // gather_batch (held-out) likewise.
  std::vector<std::uint8_t> held(bytes.size());
  core::gather_pixels(d, rows, held.data(), nullptr);
  core::gather_batch(d, rows, x.data(), nullptr);
  for (std::size_t k = 0; k < x.size(); ++k)
    ASSERT_EQ(x[k], d.pixel_values[((k % (3 * plane)) / plane) * 256 + held[k]]) << k;
}

TEST(ImageFolder, SplitHoldsOutFilesAndStatisticsComeFromTheHeldOutTransform) {
  ScratchDir dir;
  make_folder(dir.path());
  const Dataset all = core::load_image_folder(core::list_image_folder(dir.path()), options(16));
  auto [train, eval] = core::split_holdout(all, 0.34, 5);
  core::check_dataset(train, "train");
  core::check_dataset(eval, "eval");
  EXPECT_EQ(eval.rows, 2);
  EXPECT_EQ(train.rows, 4);
  std::vector<std::string> seen;
  for (const Dataset* part : {&train, &eval})
    for (std::size_t i = 0; i < part->image_files.size(); ++i) {
      seen.push_back(part->image_files[i].string());
      const auto at =
          std::find(all.image_files.begin(), all.image_files.end(), part->image_files[i]);
      ASSERT_NE(at, all.image_files.end());
      EXPECT_EQ(part->y[i], all.y[static_cast<std::size_t>(at - all.image_files.begin())]);
    }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(seen.size(), 6u);

  // Fewer images than the sample: the statistics of every image's held-out crop.
  const auto stats = core::channel_statistics(all);
  const Dataset decoded = core::decoded_sample(all, all.rows);
  const auto direct = core::channel_statistics(decoded);
  EXPECT_EQ(stats.mean, direct.mean);
  EXPECT_EQ(stats.std, direct.std);
  // A sample of 2 takes rows 0 and 3.
  const Dataset two = core::decoded_sample(all, 2);
  std::vector<std::uint8_t> rows03(2 * static_cast<std::size_t>(all.features));
  core::gather_pixels(all, std::vector<std::int64_t>{0, 3}, rows03.data(), nullptr);
  EXPECT_EQ(two.pixels, rows03);
  EXPECT_EQ(two.y, (std::vector<std::int32_t>{all.y[0], all.y[3]}));
}

TEST(ImageFolder, FingerprintFollowsTheFilesNotTheFolder) {
  ScratchDir dir;
  make_folder(dir / "one");
  make_folder(dir / "two");
  const auto a = core::load_image_folder(core::list_image_folder(dir / "one"), options(8));
  const auto b = core::load_image_folder(core::list_image_folder(dir / "two"), options(8));
  EXPECT_EQ(core::data_fingerprint(a), core::data_fingerprint(b));
  fs::rename(dir / "two" / "b_dog" / "z.jpg", dir / "two" / "b_dog" / "zz.jpg");
  const auto c = core::load_image_folder(core::list_image_folder(dir / "two"), options(8));
  EXPECT_NE(core::data_fingerprint(a), core::data_fingerprint(c));
}

}  // namespace
}  // namespace mixtrain::test

namespace mixtrain::test {
namespace {

constexpr const char* kPython = "/usr/bin/python3";  // Debian's torchvision imports only under it

// torchvision's ImageFolder, Resize and CenterCrop on the same folder: the same rows, labels and
// pixels, bit for bit.
TEST(ImageFolder, HeldOutBatchesAreTorchvisionsImageFolderBitForBit) {
  if (std::system(
          (std::string(kPython) + " -c 'import torchvision, PIL' >/dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP()
        << kPython << " cannot import torchvision and PIL (Debian: apt install "
        << "python3-torchvision); cmake/setup-debian.sh --ci installs them, so CI runs this";
  ScratchDir dir;
  make_folder(dir / "root");
  fs::create_directories(dir / "out");
  const std::int64_t size = 24, resize = 27;
  const std::string script =
      std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/tests/unit/core/data/image_folder_reference.py";
  const std::string cmd = std::string(kPython) + " " + script + " " + (dir / "root").string() +
                          " " + std::to_string(size) + " " + std::to_string(resize) + " " +
                          (dir / "out").string() + " 2>" + (dir / "err.txt").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << std::ifstream(dir / "err.txt").rdbuf();

  ImageFolderOptions o = options(size, 2);
  o.spec.resize = resize;
  const auto listing = core::list_image_folder(dir / "root");
  const Dataset d = core::load_image_folder(listing, o);
  std::string classes;
  for (const auto& c : listing.classes) classes += c + "\n";
  std::stringstream theirs;
  theirs << std::ifstream(dir / "out" / "classes.txt").rdbuf();
  EXPECT_EQ(classes, theirs.str());

  const Bytes pixels = read_file(dir / "out" / "pixels.bin");
  const Bytes labels = read_file(dir / "out" / "labels.bin");
  ASSERT_EQ(pixels.size(), static_cast<std::size_t>(d.rows * d.features));
  ASSERT_EQ(labels.size(), static_cast<std::size_t>(d.rows) * 8);
  std::vector<std::int64_t> rows(static_cast<std::size_t>(d.rows));
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::int64_t>(i);
  std::vector<std::uint8_t> ours(pixels.size());
  std::vector<std::int32_t> our_labels(rows.size());
  core::gather_pixels(d, rows, ours.data(), our_labels.data());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::int64_t label = 0;
    std::memcpy(&label, labels.data() + 8 * i, 8);
    EXPECT_EQ(our_labels[i], label) << "row " << i;
    const auto from = static_cast<std::ptrdiff_t>(i * static_cast<std::size_t>(d.features));
    std::size_t differ = 0;
    for (std::int64_t k = 0; k < d.features; ++k)
      differ +=
          ours[static_cast<std::size_t>(from + k)] != pixels[static_cast<std::size_t>(from + k)];
    EXPECT_EQ(differ, 0u) << "row " << i << " (" << d.image_files[i] << "): " << differ << " of "
                          << d.features << " bytes differ from torchvision's";
  }
}

}  // namespace
}  // namespace mixtrain::test
