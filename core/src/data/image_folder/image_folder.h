// Image folders as torchvision's ImageFolder reads them (ImageNet's train/ and val/ layout): each
// folder under the root is a class, numbered in Python's order of the folder names (by code point;
// a byte that is not UTF-8 as the surrogate Python decodes it to); its images are every .jpg,
// .jpeg and .png file beneath it (any case, subfolders included), in the order of Python's
// sorted(os.walk(...)) then sorted file names, so a row's index and label are torchvision's for
// the same folder.
//
// Contract:
// - list_image_folder() reads names only (no image); load_image_folder() builds the image-file
//   Dataset (core/data/dataset.h) of a listing: sample_shape {3, size, size}, the unit byte table
//   (byte b stands for b / 255, as ToTensor scales), classes the class count.
// - Files whose extension torchvision also reads but mixtrain does not decode (.bmp, .ppm, .pgm,
//   .tif, .tiff, .webp) are an sdk::DataError listing them by extension with an example: skipping
//   them would train on other data than torchvision's. Other files, and files beside the class
//   folders (no class's), are skipped and counted.
// - An sdk::DataError names the folder when it is missing or not a folder, holds no class folder,
//   or a class folder holds no image; for a held-out folder (`training_classes` given), when it
//   has a class folder the training folder lacks (its labels would be another model's).
// - check_files: every file's header is read (image_file.h's checks) on `threads` threads; bad
//   files are one sdk::DataError naming the first in row order with its reason, and up to 9 more
//   with the count, so a folder is mended in one pass.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "mixtrain/core/data/dataset.h"

namespace mixtrain::core {

struct ImageFolderListing {
  std::filesystem::path root;
  std::vector<std::string> classes;          // folder names, in label order
  std::vector<std::filesystem::path> files;  // every image, in torchvision's order
  std::vector<std::int32_t> labels;          // [files]
  std::int64_t skipped = 0;                  // files of other extensions, left out
  std::vector<std::string> missing_classes;  // held-out folder: training classes it lacks
};

// `training_classes`: for a held-out folder, the training folder's classes, which number its
// labels (nullptr: the folder's own).
ImageFolderListing list_image_folder(const std::filesystem::path& root,
                                     const std::vector<std::string>* training_classes = nullptr);

// Whether `file`'s extension is one mixtrain decodes: .jpg, .jpeg or .png, in any case.
bool is_image_file_name(const std::filesystem::path& file);

// Whether `file`'s extension is one torchvision's ImageFolder reads and mixtrain does not decode
// (.bmp, .ppm, .pgm, .tif, .tiff, .webp).
bool is_undecoded_image_name(const std::filesystem::path& file);

// The class folders of `root` alone, as list_image_folder() numbers them (its errors for a root
// that is missing, a file, or holds no folder), without walking into them.
std::vector<std::string> image_folder_classes(const std::filesystem::path& root);

struct ImageFolderOptions {
  std::int64_t size = 224;  // crops are size × size
  ImageFileSpec spec;       // spec.resize > 0
  bool check_files = true;
};

Dataset load_image_folder(const ImageFolderListing& listing, const ImageFolderOptions& options);

}  // namespace mixtrain::core
