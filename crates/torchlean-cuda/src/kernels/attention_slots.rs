//! Where the deterministic flash-attention VJP adds dQ (pure host arithmetic, no CUDA).
//!
//! dQ's terms scale · dS K are produced by the key/value kernel (`flash_bwd_kv`), one block
//! per 64-key tile, each visiting the query tiles that can see its keys. The atomic capsule
//! adds them into dQ with `atomicAdd` (the order varies run to run). The deterministic
//! capsule has three ways:
//!
//! - **ordered** (since the fifty-second session; not planned here: `attention.rs` takes it
//!   first wherever the f32 key kernel runs one chunk): the key kernel adds into dQ as the
//!   atomic capsule does, but the key tiles visiting a query tile add there in a fixed
//!   order (descending, so that under a causal cut or a lower-triangular mask each key
//!   tile is one step behind the one above it; under a boolean mask a tile's turn counts
//!   the visitors above it by the tile words), each waiting for its turn (a turn counter
//!   per query tile, an acquire load before and a release store after). Blocks take their
//!   coordinates from a ticket drawn when they start, so a block waits only for blocks that
//!   have started (no deadlock whatever order the device schedules blocks in). No scratch;
//!   the same additions in the same order on every run. The default since the fifty-third
//!   session (`TORCHLEAN_FLASH_DQ_ORDERED=0`: the slots or the query kernel, as below);
//! - **slots** ([`dq_slots`]): block x of the key kernel sums the terms of its key tiles into
//!   slot x of a scratch buffer `[slots][BH·L·d]` with plain stores (no atomics), and
//!   `flash_sum_batches` adds the slots in order. The terms and every addition are the same
//!   on every run: bit-identical. The scratch is at most [`MAX_SLOTS`] copies of dQ and at
//!   most [`MAX_SCRATCH_FLOATS`] floats (1 GiB) in all, fewer slots where dQ is large, so
//!   the VJP's memory stays linear in L with a bounded addition; with more key tiles than
//!   slots each block runs `group` key tiles one after the other, which shrinks the grid
//!   `group`-fold;
//! - **the query kernel** (`flash_bwd_q`): one block per 64 query rows recomputes S and dP
//!   and sums its key tiles in order. It costs two more L×S×d products (about +35% at
//!   B·H = 128, L = 2048 on an H100: docs/BENCHMARKS.md, forty-first session) and is taken
//!   where neither the ordered dQ nor slots are: the tensor-core key kernel
//!   (`TORCHLEAN_FLASH_MMA=1`), head dimensions over 64, or with
//!   `TORCHLEAN_FLASH_DQ_ORDERED=0` a grouped grid that would not fill the device once or
//!   `TORCHLEAN_FLASH_DQ_SLOTS=0`.
//!
//! The choice depends only on the call's shape, the device (its resident blocks) and the
//! process's setting, so a call's bits are the same on every run on the same device; the
//! three ways differ in the order of additions, within the kernel's declared bound.

/// The most slots (key-tile groups) of dQ scratch: at most this many copies of dQ.
pub const MAX_SLOTS: usize = 16;
/// The most floats of dQ scratch (1 GiB): B·H = 128, L = 2048, d = 64 takes all 16 slots;
/// four times that dQ takes four.
pub const MAX_SCRATCH_FLOATS: usize = 1 << 28;

/// Slot plan of a deterministic dQ: `slots` blocks along the keys, `group` key tiles each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DqSlots {
    pub group: usize,
    pub slots: usize,
}

impl DqSlots {
    /// Floats of scratch for `rows` query rows (B·H·L) of `d` columns.
    pub fn scratch_floats(&self, rows: usize, d: usize) -> usize {
        self.slots * rows * d
    }
}

/// The slot plan for `bh` batch matrices of `key_tiles` key tiles and a dQ of `dq_floats`
/// floats on a device holding `resident_blocks` key-kernel blocks at once (0: unknown), or
/// `None` when the query kernel should take dQ. One key tile per slot keeps the key kernel's
/// grid; a grouped grid is taken only while it still fills the device once (else the query
/// kernel's grid, one block per query tile, runs faster).
pub fn dq_slots(
    bh: usize,
    key_tiles: usize,
    dq_floats: usize,
    resident_blocks: usize,
) -> Option<DqSlots> {
    let most = MAX_SLOTS.min(MAX_SCRATCH_FLOATS / dq_floats.max(1));
    if bh == 0 || key_tiles == 0 || most == 0 {
        return None;
    }
    let group = key_tiles.div_ceil(most);
    let slots = key_tiles.div_ceil(group);
    let fills = resident_blocks > 0 && slots.saturating_mul(bh) >= resident_blocks;
    (group == 1 || fills).then_some(DqSlots { group, slots })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cover_every_key_tile_once_and_stay_within_the_cap() {
        for key_tiles in 1..200 {
            let p = dq_slots(128, key_tiles, 1 << 20, 264).expect("a full grid at B·H = 128");
            assert!(p.slots <= MAX_SLOTS, "{key_tiles}: {p:?}");
            // blocks x < slots run tiles [x·group, min((x+1)·group, key_tiles)): each once
            assert!(p.slots * p.group >= key_tiles, "{key_tiles}: {p:?}");
            assert!(
                (p.slots - 1) * p.group < key_tiles,
                "{key_tiles}: an empty slot {p:?}"
            );
        }
    }

    #[test]
    fn a_grouped_grid_that_would_not_fill_the_device_goes_to_the_query_kernel() {
        // L = 2048: 32 key tiles, grouped by 2 into 16 slots
        let dq = 128 * 2048 * 64;
        assert_eq!(
            dq_slots(128, 32, dq, 264),
            Some(DqSlots {
                group: 2,
                slots: 16
            })
        );
        assert_eq!(
            dq_slots(8, 32, dq / 16, 264),
            None,
            "16 · 8 = 128 blocks < 264"
        );
        assert_eq!(
            dq_slots(8, 32, dq / 16, 0),
            None,
            "unknown residency: not grouped"
        );
        // up to MAX_SLOTS key tiles the key kernel's own grid: always slots
        assert_eq!(
            dq_slots(1, 16, 2048 * 64, 264),
            Some(DqSlots {
                group: 1,
                slots: 16
            })
        );
        assert_eq!(dq_slots(0, 4, 0, 264), None);
        assert_eq!(dq_slots(4, 0, 4 * 64, 264), None);
    }

    #[test]
    fn the_scratch_never_exceeds_its_cap() {
        // B·H = 128, L = 8192 (128 key tiles): dQ is 256 MiB, four slots of 32 key tiles
        let dq = 128 * 8192 * 64;
        let p = dq_slots(128, 128, dq, 264).expect("4 · 128 = 512 blocks fill 264");
        assert_eq!(
            p,
            DqSlots {
                group: 32,
                slots: 4
            }
        );
        assert!(p.scratch_floats(128 * 8192, 64) <= MAX_SCRATCH_FLOATS);
        // L = 32768: dQ alone is 1 GiB: one slot of 512 tiles would leave 128 blocks
        assert_eq!(dq_slots(128, 512, 128 * 32768 * 64, 264), None);
        // a dQ over the cap: the query kernel
        assert_eq!(dq_slots(4096, 1, MAX_SCRATCH_FLOATS + 1, 264), None);
        for (bh, l) in [
            (1usize, 64usize),
            (8, 1000),
            (128, 2048),
            (64, 4096),
            (16, 16384),
            (300, 3000),
        ] {
            let (tiles, dq) = (l.div_ceil(64usize), bh * l * 64);
            if let Some(p) = dq_slots(bh, tiles, dq, 264) {
                assert!(
                    p.scratch_floats(bh * l, 64) <= MAX_SCRATCH_FLOATS,
                    "{bh} {l}: {p:?}"
                );
                assert!(
                    p.slots * p.group >= tiles && (p.slots - 1) * p.group < tiles,
                    "{bh} {l}: {p:?}"
                );
            }
        }
    }
}
