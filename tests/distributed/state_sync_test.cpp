// broadcast_state and verify_identical on the CNN of configs/mnist.json, built on every rank with
// seed = rank (so initial parameters differ), and an Adam optimizer that took rank + 1 steps with
// rank-dependent gradients (so moments and step counters differ). Equality is checked against
// rank 0's pre-broadcast copy fetched with a plain MPI_Bcast, bit for bit; the checksum against an
// FNV-1a computed here.
#include "distributed/state_sync.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/mpi_communicator.h"
#include "layers/build.h"
#include "mpi_test_env.h"
#include "optim/optimizer.h"

namespace dptrain::distributed {
namespace {

Json mnist_layers() {
  const std::string path = std::string(DPTRAIN_SOURCE_DIR) + "/configs/mnist.json";
  std::ifstream in(path);
  if (!in) throw Error("cannot open " + path);
  return Json::parse(in).at("model").at("layers");
}

struct Replica {
  std::unique_ptr<layers::Sequential> model;
  std::unique_ptr<FlatParameters> flat;
  std::unique_ptr<optim::Adam> adam;
  explicit Replica(uint64_t seed) {
    model = layers::build_sequential(mnist_layers(), {1, 28, 28}, seed);
    flat = std::make_unique<FlatParameters>(model->named_parameters(), Device::cpu());
    adam = std::make_unique<optim::Adam>(*flat, optim::AdamOptions{});
  }
  // What the trainer broadcasts: the flat parameters and the optimizer's flat state.
  std::vector<Tensor> buffers() const {
    std::vector<Tensor> all = {flat->values()};
    for (const Tensor& t : adam->state_buffers()) all.push_back(t);
    return all;
  }
  // Takes `steps` Adam steps with gradients that depend on `salt`.
  void train(int steps, int salt) {
    for (int s = 0; s < steps; ++s) {
      adam->zero_grad();
      int k = 0;
      for (const NamedTensor& p : adam->parameters()) {
        float* g = p.tensor.grad_data();
        for (int64_t i = 0; i < p.tensor.numel(); ++i)
          g[i] = 0.1f * static_cast<float>(std::sin(0.013 * i + 0.7 * k + salt + 0.3 * s));
        ++k;
      }
      adam->step(1e-3f);
    }
  }
  std::vector<NamedTensor> everything() const {
    std::vector<NamedTensor> all = adam->parameters();
    for (const NamedTensor& t : adam->state()) all.push_back(t);
    return all;
  }
};

uint64_t fnv1a(const std::vector<NamedTensor>& tensors) {
  uint64_t h = 14695981039346656037ull;
  for (const NamedTensor& t : tensors) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(t.tensor.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(t.tensor.numel()) * sizeof(float); ++i)
      h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

std::vector<uint64_t> gather_u64(uint64_t v) {
  std::vector<uint64_t> all(test::size());
  DPTRAIN_MPI_CHECK(MPI_Allgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD));
  return all;
}

TEST(StateSync, BroadcastStateMakesParametersAndAdamStateBitwiseRankZeros) {
  const int r = test::rank();
  Replica rep(/*seed=*/static_cast<uint64_t>(r));
  rep.train(r + 1, r);
  const std::vector<NamedTensor> tensors = rep.everything();
  ASSERT_EQ(rep.adam->state().size(), 2 * rep.adam->parameters().size());  // exp_avg, exp_avg_sq

  // Rank 0's values before the broadcast (plain MPI), and whether this rank differs from them.
  std::vector<std::vector<float>> root_before;
  std::size_t differing = 0;
  for (const NamedTensor& t : tensors) {
    root_before.push_back(test::root_copy(t.tensor.values()));
    differing += !test::bitwise_equal(root_before.back(), t.tensor.values());
  }
  if (r != 0) {
    EXPECT_EQ(differing, tensors.size()) << "premise: rank " << r << " should start different everywhere";
  }

  int64_t steps = rep.adam->steps_taken();
  EXPECT_EQ(steps, r + 1);
  MpiCommunicator comm(test::world());
  broadcast_state(comm, rep.buffers(), std::span<int64_t>(&steps, 1));
  rep.adam->set_steps_taken(steps);

  for (std::size_t k = 0; k < tensors.size(); ++k) {
    EXPECT_TRUE(test::bitwise_equal(tensors[k].tensor.values(), root_before[k]))
        << tensors[k].name << " on rank " << r << " is not rank 0's";
  }
  EXPECT_EQ(steps, 1) << "step counter";
  EXPECT_EQ(rep.adam->steps_taken(), 1);

  // Checksums: verify_identical returns the same value everywhere, equal to FNV-1a of the parameters.
  uint64_t sum = 0;
  EXPECT_NO_THROW(sum = verify_identical(comm, rep.adam->parameters()));
  for (uint64_t s : gather_u64(sum)) {
    EXPECT_EQ(s, sum);
  }
  // And the optimizer state agrees too.
  for (uint64_t s : gather_u64(fnv1a(rep.adam->state()))) {
    EXPECT_EQ(s, fnv1a(rep.adam->state()));
  }

  // The next step from identical state stays identical (same gradients on every rank).
  rep.train(1, 1000);
  for (uint64_t s : gather_u64(fnv1a(tensors))) {
    EXPECT_EQ(s, fnv1a(tensors));
  }
}

TEST(StateSync, BroadcastStateCarriesSeveralScalars) {
  Replica rep(static_cast<uint64_t>(test::rank()));
  int64_t scalars[3] = {100 + test::rank(), -7 * test::rank(), int64_t{1} << (40 + test::rank())};
  MpiCommunicator comm(test::world());
  broadcast_state(comm, rep.buffers(), std::span<int64_t>(scalars));
  EXPECT_EQ(scalars[0], 100);
  EXPECT_EQ(scalars[1], 0);
  EXPECT_EQ(scalars[2], int64_t{1} << 40);
}

TEST(StateSync, VerifyIdenticalThrowsNamingTheRankThatDiffers) {
  if (test::size() == 1) GTEST_SKIP() << "needs two ranks";
  Replica rep(0);  // seed 0 everywhere: identical replicas
  MpiCommunicator comm(test::world());
  EXPECT_NO_THROW(verify_identical(comm, rep.adam->parameters()));
  const int culprit = test::size() - 1;
  if (test::rank() == culprit) {
    float* w = rep.adam->parameters().back().tensor.data();
    w[0] = std::nextafter(w[0], 1e30f);  // one ulp in one element
  }
  std::string message;
  try {
    verify_identical(comm, rep.adam->parameters());
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_FALSE(message.empty()) << "rank " << test::rank() << " did not throw";
  EXPECT_NE(message.find("rank(s) " + std::to_string(culprit)), std::string::npos) << message;
}

// Another layout on one rank, the last: every rank throws (none is left waiting in a broadcast), that
// rank naming its own layout, the others naming it. Buffers of the same number and total but in
// another order ({0, 8} against {8, 0}: the empty one makes no call), and another count of scalars.
TEST(StateSync, BroadcastStateRefusesAnotherLayoutOnEveryRank) {
  if (test::size() == 1) GTEST_SKIP() << "needs two ranks";
  MpiCommunicator comm(test::world());
  const int culprit = test::size() - 1;
  const bool odd_one = test::rank() == culprit;
  const auto message_of = [&](const std::vector<Tensor>& buffers, std::span<int64_t> scalars) {
    try {
      broadcast_state(comm, buffers, scalars);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  int64_t scalars[2] = {1, 2};
  const Tensor empty = Tensor::zeros({0}), eight = Tensor::zeros({8});
  const std::vector<Tensor> in_order = {empty, eight}, reversed = {eight, empty};
  const std::string swapped = message_of(odd_one ? reversed : in_order, std::span<int64_t>(scalars));
  const std::string fewer_scalars =
      message_of(in_order, std::span<int64_t>(scalars, odd_one ? std::size_t{1} : std::size_t{2}));
  for (const std::string& message : {swapped, fewer_scalars}) {
    ASSERT_FALSE(message.empty()) << "rank " << test::rank() << " did not throw";
    if (odd_one) {
      EXPECT_NE(message.find("rank " + std::to_string(culprit) + " has 2 state buffers of 8 elements and "),
                std::string::npos)
          << message;
    } else {
      EXPECT_NE(message.find("rank(s) " + std::to_string(culprit) + " hold state buffers laid out otherwise"),
                std::string::npos)
          << message;
    }
    EXPECT_NE(message.find("all ranks must run the same config"), std::string::npos) << message;
  }
  if (odd_one) {
    EXPECT_NE(swapped.find("(the buffers' sizes differ)"), std::string::npos) << swapped;
    EXPECT_NE(fewer_scalars.find("and 1 counter(s), rank 0 2 of 8 and 2; "), std::string::npos)
        << fewer_scalars;
  }
  // The same layout again: nothing left over from the refusals, the broadcast goes through.
  std::vector<Tensor> mine = {empty, Tensor::full({8}, static_cast<float>(test::rank()))};
  EXPECT_EQ(message_of(mine, std::span<int64_t>(scalars)), "");
  EXPECT_EQ(mine[1].to_vector(), std::vector<float>(8, 0.0f));
}

// A world of one: broadcast_state leaves everything as it is and verify_identical just hashes.
TEST(StateSync, WorldOfOneIsANoOp) {
  Replica rep(static_cast<uint64_t>(test::rank()) + 7);
  rep.train(2, 3);
  const uint64_t before = fnv1a(rep.everything());
  int64_t steps = 2;
  test::SelfCommunicator self;
  EXPECT_NO_THROW(broadcast_state(self, rep.buffers(), std::span<int64_t>(&steps, 1)));
  EXPECT_EQ(fnv1a(rep.everything()), before);
  EXPECT_EQ(steps, 2);
  uint64_t sum = 0;
  EXPECT_NO_THROW(sum = verify_identical(self, rep.adam->parameters()));
  Replica other(static_cast<uint64_t>(test::rank()) + 8);
  EXPECT_NE(verify_identical(self, other.adam->parameters()), sum);
}

// state_sync.h documents the checksum as "FNV-1a over the parameters' bytes": 64-bit FNV-1a has
// offset basis 14695981039346656037 (0xcbf29ce484222325) and prime 1099511628211. Checked on a
// single tensor { 1.0f } (bytes 00 00 80 3f) and on the CNN's parameters.
TEST(StateSync, ChecksumIsStandardFnv1a) {
  test::SelfCommunicator self;
  const std::vector<NamedTensor> one = {{"x", Tensor::from_data({1}, std::vector<float>{1.0f})}};
  uint64_t expected = 14695981039346656037ull;
  for (unsigned char byte : {0x00, 0x00, 0x80, 0x3f}) expected = (expected ^ byte) * 1099511628211ull;
  EXPECT_EQ(verify_identical(self, one), expected);
  Replica rep(3);
  EXPECT_EQ(verify_identical(self, rep.adam->parameters()), fnv1a(rep.adam->parameters()));
}

}  // namespace
}  // namespace dptrain::distributed
