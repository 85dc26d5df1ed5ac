//! The range of record ids and recall numbers a store hands out ([`IdBlock`]): the whole
//! u32 range on a single node; in a cluster, partition `p` of `P` takes block `p`, so the
//! ids of different partitions never meet and an id names its partition
//! (docs/cluster-placement.md, "Ids carry their partition"). Blocks rather than a stride
//! keep the ids of one store dense, which the catalog's bitmaps and the vector index's
//! shards (ranges of ids) rely on.

use std::fmt;

use super::kv::{self, Kv};
use super::{keys, meta, read_fixed};
use crate::error::{Error, Result};

/// A contiguous range of ids, `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdBlock {
    /// The first id of the block.
    pub first: u32,
    /// The last id of the block (included).
    pub last: u32,
}

impl IdBlock {
    /// Every id: a single node's store.
    pub const WHOLE: IdBlock = IdBlock {
        first: 0,
        last: u32::MAX,
    };

    /// Partition `partition`'s block when the ids are cut into `partitions` blocks of
    /// `⌊2³² / partitions⌋` (the few ids left past the last block are never handed out).
    pub fn of_partition(partition: u16, partitions: u16) -> IdBlock {
        let size = Self::size(partitions);
        let first = u64::from(partition.min(partitions.max(1) - 1)) * size;
        IdBlock {
            first: u32::try_from(first).unwrap_or(u32::MAX),
            last: u32::try_from(first + size - 1).unwrap_or(u32::MAX),
        }
    }

    /// The partition whose block holds `id`, among `partitions`.
    pub fn partition_of(id: u32, partitions: u16) -> u16 {
        let p = u64::from(id) / Self::size(partitions);
        u16::try_from(p)
            .unwrap_or(u16::MAX)
            .min(partitions.max(1) - 1)
    }

    fn size(partitions: u16) -> u64 {
        (1u64 << 32) / u64::from(partitions.max(1))
    }

    /// Whether `id` is in the block.
    pub fn contains(&self, id: u32) -> bool {
        (self.first..=self.last).contains(&id)
    }

    /// The stored form: first and last, big-endian.
    fn to_bytes(self) -> Vec<u8> {
        let mut v = self.first.to_be_bytes().to_vec();
        v.extend_from_slice(&self.last.to_be_bytes());
        v
    }
}

impl fmt::Display for IdBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}…{:08x}", self.first, self.last)
    }
}

/// The block the store in `kv` hands out ids from: the one recorded, else the one asked for
/// (recorded now), else every id. A store whose recorded block differs from the one asked
/// for is refused: its ids would collide with another partition's.
pub(super) fn settle(
    kv: &dyn Kv,
    dir: &std::path::Path,
    asked: Option<IdBlock>,
) -> Result<IdBlock> {
    let key = keys::meta(meta::ID_BLOCK);
    let recorded = read_fixed::<8>(kv, &key, meta::ID_BLOCK)?.map(|b| IdBlock {
        first: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        last: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
    });
    match (recorded, asked) {
        (Some(r), Some(a)) if r != a => Err(Error::invalid(
            "ids",
            format!(
                "{} hands out the ids {r}, but this node asked for {a}: its data belongs to \
                 another partition, or the cluster's partition count changed, which it \
                 cannot under existing data; keep `[cluster] partitions` as the cluster was \
                 made, or give this node an empty data directory",
                dir.display()
            ),
        )),
        (Some(r), _) => Ok(r),
        (None, Some(a)) => {
            kv.commit(&[&[kv::Op::Put(key, a.to_bytes())]])?;
            Ok(a)
        }
        (None, None) => Ok(IdBlock::WHOLE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_tile_the_ids_and_name_their_partition() {
        for partitions in [1u16, 2, 3, 8, 32, 1000] {
            let mut next = 0u64;
            for p in 0..partitions {
                let b = IdBlock::of_partition(p, partitions);
                assert_eq!(
                    u64::from(b.first),
                    next,
                    "{partitions} partitions, block {p}"
                );
                assert!(b.first <= b.last);
                for id in [b.first, b.first + (b.last - b.first) / 2, b.last] {
                    assert_eq!(IdBlock::partition_of(id, partitions), p);
                    assert!(b.contains(id));
                }
                next = u64::from(b.last) + 1;
            }
            // Ids past the last block (never handed out) still name a partition.
            assert_eq!(IdBlock::partition_of(u32::MAX, partitions), partitions - 1);
        }
        assert_eq!(IdBlock::of_partition(0, 1), IdBlock::WHOLE);
        assert_eq!(IdBlock::of_partition(1, 2).first, 1 << 31);
        assert_eq!(IdBlock::of_partition(3, 8).to_string(), "60000000…7fffffff");
    }
}
