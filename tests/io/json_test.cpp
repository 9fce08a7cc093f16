// The nesting guard every JSON entry point runs before parsing: depth counted outside strings, the
// top-level key it happens under named, and files refused with their name.
#include "io/json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "support/safetensors_writer.h"

namespace qinfer::io {
namespace {

using ::testing::HasSubstr;

TEST(JsonDepth, CountsArraysAndObjectsOutsideStrings) {
  EXPECT_EQ(json_too_deep(R"({"a": [[1]]})", 3), std::nullopt);
  EXPECT_EQ(json_too_deep(R"({"a": [[[1]]]})", 3), "a");
  EXPECT_EQ(json_too_deep(R"({"a": 1, "b": {"c": [[]]}})", 3), "b");
  EXPECT_EQ(json_too_deep(R"({"a": "[[[[[[", "b": "\"{{{{"})", 2), std::nullopt);  // brackets inside strings
  EXPECT_EQ(json_too_deep(R"({"k\"ey": [[[]]]})", 3), "k\\\"ey");                     // the key as written
  EXPECT_EQ(json_too_deep("[[[[", 3), "");                                              // a top-level array
  EXPECT_EQ(json_too_deep(std::string(100000, '[')), "");
  EXPECT_EQ(json_too_deep(std::string(kMaxJsonDepth, '[')), std::nullopt);
  EXPECT_EQ(json_too_deep("{\"x\": " + std::string(kMaxJsonDepth, '{')), "x");
  EXPECT_EQ(json_too_deep("not json at all ]]]] }}}"), std::nullopt);  // unbalanced closers do not count
}

TEST(JsonDepth, DeepFilesAreRefusedByName) {
  qinfer::testing::TempDir dir;
  qinfer::testing::write_file(dir / "config.json", "{\"rope_scaling\": " + std::string(100000, '[') +
                                                       std::string(100000, ']') + "}");
  try {
    (void)read_json_file(dir / "config.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("config.json: rope_scaling: nested deeper than 128 levels"));
  }
}

}  // namespace
}  // namespace qinfer::io
