// NFC, including the stretches the fast path hands to utf8proc and the ones it copies.
#include <gtest/gtest.h>

#include "tokenizer/normalizer.h"

namespace qinfer::tokenizer {
namespace {

TEST(Nfc, ComposesAroundInertText) {
  EXPECT_EQ(nfc("cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");  // the combining mark is the first byte that is not inert
  EXPECT_EQ(nfc("\u0301e"), "\u0301e");
  EXPECT_EQ(nfc("a\u0323\u0302 \u4e2d\u6587 o\u0308\u0304"), "\u1ead \u4e2d\u6587 \u022b");  // reordered marks
  EXPECT_EQ(nfc("\u1112\u1161\u11ab\uac00\u11a8"), "\ud55c\uac01");  // conjoining jamo; LV syllable + T
  EXPECT_EQ(nfc("\u304b\u3099\u30cf\u309a"), "\u304c\u30d1");        // kana + voicing marks
  EXPECT_EQ(nfc("\uf900\U0002f800"), "\u8c48\u4e3d");                  // compatibility ideographs
  EXPECT_EQ(nfc("\u0915\u093c"), "\u0915\u093c");                      // composition exclusion (U+0958)
  EXPECT_EQ(nfc("\u212b\u2126 \u0344"), "\u00c5\u03a9 \u0308\u0301");   // singletons
  EXPECT_EQ(nfc("plain ASCII, Latin-1 \u00e9, \u4e2d\u6587, \ud55c\uad6d\uc5b4"),
            "plain ASCII, Latin-1 \u00e9, \u4e2d\u6587, \ud55c\uad6d\uc5b4");
  EXPECT_EQ(nfc(std::string("\0e\u0301", 4)), std::string("\0\u00e9", 3));  // NUL does not end the text
}

}  // namespace
}  // namespace qinfer::tokenizer
