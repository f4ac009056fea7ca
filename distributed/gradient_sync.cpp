// The registry of gradient-sync strategies: one line per strategy in entries().
#include "distributed/gradient_sync.h"

#include <span>

#include "core/registry.h"
#include "distributed/gradient_encoding.h"

namespace dptrain::distributed {

// Defined in their own files.
std::unique_ptr<GradientSync> make_allreduce_sync(const GradientSyncContext& context);
std::unique_ptr<GradientSync> make_powersgd_sync(const GradientSyncContext& context);
std::unique_ptr<GradientSync> make_exact_sum_sync(const GradientSyncContext& context);
std::unique_ptr<GradientSync> make_local_sync(const GradientSyncContext& context);

namespace {

std::span<const GradientSyncEntry* const> entries() {
  static const GradientSyncEntry kAllreduce{
      "allreduce", make_allreduce_sync, {}, false, /*shards_optimizer=*/true},
      kPowerSgd{"powersgd", make_powersgd_sync, {"powersgd.q", "powersgd.error"}, /*is_compression=*/true},
      kExactSum{"exact_sum", make_exact_sum_sync, {}, false, /*shards_optimizer=*/true},
      kLocal{"local", make_local_sync, {}};
  static const GradientSyncEntry* const kEntries[] = {&kAllreduce, &kPowerSgd, &kExactSum, &kLocal};
  return kEntries;
}

}  // namespace

ReducerOptions reducer_options(const GradientSyncOptions& options, const std::string& encoding) {
  return {.fusion_threshold_mb = options.fusion_threshold_mb,
          .first_bucket_mb = options.first_bucket_mb,
          .overlap = options.overlap,
          .encoding = encoding,
          .check_finite = options.check_finite,
          .shard = options.shard_optimizer};
}

std::unique_ptr<GradientSync> make_gradient_sync(const std::string& name,
                                                 const GradientSyncContext& context) {
  const GradientSyncEntry& entry = find_registered<GradientSyncEntry>(entries(), name, "gradient sync");
  DPTRAIN_CHECK(!context.options.shard_optimizer || entry.shards_optimizer,
                "distributed.shard_optimizer does not run with the \"", name,
                "\" gradient sync; it runs with ", quoted_alternatives(sharding_gradient_sync_names()));
  return entry.make(context);
}

std::vector<std::string> gradient_sync_names() {
  return registered_names<GradientSyncEntry>(entries());
}

std::vector<std::string> gradient_sync_state_names() {
  std::vector<std::string> names;
  for (const GradientSyncEntry* e : entries())
    names.insert(names.end(), e->state_names.begin(), e->state_names.end());
  return names;
}

std::vector<std::string> sharding_gradient_sync_names() {
  std::vector<std::string> names;
  for (const GradientSyncEntry* e : entries())
    if (e->shards_optimizer) names.push_back(e->name);
  return names;
}

std::vector<std::string> compression_names() {
  std::vector<std::string> names = gradient_encoding_names();
  for (const GradientSyncEntry* e : entries())
    if (e->is_compression) names.push_back(e->name);
  return names;
}

}  // namespace dptrain::distributed
