//! Parallel loops and GEMM for the native CPU kernels.
//!
//! Work is split into fixed chunks (independent of the thread count), and every output
//! element is computed by exactly one task in a fixed order, so results are bit-identical
//! run to run and across thread counts.

use rayon::prelude::*;

/// A zero-filled output or scratch buffer (from the compiled executor's pool when one is
/// active on this thread).
#[inline]
pub fn zeroed(n: usize) -> Vec<f32> {
    crate::runtime::buffers::take_zeroed(n)
}

/// An output buffer the caller overwrites entirely before reading it (no zero fill when it
/// comes from the compiled executor's pool; stale values otherwise never escape).
#[inline]
pub fn overwritten(n: usize) -> Vec<f32> {
    crate::runtime::buffers::take_overwritten(n)
}

/// The most scratch elements a thread keeps between calls (16 MiB); larger requests are
/// served and then freed.
const SCRATCH_KEEP: usize = 1 << 22;

thread_local! {
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs `f` on a scratch buffer of `n` elements with unspecified contents (`f` must write
/// before it reads), reused by this thread from call to call: kernels that need a work area
/// per task (an im2col matrix) do not allocate one per call. Re-entrant: a nested call
/// allocates its own.
pub fn with_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = SCRATCH.with(|s| s.take());
    if buf.len() < n {
        buf = vec![0.0; n];
    }
    let r = f(&mut buf[..n]);
    if buf.len() <= SCRATCH_KEEP {
        SCRATCH.with(|s| s.set(buf));
    }
    r
}

/// Below this many elements, elementwise work stays on the calling thread.
pub const PAR_THRESHOLD: usize = 1 << 15;
/// Elements per parallel task.
pub const CHUNK: usize = 1 << 13;

/// `out[i] = f(i-th chunk offset, chunk)` in parallel chunks when large.
pub fn for_chunks(out: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if out.len() < PAR_THRESHOLD {
        f(0, out);
    } else {
        out.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, c)| f(i * CHUNK, c));
    }
}

/// Elements per block of [`overwrite_each`].
const WRITE_BACK_BLOCK: usize = 64;

/// `c[j] = f(j, c[j])` for every element, computed block by block into a stack buffer and
/// copied back whole. Written as `c[j] = f(j, c[j])`, a map that leaves some values unchanged
/// (relu, clamp, a maximum) compiles to a masked store (`vmaskmovps`), which AMD cores run
/// slowly: relu in place took 33 µs against 5 µs into another buffer on a [32, 8, 16, 16]
/// tensor, one thread.
#[inline(always)]
pub fn overwrite_each(c: &mut [f32], f: impl Fn(usize, f32) -> f32) {
    let mut block = [0.0f32; WRITE_BACK_BLOCK];
    for (b, cb) in c.chunks_mut(WRITE_BACK_BLOCK).enumerate() {
        let n = cb.len();
        let at = b * WRITE_BACK_BLOCK;
        let tmp = &mut block[..n];
        for j in 0..n {
            tmp[j] = f(at + j, cb[j]);
        }
        cb.copy_from_slice(tmp);
    }
}

/// Runs `f(row_index, row)` over rows of length `width`, in parallel when large.
pub fn for_rows(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if width == 0 {
        return;
    }
    if out.len() < PAR_THRESHOLD {
        out.chunks_mut(width).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        out.par_chunks_mut(width)
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    }
}

/// The element types [`gemm`] multiplies: f32 for the kernels, f64 for the replay checkers'
/// recomputations (the `gemm` crate's f64 micro-kernels, not the f32 ones).
pub trait GemmScalar: Copy + Send + Sync + 'static {
    const ZERO: Self;
    const ONE: Self;
}

impl GemmScalar for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

impl GemmScalar for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

/// A read-only strided matrix operand: element (i, j) is at `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct Mat<'a, T = f32> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// A row-major [rows, cols] matrix.
    pub fn rows(data: &'a [T], cols: usize) -> Self {
        Mat {
            data,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose of a row-major [rows, cols] matrix, read as [cols, rows].
    pub fn transposed(data: &'a [T], cols: usize) -> Self {
        Mat {
            data,
            rs: 1,
            cs: cols,
        }
    }
}

#[allow(clippy::too_many_arguments)] // the GEMM shape: m, n, k, operands, output, two flags
/// `c[m, n] (+)= a[m, k] @ b[k, n]` with `c` row-major, through the `gemm` crate.
/// `threads`: use rayon inside the product (set false when already inside a parallel loop).
pub fn gemm<T: GemmScalar>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<T>,
    b: Mat<T>,
    c: &mut [T],
    accumulate: bool,
    threads: bool,
) {
    assert!(c.len() >= m * n, "gemm: output buffer too small");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c[..m * n].fill(T::ZERO);
        }
        return;
    }
    let max_a = (m - 1) * a.rs + (k - 1) * a.cs;
    let max_b = (k - 1) * b.rs + (n - 1) * b.cs;
    assert!(
        max_a < a.data.len() && max_b < b.data.len(),
        "gemm: operand buffer too small"
    );
    // below about a million multiply-adds (tens of microseconds on one core) waking the
    // pool's other thread costs more than it saves: with 2^18 the imported encoder's
    // [320, 32] x [32, 64] products ran 14% slower end to end (BENCHMARKS.md, ONNX inference)
    let parallelism = if threads && m * n * k >= 1 << 20 {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the asserts above bound every index gemm reads from a and b (the largest is
    // (rows-1)*rs + (cols-1)*cs) and writes to c (m*n, row-major: rs = n, cs = 1); the three
    // slices do not alias because `c` is a unique borrow.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            if accumulate { T::ONE } else { T::ZERO },
            T::ONE,
            false,
            false,
            false,
            parallelism,
        );
    }
}
