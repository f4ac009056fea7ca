// Config parsing, overrides and the resolved form.
#include "trainer/config.h"

#include <fstream>
#include <numeric>
#include <sstream>

#include "core/error.h"

namespace dptrain::trainer {
namespace {

// Each enum's config spellings, in the order error messages list them.
template <typename E>
using Names = std::initializer_list<std::pair<const char*, E>>;
constexpr Names<DeviceKind> kDevices = {
    {"cpu", DeviceKind::kCpu}, {"cuda", DeviceKind::kCuda}, {"auto", DeviceKind::kAuto}};
constexpr Names<CommBackend> kCommBackends = {
    {"auto", CommBackend::kAuto}, {"nccl", CommBackend::kNccl}, {"mpi", CommBackend::kMpi}};
constexpr Names<DatasetKind> kDatasets = {{"mnist", DatasetKind::kMnist},
                                          {"fashion_mnist", DatasetKind::kFashionMnist},
                                          {"linear", DatasetKind::kLinear},
                                          {"synthetic", DatasetKind::kSynthetic}};
constexpr Names<LossKind> kLosses = {{"cross_entropy", LossKind::kCrossEntropy}, {"mse", LossKind::kMse}};
constexpr Names<OptimizerKind> kOptimizers = {
    {"sgd", OptimizerKind::kSgd}, {"adam", OptimizerKind::kAdam}, {"adamw", OptimizerKind::kAdamW}};
constexpr Names<optim::LrScaling> kLrScalings = {{"linear", optim::LrScaling::kLinear},
                                                 {"none", optim::LrScaling::kNone}};
constexpr Names<optim::Decay> kSchedules = {
    {"constant", optim::Decay::kConstant}, {"step", optim::Decay::kStep}, {"cosine", optim::Decay::kCosine}};
constexpr Names<distributed::Compression> kCompressions = {{"none", distributed::Compression::kNone},
                                                           {"fp16", distributed::Compression::kFp16},
                                                           {"bf16", distributed::Compression::kBf16},
                                                           {"powersgd", distributed::Compression::kPowerSgd}};
constexpr Names<OnCheckpointError> kOnCheckpointErrors = {{"stop", OnCheckpointError::kStop},
                                                          {"warn", OnCheckpointError::kWarn}};
constexpr Names<ProgressMode> kProgressModes = {{"auto", ProgressMode::kAuto},
                                                {"bar", ProgressMode::kBar},
                                                {"lines", ProgressMode::kLines},
                                                {"off", ProgressMode::kOff}};

template <typename E>
std::string name_of(E value, Names<E> names) {
  for (const auto& [name, v] : names)
    if (v == value) return name;
  return "?";
}

// The enum named by `key` (one of `names`), or `fallback` when the key is absent.
template <typename E>
E get_enum(ObjectReader& r, const std::string& key, E fallback, Names<E> names) {
  std::vector<std::string> choices;
  for (const auto& [name, v] : names) choices.push_back(name);
  const std::string chosen = r.get_choice(key, name_of(fallback, names), choices);
  for (const auto& [name, v] : names)
    if (chosen == name) return v;
  return fallback;
}

}  // namespace

std::string to_string(DeviceKind kind) {
  return name_of(kind, kDevices);
}
std::string to_string(CommBackend kind) {
  return name_of(kind, kCommBackends);
}
std::string to_string(DatasetKind kind) {
  return name_of(kind, kDatasets);
}
std::string to_string(LossKind kind) {
  return name_of(kind, kLosses);
}
std::string to_string(OptimizerKind kind) {
  return name_of(kind, kOptimizers);
}

Json read_json_file(const std::string& path) {
  std::ifstream in(path);
  DPTRAIN_CHECK(in, path, ": cannot open config file");
  try {
    return Json::parse(in, nullptr, true, /*ignore_comments=*/true);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number such as 1e400
    DPTRAIN_FAIL(path, ": not valid JSON: ", e.what());
  }
}

void apply_override(Json& config, const std::string& assignment) {
  const auto eq = assignment.find('=');
  DPTRAIN_CHECK(eq != std::string::npos && eq > 0, "bad --set '", assignment, "': expected key.path=VALUE");
  try {
    static_cast<void>(Json(assignment).dump());  // the config travels to the other ranks as JSON text
  } catch (const Json::type_error&) {
    DPTRAIN_FAIL("bad --set: '", Json(assignment).dump(-1, ' ', false, Json::error_handler_t::replace),
                 "' is not valid UTF-8");
  }
  const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  Json value;
  try {
    value = Json::parse(text);
  } catch (const Json::out_of_range&) {  // a number beyond double's range, e.g. 1e400
    DPTRAIN_FAIL("bad --set '", assignment, "': ", text, " is out of range for a number");
  } catch (const Json::parse_error&) {
    const bool bare_word = !text.empty() && text.find_first_of("{}[]\",: ") == std::string::npos;
    DPTRAIN_CHECK(bare_word, "bad --set '", assignment, "': value is not JSON (quote strings, e.g. ", path,
                  "='\"text\"')");
    value = text;
  }
  Json* node = &config;
  std::stringstream keys(path);
  std::string key, walked;
  while (std::getline(keys, key, '.')) {
    DPTRAIN_CHECK(!key.empty(), "bad --set '", assignment, "': empty key in path");
    if (node->is_null()) *node = Json::object();  // a section the file leaves out
    DPTRAIN_CHECK(node->is_object(), "bad --set '", assignment, "': ", walked, " is not an object");
    walked += (walked.empty() ? "" : ".") + key;
    node = &(*node)[key];
  }
  *node = std::move(value);
}

Config parse_config(const Json& json) {
  Config c;
  ObjectReader root(json, "");
  c.seed = root.get_in_range<uint64_t>("seed", 0, 0, UINT64_MAX);
  c.output_dir = root.get<std::string>("output_dir", c.output_dir);
  c.threads = root.get_in_range("threads", 0, 0, 1024);
  c.device = get_enum(root, "device", c.device, kDevices);
  if (root.has("cuda")) {
    ObjectReader r(root.raw("cuda"), "cuda");
    c.cuda.tf32 = r.get<bool>("tf32", c.cuda.tf32);
    c.cuda.deterministic = r.get<bool>("deterministic", c.cuda.deterministic);
    r.finish();
  }

  if (root.has("data")) {
    ObjectReader r(root.raw("data"), "data");
    DataConfig& d = c.data;
    d.dataset = get_enum(r, "dataset", d.dataset, kDatasets);
    d.dir = r.get<std::string>(
        "dir", d.dataset == DatasetKind::kMnist ? "data/mnist" : "/usr/share/datasets/fashion-mnist");
    d.batch_size = r.get_in_range<int64_t>("batch_size", d.batch_size, 1, 1 << 20);
    d.eval_batch_size = r.get_in_range<int64_t>("eval_batch_size", d.eval_batch_size, 1, 1 << 20);
    d.max_train_samples = r.get_in_range<int64_t>("max_train_samples", 0, 0, INT64_MAX);
    d.max_test_samples = r.get_in_range<int64_t>("max_test_samples", 0, 0, INT64_MAX);
    d.shuffle = r.get<bool>("shuffle", d.shuffle);
    d.drop_last = r.get<bool>("drop_last", d.drop_last);
    d.mean = r.get<double>("mean", d.mean);
    d.std = r.get<double>("std", d.std);
    DPTRAIN_CHECK(d.std > 0, "config key data.std = ", d.std, " must be > 0");
    if (r.has("linear")) {
      DPTRAIN_CHECK(d.dataset == DatasetKind::kLinear,
                    "config key data.linear applies to data.dataset \"linear\" only");
      ObjectReader l(r.raw("linear"), "data.linear");
      d.linear.samples = l.get_in_range<int64_t>("samples", d.linear.samples, 1, 1 << 30);
      d.linear.test_samples = l.get_in_range<int64_t>("test_samples", d.linear.test_samples, 1, 1 << 30);
      d.linear.coefficients = l.get<std::vector<double>>("coefficients", d.linear.coefficients);
      DPTRAIN_CHECK(!d.linear.coefficients.empty(), "config key data.linear.coefficients must not be empty");
      d.linear.noise = l.get_in_range("noise", d.linear.noise, 0.0, 1e6);
      l.finish();
    }
    if (r.has("synthetic")) {
      DPTRAIN_CHECK(d.dataset == DatasetKind::kSynthetic,
                    "config key data.synthetic applies to data.dataset \"synthetic\" only");
      ObjectReader y(r.raw("synthetic"), "data.synthetic");
      d.synthetic.samples = y.get_in_range<int64_t>("samples", d.synthetic.samples, 1, 1 << 30);
      d.synthetic.test_samples =
          y.get_in_range<int64_t>("test_samples", d.synthetic.test_samples, 1, 1 << 30);
      y.finish();
    }
    r.finish();
  } else {
    c.data.dir = "data/mnist";
  }

  DPTRAIN_CHECK(root.has("model"), "config key model is missing: a model needs input_shape and layers");
  {
    ObjectReader r(root.raw("model"), "model");
    c.model.input_shape = r.require<std::vector<int64_t>>("input_shape");
    DPTRAIN_CHECK(!c.model.input_shape.empty(), "config key model.input_shape must not be empty");
    for (int64_t d : c.model.input_shape)
      DPTRAIN_CHECK(d > 0, "config key model.input_shape: dimensions must be > 0");
    c.model.architecture = r.get<std::string>("architecture", "");
    DPTRAIN_CHECK(r.has("layers") != !c.model.architecture.empty(),
                  r.has("layers")
                      ? "config keys model.layers and model.architecture exclude each other; keep one"
                      : "config key model.layers is missing (or name a model.architecture, e.g. "
                        "\"resnet20\")");
    if (r.has("layers")) c.model.layers = r.raw("layers");
    if (!c.model.architecture.empty()) {
      c.model.num_classes = r.get_in_range<int64_t>("num_classes", c.model.num_classes, 1, 1 << 24);
    } else {
      DPTRAIN_CHECK(
          !r.has("num_classes"),
          "config key model.num_classes applies to model.architecture; a layer list's last layer sets "
          "the classes");
    }
    c.model.loss = get_enum(r, "loss", c.model.loss, kLosses);
    c.model.init_from = r.get<std::string>("init_from", "");
    r.finish();
  }

  if (root.has("optimizer")) {
    ObjectReader r(root.raw("optimizer"), "optimizer");
    OptimizerConfig& o = c.optimizer;
    o.type = get_enum(r, "type", o.type, kOptimizers);
    const bool sgd = o.type == OptimizerKind::kSgd;
    o.lr = r.get_in_range("lr", sgd ? 0.01 : 1e-3, 0.0, 1e6);
    o.momentum = r.get_in_range("momentum", o.momentum, 0.0, 1.0);
    o.dampening = r.get_in_range("dampening", o.dampening, 0.0, 1.0);
    o.nesterov = r.get<bool>("nesterov", o.nesterov);
    o.weight_decay = r.get_in_range("weight_decay", o.type == OptimizerKind::kAdamW ? 1e-2 : 0.0, 0.0, 1e3);
    o.betas = r.get<std::vector<double>>("betas", o.betas);
    DPTRAIN_CHECK(
        o.betas.size() == 2 && o.betas[0] >= 0 && o.betas[0] < 1 && o.betas[1] >= 0 && o.betas[1] < 1,
        "config key optimizer.betas must be two numbers in [0, 1)");
    o.eps = r.get_in_range("eps", o.eps, 0.0, 1.0);
    DPTRAIN_CHECK(sgd || (!r.has("momentum") && !r.has("dampening") && !r.has("nesterov")),
                  "config key optimizer.momentum/dampening/nesterov apply to \"sgd\" only, not \"",
                  to_string(o.type), "\"");
    DPTRAIN_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
                  "config key optimizer.nesterov needs momentum > 0 and dampening 0");
    o.lr_scaling = get_enum(r, "lr_scaling", o.lr_scaling, kLrScalings);
    o.warmup_epochs = r.get_in_range("warmup_epochs", o.warmup_epochs, 0.0, 1e6);
    o.schedule = get_enum(r, "schedule", o.schedule, kSchedules);
    o.step_size_epochs = r.get_in_range("step_size_epochs", o.step_size_epochs, 1e-6, 1e6);
    o.gamma = r.get_in_range("gamma", o.gamma, 0.0, 1.0);
    o.min_lr = r.get_in_range("min_lr", o.min_lr, 0.0, 1e6);
    r.finish();
  }

  if (root.has("training")) {
    ObjectReader r(root.raw("training"), "training");
    TrainingConfig& t = c.training;
    t.epochs = r.get_in_range<int64_t>("epochs", t.epochs, 1, 1 << 20);
    t.max_steps = r.get_in_range<int64_t>("max_steps", t.max_steps, 0, INT64_MAX);
    t.progress = get_enum(r, "progress", t.progress, kProgressModes);
    t.log_every_steps = r.get_in_range<int64_t>("log_every_steps", t.log_every_steps, 1, INT64_MAX);
    r.finish();
  }
  if (root.has("distributed")) {
    ObjectReader r(root.raw("distributed"), "distributed");
    DistributedConfig& d = c.distributed;
    d.backend = get_enum(r, "backend", d.backend, kCommBackends);
    DPTRAIN_CHECK(
        d.backend != CommBackend::kNccl || c.device != DeviceKind::kCpu,
        "config key distributed.backend = \"nccl\" needs device \"cuda\" (or \"auto\"); NCCL reduces GPU "
        "buffers");
    d.fusion_threshold_mb = r.get_in_range("fusion_threshold_mb", d.fusion_threshold_mb, 0.0, 1e5);
    d.first_bucket_mb = r.get_in_range("first_bucket_mb", d.first_bucket_mb, 0.0, 1e5);
    d.overlap = r.get<bool>("overlap", d.overlap);
    d.compression = get_enum(r, "compression", d.compression, kCompressions);
    d.backward_passes_per_step = r.get_in_range<int64_t>("backward_passes_per_step", 1, 1, 1 << 16);
    d.check_finite = r.get<bool>("check_finite", d.check_finite);
    d.sync_batchnorm = r.get<bool>("sync_batchnorm", d.sync_batchnorm);
    d.broadcast_buffers = r.get<bool>("broadcast_buffers", d.broadcast_buffers);
    d.deterministic = r.get<bool>("deterministic", d.deterministic);
    d.deterministic_micro_batch =
        r.get_in_range<int64_t>("deterministic_micro_batch", d.deterministic_micro_batch, 1, 1 << 30);
    if (d.deterministic) {
      DPTRAIN_CHECK(c.data.batch_size % d.deterministic_micro_batch == 0,
                    "config key distributed.deterministic_micro_batch = ", d.deterministic_micro_batch,
                    " does not divide data.batch_size = ", c.data.batch_size,
                    "; pick a divisor of every per-rank batch you will run with (e.g. ",
                    std::gcd(c.data.batch_size, d.deterministic_micro_batch), ")");
      DPTRAIN_CHECK(d.compression == distributed::Compression::kNone,
                    "config keys distributed.deterministic and distributed.compression = \"",
                    name_of(d.compression, kCompressions),
                    "\" exclude each other: a compressed sum rounds differently for each grouping of "
                    "ranks; set compression to \"none\"");
      DPTRAIN_CHECK(!d.sync_batchnorm,
                    "config keys distributed.deterministic and distributed.sync_batchnorm exclude each "
                    "other: BatchNorm statistics would depend on which rank holds which micro-batch");
      DPTRAIN_CHECK(c.device == DeviceKind::kCpu,
                    "config key distributed.deterministic runs on device \"cpu\" only, not \"",
                    to_string(c.device), "\"");
    } else {
      DPTRAIN_CHECK(!r.has("deterministic_micro_batch"),
                    "config key distributed.deterministic_micro_batch applies with distributed.deterministic "
                    "= true only");
    }
    if (r.has("powersgd")) {
      DPTRAIN_CHECK(
          d.compression == distributed::Compression::kPowerSgd,
          "config key distributed.powersgd applies with distributed.compression = \"powersgd\" only");
      ObjectReader p(r.raw("powersgd"), "distributed.powersgd");
      d.powersgd.rank = p.get_in_range<int64_t>("rank", d.powersgd.rank, 1, 1 << 20);
      d.powersgd.start_step = p.get_in_range<int64_t>("start_step", d.powersgd.start_step, 0, INT64_MAX);
      d.powersgd.min_compression_rate =
          p.get_in_range("min_compression_rate", d.powersgd.min_compression_rate, 0.0, 1e9);
      p.finish();
    }
    if (d.compression == distributed::Compression::kPowerSgd)
      // "auto" may still land on the CPU; PowerSgdReducer refuses GPU buffers if it does not.
      DPTRAIN_CHECK(c.device != DeviceKind::kCuda,
                    "config key distributed.compression = \"powersgd\" runs on device \"cpu\" only in this "
                    "version, not \"",
                    to_string(c.device), "\"; use \"fp16\" or \"bf16\" on GPUs");
    d.stall_warning_s = r.get_in_range("stall_warning_s", d.stall_warning_s, 0.0, 1e9);
    d.stall_abort_s = r.get_in_range("stall_abort_s", d.stall_abort_s, 0.0, 1e9);
    d.timeline = r.get<std::string>("timeline", d.timeline);
    r.finish();
  }
  c.checkpoint.dir = c.output_dir + "/checkpoints";
  if (root.has("checkpoint")) {
    ObjectReader r(root.raw("checkpoint"), "checkpoint");
    CheckpointConfig& k = c.checkpoint;
    k.dir = r.get<std::string>("dir", k.dir);
    DPTRAIN_CHECK(!k.dir.empty(), "config key checkpoint.dir must not be empty");
    k.every_epochs = r.get_in_range<int64_t>("every_epochs", k.every_epochs, 0, INT64_MAX);
    k.every_steps = r.get_in_range<int64_t>("every_steps", k.every_steps, 0, INT64_MAX);
    k.keep = r.get_in_range<int64_t>("keep", k.keep, 0, INT64_MAX);
    k.on_error = get_enum(r, "on_error", k.on_error, kOnCheckpointErrors);
    r.finish();
  }
  root.finish();
  return c;
}

Json to_json(const Config& c) {
  Json out = {
      {"seed", c.seed},
      {"output_dir", c.output_dir},
      {"threads", c.threads},
      {"device", to_string(c.device)},
      {"cuda", {{"tf32", c.cuda.tf32}, {"deterministic", c.cuda.deterministic}}},
      {"data",
       {{"dataset", to_string(c.data.dataset)},
        {"dir", c.data.dir},
        {"batch_size", c.data.batch_size},
        {"eval_batch_size", c.data.eval_batch_size},
        {"max_train_samples", c.data.max_train_samples},
        {"max_test_samples", c.data.max_test_samples},
        {"shuffle", c.data.shuffle},
        {"drop_last", c.data.drop_last},
        {"mean", c.data.mean},
        {"std", c.data.std}}},
      {"model",
       {{"input_shape", c.model.input_shape},
        {"loss", to_string(c.model.loss)},
        {"init_from", c.model.init_from}}},
      {"optimizer", c.optimizer.type == OptimizerKind::kSgd
                        ? Json{{"type", to_string(c.optimizer.type)},
                               {"lr", c.optimizer.lr},
                               {"momentum", c.optimizer.momentum},
                               {"dampening", c.optimizer.dampening},
                               {"nesterov", c.optimizer.nesterov},
                               {"weight_decay", c.optimizer.weight_decay}}
                        : Json{{"type", to_string(c.optimizer.type)},
                               {"lr", c.optimizer.lr},
                               {"betas", c.optimizer.betas},
                               {"eps", c.optimizer.eps},
                               {"weight_decay", c.optimizer.weight_decay}}},
      {"training",
       {{"epochs", c.training.epochs},
        {"max_steps", c.training.max_steps},
        {"progress", name_of(c.training.progress, kProgressModes)},
        {"log_every_steps", c.training.log_every_steps}}},
      {"distributed",
       {{"backend", to_string(c.distributed.backend)},
        {"fusion_threshold_mb", c.distributed.fusion_threshold_mb},
        {"first_bucket_mb", c.distributed.first_bucket_mb},
        {"overlap", c.distributed.overlap},
        {"compression", name_of(c.distributed.compression, kCompressions)},
        {"backward_passes_per_step", c.distributed.backward_passes_per_step},
        {"check_finite", c.distributed.check_finite},
        {"sync_batchnorm", c.distributed.sync_batchnorm},
        {"broadcast_buffers", c.distributed.broadcast_buffers},
        {"deterministic", c.distributed.deterministic},
        {"stall_warning_s", c.distributed.stall_warning_s},
        {"stall_abort_s", c.distributed.stall_abort_s},
        {"timeline", c.distributed.timeline}}},
      {"checkpoint",
       {{"dir", c.checkpoint.dir},
        {"every_epochs", c.checkpoint.every_epochs},
        {"every_steps", c.checkpoint.every_steps},
        {"keep", c.checkpoint.keep},
        {"on_error", name_of(c.checkpoint.on_error, kOnCheckpointErrors)}}},
  };
  Json& o = out["optimizer"];
  o["lr_scaling"] = name_of(c.optimizer.lr_scaling, kLrScalings);
  o["warmup_epochs"] = c.optimizer.warmup_epochs;
  o["schedule"] = name_of(c.optimizer.schedule, kSchedules);
  if (c.optimizer.schedule == optim::Decay::kStep) {
    o["step_size_epochs"] = c.optimizer.step_size_epochs;
    o["gamma"] = c.optimizer.gamma;
  }
  if (c.optimizer.schedule == optim::Decay::kCosine) o["min_lr"] = c.optimizer.min_lr;
  if (c.model.architecture.empty()) {
    out["model"]["layers"] = c.model.layers;
  } else {
    out["model"]["architecture"] = c.model.architecture;
    out["model"]["num_classes"] = c.model.num_classes;
  }
  if (c.data.dataset == DatasetKind::kSynthetic)
    out["data"]["synthetic"] = {{"samples", c.data.synthetic.samples},
                                {"test_samples", c.data.synthetic.test_samples}};
  if (c.data.dataset == DatasetKind::kLinear) {
    out["data"]["linear"] = {{"samples", c.data.linear.samples},
                             {"test_samples", c.data.linear.test_samples},
                             {"coefficients", c.data.linear.coefficients},
                             {"noise", c.data.linear.noise}};
  }
  // Only with the mode on: the key is an error without it, and the resolved config must parse back.
  if (c.distributed.deterministic)
    out["distributed"]["deterministic_micro_batch"] = c.distributed.deterministic_micro_batch;
  if (c.distributed.compression == distributed::Compression::kPowerSgd)
    out["distributed"]["powersgd"] = {{"rank", c.distributed.powersgd.rank},
                                      {"start_step", c.distributed.powersgd.start_step},
                                      {"min_compression_rate", c.distributed.powersgd.min_compression_rate}};
  return out;
}

}  // namespace dptrain::trainer
