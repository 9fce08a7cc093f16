#include "core/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace qinfer {
namespace {

// Collects what a ProgressBar writes.
class Capture {
 public:
  Capture() : file_(open_memstream(&data_, &size_)) {}
  ~Capture() {
    std::fclose(file_);
    std::free(data_);
  }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    return std::string(data_, size_);
  }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  std::FILE* file_;
};

TEST(Progress, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(1024 * 1024 - 1), "1.0 MiB");  // not "1024.0 KiB"
  EXPECT_EQ(format_bytes(uint64_t{12} << 20 | 300u << 10), "12.3 MiB");
  EXPECT_EQ(format_bytes(uint64_t{5} << 30), "5.0 GiB");
  EXPECT_EQ(format_bytes(uint64_t{3} << 40), "3.0 TiB");
  EXPECT_EQ(format_bytes(UINT64_MAX), "16.0 EiB");
}

TEST(Progress, RendersBytesLine) {
  Capture capture;
  ProgressBar bar("loading", uint64_t{4} << 30, ProgressBar::Unit::bytes, capture.file(), false);
  EXPECT_EQ(bar.render(uint64_t{1} << 30, 2.0),
            "loading  25% [#####               ] 1.0 GiB/4.0 GiB 512.0 MiB/s ETA 0:06");
  EXPECT_EQ(bar.render(uint64_t{4} << 30, 8.0, true),
            "loading 100% [####################] 4.0 GiB/4.0 GiB 512.0 MiB/s in 0:08");
  EXPECT_EQ(bar.render(0, 0.0), "loading   0% [                    ] 0 B/4.0 GiB 0 B/s ETA --:--");
}

TEST(Progress, RendersItemsLine) {
  Capture capture;
  ProgressBar bar("quantizing", 200, ProgressBar::Unit::items, capture.file(), false);
  EXPECT_EQ(bar.render(50, 4000.0), "quantizing  25% [#####               ] 50/200 0.0 it/s ETA 3:20:00");
  EXPECT_EQ(bar.render(150, 3.0), "quantizing  75% [###############     ] 150/200 50.0 it/s ETA 0:01");
  ProgressBar empty("nothing", 0, ProgressBar::Unit::items, capture.file(), false);
  EXPECT_EQ(empty.render(0, 1.0, true), "nothing 100% [####################] 0/0 0.0 it/s in 0:01");
}

TEST(Progress, SilentWhenNotInteractive) {
  Capture capture;
  {
    ProgressBar bar("loading", 10, ProgressBar::Unit::items, capture.file(), false);
    for (int i = 0; i < 10; ++i) bar.advance();
    bar.finish();
  }
  EXPECT_EQ(capture.text(), "");
}

TEST(Progress, InteractiveDrawsFinalLineOnce) {
  Capture capture;
  {
    ProgressBar bar("loading", 4, ProgressBar::Unit::items, capture.file(), true);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back([&] { bar.advance(); });
    for (auto& t : threads) t.join();
    bar.finish();
    bar.finish();
  }  // the destructor must not draw again
  std::string text = capture.text();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.front(), '\r');
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
  EXPECT_NE(text.find("loading 100% [####################] 4/4"), std::string::npos) << text;
}

TEST(Progress, DestructorFinishesWithPartialCount) {
  Capture capture;
  {
    ProgressBar bar("download", 10, ProgressBar::Unit::items, capture.file(), true);
    bar.advance(3);
  }
  std::string text = capture.text();
  EXPECT_NE(text.find("download  30% [######              ] 3/10"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
}

TEST(Progress, RedrawsWhileRunning) {
  Capture capture;
  ProgressBar bar("work", 100, ProgressBar::Unit::items, capture.file(), true);
  bar.advance();
  EXPECT_EQ(capture.text(), "");  // throttled: too soon after the start
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  bar.advance();
  std::string text = capture.text();
  EXPECT_NE(text.find("work   2% ["), std::string::npos) << text;
  EXPECT_EQ(text.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace qinfer
