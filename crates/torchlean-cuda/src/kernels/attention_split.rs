//! How flash attention's key/value VJP kernel (`flash_bwd_kv`) divides its last blocks so
//! that the GPU's last wave is not left half empty (pure host arithmetic, no CUDA).
//!
//! The kernel runs one block per 64-key tile and batch matrix, each walking every query
//! tile; blocks are dispatched in order, `slots` at a time (SMs × resident blocks per SM).
//! When the block count is not a multiple of `slots` the last wave runs on part of the GPU:
//! at B·H = 128, L = 2048 (4,096 blocks on 264 slots of an H100 or H200) 15.5 waves take the
//! time of 16. [`key_split`] splits the key tiles of the last batch matrices along the
//! queries instead — `parts` blocks per key tile, each over a consecutive range of query
//! tiles, each leaving its partial dK, dV in a scratch buffer that `flash_sum_parts` then
//! adds in a fixed order (so dK and dV stay deterministic) — when an in-order list schedule
//! of the blocks' costs says that finishes sooner.
//!
//! The cost model counts query tiles: a block costs its query tiles plus [`BLOCK_OVERHEAD`]
//! (loading its keys and values, writing its rows), and a split adds [`sum_cost`] for the
//! summing kernel; a split is taken only when it saves 2% by the model. It assumes every
//! query tile costs the same, so callers use it only where that holds (no causal cut, no
//! mask tiles skipped).
//!
//! dK and dV stay deterministic (the same additions in the same order on every run of the
//! same call on the same device), but their bits now depend on the device's resident blocks
//! (SM count, occupancy), on B·H and on a matrix's place among them (only the last ones are
//! split), and on `TORCHLEAN_FLASH_SPLIT`: within the kernel's declared bound either way.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;

/// Cost units per query tile (integer arithmetic in the schedule).
const UNIT: u64 = 16;
/// A block's fixed cost: its key and value rows in, its dK and dV rows out — estimated at a
/// quarter of a query tile (32 KiB moved against the tile's 1M multiply-adds per block).
const BLOCK_OVERHEAD: u64 = UNIT / 4;
/// The summing kernel's cost, in query tiles: its launch (a quarter tile) and its reads and
/// writes, a tile per [`SUM_FLOATS_PER_TILE`] floats of scratch (a query tile's step takes
/// ~20 µs of a block at B·H = 128, L = 2048 on an H100; 16M floats, 64 MiB, move in about as
/// long at ~3 TB/s).
fn sum_cost(scratch_floats: usize) -> u64 {
    UNIT / 4 + (scratch_floats as u64 * UNIT).div_ceil(SUM_FLOATS_PER_TILE)
}
const SUM_FLOATS_PER_TILE: u64 = 16 << 20;
/// A split is taken only if the model says it saves at least this share of the time
/// (1/50): below that, the second launch and the scratch are not worth their risk of being
/// mispriced.
const MIN_GAIN_DIVISOR: u64 = 50;
/// The most blocks one key tile is split into.
const MAX_PARTS: usize = 8;
/// The most floats of partial dK, dV rows a split may hold (64 MiB).
const MAX_SCRATCH_FLOATS: usize = 16 << 20;
/// Candidate splits whose part blocks exceed this many waves are not considered (they
/// cannot shorten the last wave and would make planning slow).
const MAX_SPLIT_WAVES: usize = 4;

/// The last `heads` batch matrices run `parts` blocks per key tile (none when `heads` is 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySplit {
    pub heads: usize,
    pub parts: usize,
}

impl KeySplit {
    pub const NONE: KeySplit = KeySplit { heads: 0, parts: 1 };

    /// Floats of the scratch rows for `s` keys of dK (width `d`) and dV (width `dv`).
    pub fn scratch_floats(&self, s: usize, d: usize, dv: usize) -> usize {
        self.heads * self.parts * s * (d + dv)
    }
}

/// The split for `bh` batch matrices of `key_tiles` key tiles and `query_tiles` query tiles
/// on `slots` resident blocks, with `row_floats` = d + dv floats per key row and `keys` keys;
/// [`KeySplit::NONE`] when no split finishes sooner by the model (or `slots` is 0: unknown).
/// Results are remembered per argument list.
pub fn key_split(
    bh: usize,
    key_tiles: usize,
    query_tiles: usize,
    slots: usize,
    keys: usize,
    row_floats: usize,
) -> KeySplit {
    type Key = (usize, usize, usize, usize, usize, usize);
    static SEEN: Mutex<Vec<(Key, KeySplit)>> = Mutex::new(Vec::new());
    let key = (bh, key_tiles, query_tiles, slots, keys, row_floats);
    // a poisoned lock only means another thread panicked while planning: plan again
    if let Ok(seen) = SEEN.lock() {
        if let Some((_, split)) = seen.iter().find(|(k, _)| *k == key) {
            return *split;
        }
    }
    let split = plan(bh, key_tiles, query_tiles, slots, keys * row_floats);
    if let Ok(mut seen) = SEEN.lock() {
        if seen.len() >= 64 {
            seen.remove(0);
        }
        seen.push((key, split));
    }
    split
}

fn plan(
    bh: usize,
    key_tiles: usize,
    query_tiles: usize,
    slots: usize,
    floats_per_part: usize,
) -> KeySplit {
    if slots == 0 || bh == 0 || key_tiles == 0 || query_tiles < 2 {
        return KeySplit::NONE;
    }
    let full_cost = query_tiles as u64 * UNIT + BLOCK_OVERHEAD;
    let baseline = (bh * key_tiles).div_ceil(slots) as u64 * full_cost;
    let mut best = (baseline - baseline / MIN_GAIN_DIVISOR, KeySplit::NONE);
    for heads in 1..=bh {
        if heads * key_tiles > MAX_SPLIT_WAVES * slots {
            break;
        }
        for parts in 2..=MAX_PARTS.min(query_tiles) {
            if heads * key_tiles * parts > MAX_SPLIT_WAVES * slots
                || heads * parts * floats_per_part > MAX_SCRATCH_FLOATS
            {
                break;
            }
            let split = KeySplit { heads, parts };
            let time = makespan(bh, key_tiles, query_tiles, slots, split)
                + sum_cost(heads * parts * floats_per_part);
            if time < best.0 {
                best = (time, split);
            }
        }
    }
    best.1
}

/// The finishing time of an in-order list schedule of the kernel's blocks on `slots` slots.
fn makespan(bh: usize, key_tiles: usize, query_tiles: usize, slots: usize, split: KeySplit) -> u64 {
    let full_cost = query_tiles as u64 * UNIT + BLOCK_OVERHEAD;
    let full_blocks = (bh - split.heads) * key_tiles;
    // equal blocks in order: every slot ran `waves` of them, `extra` slots one more
    let (waves, extra) = (full_blocks / slots, full_blocks % slots);
    let mut free: BinaryHeap<Reverse<u64>> = (0..slots)
        .map(|i| Reverse((waves + usize::from(i < extra)) as u64 * full_cost))
        .collect();
    for _head in 0..split.heads {
        for p in 0..split.parts {
            let tiles = (p + 1) * query_tiles / split.parts - p * query_tiles / split.parts;
            let cost = tiles as u64 * UNIT + BLOCK_OVERHEAD;
            for _tile in 0..key_tiles {
                // `slots` > 0 entries, one popped and one pushed per block
                if let Some(Reverse(at)) = free.pop() {
                    free.push(Reverse(at + cost));
                }
            }
        }
    }
    free.into_iter().map(|Reverse(t)| t).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The makespan by brute force: blocks in order, each to the slot free first.
    fn simulate(costs: &[u64], slots: usize) -> u64 {
        let mut free = vec![0u64; slots];
        for &c in costs {
            let i = (0..slots).min_by_key(|&i| free[i]).unwrap();
            free[i] += c;
        }
        free.into_iter().max().unwrap()
    }

    fn costs(bh: usize, kt: usize, qt: usize, split: KeySplit) -> Vec<u64> {
        let mut out = Vec::new();
        for _ in 0..(bh - split.heads) * kt {
            out.push(qt as u64 * UNIT + BLOCK_OVERHEAD);
        }
        for _ in 0..split.heads {
            for p in 0..split.parts {
                let tiles = (p + 1) * qt / split.parts - p * qt / split.parts;
                out.extend(std::iter::repeat_n(
                    tiles as u64 * UNIT + BLOCK_OVERHEAD,
                    kt,
                ));
            }
        }
        out
    }

    #[test]
    fn the_closed_form_schedule_matches_a_brute_force_one() {
        for (bh, kt, qt, slots) in [
            (128, 32, 32, 264),
            (5, 7, 9, 11),
            (3, 4, 5, 64),
            (16, 8, 8, 132),
        ] {
            for heads in 0..=bh.min(6) {
                for parts in 1..=5 {
                    let split = KeySplit { heads, parts };
                    assert_eq!(
                        makespan(bh, kt, qt, slots, split),
                        simulate(&costs(bh, kt, qt, split), slots),
                        "bh {bh} kt {kt} qt {qt} slots {slots} {split:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_half_empty_last_wave_is_split_and_finishes_sooner() {
        // B·H = 128, L = 2048 on 132 SMs × 2 blocks: 15.5 waves
        let split = plan(128, 32, 32, 264, 2048 * 128);
        assert!(split.heads > 0 && split.parts > 1, "{split:?}");
        let before = makespan(128, 32, 32, 264, KeySplit::NONE);
        let after =
            makespan(128, 32, 32, 264, split) + sum_cost(split.scratch_floats(2048, 64, 64));
        assert!(after * 100 < before * 99, "{before} -> {after}");
        // the scratch stays within its cap
        assert!(split.scratch_floats(2048, 64, 64) <= MAX_SCRATCH_FLOATS);
    }

    #[test]
    fn full_waves_and_unknown_slots_are_left_alone() {
        // 4,224 blocks = 16 full waves of 264
        assert_eq!(plan(132, 32, 32, 264, 1 << 10), KeySplit::NONE);
        assert_eq!(plan(128, 32, 32, 0, 1 << 10), KeySplit::NONE);
        // one query tile: nothing to split along
        assert_eq!(plan(128, 32, 1, 264, 1 << 10), KeySplit::NONE);
    }

    #[test]
    fn a_few_long_matrices_spread_over_the_idle_slots() {
        // one batch matrix of 32 key tiles on 264 slots: most of the GPU idle
        let split = plan(1, 32, 32, 264, 1 << 10);
        assert_eq!(split.heads, 1);
        assert!(split.parts >= 4, "{split:?}");
    }

    #[test]
    fn splits_that_would_hold_too_much_scratch_are_not_taken() {
        let split = plan(1, 32, 32, 264, MAX_SCRATCH_FLOATS);
        assert_eq!(split, KeySplit::NONE);
    }
}
