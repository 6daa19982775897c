// SkipBlame: the value a skipped step's replay blames, and the text it travels in between ranks.
#include <gtest/gtest.h>

#include "train/skip_blame.h"

namespace mixtrain::core {
namespace {

TEST(SkipBlame, NothingFoundIsEmptyAndPrintsNoneOnReplay) {
  const SkipBlame none;
  EXPECT_FALSE(none.found());
  EXPECT_EQ(none.tensor_or_none(), "none on replay");
  EXPECT_EQ(none.to_text(), "");
  EXPECT_EQ(SkipBlame::from_text(""), none);
  EXPECT_EQ(none.in_micro_batch(1, 4), none);
}

TEST(SkipBlame, TextRoundTripKeepsTensorAndNode) {
  for (const SkipBlame& blame : {SkipBlame{"backward fc1.weight.grad", "fc1"},
                                 SkipBlame{"loss", ""}, SkipBlame{"forward a b: c", "a"}}) {
    EXPECT_TRUE(blame.found());
    EXPECT_EQ(blame.tensor_or_none(), blame.tensor);
    EXPECT_EQ(SkipBlame::from_text(blame.to_text()), blame) << blame.to_text();
  }
}

TEST(SkipBlame, MicroBatchNamesItsPlaceAndKeepsTheNode) {
  const SkipBlame b = SkipBlame{"forward fc2.output", "fc2"}.in_micro_batch(1, 4);
  EXPECT_EQ(b.tensor, "micro-batch 2 of 4: forward fc2.output");
  EXPECT_EQ(b.node, "fc2");
  EXPECT_EQ(SkipBlame::from_text(b.to_text()), b);
}

TEST(SkipBlame, ValuesCompareByBothFields) {
  EXPECT_EQ((SkipBlame{"loss", ""}), (SkipBlame{"loss", ""}));
  EXPECT_NE((SkipBlame{"forward fc.output", "fc"}), (SkipBlame{"forward fc.output", ""}));
  EXPECT_NE((SkipBlame{"forward fc.output", "fc"}), (SkipBlame{"backward fc.output", "fc"}));
}

}  // namespace
}  // namespace mixtrain::core
