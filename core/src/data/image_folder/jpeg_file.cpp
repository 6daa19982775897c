#include "data/image_folder/jpeg_file.h"

// libjpeg's API, not TurboJPEG's: TurboJPEG reports one error code per call, a warning whenever
// any warning came first, so a file whose data end before its first scan (the memory source
// warns "Premature end of JPEG file", then the decoder stops: no image) came back as a warning
// with zero pixels and trained as a black image. Here libjpeg's callbacks tell the two apart, as
// PIL's own decoder does: a fatal error refuses the file; a warning leaves the image decoded,
// unless the data ended before its last row (image_file.h's contract).
#include <cstddef>
#include <cstdio>  // jpeglib.h names FILE and size_t without including their headers
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <algorithm>
#include <csetjmp>
#include <string>
#include <vector>

namespace mixtrain::core::image_files {
namespace {

// libjpeg reports a fatal error by calling error_exit, which must not return: it jumps back to
// the setjmp of the stage that called into libjpeg. Every function below that calls setjmp holds
// only trivially destructible locals and runs no C++ code that owns resources across the jump;
// the buffers and the decompressor's owner live in decode_jpeg.
struct JpegJob {
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
  // JWRN_JPEG_EOF before the image's last row was decoded: the data stopped before the image
  // did. libjpeg inserts an end marker and fills the rest; PIL, whose decoder waits for more data
  // there, refuses such a file ("image file is truncated"), and so does the loader. Data that end
  // after the last row (in the search for the end marker) PIL accepts: so does the loader.
  bool data_ended = false;
  bool rows_done = false;
};

// TurboJPEG's TJFLAG_LIMITSCANS bound: only a hostile progressive file has more scans, and each
// one re-reads the whole coefficient image (minutes for one file).
constexpr int kMaxScans = 500;

JpegJob& job_of(j_common_ptr cinfo) {
  return *static_cast<JpegJob*>(cinfo->client_data);
}

[[noreturn]] void jump_on_error(j_common_ptr cinfo) {
  JpegJob& job = job_of(cinfo);
  (*cinfo->err->format_message)(cinfo, job.message);
  std::longjmp(job.jump, 1);
}

// Warnings (level < 0) are counted, never printed: libjpeg would write them to stderr from the
// loader's threads. Trace messages (level >= 0) are ignored.
void note_warning(j_common_ptr cinfo, int level) {
  if (level >= 0) return;
  ++cinfo->err->num_warnings;
  JpegJob& job = job_of(cinfo);
  if (cinfo->err->msg_code == JWRN_JPEG_EOF && !job.rows_done) job.data_ended = true;
}

void print_nothing(j_common_ptr) {}

void limit_scans(j_common_ptr cinfo) {
  if (cinfo->is_decompressor == 0) return;
  if (reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number <= kMaxScans) return;
  JpegJob& job = job_of(cinfo);
  std::snprintf(job.message, sizeof job.message, "a progressive image of more than %d scans",
                kMaxScans);
  std::longjmp(job.jump, 1);
}

// PIL reads CMYK JPEGs as Adobe writes them, inverted ("CMYK;I"), then converts to RGB with
// R = (255 − K') − C'·(255 − K')/255 in its rounded integer form, where C', K' are the inverted
// samples.
void cmyk_to_rgb(const std::uint8_t* cmyk, std::size_t pixels, std::uint8_t* rgb) {
  for (std::size_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int not_k = cmyk[3];  // 255 − inverted K
    for (int c = 0; c < 3; ++c) {
      const int ink = 255 - cmyk[c];
      const int t = ink * not_k + 128;
      const int v = not_k - (((t >> 8) + t) >> 8);
      rgb[c] = static_cast<std::uint8_t>(std::clamp(v, 0, 255));
    }
  }
}

// The decompressor and its callbacks; destroyed whatever stage failed.
struct Decompressor {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr errors{};
  jpeg_progress_mgr progress{};
  JpegJob job;
  bool created = false;
  Decompressor() {
    cinfo.err = jpeg_std_error(&errors);
    errors.error_exit = jump_on_error;
    errors.emit_message = note_warning;
    errors.output_message = print_nothing;
    progress.progress_monitor = limit_scans;
  }
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
  ~Decompressor() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

// Creates the decompressor and reads the headers up to the first scan. False with job.message
// set on an error.
bool jpeg_open(Decompressor* dec, const std::uint8_t* data, std::size_t size) {
  if (setjmp(dec->job.jump)) return false;
  // Before the creation, whose own errors (out of memory) reach jump_on_error: it keeps err and
  // client_data and clears the rest, progress included.
  dec->cinfo.client_data = &dec->job;
  jpeg_create_decompress(&dec->cinfo);
  dec->created = true;
  dec->cinfo.progress = &dec->progress;
  jpeg_mem_src(&dec->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&dec->cinfo, TRUE);
  return true;
}

// Decodes every row into rows[y] (each output_width · output_components bytes) with PIL's
// settings, then reads on to the end marker as PIL's decoder does (an error there refuses the
// file in PIL too). False with job.message set.
bool jpeg_rows(Decompressor* dec, J_COLOR_SPACE space, JSAMPROW* rows) {
  if (setjmp(dec->job.jump)) return false;
  jpeg_decompress_struct& cinfo = dec->cinfo;
  cinfo.out_color_space = space;
  // libjpeg's defaults, which PIL keeps: the accurate integer IDCT and fancy upsampling.
  cinfo.dct_method = JDCT_ISLOW;
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo);
  while (cinfo.output_scanline < cinfo.output_height)
    jpeg_read_scanlines(&cinfo, rows + cinfo.output_scanline,
                        cinfo.output_height - cinfo.output_scanline);
  dec->job.rows_done = true;
  jpeg_finish_decompress(&cinfo);
  return true;
}
}  // namespace

RgbImage decode_jpeg(std::span<const std::uint8_t> bytes, std::string_view origin) {
  // The frame header is parsed here first, so the size limits hold before libjpeg allocates
  // anything for the image (a progressive file's whole coefficient image at the start).
  ByteReader reader(bytes, origin);
  const JpegFrame frame = read_jpeg_frame(reader);
  Decompressor dec;
  const auto refuse = [&](const char* when) {
    fail(origin,
         std::string(dec.job.data_ended ? "is truncated (" : "is not a readable JPEG (") + when +
             ": " + dec.job.message + ")",
         kRewriteHint);
  };
  if (!jpeg_open(&dec, bytes.data(), bytes.size())) refuse("header");
  const jpeg_decompress_struct& cinfo = dec.cinfo;
  if (static_cast<std::int64_t>(cinfo.image_width) != frame.header.width ||
      static_cast<std::int64_t>(cinfo.image_height) != frame.header.height ||
      cinfo.num_components != frame.components)
    fail(origin, "is not a valid JPEG: its frame header is not the one libjpeg decodes",
         kRewriteHint);
  const int width = static_cast<int>(frame.header.width);
  const int height = static_cast<int>(frame.header.height);

  RgbImage image;
  image.width = width;
  image.height = height;
  const auto pixels = static_cast<std::size_t>(width) * static_cast<std::size_t>(height);
  image.pixels.resize(pixels * 3);
  // Four components are CMYK or YCCK (libjpeg converts YCCK to CMYK), one gray; three are
  // YCbCr or RGB, both of which JCS_RGB receives.
  const bool cmyk = frame.components == 4;
  const bool gray = frame.components == 1;
  const int channels = cmyk ? 4 : gray ? 1 : 3;
  std::vector<std::uint8_t> staging(cmyk || gray ? pixels * static_cast<std::size_t>(channels) : 0);
  std::uint8_t* target = cmyk || gray ? staging.data() : image.pixels.data();
  std::vector<JSAMPROW> rows(static_cast<std::size_t>(height));
  for (std::size_t y = 0; y < rows.size(); ++y)
    rows[y] = target + y * static_cast<std::size_t>(width) * static_cast<std::size_t>(channels);
  if (!jpeg_rows(&dec, cmyk ? JCS_CMYK : gray ? JCS_GRAYSCALE : JCS_RGB, rows.data()))
    refuse("image data");
  // A warning leaves the image decoded, as PIL accepts it (extraneous bytes, corrupt data libjpeg
  // resynchronises from), unless the data ended before its last row.
  if (dec.job.data_ended)
    fail(origin, "is truncated (the data end before the image does)", kRewriteHint);
  if (cmyk) {
    cmyk_to_rgb(staging.data(), pixels, image.pixels.data());
  } else if (gray) {
    for (std::size_t i = 0; i < pixels; ++i)
      std::fill_n(image.pixels.data() + 3 * i, 3, staging[i]);
  }
  return image;
}

}  // namespace mixtrain::core::image_files
