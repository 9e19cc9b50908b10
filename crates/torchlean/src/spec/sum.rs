//! How the spec adds up long sequences: cascade (pairwise) summation.
//!
//! A sum is the same real number in any order, but evaluated in f32 (the reference
//! provider runs the spec at f32) a left-to-right sum of n terms errs by up to (n − 1)·u
//! times the sum of the magnitudes, and typically by √n·u: 1.7e-5 relative on a million
//! values near 100. The spec therefore adds in blocks of [`BLOCK`] terms left to right and
//! then adds the blocks' sums pairwise (a binary counter over completed blocks), as NumPy
//! and PyTorch's CPU reductions do: the bound becomes (BLOCK − 1 + ⌈log2(n / BLOCK)⌉)·u.
//! A sequence of at most `BLOCK` terms is added exactly left to right, so short rows (a
//! softmax over a few classes, a small layer norm) keep the plain sum's value bit for bit.
//!
//! The order is fixed by the sequence alone: results are deterministic.

use crate::scalar::Scalar;

/// Terms added left to right before a block's sum joins the pairwise cascade.
pub const BLOCK: usize = 32;

/// A running cascade sum: push terms in order, then [`Cascade::total`].
#[derive(Clone, Debug)]
pub struct Cascade<T> {
    /// The current block's running sum and how many terms it holds.
    block: T,
    in_block: usize,
    /// `levels[i]`: the sum of 2^i completed blocks, when bit i of the completed-block count
    /// is set.
    levels: Vec<Option<T>>,
}

impl<T: Scalar> Default for Cascade<T> {
    fn default() -> Self {
        Cascade {
            block: T::zero(),
            in_block: 0,
            levels: Vec::new(),
        }
    }
}

impl<T: Scalar> Cascade<T> {
    /// Adds the next term.
    pub fn push(&mut self, v: T) {
        // a block starts from +0, as a plain sum does: a sum of -0s is +0 (PyTorch's too)
        self.block += v;
        self.in_block += 1;
        if self.in_block == BLOCK {
            let mut carry = self.block;
            self.block = T::zero();
            self.in_block = 0;
            for level in self.levels.iter_mut() {
                match level.take() {
                    Some(s) => carry = s + carry,
                    None => {
                        *level = Some(carry);
                        return;
                    }
                }
            }
            self.levels.push(Some(carry));
        }
    }

    /// The sum of every term pushed (0 for none): the completed levels from the largest
    /// (earliest terms) down, then the partial block.
    pub fn total(&self) -> T {
        let mut acc: Option<T> = None;
        for s in self.levels.iter().rev().flatten() {
            acc = Some(match acc {
                Some(a) => a + *s,
                None => *s,
            });
        }
        match (acc, self.in_block) {
            (Some(a), 0) => a,
            (Some(a), _) => a + self.block,
            (None, 0) => T::zero(),
            (None, _) => self.block,
        }
    }
}

/// The cascade sum of a sequence (see the module doc): [`Cascade`]'s arithmetic, in its
/// order, with the levels on the stack instead of a vector (a sum of a short row allocated
/// one before; `sum_equals_the_cascade_bit_for_bit` below holds the two equal).
pub fn sum<T: Scalar>(values: impl IntoIterator<Item = T>) -> T {
    sum_with(values, T::zero(), |a, b| a + b)
}

/// [`sum`]'s operations in its order for any type with a zero and an addition: `add(a, b)`
/// wherever [`sum`] computes `a + b`. The checkers run it on lanes of eight rows
/// (`providers/checkers/norm.rs`), each lane then holding its row's [`sum`] bit for bit.
#[inline(always)]
pub fn sum_with<T: Copy>(
    values: impl IntoIterator<Item = T>,
    zero: T,
    add: impl Fn(T, T) -> T,
) -> T {
    cascade_with(values, zero, add, BLOCK)
}

/// [`sum_with`] with blocks of `block` terms (at least 1): `block` 1 adds the values
/// themselves pairwise (a binary counter), as the native kernels combine their vector
/// blocks' sums (`providers/native_cpu/vmath.rs`).
#[inline(always)]
pub fn cascade_with<T: Copy>(
    values: impl IntoIterator<Item = T>,
    zero: T,
    add: impl Fn(T, T) -> T,
    block_len: usize,
) -> T {
    let mut levels = [zero; 64];
    let (mut filled, mut used) = (0u64, 0usize);
    let (mut block, mut in_block) = (zero, 0usize);
    for v in values {
        block = add(block, v);
        in_block += 1;
        if in_block >= block_len {
            let mut carry = block;
            (block, in_block) = (zero, 0);
            let mut i = 0;
            while i < used && filled & (1 << i) != 0 {
                carry = add(levels[i], carry);
                filled &= !(1 << i);
                i += 1;
            }
            levels[i] = carry;
            filled |= 1 << i;
            used = used.max(i + 1);
        }
    }
    let mut acc: Option<T> = None;
    for i in (0..used).rev().filter(|&i| filled & (1 << i) != 0) {
        acc = Some(match acc {
            Some(a) => add(a, levels[i]),
            None => levels[i],
        });
    }
    match (acc, in_block) {
        (Some(a), 0) => a,
        (Some(a), _) => add(a, block),
        (None, 0) => zero,
        (None, _) => block,
    }
}

/// Many cascade sums at once, each term added to the output it names: a scatter-add
/// (a broadcast's VJP, a parameter's gradient over a batch) whose outputs are each summed
/// in the order their terms arrive.
pub struct Sums<T> {
    cells: Vec<Cascade<T>>,
}

impl<T: Scalar> Sums<T> {
    pub fn new(n: usize) -> Sums<T> {
        Sums {
            cells: vec![Cascade::default(); n],
        }
    }
    /// Adds `v` to output `i`.
    pub fn add(&mut self, i: usize, v: T) {
        self.cells[i].push(v);
    }
    pub fn totals(&self) -> Vec<T> {
        self.cells.iter().map(Cascade::total).collect()
    }
    /// The totals as an array of `shape` (whose element count is the number of outputs).
    pub fn into_array(self, shape: &[usize]) -> super::Array<T> {
        super::Array {
            shape: shape.to_vec(),
            data: self.totals(),
        }
    }
}

/// Many cascade sums fed a row at a time: every output gets one term per row, in row order
/// (a norm's parameter gradient over the rows of a batch). [`Sums`]'s values bit for bit
/// (`row_sums_equal_sums_bit_for_bit` below): each output's block is added to as a whole row
/// (a loop the compiler vectorizes), and the cascade's levels are shared, since every output
/// has completed as many blocks as every other.
pub struct RowSums<T> {
    /// Each output's current block (`in_block` terms so far, from +0).
    block: Vec<T>,
    in_block: usize,
    /// `levels[i]`: each output's sum of 2^i completed blocks, when bit i of `filled` is set.
    levels: Vec<Vec<T>>,
    filled: u64,
}

impl<T: Scalar> RowSums<T> {
    pub fn new(n: usize) -> RowSums<T> {
        RowSums {
            block: vec![T::zero(); n],
            in_block: 0,
            levels: Vec::new(),
            filled: 0,
        }
    }

    /// Adds the row whose term for output `j` is `term(j)`.
    pub fn push_row(&mut self, term: impl Fn(usize) -> T) {
        for (j, b) in self.block.iter_mut().enumerate() {
            *b += term(j);
        }
        self.in_block += 1;
        if self.in_block < BLOCK {
            return;
        }
        // a completed block joins the cascade as Cascade::push does, for every output at once
        let n = self.block.len();
        let mut carry = std::mem::replace(&mut self.block, vec![T::zero(); n]);
        self.in_block = 0;
        let mut i = 0;
        while i < self.levels.len() && self.filled & (1 << i) != 0 {
            for (c, &s) in carry.iter_mut().zip(&self.levels[i]) {
                *c = s + *c;
            }
            self.filled &= !(1 << i);
            i += 1;
        }
        if i == self.levels.len() {
            self.levels.push(carry);
        } else {
            self.levels[i] = carry;
        }
        self.filled |= 1 << i;
    }

    /// Every output's sum, as [`Cascade::total`] adds them.
    pub fn totals(&self) -> Vec<T> {
        let mut acc: Option<Vec<T>> = None;
        for i in (0..self.levels.len()).rev() {
            if self.filled & (1 << i) == 0 {
                continue;
            }
            acc = Some(match acc {
                Some(mut a) => {
                    a.iter_mut()
                        .zip(&self.levels[i])
                        .for_each(|(a, &s)| *a += s);
                    a
                }
                None => self.levels[i].clone(),
            });
        }
        match (acc, self.in_block) {
            (Some(mut a), n) if n > 0 => {
                a.iter_mut().zip(&self.block).for_each(|(a, &b)| *a += b);
                a
            }
            (Some(a), _) => a,
            (None, 0) => vec![T::zero(); self.block.len()],
            (None, _) => self.block.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Cascade`]'s total of a sequence: the reference for [`sum`].
    fn cascade<T: Scalar>(xs: &[T]) -> T {
        let mut c = Cascade::default();
        xs.iter().for_each(|&v| c.push(v));
        c.total()
    }

    #[test]
    fn row_sums_equal_sums_bit_for_bit() {
        let mut k = 7u64;
        let mut next = || {
            k += 1;
            (crate::spec::splitmix64(k) >> 11) as f64 / (1u64 << 53) as f64 * 20.0 - 10.0
        };
        for (n, rows) in [
            (1usize, 0usize),
            (3, 1),
            (5, 31),
            (5, 32),
            (4, 33),
            (7, 97),
            (2, 1000),
            (3, 2049),
        ] {
            let terms: Vec<f64> = (0..n * rows).map(|_| next()).collect();
            let (mut a, mut b) = (RowSums::new(n), Sums::new(n));
            let (mut a32, mut b32) = (RowSums::new(n), Sums::new(n));
            for r in 0..rows {
                let row = &terms[r * n..(r + 1) * n];
                a.push_row(|j| row[j]);
                a32.push_row(|j| row[j] as f32);
                for (j, &v) in row.iter().enumerate() {
                    b.add(j, v);
                    b32.add(j, v as f32);
                }
            }
            let bits = |v: Vec<f64>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(a.totals()),
                bits(b.totals()),
                "f64, {n} outputs, {rows} rows"
            );
            let bits32 = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits32(a32.totals()),
                bits32(b32.totals()),
                "f32, {n} outputs, {rows} rows"
            );
        }
    }

    #[test]
    fn sum_equals_the_cascade_bit_for_bit() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 200.0 - 100.0
        };
        let xs: Vec<f64> = (0..70_000).map(|_| next()).collect();
        let lengths = (0..=300).chain([1023, 1024, 1025, 4096, 32 * 1000 + 7, 70_000]);
        for n in lengths {
            let (a, b) = (sum(xs[..n].iter().copied()), cascade(&xs[..n]));
            assert_eq!(a.to_bits(), b.to_bits(), "f64, n = {n}");
            let ys: Vec<f32> = xs[..n].iter().map(|&v| v as f32).collect();
            let (a, b) = (sum(ys.iter().copied()), cascade(&ys));
            assert_eq!(a.to_bits(), b.to_bits(), "f32, n = {n}");
        }
    }

    #[test]
    fn short_sequences_are_summed_left_to_right_bit_for_bit() {
        let xs: Vec<f32> = (0..BLOCK).map(|i| 1.0 / (i as f32 + 0.37)).collect();
        for n in 0..=BLOCK {
            let plain = xs[..n].iter().fold(0.0f32, |a, &v| a + v);
            assert_eq!(
                sum(xs[..n].iter().copied()).to_bits(),
                plain.to_bits(),
                "n = {n}"
            );
        }
    }

    #[test]
    fn long_sums_stay_within_the_cascade_bound() {
        // a million values near 100 in f32, against the exact f64 sum of the same f32 values
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let xs: Vec<f32> = (0..1_000_003)
            .map(|_| {
                s = crate::spec::splitmix64(s);
                100.0 + (s >> 40) as f32 / (1u64 << 24) as f32
            })
            .collect();
        let exact: f64 = xs.iter().map(|&v| v as f64).sum();
        let abs: f64 = xs.iter().map(|&v| v.abs() as f64).sum();
        let got = sum(xs.iter().copied()) as f64;
        let levels = (xs.len() / BLOCK).ilog2() as f64 + 1.0;
        let bound = (BLOCK as f64 - 1.0 + levels) * f32::EPSILON as f64 / 2.0 * abs;
        assert!(
            (got - exact).abs() <= bound,
            "error {} > bound {bound}",
            (got - exact).abs()
        );
        // and far below what a left-to-right f32 sum reaches here
        let plain = xs.iter().fold(0.0f32, |a, &v| a + v) as f64;
        assert!((got - exact).abs() * 100.0 < (plain - exact).abs());
    }

    #[test]
    fn a_sum_of_negative_zeros_is_positive_zero_as_in_pytorch() {
        for n in [1, 2, 32, 33, 100] {
            assert_eq!(sum(vec![-0.0f32; n]).to_bits(), 0.0f32.to_bits(), "n = {n}");
        }
        assert_eq!(sum(Vec::<f32>::new()).to_bits(), 0.0f32.to_bits());
    }

    #[test]
    fn every_length_sums_every_term_once() {
        // integers small enough that every order is exact
        for n in [0, 1, 31, 32, 33, 64, 65, 95, 96, 97, 1000, 4096, 4097] {
            let got = sum((1..=n).map(|i| i as f64));
            assert_eq!(got, (n * (n + 1) / 2) as f64, "n = {n}");
        }
    }
}
