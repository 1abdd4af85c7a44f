// The segment ledger on hand-made segments: lookups by base and by address, the statistics a regular
// segment and an expandable segment's chunks move, and the reserved bytes of the pool that owns them.
#include "graphalloc/allocator/core/segment_ledger.h"

#include <memory>

#include "graphalloc/allocator/base/bytes.h"
#include "graphalloc/allocator/core/block_pool.h"
#include "graphalloc/allocator/core/stream_shard.h"
#include "gtest/gtest.h"

namespace graphalloc {
namespace {

class SegmentLedgerTest : public ::testing::Test {
 protected:
  Segment MakeSegment(DevicePtr base, std::size_t size, bool small, StreamShard* shard) {
    Segment s;
    s.base = base;
    s.size = size;
    s.shard = shard;
    s.pool = small ? &shard->small_pool : &shard->large_pool;
    return s;
  }

  HistoryRing history_;
  PoolState pool_{1, {}, nullptr};
  StreamShard default_shard_{kDefaultStream, nullptr};
  StreamShard pool_shard_{kDefaultStream, &pool_};
  SegmentLedger ledger_{/*max_split_size=*/64 * kMiB, history_, /*device=*/0};
};

TEST_F(SegmentLedgerTest, RegularSegmentsAreReservedWhole) {
  Segment small = MakeSegment(0x100000, 2 * kMiB, true, &default_shard_);
  Segment big = MakeSegment(0x10000000, 128 * kMiB, false, &pool_shard_);
  ledger_.Link(&small);
  ledger_.Link(&big);
  EXPECT_EQ(ledger_.size(), 2u);
  EXPECT_EQ(ledger_.Find(0x100000), &small);
  EXPECT_EQ(ledger_.Find(0x100200), nullptr);
  EXPECT_EQ(ledger_.Containing(0x100200), &small);
  EXPECT_EQ(ledger_.Containing(0x100000 + 2 * kMiB), nullptr);
  EXPECT_EQ(ledger_.Containing(0x10000000 + 128 * kMiB - 1), &big);
  EXPECT_EQ(ledger_.Containing(0x1000), nullptr);
  EXPECT_EQ(ledger_.stats().segment.all().current, 2);
  EXPECT_EQ(ledger_.reserved_bytes(), 130 * kMiB);
  EXPECT_EQ(ledger_.stats().oversize_segments.all().current, 1);
  EXPECT_EQ(pool_.reserved_bytes, static_cast<std::int64_t>(128 * kMiB));
  ledger_.Unlink(&big);
  EXPECT_EQ(pool_.reserved_bytes, 0);
  EXPECT_EQ(pool_.peak_reserved_bytes, static_cast<std::int64_t>(128 * kMiB));
  EXPECT_EQ(ledger_.reserved_bytes(), 2 * kMiB);
  EXPECT_EQ(ledger_.stats().oversize_segments.all().current, 0);
  ledger_.Unlink(&small);
  EXPECT_EQ(ledger_.size(), 0u);
}

TEST_F(SegmentLedgerTest, ExpandableSegmentsReserveTheirChunks) {
  Segment s = MakeSegment(0x40000000, 1024 * kMiB, false, &pool_shard_);
  s.expandable = true;
  s.vmm = std::make_unique<ExpandableSegment>(s.base, s.size);
  ledger_.AddReservation(&s);
  EXPECT_EQ(ledger_.Find(s.base), &s);
  EXPECT_EQ(ledger_.reserved_bytes(), 0u);
  EXPECT_EQ(ledger_.stats().segment.all().current, 0);
  const ChunkPlacement chunk{s.base + 4 * kMiB, 48 * kMiB, PhysicalHandle{7}};
  ledger_.ChunkMapped(&s, chunk);
  EXPECT_EQ(s.vmm->mapped_bytes(), 48 * kMiB);
  EXPECT_EQ(ledger_.reserved_bytes(), 48 * kMiB);
  EXPECT_EQ(ledger_.stats().num_device_alloc, 1);
  EXPECT_EQ(pool_.reserved_bytes, static_cast<std::int64_t>(48 * kMiB));
  ledger_.ChunkUnmapped(&s, chunk);
  EXPECT_EQ(s.vmm->mapped_bytes(), 0u);
  EXPECT_EQ(ledger_.reserved_bytes(), 0u);
  EXPECT_EQ(ledger_.stats().num_device_free, 1);
  EXPECT_EQ(ledger_.stats().segment.all().current, 0);  // never counted as a segment
  ledger_.RemoveReservation(&s);
  EXPECT_EQ(ledger_.Find(s.base), nullptr);
}

}  // namespace
}  // namespace graphalloc
