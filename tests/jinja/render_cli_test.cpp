// `qinfer render`: exact prompt bytes on stdout (no added newline), clear errors with exit status 1.
#include <gtest/gtest.h>

#include <fstream>

#include "jinja/jinja_test_util.h"
#include "support/run_command.h"

namespace qinfer {
namespace {

namespace fs = std::filesystem;
using testing::jinja_data_dir;
using testing::read_file_bytes;

class RenderCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(QINFER_BINARY)) << "build the qinfer target first: " << QINFER_BINARY;
    dir_ = fs::temp_directory_path() / ("qinfer-render-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    // A model folder as Qwen3 checkpoints ship it: the template inside tokenizer_config.json.
    auto config = testing::read_ordered_json(jinja_data_dir() / "tokenizer_config.json");
    config["chat_template"] = read_file_bytes(jinja_data_dir() / "qwen3.jinja");
    write("model/tokenizer_config.json", config.dump(2));
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::string& text) {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }

  testing::CommandResult render(const std::string& model, const fs::path& request) {
    return testing::run_command(std::string(QINFER_BINARY) + " render --model " + (dir_ / model).string() + " < " +
                                request.string());
  }

  fs::path dir_;
};

TEST_F(RenderCli, PrintsExactlyThePrompt) {
  for (const char* name : {"tools_basic", "tool_call_string_args", "unicode", "no_generation_prompt"}) {
    const auto r = render("model", jinja_data_dir() / "requests" / (std::string(name) + ".json"));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, read_file_bytes(jinja_data_dir() / "expected" / ("qwen3__" + std::string(name) + ".txt"))) << name;
    EXPECT_EQ(r.err, "");
  }
}

TEST_F(RenderCli, ChatTemplateJinjaFileWins) {
  write("model/chat_template.jinja", read_file_bytes(jinja_data_dir() / "qwen35_features.jinja"));
  const auto r = render("model", jinja_data_dir() / "requests" / "images_vision_id.json");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, read_file_bytes(jinja_data_dir() / "expected" / "qwen35_features__images_vision_id.txt"));
}

TEST_F(RenderCli, TemplateRaiseIsAnErrorNamingTheLine) {
  write("model/chat_template.jinja", read_file_bytes(jinja_data_dir() / "qwen35_features.jinja"));
  const auto r = render("model", jinja_data_dir() / "requests" / "system_image_error.json");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("chat_template.jinja:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("System message cannot contain images."), std::string::npos) << r.err;
}

TEST_F(RenderCli, BadInputsFailWithAClearMessage) {
  write("bad.json", "{\"messages\": [");
  auto r = render("model", dir_ / "bad.json");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("request on stdin is not valid JSON"), std::string::npos) << r.err;

  // Nested past the depth limit: an error before parsing, not a stack overflow.
  write("deep.json", "{\"messages\": [], \"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  r = render("model", dir_ / "deep.json");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("request on stdin: nested deeper than 128 levels (under \"x\")"), std::string::npos) << r.err;

  write("no_role.json", R"({"messages": [{"content": "hi"}]})");
  r = render("model", dir_ / "no_role.json");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("messages[0].role"), std::string::npos) << r.err;

  write("broken/chat_template.jinja", "fine\n{{ messages[0] | nosuchfilter }}");
  r = render("broken", dir_ / "no_role.json");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("chat_template.jinja:2: no filter named 'nosuchfilter'"), std::string::npos) << r.err;

  fs::create_directories(dir_ / "empty");
  r = render("empty", jinja_data_dir() / "requests" / "simple_user.json");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no chat template"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace qinfer
