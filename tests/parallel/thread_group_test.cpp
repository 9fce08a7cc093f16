// ThreadGroup: the in-process communicator the CPU tensor-parallel path and CI run on. Sums must be
// in rank order (bit-identical on every rank, run after run), and a failing rank must not leave the
// others hanging in a collective.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "core/error.h"
#include "parallel/communicator.h"

namespace qinfer::parallel {
namespace {

// Values whose float sum depends on the order they are added in: a large value on rank 0 that
// later small ones partly vanish into.
float contribution(int rank, int64_t i) {
  if (rank == 0) return (i % 2 ? 1e8f : -3e7f) + static_cast<float>(i) * 0.37f;
  return 1.25f + static_cast<float>(rank) * 0.3f - static_cast<float>(i % 7) * 0.11f;
}

class ThreadGroupSizes : public ::testing::TestWithParam<int> {};

TEST_P(ThreadGroupSizes, AllReduceSumsInRankOrderOnEveryRank) {
  const int size = GetParam();
  const int64_t n = 1001;
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) {
    float sum = contribution(0, i);
    for (int r = 1; r < size; ++r) sum += contribution(r, i);
    want[static_cast<size_t>(i)] = sum;
  }
  ThreadGroup group(size);
  EXPECT_EQ(group.size(), size);
  std::vector<std::vector<float>> got(static_cast<size_t>(size));
  group.run([&](Communicator& comm) {
    EXPECT_EQ(comm.size(), size);
    auto ops = make_ref_ops();
    // Many collectives in a row, of changing shapes, as a forward makes them.
    for (int rep = 0; rep < 20; ++rep) {
      Tensor t = host_tensor(DType::f32, {rep % 2 ? 1 : 7, n});
      const int64_t rows = t.dim(0);
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t i = 0; i < n; ++i) t.ptr<float>()[row * n + i] = contribution(comm.rank(), i);
      comm.all_reduce_sum(*ops, t);
      for (int64_t row = 0; row < rows; ++row)
        ASSERT_EQ(std::memcmp(t.ptr<float>() + row * n, want.data(), n * sizeof(float)), 0)
            << "rank " << comm.rank() << " rep " << rep << " row " << row;
      got[static_cast<size_t>(comm.rank())].assign(t.ptr<float>(), t.ptr<float>() + n);
    }
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], want) << "rank " << r;
  if (size > 2) {
    // The order matters for these values (two terms commute; three do not associate): a reversed
    // sum differs somewhere.
    bool differs = false;
    for (int64_t i = 0; i < n && !differs; ++i) {
      float reversed = contribution(size - 1, i);
      for (int r = size - 2; r >= 0; --r) reversed += contribution(r, i);
      differs = reversed != want[static_cast<size_t>(i)];
    }
    EXPECT_TRUE(differs);
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ThreadGroupSizes, ::testing::Values(1, 2, 4));

TEST(ThreadGroup, FailingRankReleasesTheOthersAndItsErrorIsRethrown) {
  ThreadGroup group(3);
  std::atomic<int> released{0};
  try {
    group.run([&](Communicator& comm) {
      if (comm.rank() == 1) fail("rank 1 cannot load its weights");
      auto ops = make_ref_ops();
      Tensor t = host_tensor(DType::f32, {4});
      try {
        comm.all_reduce_sum(*ops, t);
      } catch (const Error&) {
        ++released;
        throw;
      }
    });
    FAIL() << "run did not rethrow";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 1 cannot load its weights");
  }
  EXPECT_EQ(released.load(), 2);
  EXPECT_THROW(group.run([](Communicator&) {}), Error);
}

TEST(ThreadGroup, MismatchedShapesAndDtypesAreErrors) {
  ThreadGroup group(2);
  try {
    group.run([&](Communicator& comm) {
      auto ops = make_ref_ops();
      Tensor t = host_tensor(DType::f32, {comm.rank() == 0 ? 4 : 5});
      comm.all_reduce_sum(*ops, t);
    });
    FAIL() << "mismatched sizes were reduced";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reduces"), std::string::npos) << e.what();
  }
  ThreadGroup one(1);
  try {
    one.run([&](Communicator& comm) {
      auto ops = make_ref_ops();
      Tensor t = host_tensor(DType::bf16, {4});
      comm.all_reduce_sum(*ops, t);
    });
    FAIL() << "a bf16 tensor was reduced";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only f32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ThreadGroup(0), Error);
}

}  // namespace
}  // namespace qinfer::parallel
