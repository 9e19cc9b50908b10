//! The eager storage cache (runtime::buffers): freed large storages are kept and reused by
//! the next kernel output of that size, shared storages are not taken early, and the cache
//! empties on request. One test in its own binary: the cache is process-wide.

mod support;
use torchlean::runtime::buffers::{cached_bytes, release_cached, CACHE_MIN_ELEMENTS};
use torchlean::Tensor;

#[test]
fn freed_large_storages_are_reused_and_released_on_request() {
    support::checked_cpu_default();
    release_cached();
    let n = CACHE_MIN_ELEMENTS * 2;
    let bytes = n * std::mem::size_of::<f32>();

    // a storage below the threshold is not kept
    drop(Tensor::full(&[CACHE_MIN_ELEMENTS / 2], 1.0).unwrap());
    assert_eq!(cached_bytes(), 0);

    // the last handle of a large storage gives it to the cache
    let t = Tensor::full(&[n], 7.0).unwrap();
    let view = t.reshape(&[2, CACHE_MIN_ELEMENTS as isize]).unwrap();
    drop(t);
    assert_eq!(cached_bytes(), 0, "a view still holds the storage");
    drop(view);
    assert_eq!(cached_bytes(), bytes);

    // the next kernel output of that size takes it, and its values are the kernel's
    let x = Tensor::from_vec((0..n).map(|i| (i % 13) as f32 * 0.1).collect(), &[n]).unwrap();
    let y = x.neg().unwrap();
    assert_eq!(cached_bytes(), 0, "the output reused the cached buffer");
    for (a, b) in x.to_vec().iter().zip(y.to_vec()) {
        assert_eq!(-a, b);
    }

    drop(y);
    assert_eq!(release_cached(), bytes);
    assert_eq!(cached_bytes(), 0);
}
