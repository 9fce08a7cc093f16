#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "backend/cuda/buffer.h"
#include "backend/cuda/check.h"
#include "core/error.h"

namespace qinfer::cuda {
namespace {

TEST(DeviceBuffer, RoundTripsBytes) {
  std::vector<int32_t> values(10007);
  std::iota(values.begin(), values.end(), -5000);
  DeviceBuffer buffer(values.size() * sizeof(int32_t));
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(buffer.size(), values.size() * sizeof(int32_t));
  buffer.upload(std::span<const int32_t>(values));
  EXPECT_EQ(buffer.download<int32_t>(), values);
}

TEST(DeviceBuffer, UploadsAndDownloadsAtAnOffset) {
  DeviceBuffer buffer(16);
  std::vector<uint8_t> zeros(16, 0), part = {1, 2, 3};
  buffer.upload(zeros.data(), zeros.size());
  buffer.upload(part.data(), part.size(), 13);
  auto got = buffer.download<uint8_t>();
  EXPECT_EQ(got[12], 0);
  EXPECT_EQ(got[13], 1);
  EXPECT_EQ(got[15], 3);
  uint8_t one = 0;
  buffer.download(&one, 1, 14);
  EXPECT_EQ(one, 2);
}

TEST(DeviceBuffer, RejectsCopiesOutsideTheBuffer) {
  DeviceBuffer buffer(8);
  std::vector<uint8_t> host(16);
  EXPECT_THROW(buffer.upload(host.data(), 9), Error);
  EXPECT_THROW(buffer.upload(host.data(), 4, 5), Error);
  EXPECT_THROW(buffer.download(host.data(), 1, 8), Error);
  EXPECT_THROW(DeviceBuffer(6).download<uint32_t>(), Error);  // 6 bytes is no whole number of uint32
}

TEST(DeviceBuffer, MovesOwnership) {
  DeviceBuffer a(256);
  void* pointer = a.data();
  DeviceBuffer b(std::move(a));
  EXPECT_EQ(b.data(), pointer);
  EXPECT_EQ(b.size(), 256u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(a.size(), 0u);
  DeviceBuffer c(64);
  c = std::move(b);
  EXPECT_EQ(c.data(), pointer);
  EXPECT_EQ(c.size(), 256u);
}

TEST(DeviceBuffer, EmptyBufferHoldsNothing) {
  DeviceBuffer buffer(0);
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_EQ(buffer.size(), 0u);
  EXPECT_TRUE(buffer.download<float>().empty());
}

TEST(CudaCheck, ErrorNamesTheCallTheLineAndTheReason) {
  const cudaError_t status = cudaSetDevice(9999);
  ASSERT_NE(status, cudaSuccess);
  try {
    QINFER_CUDA_CHECK(cudaSetDevice(9999));
    FAIL() << "expected qinfer::Error";
  } catch (const Error& error) {
    std::string message = error.what();
    EXPECT_NE(message.find("cudaSetDevice(9999)"), std::string::npos) << message;
    EXPECT_NE(message.find("buffer_test.cpp:"), std::string::npos) << message;
    EXPECT_NE(message.find(cudaGetErrorString(status)), std::string::npos) << message;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a thrown check must leave no error behind";
}

}  // namespace
}  // namespace qinfer::cuda
