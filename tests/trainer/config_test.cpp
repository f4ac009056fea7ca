// Strict config parsing: the shipped configs parse; unknown keys, wrong types, out-of-range values
// and bad choices are errors naming the key path; --set overrides; the checked-in reference page and
// fuzz dictionary match the config table.
#include "trainer/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/config_table.h"
#include "core/error.h"
#include "tests/test_util.h"

namespace dptrain::trainer {
namespace {

const std::string kSource = DPTRAIN_SOURCE_DIR;

Json mnist() {
  return read_json_file(kSource + "/configs/mnist.json");
}

template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> fragments) {
  test_util::expect_one_line_error(std::forward<F>(f), fragments);
}

void expect_config_error(const Json& json, std::initializer_list<std::string> fragments) {
  expect_error([&] { parse_config(json); }, fragments);
}

TEST(ParseConfig, MnistCnn) {
  const Config c = parse_config(mnist());
  EXPECT_EQ(c.seed, 42u);
  EXPECT_EQ(c.output_dir, "runs/mnist");
  EXPECT_EQ(c.data.dataset, "mnist");
  EXPECT_EQ(c.data.dir, "data/mnist");
  EXPECT_EQ(c.data.batch_size, 128);
  EXPECT_EQ(c.data.eval_batch_size, 1000);  // default
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_DOUBLE_EQ(c.data.mean, 0.1307);
  EXPECT_EQ(c.model.input_shape, (Shape{1, 28, 28}));
  ASSERT_TRUE(c.model.layers.is_array());
  EXPECT_EQ(c.model.layers.size(), 10u);
  EXPECT_EQ(c.model.layers[7]["out_features"], 64);
  EXPECT_EQ(c.model.loss, LossKind::kCrossEntropy);
  EXPECT_EQ(c.optimizer.type, "adam");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.001);
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(c.training.epochs, 5);
  EXPECT_EQ(c.training.max_steps, 0);
}

TEST(ParseConfig, MnistMlp) {
  const Config c = parse_config(read_json_file(kSource + "/configs/mnist_mlp.json"));
  EXPECT_EQ(c.output_dir, "runs/mnist_mlp");
  EXPECT_EQ(c.model.layers.size(), 4u);
  EXPECT_EQ(c.model.layers[1]["out_features"], 128);
}

TEST(ParseConfig, DefaultsForAMinimalConfig) {
  const Config c =
      parse_config(Json::parse(R"({"model": {"input_shape": [4], "layers": [{"type": "relu"}]}})"));
  EXPECT_EQ(c.seed, 0u);
  EXPECT_EQ(c.data.dir, "data/mnist");
  EXPECT_EQ(c.data.batch_size, 128);
  EXPECT_EQ(c.optimizer.type, "adam");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.training.epochs, 1);
  EXPECT_EQ(c.training.progress, ProgressMode::kAuto);
  // Type-dependent defaults.
  Config sgd = parse_config(Json::parse(R"({"model": {"input_shape": [4], "layers": [{"type": "relu"}]},
                                             "optimizer": {"type": "sgd"}})"));
  EXPECT_DOUBLE_EQ(sgd.optimizer.lr, 0.01);
  Config adamw = parse_config(Json::parse(R"({"model": {"input_shape": [4], "layers": [{"type": "relu"}]},
                                               "optimizer": {"type": "adamw"}})"));
  EXPECT_DOUBLE_EQ(adamw.optimizer.weight_decay, 1e-2);
  Config fashion = parse_config(Json::parse(R"({"model": {"input_shape": [4], "layers": [{"type": "relu"}]},
                                                "data": {"dataset": "fashion_mnist"}})"));
  EXPECT_EQ(fashion.data.dir, "/usr/share/datasets/fashion-mnist");
  // Checkpoints live under the output directory unless told otherwise.
  Config out = parse_config(Json::parse(R"({"model": {"input_shape": [4], "layers": [{"type": "relu"}]},
                                            "output_dir": "runs/x"})"));
  EXPECT_EQ(out.checkpoint.dir, "runs/x/checkpoints");
  EXPECT_EQ(out.checkpoint.every_epochs, 1);
  EXPECT_EQ(out.checkpoint.every_steps, 0);
  EXPECT_EQ(out.checkpoint.keep, 3);
}

// A dead peer hangs NCCL's collectives forever: by default they are aborted after 600 s (PyTorch's
// timeout); MPI's cannot be cancelled, so by default it only warns. An explicit value is kept.
TEST(ParseConfig, StallAbortDefaultsByBackend) {
  const Config c =
      parse_config(Json::parse(R"({"model": {"input_shape": [4], "layers": [{"type": "relu"}]}})"));
  EXPECT_DOUBLE_EQ(stall_abort_seconds(c.distributed, /*nccl=*/true), 600.0);
  EXPECT_DOUBLE_EQ(stall_abort_seconds(c.distributed, /*nccl=*/false), 0.0);
  for (const double set : {0.0, 30.0}) {
    const Config d = parse_config(Json::parse(R"({"model": {"input_shape": [4], "layers": [{"type": "relu"}]},
                                                  "distributed": {"stall_abort_s": )" +
                                              std::to_string(set) + "}}"));
    EXPECT_DOUBLE_EQ(stall_abort_seconds(d.distributed, true), set);
    EXPECT_DOUBLE_EQ(stall_abort_seconds(d.distributed, false), set);
  }
  // Only -1 means "by backend": a value between it and 0 (once read as "never") is an error.
  for (const char* bad : {"-2", "-0.5", "2e9"})
    expect_config_error(
        Json::parse(std::string(R"({"model": {"input_shape": [4], "layers": [{"type": "relu"}]},
                                                    "distributed": {"stall_abort_s": )") +
                    bad + "}}"),
        {"distributed.stall_abort_s", "must be -1 (by backend) or seconds in [0, 1e9]"});
}

TEST(ParseConfig, ResolvedConfigRoundTrips) {
  const Config c = parse_config(mnist());
  const Json resolved = to_json(c);
  EXPECT_EQ(resolved["data"]["eval_batch_size"], 1000);
  EXPECT_EQ(resolved["optimizer"]["type"], "adam");
  EXPECT_FALSE(resolved["optimizer"].contains("momentum")) << "adam's resolved form must parse again";
  const Config again = parse_config(resolved);
  EXPECT_EQ(to_json(again), resolved);
  // The same for an SGD config (its own key set).
  Json sgd = mnist();
  sgd["optimizer"] = Json::parse(R"({"type": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": true})");
  const Json sgd_resolved = to_json(parse_config(sgd));
  EXPECT_EQ(to_json(parse_config(sgd_resolved)), sgd_resolved);
}

TEST(ConfigErrors, UnknownOrNegativeCheckpointKeys) {
  Json j = mnist();
  j["checkpoint"] = Json::parse(R"({"every_step": 10})");
  expect_config_error(j, {"checkpoint.every_step", "not a known key"});
  j["checkpoint"] = Json::parse(R"({"keep": -1})");
  expect_config_error(j, {"checkpoint.keep", "out of range"});
}

TEST(ConfigErrors, UnknownTopLevelKey) {
  Json j = mnist();
  j["sed"] = 1;
  expect_config_error(j, {"config key sed", "not a known key", "did you mean seed?"});
}

// A misspelt key names the known key nearest to it (within a third of its length in edits); a key
// near none says where the keys are listed.
TEST(ConfigErrors, UnknownNestedKey) {
  Json j = mnist();
  j["optimizer"]["lrr"] = 0.1;
  expect_config_error(j, {"optimizer.lrr", "not a known key", "did you mean optimizer.lr?"});
  Json k = mnist();
  k["data"]["batchsize"] = 64;
  expect_config_error(k, {"data.batchsize", "did you mean data.batch_size?"});
  Json t = mnist();
  t["training"]["epoch"] = 3;
  expect_config_error(t, {"training.epoch", "did you mean training.epochs?"});
  Json m = mnist();
  m["model"]["layer"] = Json::array();
  expect_config_error(m, {"model.layer", "did you mean model.layers?"});
  Json o = mnist();
  o["optimiser"] = o["optimizer"];
  expect_config_error(o, {"config key optimiser", "did you mean optimizer?"});
  Json far = mnist();
  far["training"]["colour"] = 3;
  expect_config_error(far, {"training.colour is not a known key; check its spelling against docs/config.md"});
}

TEST(ConfigErrors, WrongType) {
  Json j = mnist();
  j["data"]["batch_size"] = "128";
  expect_config_error(j, {"data.batch_size", "expected an integer", "a string"});
  Json f = mnist();
  f["data"]["batch_size"] = 128.5;
  expect_config_error(f, {"data.batch_size", "expected an integer"});
  Json b = mnist();
  b["data"]["shuffle"] = "yes";
  expect_config_error(b, {"data.shuffle", "true or false"});
  Json l = mnist();
  l["optimizer"]["lr"] = "fast";
  expect_config_error(l, {"optimizer.lr", "expected a number"});
  Json s = mnist();
  s["model"]["input_shape"] = Json::parse(R"([1, "28", 28])");
  expect_config_error(s, {"model.input_shape[1]", "expected an integer"});
  Json o = mnist();
  o["data"] = 5;
  expect_config_error(o, {"data", "expected an object"});
}

TEST(ConfigErrors, OutOfRange) {
  Json j = mnist();
  j["data"]["batch_size"] = 0;
  expect_config_error(j, {"data.batch_size", "out of range"});
  Json e = mnist();
  e["training"]["epochs"] = -1;
  expect_config_error(e, {"training.epochs", "out of range"});
  Json t = mnist();
  t["threads"] = 5000;
  expect_config_error(t, {"threads", "out of range"});
  Json s = mnist();
  s["data"]["std"] = 0.0;
  expect_config_error(s, {"data.std"});
  Json m = mnist();
  m["model"]["input_shape"] = Json::parse("[1, 0, 28]");
  expect_config_error(m, {"model.input_shape"});
  Json b = mnist();
  b["optimizer"]["betas"] = Json::parse("[0.9, 1.0]");
  expect_config_error(b, {"optimizer.betas"});
}

// A negative learning rate climbs the loss; 0 is a legal no-op (the e2e tests measure a starting
// point with it). Checked for both optimizers, whose defaults differ.
TEST(ConfigErrors, NegativeLearningRateIsRejectedAndZeroIsNot) {
  for (const char* type : {"adam", "sgd"}) {
    Json j = mnist();
    j["optimizer"]["type"] = type;
    j["optimizer"]["lr"] = -0.5;
    expect_config_error(j, {"optimizer.lr", "out of range"});
    j["optimizer"]["lr"] = -1e-300;
    expect_config_error(j, {"optimizer.lr", "out of range"});
    j["optimizer"]["lr"] = 0.0;
    EXPECT_EQ(parse_config(j).optimizer.lr, 0.0) << type;
  }
}

// Integers that do not fit the field must be rejected, not wrapped into range.
TEST(ConfigErrors, IntegersOutsideTheFieldTypeAreRejected) {
  Json seed = mnist();
  seed["seed"] = -1;  // the seed is unsigned
  expect_config_error(seed, {"seed"});
  Json threads = mnist();
  threads["threads"] = 4294967297LL;  // 2^32 + 1: an int would wrap it to 1
  expect_config_error(threads, {"threads"});
  Json batch = mnist();
  batch["data"]["batch_size"] = 18446744073709551615ULL;  // 2^64 - 1
  expect_config_error(batch, {"data.batch_size"});
}

TEST(ConfigErrors, BadChoice) {
  Json j = mnist();
  j["optimizer"]["type"] = "rmsprop";
  expect_config_error(j, {"optimizer.type", "rmsprop", "\"sgd\"", "\"adam\"", "\"adamw\""});
  Json d = mnist();
  d["data"]["dataset"] = "cifar10";
  expect_config_error(d, {"data.dataset", "cifar10"});
  Json l = mnist();
  l["model"]["loss"] = "hinge";
  expect_config_error(l, {"model.loss", "hinge"});
  Json p = mnist();
  p["training"]["progress"] = "spinner";
  expect_config_error(p, {"training.progress", "spinner", "\"lines\""});
}

TEST(ConfigErrors, InconsistentOptimizerKeys) {
  Json j = mnist();
  j["optimizer"]["momentum"] = 0.9;  // adam
  expect_config_error(j, {"optimizer.momentum", "sgd"});
  Json n = mnist();
  n["optimizer"] = Json::parse(R"({"type": "sgd", "nesterov": true})");
  expect_config_error(n, {"optimizer.nesterov"});
}

TEST(ConfigErrors, MissingModel) {
  Json j = mnist();
  j.erase("model");
  expect_config_error(j, {"model", "missing"});
  Json s = mnist();
  s["model"].erase("input_shape");
  expect_config_error(s, {"model.input_shape", "missing"});
}

TEST(ParseConfig, ResnetPresetsAndSyntheticDataRoundTrip) {
  for (const char* name : {"resnet20_fashion_mnist.json", "resnet50_synthetic.json"}) {
    const Config c = parse_config(read_json_file(kSource + "/configs/" + name));
    EXPECT_FALSE(c.model.architecture.empty()) << name;
    const Json resolved = to_json(c);
    EXPECT_FALSE(resolved["model"].contains("layers")) << name;
    EXPECT_EQ(to_json(parse_config(resolved)), resolved) << name;
  }
  const Config r50 = parse_config(read_json_file(kSource + "/configs/resnet50_synthetic.json"));
  EXPECT_EQ(r50.model.architecture, "resnet50");
  EXPECT_EQ(r50.model.num_classes, 1000);
  EXPECT_EQ(r50.data.dataset, "synthetic");
  EXPECT_EQ(r50.data.synthetic.samples, 1024);
  EXPECT_FALSE(r50.distributed.sync_batchnorm);
  EXPECT_TRUE(r50.distributed.broadcast_buffers);
  Json j = read_json_file(kSource + "/configs/resnet20_fashion_mnist.json");
  j["distributed"]["sync_batchnorm"] = true;
  j["distributed"]["broadcast_buffers"] = false;
  const Config synced = parse_config(j);
  EXPECT_TRUE(synced.distributed.sync_batchnorm);
  EXPECT_FALSE(synced.distributed.broadcast_buffers);
  EXPECT_EQ(to_json(parse_config(to_json(synced))), to_json(synced));
}

TEST(ConfigErrors, ArchitectureLayersAndSyntheticKeys) {
  Json both = mnist();
  both["model"]["architecture"] = "resnet20";
  expect_config_error(both, {"model.layers", "model.architecture", "exclude each other"});
  // Rank 0 validates the config alone, so an unknown architecture is its error, not every rank's.
  Json unknown_architecture = read_json_file(kSource + "/configs/resnet20_fashion_mnist.json");
  unknown_architecture["model"]["architecture"] = "resnet21";
  expect_config_error(unknown_architecture,
                      {"model.architecture", "\"resnet21\" is not an architecture", "\"resnet20\""});
  Json classes = mnist();
  classes["model"]["num_classes"] = 10;
  expect_config_error(classes, {"model.num_classes", "model.architecture"});
  Json zero = read_json_file(kSource + "/configs/resnet50_synthetic.json");
  zero["model"]["num_classes"] = 0;
  expect_config_error(zero, {"model.num_classes", "out of range"});
  Json stray = mnist();
  stray["data"]["synthetic"] = Json::parse(R"({"samples": 8})");
  expect_config_error(stray, {"data.synthetic", "\"synthetic\" only"});
  Json unknown = read_json_file(kSource + "/configs/resnet50_synthetic.json");
  unknown["data"]["synthetic"]["sample"] = 8;
  expect_config_error(unknown, {"data.synthetic.sample", "not a known key"});
  Json sync = mnist();
  sync["distributed"]["sync_batchnorm"] = "yes";
  expect_config_error(sync, {"distributed.sync_batchnorm"});
  Json tile = mnist();
  tile["cpu"]["winograd_tile"] = 3;
  expect_config_error(tile, {"cpu.winograd_tile", "= 3 must be 2 or 4"});
  tile["cpu"]["winograd_tile"] = 4;
  EXPECT_EQ(parse_config(tile).cpu.winograd_tile, 4);
}

TEST(ParseConfig, DeterministicModeRoundTrips) {
  Json j = mnist();
  j["distributed"]["deterministic"] = true;
  const Config plain = parse_config(j);
  EXPECT_TRUE(plain.distributed.deterministic);
  EXPECT_EQ(plain.distributed.deterministic_micro_batch, 32);  // divides the default batch of 128
  j["distributed"]["deterministic_micro_batch"] = 16;
  const Config c = parse_config(j);
  EXPECT_EQ(c.distributed.deterministic_micro_batch, 16);
  EXPECT_EQ(to_json(parse_config(to_json(c))), to_json(c));
}

TEST(ConfigErrors, DeterministicModeExcludesWhatDependsOnTheRanks) {
  Json base = mnist();
  base["distributed"]["deterministic"] = true;
  Json micro = base;
  micro["distributed"]["deterministic_micro_batch"] = 48;
  expect_config_error(micro, {"distributed.deterministic_micro_batch = 48", "data.batch_size = 128", "16"});
  Json fp16 = base;
  fp16["distributed"]["compression"] = "fp16";
  expect_config_error(fp16, {"distributed.deterministic", "distributed.compression", "\"none\""});
  Json sync = base;
  sync["distributed"]["sync_batchnorm"] = true;
  expect_config_error(sync, {"distributed.deterministic", "distributed.sync_batchnorm"});
  Json gpu = base;
  gpu["device"] = "cuda";
  expect_config_error(gpu, {"distributed.deterministic", "\"cpu\"", "\"cuda\""});
  Json stray = mnist();
  stray["distributed"]["deterministic_micro_batch"] = 16;
  expect_config_error(stray, {"distributed.deterministic_micro_batch", "distributed.deterministic = true"});
}

TEST(Config, PowerSgdKeysAndTheirDefaults) {
  Json j = mnist();
  j["distributed"]["compression"] = "powersgd";
  const Config defaults = parse_config(j);
  EXPECT_EQ(defaults.distributed.compression, "powersgd");
  EXPECT_EQ(defaults.distributed.powersgd.rank, 2);
  EXPECT_EQ(defaults.distributed.powersgd.start_step, 100);
  EXPECT_EQ(defaults.distributed.powersgd.min_compression_rate, 2);
  j["distributed"]["powersgd"] = {{"rank", 4}, {"start_step", 0}, {"min_compression_rate", 1.5}};
  const Config c = parse_config(j);
  EXPECT_EQ(c.distributed.powersgd.rank, 4);
  EXPECT_EQ(c.distributed.powersgd.start_step, 0);
  EXPECT_EQ(c.distributed.powersgd.min_compression_rate, 1.5);
  EXPECT_EQ(to_json(parse_config(to_json(c))), to_json(c));
}

TEST(ConfigErrors, PowerSgdKeys) {
  Json stray = mnist();
  stray["distributed"]["powersgd"] = {{"rank", 2}};
  expect_config_error(stray, {"distributed.powersgd", "distributed.compression = \"powersgd\""});
  Json base = mnist();
  base["distributed"]["compression"] = "powersgd";
  Json zero = base;
  zero["distributed"]["powersgd"] = {{"rank", 0}};
  expect_config_error(zero, {"distributed.powersgd.rank", "out of range"});
  Json typo = base;
  typo["distributed"]["powersgd"] = {{"start_iter", 5}};
  expect_config_error(typo, {"distributed.powersgd.start_iter", "not a known key"});
  Json gpu = base;
  gpu["device"] = "cuda";
  expect_config_error(gpu, {"\"powersgd\"", "\"cpu\"", "\"cuda\""});
  Json deterministic = base;
  deterministic["distributed"]["deterministic"] = true;
  expect_config_error(deterministic, {"distributed.deterministic", "distributed.compression = \"powersgd\""});
}

// "auto" resolves by the rule of gradient_sync_of; an explicit strategy must agree with the other keys.
TEST(Config, GradientSyncAutoAndExplicit) {
  Json j = mnist();
  EXPECT_EQ(gradient_sync_of(parse_config(j)), "allreduce");
  j["distributed"]["compression"] = "fp16";
  EXPECT_EQ(gradient_sync_of(parse_config(j)), "allreduce");
  j["distributed"]["compression"] = "powersgd";
  EXPECT_EQ(gradient_sync_of(parse_config(j)), "powersgd");
  j["distributed"]["compression"] = "none";
  j["distributed"]["deterministic"] = true;
  EXPECT_EQ(gradient_sync_of(parse_config(j)), "exact_sum");
  j["distributed"]["gradient_sync"] = "exact_sum";
  EXPECT_EQ(gradient_sync_of(parse_config(j)), "exact_sum");
  // Explicit PowerSGD without the compression key: its section applies.
  Json explicit_powersgd = mnist();
  explicit_powersgd["distributed"]["gradient_sync"] = "powersgd";
  explicit_powersgd["distributed"]["powersgd"] = {{"rank", 3}};
  EXPECT_EQ(parse_config(explicit_powersgd).distributed.powersgd.rank, 3);
  EXPECT_EQ(to_json(parse_config(to_json(parse_config(explicit_powersgd)))),
            to_json(parse_config(explicit_powersgd)));
}

TEST(ConfigErrors, GradientSyncKeys) {
  Json unknown = mnist();
  unknown["distributed"]["gradient_sync"] = "zero1";
  expect_config_error(unknown, {"distributed.gradient_sync", "\"auto\"", "\"allreduce\"", "\"exact_sum\""});
  Json exact = mnist();
  exact["distributed"]["gradient_sync"] = "exact_sum";
  expect_config_error(exact,
                      {"distributed.gradient_sync = \"exact_sum\"", "distributed.deterministic = true"});
  Json deterministic = mnist();
  deterministic["distributed"]["deterministic"] = true;
  deterministic["distributed"]["gradient_sync"] = "allreduce";
  expect_config_error(deterministic, {"distributed.gradient_sync = \"allreduce\"", "\"exact_sum\""});
  Json mismatch = mnist();
  mismatch["distributed"]["compression"] = "powersgd";
  mismatch["distributed"]["gradient_sync"] = "allreduce";
  expect_config_error(mismatch, {"distributed.compression = \"powersgd\"", "\"powersgd\" (or \"auto\")",
                                 "not \"allreduce\""});
}

TEST(ReadJsonFile, MissingFileAndSyntaxErrorNameTheFile) {
  expect_error([] { read_json_file(kSource + "/configs/no_such_config.json"); },
               {"no_such_config.json", "cannot open"});
  // A file that exists but is not JSON (this test's own CMakeLists).
  expect_error([] { read_json_file(kSource + "/tests/trainer/CMakeLists.txt"); },
               {"CMakeLists.txt", "not valid JSON"});
  // A number beyond double's range (found by fuzz_config; its input is in tests/fuzz/regressions).
  const std::string huge = ::testing::TempDir() + "dptrain_huge_number.json";
  std::ofstream(huge) << R"({"seed": 1, "optimizer": {"lr": 1e400}})";
  expect_error([&] { read_json_file(huge); }, {huge, "not valid JSON", "1e400"});
  std::remove(huge.c_str());
}

// ---- apply_override -------------------------------------------------------------------------

TEST(ApplyOverride, SetsNestedValuesAsJson) {
  Json j = mnist();
  apply_override(j, "optimizer.lr=0.5");
  apply_override(j, "training.epochs=3");
  apply_override(j, "data.shuffle=false");
  apply_override(j, "model.input_shape=[1,28,28]");
  apply_override(j, "optimizer.betas=[0.8, 0.9]");
  EXPECT_EQ(j["optimizer"]["lr"], 0.5);
  EXPECT_TRUE(j["training"]["epochs"].is_number_integer());
  const Config c = parse_config(j);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.training.epochs, 3);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.8, 0.9}));
}

TEST(ApplyOverride, BareWordBecomesAString) {
  Json j = mnist();
  apply_override(j, "data.dataset=fashion_mnist");
  EXPECT_EQ(j["data"]["dataset"], "fashion_mnist");
  apply_override(j, "output_dir=runs/x-1");
  EXPECT_EQ(j["output_dir"], "runs/x-1");
  apply_override(j, "data.dir=\"/tmp/with space\"");
  EXPECT_EQ(j["data"]["dir"], "/tmp/with space");
  // A value with '=' in it: only the first '=' separates key and value.
  apply_override(j, "output_dir=a=b");
  EXPECT_EQ(j["output_dir"], "a=b");
  EXPECT_EQ(parse_config(j).data.dataset, "fashion_mnist");
}

// The optional sections (data, optimizer, training) may be absent from a config; --set must still be
// able to set a key inside one, e.g. --set training.epochs=2.
TEST(ApplyOverride, SetsAKeyInAnAbsentOptionalSection) {
  Json j = Json::parse(R"({"model": {"input_shape": [4], "layers": [{"type": "relu"}]}})");
  apply_override(j, "training.epochs=2");
  apply_override(j, "optimizer.type=sgd");
  EXPECT_EQ(j["training"]["epochs"], 2);
  const Config c = parse_config(j);
  EXPECT_EQ(c.training.epochs, 2);
  EXPECT_EQ(c.optimizer.type, "sgd");
}

TEST(ApplyOverride, InvalidAssignments) {
  Json j = mnist();
  expect_error([&] { apply_override(j, "a.b"); }, {"a.b", "key.path=VALUE"});
  expect_error([&] { apply_override(j, "=3"); }, {"key.path=VALUE"});
  expect_error([&] { apply_override(j, "x={"); }, {"x={", "not JSON"});
  expect_error([&] { apply_override(j, "x=[1,"); }, {"not JSON"});
  expect_error([&] { apply_override(j, "x=two words"); }, {"not JSON"});
  expect_error([&] { apply_override(j, "data.batch_size.x=1"); }, {"data.batch_size", "not an object"});
  // Found by fuzz_config: nlohmann's out_of_range escaped, naming no key.
  expect_error([&] { apply_override(j, "optimizer.lr=1e400"); }, {"optimizer.lr=1e400", "out of range"});
  // Also found by fuzz_config: a bare word with a byte that is not UTF-8 was taken as a string and
  // failed later, in nlohmann's dump, when rank 0 sent the config to the other ranks.
  expect_error([&] { apply_override(j, "output_dir=runs\xf5x"); }, {"output_dir=runs", "not valid UTF-8"});
  EXPECT_EQ(j, mnist()) << "a rejected override must not change the config";
  expect_error([&] { apply_override(j, "a..b=1"); }, {"empty key"});
}

TEST(ApplyOverride, NewUnknownKeyIsRejectedByParse) {
  Json j = mnist();
  apply_override(j, "optimizer.lrr=1");
  expect_config_error(j, {"optimizer.lrr", "not a known key"});
  Json k = mnist();
  apply_override(k, "data.batch_size=\"x\"");
  expect_config_error(k, {"data.batch_size", "expected an integer"});
}

// ---- Where keys apply, and the generated reference -----------------------------------------

// Keys that only mean something in another mode are accepted (a config may switch modes with one
// --set) but left out of the resolved config, which must parse back.
TEST(ParseConfig, KeysOfAnotherModeAreIgnoredAndNotPrinted) {
  Json j = mnist();
  j["optimizer"] = Json::parse(R"({"type": "sgd", "schedule": "constant", "gamma": 0.5, "min_lr": 0.1,
                                   "betas": [0.8, 0.9], "eps": 1e-6})");
  const Json resolved = to_json(parse_config(j));
  for (const char* key : {"gamma", "step_size_epochs", "min_lr", "betas", "eps"})
    EXPECT_FALSE(resolved["optimizer"].contains(key)) << key;
  EXPECT_EQ(to_json(parse_config(resolved)), resolved);
  j["optimizer"]["schedule"] = "step";
  EXPECT_EQ(to_json(parse_config(j))["optimizer"]["gamma"], 0.5);
  Json bad = j;
  bad["optimizer"]["gamma"] = 2;  // ignored or not, a value out of range is an error
  expect_config_error(bad, {"optimizer.gamma", "out of range"});
}

// The resolved config of a minimal one is exactly the table's defaults (and no more keys).
TEST(ParseConfig, ResolvedDefaultsOfAMinimalConfig) {
  const Json resolved =
      to_json(parse_config(Json::parse(R"({"model": {"input_shape": [4], "layers": [{"type": "relu"}]}})")));
  EXPECT_EQ(resolved["data"]["dir"], "data/mnist");
  EXPECT_EQ(resolved["optimizer"]["lr"], 1e-3);
  EXPECT_EQ(resolved["optimizer"]["betas"], Json::parse("[0.9, 0.999]"));
  EXPECT_EQ(resolved["checkpoint"]["dir"], "runs/default/checkpoints");
  EXPECT_FALSE(resolved["distributed"].contains("powersgd"));
  EXPECT_FALSE(resolved["distributed"].contains("deterministic_micro_batch"));
  EXPECT_FALSE(resolved["model"].contains("architecture"));
  EXPECT_FALSE(resolved["data"].contains("linear"));
  EXPECT_EQ(resolved["cpu"]["winograd"], true);
  EXPECT_EQ(resolved["cpu"]["winograd_tile"], 2);
  EXPECT_EQ(resolved.size(), 12u);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The first line where two texts differ, both versions; "" where they are equal.
std::string first_difference(const std::string& checked_in, const std::string& generated) {
  std::stringstream a(checked_in), b(generated);
  std::string line_a, line_b;
  for (int line = 1;; ++line) {
    const bool more_a = static_cast<bool>(std::getline(a, line_a)),
               more_b = static_cast<bool>(std::getline(b, line_b));
    if (!more_a && !more_b) return "";
    if (more_a != more_b || line_a != line_b)
      return "line " + std::to_string(line) + ":\n  checked in: " + (more_a ? line_a : "<end>") +
             "\n  generated:  " + (more_b ? line_b : "<end>");
  }
}

TEST(ConfigReference, CheckedInPageIsCurrent) {
  const std::string difference =
      first_difference(slurp(kSource + "/docs/config.md"), config_reference_markdown());
  EXPECT_EQ(difference, "")
      << "docs/config.md differs from the config table in trainer/config.cpp at " << difference
      << "\nregenerate it with\n  build/trainer --print-config-reference > docs/config.md";
}

TEST(ConfigReference, FuzzDictionaryHoldsTheGeneratedBlock) {
  const std::string dictionary = slurp(kSource + "/tests/fuzz/config.dict");
  EXPECT_NE(dictionary.find(config_fuzz_dictionary()), std::string::npos)
      << "tests/fuzz/config.dict lacks the config table's current keys; regenerate its generated block with\n"
         "  sed -i '/^# BEGIN generated/,$d' tests/fuzz/config.dict &&\n"
         "  build/trainer --print-config-reference=dict >> tests/fuzz/config.dict";
}

// What `trainer --print-config-reference[=dict]` prints, without a config (and without MPI).
TEST(ConfigReference, TrainerPrintsBoth) {
  for (const auto& [flag, expected] :
       {std::pair{"", config_reference_markdown()}, std::pair{"=dict", config_fuzz_dictionary()}}) {
    const std::string command = std::string("'") + DPTRAIN_TRAINER_PATH + "' --print-config-reference" + flag;
    FILE* pipe = ::popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string out;
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
    EXPECT_EQ(::pclose(pipe), 0) << command;
    EXPECT_EQ(out, expected) << command;
  }
}

// Every key a resolved config holds is on the reference page (the page and --print-config come from
// one table, so this fails only if the table stops describing a field it prints).
TEST(ConfigReference, DescribesEveryResolvedKey) {
  const std::string page = config_reference_markdown();
  Json j = mnist();
  j["optimizer"] = Json::parse(R"({"type": "sgd", "schedule": "step"})");
  j["distributed"] = Json::parse(R"({"compression": "powersgd"})");
  std::vector<Json> resolved = {
      to_json(parse_config(j)),
      to_json(parse_config(read_json_file(kSource + "/configs/resnet50_synthetic.json"))),
      to_json(parse_config(read_json_file(kSource + "/configs/linear_regression.json")))};
  j["optimizer"]["schedule"] = "cosine";
  j["distributed"] = Json::parse(R"({"deterministic": true})");
  resolved.push_back(to_json(parse_config(j)));
  for (const Json& r : resolved) {
    const Json flat = r.flatten();
    for (const auto& item : flat.items()) {
      // "/data/linear/coefficients/0" -> "data.linear.coefficients": up to the first list index.
      std::string key, segment;
      std::stringstream pointer(item.key().substr(1));
      while (std::getline(pointer, segment, '/') &&
             segment.find_first_not_of("0123456789") != std::string::npos)
        key += (key.empty() ? "" : ".") + segment;
      EXPECT_NE(page.find("| `" + key + "` |"), std::string::npos) << key;
    }
  }
}

// ---- The table machinery on its own (core/config_table.h) -----------------------------------

struct Toy {
  std::string name;
  int64_t count{};
  struct Extra {
    double x{};
  } extra;
};

// A registry's names: a choice whose names live outside the table.
std::vector<std::string> toy_names() {
  return {"alpha", "beta"};
}

const config_table::Section<Toy>& toy_table() {
  using namespace config_table;
  static const Table<Toy> table = [] {
    Table<Toy> t("A toy.");
    auto top = t.root();
    const When<Toy> beta{R"(name = "beta")", [](const Toy& toy) { return toy.name == "beta"; },
                         rule("applies to beta only")};
    const auto count =
        computed("2 for beta, else 1", [](const Toy& toy) { return toy.name == "beta" ? 2 : 1; });
    top.field("name", &Toy::name, "alpha", toy_names, "Which one.");
    top.field("count", &Toy::count, count, Range{0, 9}, "How many.");
    top.section("extra", &Toy::extra, "Beta's extra.", beta).field("x", &Toy::Extra::x, 0.5, Any{}, "X.");
    return t;
  }();
  return table.section();
}

Toy read_toy(const Json& json) {
  Toy toy;
  config_table::read_section(toy_table(), json, toy);
  return toy;
}

TEST(ConfigTable, RegistryChoicesComputedDefaultsAndConditions) {
  const Toy alpha = read_toy(Json::object());
  EXPECT_EQ(alpha.name, "alpha");
  EXPECT_EQ(alpha.count, 1);
  EXPECT_EQ(alpha.extra.x, 0.5);  // filled in even where it does not apply
  EXPECT_EQ(config_table::write_section(toy_table(), alpha), Json::parse(R"({"name": "alpha", "count": 1})"));
  const Toy beta = read_toy(Json::parse(R"({"name": "beta", "extra": {"x": 2}})"));
  EXPECT_EQ(beta.count, 2);
  EXPECT_EQ(config_table::write_section(toy_table(), beta),
            Json::parse(R"({"name": "beta", "count": 2, "extra": {"x": 2.0}})"));
  expect_error([] { read_toy(Json::parse(R"({"name": "gamma"})")); },
               {"config key name = \"gamma\" is not one of \"alpha\", \"beta\""});
  expect_error([] { read_toy(Json::parse(R"({"extra": {"x": 1}})")); },
               {"config key extra applies to beta only"});
  expect_error([] { read_toy(Json::parse(R"({"count": 10})")); },
               {"config key count = 10 is out of range [0, 9]"});
  expect_error([] { read_toy(Json::parse(R"({"name": "beta", "extra": {"y": 1}})")); },
               {"config key extra.y is not a known key"});
}

TEST(ConfigTable, DescribesFieldsForTheReference) {
  std::vector<config_table::SectionDoc> sections;
  config_table::describe(toy_table(), sections);
  const std::string page = config_table::render_reference(sections, "# Toy\n");
  EXPECT_NE(page.find("| `name` | string | `\"alpha\"` | `\"alpha\"`, `\"beta\"` |  | Which one. |"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("| `count` | integer | 2 for beta, else 1 | [0, 9] |"), std::string::npos) << page;
  EXPECT_NE(page.find("Applies when `name = \"beta\"`"), std::string::npos) << page;
  const std::string dictionary = config_table::render_fuzz_dictionary(sections);
  for (const char* entry :
       {R"("\"name\"")", R"("\"extra\"")", R"("\"x\"")", R"("\"beta\"")", R"("extra.x=")"})
    EXPECT_NE(dictionary.find(std::string(entry) + "\n"), std::string::npos) << entry << " in\n"
                                                                             << dictionary;
}

}  // namespace
}  // namespace dptrain::trainer
