// JPEG bytes for the image tests, written by libjpeg's compressor: the encoder half of the
// library whose decoder (data/image_folder/jpeg_file.cpp) is under test, set up as TurboJPEG's
// tjCompress2 sets it up (the subsampling on the luma and K components, YCCK for CMYK input,
// the accurate integer DCT).
//
// Contract: pixels are row-major [height, width, channels] with 3 (RGB), 1 (gray) or 4 (CMYK,
// written as YCCK, as PIL cannot write it) channels; quality 1..100; `scans`, when given, is the
// scan script (a progressive file's, whose component indices are the file's). An encoder error
// fails the calling test (ADD_FAILURE with libjpeg's message) and returns no bytes.
#pragma once

#include <cstdio>  // jpeglib.h names FILE and size_t without including their headers
// clang-format off
#include <jpeglib.h>
// clang-format on

#include <gtest/gtest.h>

#include <csetjmp>
#include <cstdlib>
#include <vector>

namespace mixtrain::test {

enum class JpegPixels { rgb, gray, cmyk };
// Chroma subsampling: 4:4:4, 4:2:0 (the luma, and K, at twice the chroma's rate both ways), or
// one gray component.
enum class JpegSampling { s444, s420, gray };

namespace jpeg_test_writer {

struct Job {
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
};

[[noreturn]] inline void jump_on_error(j_common_ptr cinfo) {
  auto* job = static_cast<Job*>(cinfo->client_data);
  (*cinfo->err->format_message)(cinfo, job->message);
  std::longjmp(job->jump, 1);
}

// Holds only trivially destructible locals across setjmp; the caller owns the buffers.
inline bool compress(jpeg_compress_struct* cinfo, Job* job, const unsigned char* pixels, int width,
                     int height, JpegPixels in, JpegSampling sampling, int quality,
                     const std::vector<jpeg_scan_info>* scans, unsigned char** out,
                     unsigned long* size) {
  if (setjmp(job->jump)) return false;
  cinfo->client_data = job;
  jpeg_create_compress(cinfo);
  jpeg_mem_dest(cinfo, out, size);
  cinfo->image_width = static_cast<JDIMENSION>(width);
  cinfo->image_height = static_cast<JDIMENSION>(height);
  const int channels = in == JpegPixels::rgb ? 3 : in == JpegPixels::gray ? 1 : 4;
  cinfo->input_components = channels;
  cinfo->in_color_space = in == JpegPixels::rgb    ? JCS_RGB
                          : in == JpegPixels::gray ? JCS_GRAYSCALE
                                                   : JCS_CMYK;
  jpeg_set_defaults(cinfo);
  jpeg_set_quality(cinfo, quality, TRUE);
  cinfo->dct_method = JDCT_ISLOW;
  jpeg_set_colorspace(cinfo, in == JpegPixels::cmyk           ? JCS_YCCK
                             : sampling == JpegSampling::gray ? JCS_GRAYSCALE
                                                              : JCS_YCbCr);
  const int factor = sampling == JpegSampling::s420 ? 2 : 1;
  for (int c = 0; c < cinfo->num_components; ++c) {
    const bool full_rate = c == 0 || c == 3;  // Y, and K of YCCK
    cinfo->comp_info[c].h_samp_factor = full_rate ? factor : 1;
    cinfo->comp_info[c].v_samp_factor = full_rate ? factor : 1;
  }
  if (scans != nullptr) {
    cinfo->scan_info = scans->data();
    cinfo->num_scans = static_cast<int>(scans->size());
  }
  jpeg_start_compress(cinfo, TRUE);
  const auto stride = static_cast<std::size_t>(width) * static_cast<std::size_t>(channels);
  while (cinfo->next_scanline < cinfo->image_height) {
    auto* row = const_cast<JSAMPROW>(pixels + cinfo->next_scanline * stride);
    jpeg_write_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_compress(cinfo);
  return true;
}

}  // namespace jpeg_test_writer

inline std::vector<unsigned char> jpeg_bytes(const unsigned char* pixels, int width, int height,
                                             JpegPixels in, JpegSampling sampling, int quality = 95,
                                             const std::vector<jpeg_scan_info>* scans = nullptr) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr errors{};
  cinfo.err = jpeg_std_error(&errors);
  errors.error_exit = jpeg_test_writer::jump_on_error;
  jpeg_test_writer::Job job;
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const bool ok = jpeg_test_writer::compress(&cinfo, &job, pixels, width, height, in, sampling,
                                             quality, scans, &out, &size);
  jpeg_destroy_compress(&cinfo);
  std::vector<unsigned char> bytes;
  if (ok) bytes.assign(out, out + size);
  std::free(out);  // jpeg_mem_dest's buffer, malloc'd by libjpeg
  if (!ok) ADD_FAILURE() << "libjpeg could not write the test's JPEG: " << job.message;
  return bytes;
}

}  // namespace mixtrain::test
