#include "data/image_folder/image_folder.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "console/short_list.h"
#include "data/byte_images.h"
#include "data/image_folder/image_file.h"
#include "data/image_folder/parallel_rows.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {
namespace {

namespace fs = std::filesystem;

std::string lower(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

bool decoded_extension(const std::string& ext) {
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// torchvision's IMG_EXTENSIONS less the ones decoded here.
bool torchvision_only_extension(const std::string& ext) {
  return ext == ".bmp" || ext == ".ppm" || ext == ".pgm" || ext == ".tif" || ext == ".tiff" ||
         ext == ".webp";
}

// A name as Python's str holds it: UTF-8 decoded strictly, each byte it cannot decode kept as the
// lone surrogate U+DC00 + byte (os.fsdecode's surrogateescape on POSIX).
std::u32string python_code_points(std::string_view bytes) {
  const auto at = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const auto continuation = [&](std::size_t i, unsigned low, unsigned high) {
    return i < bytes.size() && at(i) >= low && at(i) <= high;
  };
  std::u32string out;
  for (std::size_t i = 0; i < bytes.size();) {
    const unsigned b = at(i);
    // The lead byte's length and its first continuation's range (no overlongs, no surrogates,
    // nothing past U+10FFFF), as Python's decoder accepts them.
    std::size_t n = 0;
    unsigned low = 0x80, high = 0xBF;
    if (b < 0x80)
      n = 1;
    else if (b >= 0xC2 && b <= 0xDF)
      n = 2;
    else if (b == 0xE0)
      n = 3, low = 0xA0;
    else if (b == 0xED)
      n = 3, high = 0x9F;
    else if (b >= 0xE1 && b <= 0xEF)
      n = 3;
    else if (b == 0xF0)
      n = 4, low = 0x90;
    else if (b == 0xF4)
      n = 4, high = 0x8F;
    else if (b >= 0xF1 && b <= 0xF3)
      n = 4;
    bool valid = n > 0 && (n == 1 || continuation(i + 1, low, high));
    for (std::size_t k = 2; valid && k < n; ++k) valid = continuation(i + k, 0x80, 0xBF);
    if (!valid) {
      out.push_back(0xDC00 + b);
      ++i;
      continue;
    }
    char32_t c = n == 1 ? b : b & (0xFF >> (n + 1));
    for (std::size_t k = 1; k < n; ++k) c = (c << 6) | (at(i + k) & 0x3F);
    out.push_back(c);
    i += n;
  }
  return out;
}

// Python's sorted() order of names: by code point, which for valid UTF-8 is the bytes' order, but
// puts a byte Python cannot decode (U+DC80..U+DCFF) between U+D7FF and U+E000.
bool python_less(std::string_view a, std::string_view b) {
  const auto plain = [](std::string_view s) {
    return std::all_of(s.begin(), s.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0x80) == 0; });
  };
  if (plain(a) && plain(b)) return a < b;
  return python_code_points(a) < python_code_points(b);
}

// The class folders of `root`: its entries that are folders (symbolic links followed, as
// os.scandir's is_dir() follows them), in Python's order of their names, as torchvision's
// find_classes sorts them.
std::vector<std::string> class_folders(const fs::path& root) {
  std::error_code ec;
  if (!fs::exists(root, ec))
    throw sdk::DataError("image folder '" + root.string() + "' does not exist",
                         "point data.image_folder.train (or eval) at the folder that holds a "
                         "folder per class");
  if (!fs::is_directory(root, ec))
    throw sdk::DataError("image folder '" + root.string() + "' is a file, not a folder",
                         "point it at the folder that holds a folder per class (ImageNet's "
                         "train/), not at an image");
  std::vector<std::string> out;
  try {
    for (const auto& entry : fs::directory_iterator(root))
      if (entry.is_directory()) out.push_back(entry.path().filename().string());
  } catch (const fs::filesystem_error& e) {
    throw sdk::DataError("image folder '" + root.string() + "' cannot be read: " + e.what(),
                         "check its permissions");
  }
  std::sort(out.begin(), out.end(), python_less);
  if (out.empty())
    throw sdk::DataError("image folder '" + root.string() + "' holds no class folder",
                         "put each class's images in a folder of its own under it "
                         "(root/cat/1.jpg, root/dog/2.jpg), as torchvision's ImageFolder reads "
                         "them");
  return out;
}

struct FoundFile {
  std::string dir, name;  // what sorted(os.walk(...)) and sorted(files) order by
  fs::path path;
};

// Every file under one class folder, in torchvision's order; other extensions counted in
// `skipped`, torchvision-only ones collected in `undecodable` by extension.
std::vector<fs::path> class_files(
    const fs::path& folder, std::int64_t& skipped,
    std::map<std::string, std::pair<std::int64_t, fs::path>>& undecodable) {
  std::vector<FoundFile> found;
  try {
    for (auto it = fs::recursive_directory_iterator(
             folder, fs::directory_options::follow_directory_symlink);
         it != fs::recursive_directory_iterator(); ++it) {
      if (it->is_directory()) continue;
      const fs::path& p = it->path();
      const std::string ext = lower(p.extension().string());
      if (decoded_extension(ext)) {
        found.push_back({p.parent_path().string(), p.filename().string(), p});
      } else if (torchvision_only_extension(ext)) {
        auto& [count, example] = undecodable[ext];
        if (count++ == 0) example = p;
      } else {
        ++skipped;
      }
    }
  } catch (const fs::filesystem_error& e) {
    throw sdk::DataError("class folder '" + folder.string() + "' cannot be read: " + e.what(),
                         "check its permissions, and that no symbolic link under it leads back "
                         "to a folder above (a loop)");
  }
  std::sort(found.begin(), found.end(), [](const FoundFile& a, const FoundFile& b) {
    if (a.dir != b.dir) return python_less(a.dir, b.dir);
    return python_less(a.name, b.name);
  });
  std::vector<fs::path> out;
  out.reserve(found.size());
  for (auto& f : found) out.push_back(std::move(f.path));
  return out;
}

// Every file's header, on `threads` threads: the bad ones said together, first in row order.
void check_headers(const std::vector<fs::path>& files, unsigned threads) {
  std::mutex lock;
  std::vector<std::pair<std::int64_t, sdk::DataError>> bad;
  parallel_rows(static_cast<std::int64_t>(files.size()), threads, [&](std::int64_t i) {
    try {
      read_image_header(files[static_cast<std::size_t>(i)]);
    } catch (const sdk::DataError& e) {
      const std::scoped_lock hold(lock);
      bad.emplace_back(i, e);
    }
  });
  if (bad.empty()) return;
  std::sort(bad.begin(), bad.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> others;
  for (std::size_t k = 1; k < bad.size(); ++k)
    others.push_back(files[static_cast<std::size_t>(bad[k].first)].string());
  const std::string more = quoted_short_list(others, 9);
  const sdk::DataError& first = bad.front().second;
  if (bad.size() == 1) throw first;
  throw sdk::DataError(std::string(first.what()) + "; " + std::to_string(bad.size() - 1) +
                           " more file" + (bad.size() > 2 ? "s" : "") +
                           " of the folder cannot be read either: " + more,
                       first.hint());
}

}  // namespace

bool is_image_file_name(const fs::path& file) {
  return decoded_extension(lower(file.extension().string()));
}

bool is_undecoded_image_name(const fs::path& file) {
  return torchvision_only_extension(lower(file.extension().string()));
}

std::vector<std::string> image_folder_classes(const fs::path& root) {
  return class_folders(root);
}

ImageFolderListing list_image_folder(const fs::path& root,
                                     const std::vector<std::string>* training_classes) {
  ImageFolderListing out;
  out.root = root;
  const auto folders = class_folders(root);
  out.classes = training_classes != nullptr ? *training_classes : folders;
  // The label of each name (a record's names are in label order, whatever order that is).
  std::map<std::string, std::int32_t> label_of;
  for (std::size_t i = 0; i < out.classes.size(); ++i)
    label_of.emplace(out.classes[i], static_cast<std::int32_t>(i));
  if (training_classes != nullptr) {
    std::vector<std::string> foreign;
    for (const auto& f : folders)
      if (!label_of.contains(f)) foreign.push_back(f);
    if (!foreign.empty())
      throw sdk::DataError("held-out folder '" + root.string() +
                               "' has class folders the "
                               "training folder lacks: " +
                               quoted_short_list(foreign, 5),
                           "a held-out image must be of a class the model learns: give both "
                           "folders the same class folders");
    for (const auto& c : out.classes)
      if (std::find(folders.begin(), folders.end(), c) == folders.end())
        out.missing_classes.push_back(c);
  }
  // Files beside the class folders: no class's, and ImageFolder reads none either.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (!entry.is_directory(ec)) ++out.skipped;
  std::map<std::string, std::pair<std::int64_t, fs::path>> undecodable;
  std::vector<std::string> empty;
  for (const auto& name : folders) {
    const std::int32_t label = label_of.at(name);
    auto files = class_files(root / name, out.skipped, undecodable);
    if (files.empty()) empty.push_back(name);
    out.labels.insert(out.labels.end(), files.size(), label);
    for (auto& f : files) out.files.push_back(std::move(f));
  }
  if (!undecodable.empty()) {
    std::string what, example;
    for (const auto& [ext, seen] : undecodable) {
      what += (what.empty() ? "" : ", ") + std::to_string(seen.first) + " " + ext;
      if (example.empty()) example = seen.second.string();
    }
    throw sdk::DataError("image folder '" + root.string() +
                             "' holds images that mixtrain does "
                             "not decode (" +
                             what + " files, e.g. '" + example +
                             "'); torchvision would train on them, so leaving them out would "
                             "train on other data",
                         "convert them to PNG or JPEG (e.g. mogrify -format png '*.webp'), or "
                         "move them out of the folder");
  }
  if (!empty.empty())
    throw sdk::DataError("image folder '" + root.string() + "': class folder" +
                             (empty.size() > 1 ? "s " : " ") + quoted_short_list(empty, 5) +
                             (empty.size() > 1 ? " hold" : " holds") +
                             " no .jpg, .jpeg or .png file",
                         "put the class's images in it, or remove the folder (it would be a "
                         "class the model never sees)");
  return out;
}

Dataset load_image_folder(const ImageFolderListing& listing, const ImageFolderOptions& options) {
  if (options.spec.resize <= 0 || options.size <= 0)
    throw std::invalid_argument("load_image_folder: size and spec.resize must be > 0");
  Dataset d;
  d.rows = static_cast<std::int64_t>(listing.files.size());
  d.sample_shape = {3, options.size, options.size};
  d.features = 3 * options.size * options.size;
  d.classes = static_cast<std::int32_t>(listing.classes.size());
  d.y = listing.labels;
  d.image_files = listing.files;
  d.class_names = listing.classes;
  d.image_spec = options.spec;
  d.pixel_values = unit_byte_values(3);
  if (options.check_files) check_headers(d.image_files, options.spec.threads);
  return d;
}

}  // namespace mixtrain::core
