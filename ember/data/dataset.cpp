// Dataset::get without a generator, and TransformDataset. Invariant: a transform sees the sample's own generator,
// so a transformed sample depends only on (dataset, index, seed, epoch).
#include "ember/data/dataset.h"

#include <utility>

#include "ember/base/error.h"
#include "ember/data/random.h"

namespace ember::data {

Example Dataset::get(int64_t index) const {
  Generator rng(sample_seed(0, 0, index));
  return get(index, rng);
}

TransformDataset::TransformDataset(std::shared_ptr<const Dataset> base, Transform data_transform,
                                   Transform target_transform)
    : base_(std::move(base)), data_transform_(std::move(data_transform)),
      target_transform_(std::move(target_transform)) {
  EMBER_CHECK(base_ != nullptr, ValueError, "TransformDataset: the base dataset is null");
}

Example TransformDataset::get(int64_t index, Generator& rng) const {
  Example ex = base_->get(index, rng);
  if (data_transform_) ex.data = data_transform_(ex.data, rng);
  if (target_transform_) ex.target = target_transform_(ex.target, rng);
  return ex;
}

}  // namespace ember::data
