// Token data: llm.c token files and byte-level text, windows of block_size + 1 tokens, the tail
// split, gather_tokens, the sampler over windows, and load_train_and_eval.
#include "data_test_util.h"

#include "mixtrain/core/config/experiment.h"
#include "mixtrain/core/data/batch_sampler.h"
#include "mixtrain/core/data/dataset.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace mixtrain::core {
namespace {

using test::append_le;
using test::Bytes;
using test::expect_data_error;
using test::read_file;
using test::ScratchDir;
using test::write_file;

// An llm.c token file written byte by byte, independent of the reader: header fields as given
// (the count defaults to the number of tokens).
Bytes token_file(const std::vector<std::uint16_t>& tokens, std::int32_t magic = 20240520,
                 std::int32_t version = 1, std::optional<std::int32_t> count = std::nullopt) {
  Bytes out;
  append_le(out, magic);
  append_le(out, version);
  append_le(out, count.value_or(static_cast<std::int32_t>(tokens.size())));
  for (int i = 3; i < 256; ++i) append_le(out, std::int32_t{0});
  for (auto t : tokens) append_le(out, t);
  return out;
}

// Distinct-looking tokens below `vocab`: 7·i + 3 mod vocab.
std::vector<std::int32_t> stream(std::size_t n, std::int32_t vocab = 1000) {
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int32_t>((7 * i + 3) % vocab);
  return v;
}

std::vector<std::int32_t> as_int32(const Bytes& bytes) {
  return {bytes.begin(), bytes.end()};
}

// ---- files ----------------------------------------------------------------------------------

TEST(data_TokenFiles, ReadsATokenFileWrittenByTheTest) {
  ScratchDir dir;
  const std::vector<std::uint16_t> tokens = {0, 1, 50256, 65535, 300, 7};
  write_file(dir / "t.bin", token_file(tokens));
  const auto got = load_token_file(dir / "t.bin", 65536);
  EXPECT_EQ(got, std::vector<std::int32_t>(tokens.begin(), tokens.end()));
  // Room for predict's placeholder target: appending it copies nothing.
  EXPECT_GT(got.capacity(), got.size());
  // A zero-token file is a valid file; it only cannot make a window.
  write_file(dir / "empty.bin", token_file({}));
  EXPECT_TRUE(load_token_file(dir / "empty.bin", 50257).empty());
}

TEST(data_TokenFiles, EveryMalformedFileNamesTheFileAndTheOffset) {
  ScratchDir dir;
  const auto file = dir / "bad.bin";
  const std::string name = file.string();
  // Each case: the file's bytes, and what the message must say.
  auto expect_error = [&](const Bytes& bytes, const std::vector<std::string>& fragments) {
    SCOPED_TRACE(fragments.front());
    write_file(file, bytes);
    expect_data_error([&] { (void)load_token_file(file, 50257); }, name, fragments);
  };
  expect_error(token_file({1, 2, 3}, 20240521), {"byte offset 0", "20240521", "20240520", "magic"});
  expect_error(token_file({1, 2, 3}, 20240520, 2), {"byte offset 4", "version", "is 2"});
  expect_error(token_file({1, 2, 3}, 20240520, 1, -5), {"byte offset 8", "negative"});
  // The header claims more tokens than the file holds, and fewer.
  expect_error(token_file({1, 2, 3}, 20240520, 1, 4),
               {"truncated", "4 tokens", "byte offset 1024", "6 bytes"});
  expect_error(token_file({1, 2, 3}, 20240520, 1, 2), {"2 unexpected bytes", "byte offset 1028"});
  expect_error(token_file({1, 2, 3}, 20240520, 1, 2147483647), {"truncated", "2147483647 tokens"});
  // Shorter than the header (with a right magic, and with too few bytes to hold one).
  Bytes short_header = token_file({});
  short_header.resize(600);
  expect_error(short_header, {"truncated", "600 bytes", "1024-byte header"});
  expect_error(Bytes{0x01, 0x02}, {"2 bytes", "1024-byte header"});
  expect_error(Bytes{}, {"0 bytes"});
  // A token outside the vocabulary: its value, index and byte offset.
  expect_error(token_file({1, 2, 3, 4, 5, 50257, 6}),
               {"token 50257", "index 5", "byte offset 1034", "vocab_size"});
  expect_data_error([&] { (void)load_token_file(dir / "missing.bin", 50257); },
                    (dir / "missing.bin").string(), {"no such file"});
}

TEST(data_TokenFiles, TextIsItsBytesOneFileAfterAnother) {
  ScratchDir dir;
  Bytes every_byte;
  for (int b = 0; b < 256; ++b) every_byte.push_back(static_cast<unsigned char>(b));
  const Bytes words = {'h', 'e', 'l', 'l', 'o', '\n'};
  write_file(dir / "a.txt", every_byte);
  write_file(dir / "b.txt", words);
  const std::vector<std::filesystem::path> files = {dir / "a.txt", dir / "b.txt"};
  Bytes both = every_byte;
  both.insert(both.end(), words.begin(), words.end());
  const auto text = load_text_tokens(files);
  EXPECT_EQ(text, as_int32(both));
  EXPECT_GT(text.capacity(), text.size());  // room for predict's placeholder, as above

  write_file(dir / "empty.txt", {});
  const std::vector<std::filesystem::path> with_empty = {dir / "a.txt", dir / "empty.txt"};
  expect_data_error([&] { (void)load_text_tokens(with_empty); }, (dir / "empty.txt").string(),
                    {"empty"});
  expect_data_error([&] { (void)load_text_tokens({}); }, "text", {"no files"});

  // Every byte is a token, so binary files would load: the two formats a user mixes up are
  // refused by their magic, while a text that merely starts like them still reads.
  write_file(dir / "rows.npy", {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0});
  expect_data_error([&] { (void)load_text_tokens(std::vector{dir / "rows.npy"}); },
                    (dir / "rows.npy").string(), {"NumPy .npy file", "data.source = \"npy\""});
  write_file(dir / "tokens.bin", token_file({1, 2, 3}));
  expect_data_error([&] { (void)load_text_tokens(std::vector{dir / "tokens.bin"}); },
                    (dir / "tokens.bin").string(), {"llm.c token file", "\"tokens\""});
  write_file(dir / "text.gz", {0x1f, 0x8b, 8, 0, 0, 0, 0, 0});
  expect_data_error([&] { (void)load_text_tokens(std::vector{dir / "text.gz"}); },
                    (dir / "text.gz").string(), {"gzip-compressed", "gunzip"});
  write_file(dir / "short.txt", {'N', 'U'});
  EXPECT_EQ(load_text_tokens(std::vector{dir / "short.txt"}),
            (std::vector<std::int32_t>{'N', 'U'}));
}

// The sample tool's output reads back as the text's bytes, and its --val-fraction split is the
// split eval_fraction makes of the same text.
TEST(data_TokenFiles, MakeTokenFileOutputReadsBackAsTheText) {
  const char* python = nullptr;
  for (const char* candidate : {"/usr/bin/python3", "python3"})
    if (std::system((std::string("command -v ") + candidate + " >/dev/null 2>&1").c_str()) == 0) {
      python = candidate;
      break;
    }
  if (python == nullptr) GTEST_SKIP() << "no python3 to run samples/data_tools/make_token_file.py";
  ScratchDir dir;
  Bytes text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<unsigned char>((i * 37 + i / 7) % 256));
  write_file(dir / "a.txt", Bytes(text.begin(), text.begin() + 600));
  write_file(dir / "b.txt", Bytes(text.begin() + 600, text.end()));
  const std::string tool =
      std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/samples/data_tools/make_token_file.py";
  const std::string command = std::string(python) + " " + tool + " " + (dir / "a.txt").string() +
                              " " + (dir / "b.txt").string() + " --out " +
                              (dir / "train.bin").string() + " --val-out " +
                              (dir / "val.bin").string() + " --val-fraction 0.25 >/dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  const auto train = load_token_file(dir / "train.bin", 256);
  const auto val = load_token_file(dir / "val.bin", 256);
  auto joined = train;
  joined.insert(joined.end(), val.begin(), val.end());
  EXPECT_EQ(joined, as_int32(text));
  EXPECT_EQ(val.size(), 250u);

  auto [tr, ev] = split_token_tail(
      load_text_tokens(std::vector<std::filesystem::path>{dir / "a.txt", dir / "b.txt"}), 16, 256,
      0.25, "text");
  EXPECT_EQ(tr.tokens, train);
  EXPECT_EQ(ev.tokens, val);
}

// The sample tool never destroys data: an input is never an output (--force or not), --out and
// --val-out are never one file, an existing output needs --force, a missing output folder is
// made, and a refused command writes nothing.
TEST(data_TokenFiles, MakeTokenFileNeverOverwritesAnInputOrAnExistingOutput) {
  if (std::system("command -v python3 >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no python3 to run samples/data_tools/make_token_file.py";
  ScratchDir dir;
  const Bytes text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '\n'};
  write_file(dir / "a.txt", text);
  const std::string tool =
      std::string(MIXTRAIN_TEST_SOURCE_DIR) + "/samples/data_tools/make_token_file.py";
  auto exit_code = [&](const std::string& args) {
    const int status = std::system(("cd '" + dir.path().string() + "' && python3 " + tool + " " +
                                    args + " >/dev/null 2>err.txt")
                                       .c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  auto err = [&] {
    std::ifstream in(dir / "err.txt");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(exit_code("a.txt --out a.txt --force"), 2);
  EXPECT_NE(err().find("a.txt is an input and an output"), std::string::npos) << err();
  EXPECT_EQ(exit_code("a.txt --out sub/../a.txt"), 2);
  EXPECT_EQ(read_file(dir / "a.txt"), text);

  EXPECT_EQ(exit_code("a.txt --out t.bin --val-out ./t.bin --val-fraction 0.25"), 2);
  EXPECT_NE(err().find("are the same file"), std::string::npos) << err();
  EXPECT_FALSE(std::filesystem::exists(dir / "t.bin"));

  ASSERT_EQ(exit_code("a.txt --out new/dir/t.bin --val-out new/v.bin --val-fraction 0.25"), 0)
      << err();
  EXPECT_EQ(load_token_file(dir / "new/dir/t.bin", 256).size(), 9u);
  EXPECT_EQ(load_token_file(dir / "new/v.bin", 256).size(), 3u);
  // Both exist now: refused without --force (neither touched), replaced with it.
  write_file(dir / "b.txt", {'x', 'y', 'z', 'w'});
  EXPECT_EQ(exit_code("b.txt --out new/dir/t.bin --val-out new/v.bin --val-fraction 0.25"), 2);
  EXPECT_NE(err().find("new/dir/t.bin exists; add --force"), std::string::npos) << err();
  EXPECT_EQ(load_token_file(dir / "new/dir/t.bin", 256).size(), 9u);
  ASSERT_EQ(exit_code("b.txt --out new/dir/t.bin --val-out new/v.bin --val-fraction 0.25 --force"),
            0)
      << err();
  EXPECT_EQ(load_token_file(dir / "new/dir/t.bin", 256),
            (std::vector<std::int32_t>{'x', 'y', 'z'}));
  EXPECT_EQ(load_token_file(dir / "new/v.bin", 256), (std::vector<std::int32_t>{'w'}));
  // A missing input or a folder as input: a message, not a traceback.
  EXPECT_EQ(exit_code("missing.txt --out m.bin"), 2);
  EXPECT_NE(err().find("missing.txt is not a file that exists"), std::string::npos) << err();
  EXPECT_EQ(exit_code("new --out m.bin"), 2);
  EXPECT_NE(err().find("new is a folder"), std::string::npos) << err();
  EXPECT_FALSE(std::filesystem::exists(dir / "m.bin"));
}

// ---- windows --------------------------------------------------------------------------------

TEST(data_TokenWindows, RowsFollowTheWindowFormula) {
  for (const std::size_t n : {5u, 6u, 17u, 100u})
    for (const std::int64_t block : {1, 4})
      for (const std::int64_t stride : {std::int64_t{1}, std::int64_t{3}, block}) {
        const Dataset d = make_token_dataset(stream(n), block, 1000, stride, "test");
        // Count the windows that fit by walking the starts.
        std::int64_t fits = 0;
        for (std::int64_t start = 0; start + block + 1 <= static_cast<std::int64_t>(n);
             start += stride)
          ++fits;
        EXPECT_EQ(d.rows, fits) << n << " " << block << " " << stride;
        EXPECT_EQ(d.rows, (static_cast<std::int64_t>(n) - block - 1) / stride + 1);
        EXPECT_TRUE(d.is_tokens());
        EXPECT_EQ(d.labels_per_row(), block);
        EXPECT_EQ(d.features, block);
        EXPECT_EQ(d.classes, 1000);
        EXPECT_TRUE(d.x.empty() && d.y.empty());
      }
}

TEST(data_TokenWindows, GatherGivesTheWindowAndItsNextTokens) {
  const auto tokens = stream(50);
  const std::int64_t block = 6, stride = 4;
  const Dataset d = make_token_dataset(tokens, block, 1000, stride, "test");
  const std::vector<std::int64_t> rows = {3, 0, d.rows - 1, 3};
  std::vector<std::int32_t> ids(rows.size() * block), targets(rows.size() * block);
  gather_tokens(d, rows, ids.data(), targets.data());
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::int64_t t = 0; t < block; ++t) {
      const auto at = static_cast<std::size_t>(rows[i] * stride + t);
      EXPECT_EQ(ids[i * block + t], tokens[at]);
      EXPECT_EQ(targets[i * block + t], tokens[at + 1]);
    }
  std::vector<std::int32_t> ids_only(rows.size() * block);
  gather_tokens(d, rows, ids_only.data(), nullptr);
  EXPECT_EQ(ids_only, ids);
  const std::vector<std::int64_t> bad = {d.rows};
  EXPECT_THROW(gather_tokens(d, bad, ids.data(), targets.data()), std::out_of_range);
}

TEST(data_TokenWindows, TablesAndTokensRefuseEachOthersCalls) {
  const Dataset tokens = make_token_dataset(stream(20), 4, 1000, 1, "test");
  Dataset table;
  table.rows = 2;
  table.features = 1;
  table.classes = 2;
  table.x = {0.5f, 1.5f};
  table.y = {0, 1};
  const std::vector<std::int64_t> rows = {0};
  std::vector<float> x(8);
  std::vector<std::int32_t> ids(8), y(8);
  EXPECT_THROW(gather_batch(tokens, rows, x.data(), y.data()), std::logic_error);
  EXPECT_THROW(gather_tokens(table, rows, ids.data(), y.data()), std::logic_error);
  EXPECT_THROW((void)split_holdout(tokens, 0.1, 1), std::logic_error);
}

TEST(data_TokenWindows, TooFewTokensOrAnOutOfVocabularyTokenIsADataError) {
  expect_data_error([] { (void)make_token_dataset(stream(8), 8, 1000, 1, "stream.bin"); },
                    "stream.bin", {"8 tokens", "block_size + 1 = 9"});
  EXPECT_NO_THROW((void)make_token_dataset(stream(9), 8, 1000, 1, "stream.bin"));
  auto tokens = stream(30, 100);
  tokens[17] = 100;
  expect_data_error([&] { (void)make_token_dataset(tokens, 4, 100, 1, "stream.bin"); },
                    "stream.bin", {"token 100", "index 17"});
  EXPECT_THROW((void)make_token_dataset(stream(30), 0, 1000, 1, "x"), std::invalid_argument);
  EXPECT_THROW((void)make_token_dataset(stream(30), 4, 1000, 0, "x"), std::invalid_argument);
  // check_dataset holds token datasets to the same contract.
  Dataset d = make_token_dataset(stream(30), 4, 1000, 1, "x");
  d.rows += 1;
  expect_data_error([&] { check_dataset(d, "edited"); }, "edited", {"rows"});
}

// ---- the tail split ---------------------------------------------------------------------------

TEST(data_TokenSplit, TheTailIsHeldOutInWholeWindowsAndNeverOverlapsTraining) {
  const auto tokens = stream(100);
  const std::int64_t block = 4;
  auto [train, eval] = split_token_tail(tokens, block, 1000, 0.2, "s");
  // The last round(100 · 0.2) = 20 tokens, in order, are the eval stream.
  ASSERT_EQ(eval.tokens.size(), 20u);
  EXPECT_TRUE(std::equal(eval.tokens.begin(), eval.tokens.end(), tokens.begin() + 80));
  ASSERT_EQ(train.tokens.size(), 80u);
  EXPECT_TRUE(std::equal(train.tokens.begin(), train.tokens.end(), tokens.begin()));
  EXPECT_EQ(train.stride, 1);
  EXPECT_EQ(train.rows, 80 - block);
  EXPECT_EQ(eval.stride, block);
  EXPECT_EQ(eval.rows, (20 - block - 1) / block + 1);
  // The last training window's last target is token 79; eval windows do not overlap.
  std::vector<std::int32_t> ids(block), targets(block);
  const std::vector<std::int64_t> last = {train.rows - 1};
  gather_tokens(train, last, ids.data(), targets.data());
  EXPECT_EQ(targets.back(), tokens[79]);
  std::vector<std::int32_t> seen;
  for (std::int64_t r = 0; r < eval.rows; ++r) {
    const std::vector<std::int64_t> row = {r};
    gather_tokens(eval, row, ids.data(), targets.data());
    seen.insert(seen.end(), targets.begin(), targets.end());
  }
  // Every predicted eval token once, in order: tokens 81, 82, ... .
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], tokens[81 + i]);

  // eval_fraction 0: all of it trains; the empty eval set keeps the token form.
  auto [all, none] = split_token_tail(tokens, block, 1000, 0.0, "s");
  EXPECT_EQ(all.tokens, tokens);
  EXPECT_EQ(none.rows, 0);
  EXPECT_TRUE(none.is_tokens());
  EXPECT_EQ(none.features, block);
  EXPECT_EQ(none.classes, 1000);
}

TEST(data_TokenSplit, ATailOrARestTooShortForOneWindowSaysHowManyItNeeds) {
  // 100 · 0.04 = 4 tokens held out, 9 needed for block_size 8.
  expect_data_error([] { (void)split_token_tail(stream(100), 8, 1000, 0.04, "s.bin"); }, "s.bin",
                    {"holds 4 tokens", "block_size + 1 = 9", "(eval_fraction 0.04 of 100"});
  EXPECT_NO_THROW((void)split_token_tail(stream(100), 8, 1000, 0.09, "s.bin"));
  expect_data_error([] { (void)split_token_tail(stream(20), 8, 1000, 0.6, "s.bin"); }, "s.bin",
                    {"8 remain for training", "block_size + 1 = 9"});
  expect_data_error([] { (void)split_token_tail(stream(20), 8, 1000, 1.0, "s.bin"); }, "s.bin",
                    {"eval_fraction must be in [0, 1)"});
  // The fraction suggested splits when followed: 17/2.3e6 = 7.39e-6, printed rounded up (a
  // rounded-down 7e-6 or 0.000007 holds 16 tokens, one short).
  try {
    (void)split_token_tail(stream(2'300'000), 16, 1000, 0.000005, "s.bin");
    ADD_FAILURE() << "split";
  } catch (const sdk::DataError& e) {
    const std::string lead = "raise data.eval_fraction to at least ";
    const auto at = e.hint().find(lead);
    ASSERT_NE(at, std::string::npos) << e.hint();
    const double suggested = std::stod(e.hint().substr(at + lead.size()));
    EXPECT_NO_THROW((void)split_token_tail(stream(2'300'000), 16, 1000, suggested, "s.bin"))
        << e.hint();
  }
  // Too short for a training and an evaluation window at any fraction: no fraction is suggested
  // (it would be above 0.5, or infinite for an empty stream).
  for (const std::size_t n : {0u, 17u}) {
    try {
      (void)split_token_tail(stream(n), 8, 1000, 0.1, "s.bin");
      ADD_FAILURE() << n << " tokens split";
    } catch (const sdk::DataError& e) {
      EXPECT_EQ(e.hint().find("raise data.eval_fraction"), std::string::npos) << e.hint();
      EXPECT_NE(e.hint().find("cannot hold a training and an evaluation window"), std::string::npos)
          << e.hint();
    }
  }
}

// ---- sampling windows -------------------------------------------------------------------------

std::vector<std::int32_t> gathered(const Dataset& d, BatchSampler& sampler, int batches) {
  std::vector<std::int32_t> out;
  std::vector<std::int32_t> ids, targets;
  for (int b = 0; b < batches; ++b) {
    const auto rows = sampler.next();
    ids.resize(rows.size() * static_cast<std::size_t>(d.features));
    targets.resize(ids.size());
    gather_tokens(d, rows, ids.data(), targets.data());
    out.insert(out.end(), ids.begin(), ids.end());
    out.insert(out.end(), targets.begin(), targets.end());
  }
  return out;
}

TEST(data_TokenSampling, SeededWindowsAreBitIdenticalAndResumeExactly) {
  const Dataset d = make_token_dataset(stream(300), 8, 1000, 1, "s");
  const std::int64_t batch = 16;
  // Past an epoch boundary (292 windows: 18 batches per epoch).
  BatchSampler a(d.rows, batch, true, 42), b(d.rows, batch, true, 42), c(d.rows, batch, true, 43);
  const auto first = gathered(d, a, 25);
  EXPECT_EQ(first, gathered(d, b, 25));
  EXPECT_NE(first, gathered(d, c, 25));

  BatchSampler straight(d.rows, batch, true, 42);
  const auto head = gathered(d, straight, 11);
  const auto cursor = straight.cursor();
  const auto tail = gathered(d, straight, 14);
  BatchSampler resumed(d.rows, batch, true, 42);
  resumed.set_cursor(cursor);
  EXPECT_EQ(gathered(d, resumed, 14), tail);
  auto joined = head;
  joined.insert(joined.end(), tail.begin(), tail.end());
  EXPECT_EQ(joined, first);
}

// ---- from DataSettings ------------------------------------------------------------------------

TEST(data_TokenLoading, TokenAndTextSourcesBuildTheirSplits) {
  ScratchDir dir;
  std::vector<std::uint16_t> train_tokens(200), eval_tokens(40);
  for (std::size_t i = 0; i < train_tokens.size(); ++i)
    train_tokens[i] = static_cast<std::uint16_t>(i * 131 % 50257);
  for (std::size_t i = 0; i < eval_tokens.size(); ++i)
    eval_tokens[i] = static_cast<std::uint16_t>(i * 17 % 50257);
  write_file(dir / "train.bin", token_file(train_tokens));
  write_file(dir / "val.bin", token_file(eval_tokens));

  DataSettings s;
  s.source = DataSource::tokens;
  s.token_paths = {dir / "train.bin"};
  s.eval_token_paths = {dir / "val.bin"};
  s.block_size = 8;
  s.vocab_size = 50257;
  s.eval_fraction = 0.5;  // unused: the eval file is the held-out set
  auto [train, eval] = load_train_and_eval(s, 1);
  EXPECT_EQ(train.tokens, std::vector<std::int32_t>(train_tokens.begin(), train_tokens.end()));
  EXPECT_EQ(train.rows, 200 - 8);
  EXPECT_EQ(eval.tokens, std::vector<std::int32_t>(eval_tokens.begin(), eval_tokens.end()));
  EXPECT_EQ(eval.stride, 8);
  EXPECT_EQ(eval.classes, 50257);

  s.eval_token_paths.clear();  // the tail of train.bin instead
  auto [head, tail] = load_train_and_eval(s, 1);
  EXPECT_EQ(head.tokens.size(), 100u);
  EXPECT_EQ(tail.tokens.size(), 100u);
  s.vocab_size = 100;  // train.bin holds larger tokens
  expect_data_error([&] { (void)load_train_and_eval(s, 1); }, "train.bin", {"vocab_size = 100"});

  const Bytes text = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'};
  write_file(dir / "t.txt", text);
  DataSettings t;
  t.source = DataSource::text;
  t.token_paths = {dir / "t.txt", dir / "t.txt"};
  t.block_size = 3;
  t.vocab_size = 256;
  t.eval_fraction = 0.2;
  auto [text_train, text_eval] = load_train_and_eval(t, 1);
  EXPECT_EQ(text_train.tokens, as_int32(Bytes{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'a',
                                              'b', 'c', 'd', 'e', 'f'}));
  EXPECT_EQ(text_eval.tokens, as_int32(Bytes{'g', 'h', 'i', 'j'}));
  EXPECT_EQ(text_eval.rows, 1);
  t.block_size = 30;  // 20 bytes cannot hold one window
  expect_data_error([&] { (void)load_train_and_eval(t, 1); }, "t.txt", {"block_size + 1 = 31"});
}

TEST(data_TokenLoading, TableSourcesSplitAsBefore) {
  DataSettings s;
  s.source = DataSource::synthetic;
  s.synthetic.rows = 300;
  s.eval_fraction = 0.2;
  s.classes = 12;  // raises the synthetic 10 classes
  auto [train, eval] = load_train_and_eval(s, 5);
  Dataset all = make_synthetic(s.synthetic);
  all.classes = 12;
  auto [want_train, want_eval] = split_holdout(std::move(all), 0.2, 5);
  EXPECT_EQ(train.x, want_train.x);
  EXPECT_EQ(train.y, want_train.y);
  EXPECT_EQ(eval.x, want_eval.x);
  EXPECT_EQ(train.classes, 12);
  EXPECT_FALSE(train.is_tokens());
  EXPECT_EQ(train.labels_per_row(), 1);
}

}  // namespace
}  // namespace mixtrain::core
