// ProcessGroup collectives against hand-computed values from rank-dependent inputs (MPI over CPU tensors; the dtype
// cases also NCCL over CUDA tensors), the typed errors raised before anything is launched, Work's error path and
// waits from several threads. Correct at any world size.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

#include "ember/base/error.h"
#include "tests/dist/dist_test_util.h"
#include "tests/harness/op_harness.h"

namespace ember {
namespace {

// Every backend (MPI over CPU tensors, NCCL over CUDA tensors) and floating dtype.
class CollectiveDTypes : public ::testing::TestWithParam<std::tuple<testing::DistBackend, DType>> {};

// rank r holds (r + 1) * (i + 1): the sum over ranks is (i + 1) * n(n+1)/2 — small integers, exact in every dtype.
TEST_P(CollectiveDTypes, AllReduceSumAndAvg) {
  EMBER_DIST_GROUP_OF(pg, dev, std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  const int n = pg.size(), r = pg.rank();
  const int64_t len = 37;
  for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg}) {
    std::vector<double> mine(len), expected(len);
    for (int64_t i = 0; i < len; ++i) {
      mine[i] = (r + 1) * (i + 1);
      expected[i] = (i + 1) * n * (n + 1) / 2.0 / (op == dist::ReduceOp::Avg ? n : 1);
    }
    Tensor t = from_vector(mine, {len}).to(dt).to(dev);
    auto work = pg.all_reduce(t, op);
    work->wait();
    EXPECT_TRUE(work->is_completed());
    EXPECT_EQ(t.dtype(), dt);
    EXPECT_TRUE(testing::allclose(t, from_vector(expected, {len}), {0.0, 0.0})) << dist::reduce_op_name(op);
  }
}

// Element j of rank q's input is 100 q + j % 64 (exact in every dtype tested, sums included).
void reduce_scatter_case(dist::ProcessGroup& pg, Device dev, DType dt, int n, int r, int64_t chunk) {
  std::vector<double> in(n * chunk), expected(chunk);
  for (int64_t j = 0; j < n * chunk; ++j) in[j] = 100.0 * r + static_cast<double>(j % 64);
  for (int64_t k = 0; k < chunk; ++k)
    expected[k] = 100.0 * n * (n - 1) / 2 + n * static_cast<double>((r * chunk + k) % 64);
  const Tensor input = from_vector(in, {n * chunk}).to(dt).to(dev);
  Tensor output = full({chunk}, std::nan(""), TensorOptions(dt, dev));
  pg.reduce_scatter(output, input, dist::ReduceOp::Sum)->wait();
  EXPECT_TRUE(testing::allclose(output, from_vector(expected, {chunk}), {0.0, 0.0}));
  for (auto& e : expected) e /= n;
  output.fill_(std::nan(""));
  pg.reduce_scatter(output, input, dist::ReduceOp::Avg)->wait();
  EXPECT_TRUE(testing::allclose(output, from_vector(expected, {chunk}), {0.0, 1e-12}));
}

// Rank r's output is chunk r of the sum, then of the average. A chunk of 3 and one of 2^21 + 3 elements: NCCL takes
// other paths for large counts, and one left the output of an average over one rank unwritten. The output starts as
// NaN so that an element left unwritten shows.
TEST_P(CollectiveDTypes, ReduceScatter) {
  EMBER_DIST_GROUP_OF(pg, dev, std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  const int n = pg.size(), r = pg.rank();
  for (const int64_t chunk : {int64_t{3}, int64_t{(1 << 21) + 3}}) {
    SCOPED_TRACE(chunk);
    reduce_scatter_case(pg, dev, dt, n, r, chunk);
  }
}

// rank q contributes 10 q + k: the output is every rank's input in rank order.
TEST_P(CollectiveDTypes, AllGatherAndBroadcast) {
  EMBER_DIST_GROUP_OF(pg, dev, std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  const int n = pg.size(), r = pg.rank();
  std::vector<double> in(4), expected(4 * n);
  for (int k = 0; k < 4; ++k) in[k] = 10.0 * r + k;
  for (int q = 0; q < n; ++q)
    for (int k = 0; k < 4; ++k) expected[q * 4 + k] = 10.0 * q + k;
  Tensor output = empty({n, 4}, TensorOptions(dt, dev));
  pg.all_gather(output, from_vector(in, {4}).to(dt).to(dev))->wait();
  EXPECT_TRUE(testing::allclose(output.reshape({-1}), from_vector(expected, {4 * n}), {0.0, 0.0}));

  Tensor b = full({5}, 1.0 + r, TensorOptions(dt, dev));
  pg.broadcast(b, n - 1)->wait();
  EXPECT_TRUE(testing::allclose(b, full({5}, static_cast<double>(n), DType::f64), {0.0, 0.0}));
}

// The NCCL instances are named cuda/...: ctest gives them the label gpu (tests/CMakeLists.txt).
auto collective_case_name = [](const auto& info) {
  return std::string(testing::backend_name(std::get<0>(info.param))) + "_" + dtype_name(std::get<1>(info.param));
};
INSTANTIATE_TEST_SUITE_P(Dist, CollectiveDTypes,
                         ::testing::Combine(::testing::Values(testing::DistBackend::Mpi),
                                            ::testing::Values(DType::f32, DType::f64, DType::f16, DType::bf16)),
                         collective_case_name);
INSTANTIATE_TEST_SUITE_P(cuda, CollectiveDTypes,
                         ::testing::Combine(::testing::Values(testing::DistBackend::Nccl),
                                            ::testing::Values(DType::f32, DType::f64, DType::f16, DType::bf16)),
                         collective_case_name);

TEST(DistCollectives, IntegerSumAndBytesGather) {
  EMBER_DIST_GROUP(pg);
  const int n = pg.size(), r = pg.rank();
  Tensor t = full({3}, static_cast<int64_t>(1) << 40, DType::i64);
  t.fill_((static_cast<int64_t>(1) << 40) * (r + 1));
  pg.all_reduce(t)->wait();
  for (int64_t v : t.to_vector<int64_t>()) EXPECT_EQ(v, (static_cast<int64_t>(1) << 40) * n * (n + 1) / 2);
  Tensor out = empty({n * 2}, DType::u8);
  pg.all_gather(out, full({2}, r + 7, DType::u8))->wait();
  const auto got = out.to_vector<int64_t>();
  for (int q = 0; q < n; ++q) EXPECT_EQ(got[q * 2], q + 7);
}

TEST(DistCollectives, AsyncWorksCompleteInAnyWaitOrder) {
  EMBER_DIST_GROUP(pg);
  const int n = pg.size();
  std::vector<Tensor> ts;
  std::vector<dist::WorkPtr> works;
  for (int k = 0; k < 4; ++k) {
    ts.push_back(full({1000}, 1.0 + k, DType::f32));
    works.push_back(pg.all_reduce(ts.back()));
  }
  works.push_back(pg.barrier());
  for (int k = 4; k >= 0; --k) works[k]->wait();  // reverse order: each still completes
  for (int k = 0; k < 4; ++k) EXPECT_EQ(ts[k].to_vector<float>()[999], static_cast<float>((1.0 + k) * n));
}

TEST(DistCollectives, TypedErrorsBeforeLaunch) {
  EMBER_DIST_GROUP(pg);
  const int n = pg.size();
  EXPECT_THROW(pg.all_gather(empty({3 * n + 1}), empty({3})), ShapeError);
  EXPECT_THROW(pg.all_gather(empty({3 * n}, DType::f64), empty({3})), DTypeError);
  EXPECT_THROW(pg.reduce_scatter(empty({2}), empty({2 * n + 1})), ShapeError);
  EXPECT_THROW(pg.all_reduce(empty({2}, DType::b8)), DTypeError);
  EXPECT_THROW(pg.all_reduce(empty({2}, DType::i32), dist::ReduceOp::Avg), DTypeError);
  EXPECT_THROW(pg.all_reduce(empty({4, 4}).t()), ValueError);
  EXPECT_THROW(pg.broadcast(empty({2}), n), ValueError);
  EXPECT_THROW(pg.broadcast(empty({2}), -1), ValueError);
  EXPECT_EQ(pg.backend(), "mpi");
  EXPECT_EQ(dist::world_size(), n);
  EXPECT_EQ(dist::world_rank(), pg.rank());
  EXPECT_GE(dist::local_rank(), 0);
  EXPECT_TRUE(dist::is_initialized());
}

// Note [Work errors]: a Work whose operation fails is completed with the error; every wait() rethrows it, polling
// stops, and the completion of a successful one runs once however many threads wait.
class FakeWork : public dist::PolledWork {
 public:
  explicit FakeWork(int polls_until_done, bool fail) : left_(polls_until_done), fail_(fail) {}
  std::atomic<int> polls{0}, completions{0};

 protected:
  bool poll() override {
    ++polls;
    if (--left_ > 0) return false;
    if (fail_) throw BackendError("MPI_Test failed (simulated)");
    ++completions;
    return true;
  }

 private:
  int left_;
  bool fail_;
};

TEST(DistWork, AFailedWorkIsCompletedAndRethrowsOnEveryWait) {
  FakeWork w(3, true);
  EXPECT_FALSE(w.is_completed());
  EXPECT_THROW(w.wait(), BackendError);
  EXPECT_TRUE(w.is_completed());
  EXPECT_THROW(w.wait(), BackendError);
  std::thread other([&] { EXPECT_THROW(w.wait(), BackendError); });
  other.join();
  EXPECT_EQ(w.polls.load(), 3);  // never polled again after the failure
  EXPECT_EQ(w.completions.load(), 0);
}

TEST(DistWork, ConcurrentWaitersRunTheCompletionOnce) {
  FakeWork w(200, false);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { w.wait(); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(w.completions.load(), 1);
  EXPECT_EQ(w.polls.load(), 200);
}

// Note [MPI threading]: one thread launches collectives while two others wait on them (each waits every Work); the
// launches keep going while a waiter polls, and every result is right.
TEST(DistCollectives, LaunchOnOneThreadWhileOthersWait) {
  EMBER_DIST_GROUP(pg);
  const int n = pg.size();
  constexpr int kCount = 64;
  std::vector<Tensor> ts(kCount);
  std::vector<dist::WorkPtr> works(kCount);
  std::mutex m;
  std::condition_variable cv;
  int launched = 0;
  auto waiter = [&] {
    for (int k = 0; k < kCount; ++k) {
      dist::WorkPtr w;
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return launched > k; });
        w = works[k];
      }
      w->wait();
    }
  };
  std::thread a(waiter), b(waiter);
  for (int k = 0; k < kCount; ++k) {
    Tensor t = full({257}, 1.0 + k, DType::f32);
    dist::WorkPtr w = pg.all_reduce(t, k % 2 ? dist::ReduceOp::Avg : dist::ReduceOp::Sum);
    {
      std::lock_guard<std::mutex> lock(m);
      ts[k] = t;
      works[k] = w;
      ++launched;
    }
    cv.notify_all();
  }
  a.join();
  b.join();
  for (int k = 0; k < kCount; ++k) {
    EXPECT_TRUE(works[k]->is_completed());
    EXPECT_EQ(ts[k].to_vector<float>()[256], static_cast<float>((1.0 + k) * (k % 2 ? 1 : n))) << k;
  }
}

}  // namespace
}  // namespace ember
