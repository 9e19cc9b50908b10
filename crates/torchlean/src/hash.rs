//! FNV-1a, 64-bit: the one hash behind checkpoint checksums, the vocabulary's and class
//! names' signatures, the CUDA kernel cache's keys and the fuzzers' per-input choices.
//! Not cryptographic: it detects accidents (a corrupted file, another vocabulary), not an
//! adversary.

/// The FNV-1a state, fed with [`std::hash::Hasher::write`].
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    /// The offset basis.
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    /// A hasher that continues from `state` (a [`std::hash::Hasher::finish`] value): for a
    /// caller that folds words itself, faster than byte by byte.
    pub fn with_state(state: u64) -> Self {
        Fnv1a(state)
    }
}

impl std::hash::Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// FNV-1a of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = Fnv1a::default();
    h.write(bytes);
    h.finish()
}
