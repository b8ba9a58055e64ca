// The meta allocation scope (core/meta_scope.h, Note [Meta allocation scope]): meta tensors take addresses from the
// scope's address-only caching allocator and give them back, with the allocator's size classes (DESIGN.md reference
// numbers: 512 B rounding, 2 MiB small segments for <= 1 MiB, 20 MiB segments for 1-10 MiB); outside a scope they
// stay byte-free; data pointers stay null; reading a meta value gives 0. Expected numbers are hand-computed.
#include <gtest/gtest.h>

#include <thread>

#include "ember/ember.h"
#include "ember/core/meta_scope.h"
#include "ember/memory/address_only.h"
#include "ember/memory/backing.h"

using namespace ember;

namespace {
constexpr int64_t kMiB = 1024 * 1024;

memory::AllocatorConfig fixed_segments() {
  memory::AllocatorConfig c;
  c.expandable_segments = false;
  return c;
}
}  // namespace

TEST(MetaScope, OutsideAScopeMetaHoldsNoBytes) {
  EXPECT_EQ(current_meta_allocator(), nullptr);
  const Tensor t = empty({1000}, TensorOptions(DType::f32, Device::meta()));
  EXPECT_EQ(t.raw_data(), nullptr);
  EXPECT_EQ(t.storage()->nbytes(), 4000);
  EXPECT_THROW(allocator_for(Device::meta()), DeviceError);
}

TEST(MetaScope, AllocationsFollowTheSizeClasses) {
  MetaAllocationScope scope(fixed_segments());
  memory::CachingAllocator& a = scope.allocator();
  EXPECT_EQ(&allocator_for(Device::meta()), &a);
  {
    const Tensor small = empty({1000}, TensorOptions(DType::f32, Device::meta()));  // 4000 B -> 4096 B
    EXPECT_EQ(small.raw_data(), nullptr) << "a meta tensor's data pointer is never an address";
    EXPECT_EQ(small.data<float>(), nullptr);
    EXPECT_EQ(a.stats().allocated_bytes, 4096);
    EXPECT_EQ(a.stats().requested_bytes, 4000);
    EXPECT_EQ(a.stats().reserved_bytes, 2 * kMiB);  // one small-pool segment
    const Tensor large = empty({kMiB}, TensorOptions(DType::f32, Device::meta()));  // 4 MiB: a 20 MiB segment
    EXPECT_EQ(a.stats().allocated_bytes, 4096 + 4 * kMiB);
    EXPECT_EQ(a.stats().reserved_bytes, 22 * kMiB);
    const Tensor view = large.narrow(0, 16, 32).view({4, 8});  // views take nothing
    EXPECT_EQ(a.stats().allocated_bytes, 4096 + 4 * kMiB);
  }
  EXPECT_EQ(a.stats().allocated_bytes, 0);
  EXPECT_EQ(a.stats().peak_allocated_bytes, 4096 + 4 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, 22 * kMiB) << "freed blocks stay cached, as on a device";
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  a.check_invariants();
}

TEST(MetaScope, CachedBlocksAreReusedLikeReal) {
  MetaAllocationScope scope(fixed_segments());
  memory::CachingAllocator& a = scope.allocator();
  for (int i = 0; i < 5; ++i) {
    const Tensor t = empty({3 * kMiB / 4}, TensorOptions(DType::f32, Device::meta()));  // 3 MiB
  }
  EXPECT_EQ(a.stats().reserved_bytes, 20 * kMiB) << "each 3 MiB block reuses the cached one";
  EXPECT_EQ(a.stats().num_allocs, 5);
}

TEST(MetaScope, CapacityMakesOutOfMemory) {
  memory::AllocatorConfig c = fixed_segments();
  c.capacity = 32 * kMiB;
  MetaAllocationScope scope(c);
  const Tensor fits = empty({2 * kMiB}, TensorOptions(DType::f32, Device::meta()));  // 8 MiB in a 20 MiB segment
  // 16 MiB needs a segment of its own: 20 + 16 > 32 MiB.
  EXPECT_THROW(empty({4 * kMiB}, TensorOptions(DType::f32, Device::meta())), OutOfMemoryError);
  EXPECT_EQ(scope.allocator().stats().num_ooms, 1);
}

TEST(MetaScope, ExpandableSegmentsWhenThePolicySaysSo) {
  memory::AllocatorConfig c;
  c.expandable_segments = true;
  MetaAllocationScope scope(c);
  const Tensor t = empty({3 * kMiB / 4}, TensorOptions(DType::f32, Device::meta()));  // 3 MiB
  const std::vector<memory::SegmentSnapshot> segs = scope.allocator().snapshot();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_TRUE(segs[0].expandable);
  EXPECT_EQ(scope.allocator().stats().reserved_bytes, 4 * kMiB) << "two 2 MiB pages mapped, not a 20 MiB segment";
}

TEST(MetaScope, EffectivePolicyDropsExpandableSegmentsTheBackingLacks) {
  memory::AllocatorConfig c;
  c.expandable_segments = true;
  memory::CachingAllocator host(memory::make_host_backing(), c);
  EXPECT_FALSE(memory::effective_config(host).expandable_segments);
  memory::CachingAllocator simulated(memory::make_simulated_backing(64 * kMiB, false), c);
  EXPECT_TRUE(memory::effective_config(simulated).expandable_segments);
}

TEST(MetaScope, ScopesNestAndTensorsMayOutliveTheirScope) {
  MetaAllocationScope outer(fixed_segments());
  Tensor survivor;
  {
    MetaAllocationScope inner(fixed_segments());
    survivor = empty({1000}, TensorOptions(DType::f32, Device::meta()));
    EXPECT_EQ(inner.allocator().stats().allocated_bytes, 4096);
    EXPECT_EQ(outer.allocator().stats().allocated_bytes, 0);
  }
  EXPECT_EQ(current_meta_allocator(), &outer.allocator());
  const Tensor t = empty({10}, TensorOptions(DType::f32, Device::meta()));
  EXPECT_EQ(outer.allocator().stats().allocated_bytes, 512);
  survivor = Tensor();  // frees into the inner scope's allocator, which the storage kept alive
  EXPECT_EQ(outer.allocator().stats().allocated_bytes, 512);
}

TEST(MetaScope, OtherThreadsKeepMetaByteFree) {
  MetaAllocationScope scope(fixed_segments());
  std::thread other([] {
    EXPECT_EQ(current_meta_allocator(), nullptr);
    const Tensor t = empty({1000}, TensorOptions(DType::f32, Device::meta()));
  });
  other.join();
  EXPECT_EQ(scope.allocator().stats().num_allocs, 0);
}

TEST(MetaScope, PlaceholdersAndPausesTakeNothing) {
  MetaAllocationScope scope(fixed_segments());
  const Tensor p = meta_placeholder({64, 32, 26, 26}, DType::f32);
  EXPECT_EQ(p.sizes(), (Shape{64, 32, 26, 26}));
  EXPECT_TRUE(p.is_contiguous());
  {
    MetaAllocationPause pause;
    EXPECT_EQ(current_meta_allocator(), nullptr);
    const Tensor t = empty({1000}, TensorOptions(DType::f32, Device::meta()));
  }
  EXPECT_EQ(current_meta_allocator(), &scope.allocator());
  EXPECT_EQ(scope.allocator().stats().num_allocs, 0);
}

TEST(MetaScope, OpsAllocateTheirResults) {
  MetaAllocationScope scope(fixed_segments());
  memory::CachingAllocator& a = scope.allocator();
  const Tensor x = empty({256, 128}, TensorOptions(DType::f32, Device::meta()));   // 128 KiB
  const Tensor w = empty({64, 128}, TensorOptions(DType::f32, Device::meta()));    // 32 KiB
  const Tensor y = ops::matmul(x, w.t());                                           // [256, 64]: 64 KiB
  EXPECT_EQ(a.stats().allocated_bytes, (128 + 32 + 64) * 1024);
  const Tensor h = x.to(DType::f16);  // a cast allocates its result: 64 KiB
  EXPECT_EQ(a.stats().allocated_bytes, (128 + 32 + 64 + 64) * 1024);
}

TEST(MetaScope, ReadingAMetaValueGivesZeroOnlyInADryRun) {
  const Tensor loss = empty({}, TensorOptions(DType::f32, Device::meta()));
  EXPECT_THROW(loss.item_double(), DeviceError);  // outside every scope: no value to read
  MetaAllocationScope scope(fixed_segments());
  EXPECT_EQ(loss.item_double(), 0.0);
  EXPECT_EQ(loss.item<float>(), 0.0f);
  EXPECT_THROW(empty({3}, TensorOptions(DType::f32, Device::meta())).to_vector<float>(), DeviceError);
  EXPECT_THROW(empty({3}, TensorOptions(DType::f32, Device::meta())).item_double(), ShapeError);
}
