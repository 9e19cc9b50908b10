//! In-memory datasets (batching, seeded shuffling, splitting, the step sampler) and the
//! embedded synthetic datasets and text corpus.

mod support;
use torchlean::data::synthetic::{self, Pde};
use torchlean::data::text::{char_lm_dataset, CharVocab, CORPUS};
use torchlean::data::{epoch_permutation, BatchSampler, DataError, Dataset};
use torchlean::{Error, Tensor};

fn toy(n: usize) -> Dataset {
    let x = Tensor::from_vec((0..n * 2).map(|v| v as f32).collect(), &[n, 2]).unwrap();
    let y = Tensor::from_vec((0..n).map(|v| v as f32).collect(), &[n]).unwrap();
    Dataset::new(&x, &y).unwrap()
}

#[test]
fn datasets_validate_and_gather_rows() {
    support::checked_cpu_default();
    let x = Tensor::zeros(&[4, 2]).unwrap();
    let y = Tensor::zeros(&[5]).unwrap();
    assert!(matches!(
        Dataset::new(&x, &y),
        Err(Error::Data(DataError::Invalid(_)))
    ));
    assert!(Dataset::from_vecs(vec![0.0; 5], &[2], vec![0.0; 2], &[]).is_err());
    let ds = toy(5);
    let (bx, by) = ds.gather(&[4, 0, 4]).unwrap();
    assert_eq!(bx.shape(), &[3, 2]);
    assert_eq!(bx.to_vec(), vec![8.0, 9.0, 0.0, 1.0, 8.0, 9.0]);
    assert_eq!(by.to_vec(), vec![4.0, 0.0, 4.0]);
    assert!(ds.gather(&[5]).is_err());
    let (a, b) = ds.split(2).unwrap();
    assert_eq!((a.len(), b.len()), (2, 3));
    assert_eq!(b.targets().unwrap().to_vec(), vec![2.0, 3.0, 4.0]);
    assert!(ds.split(6).is_err());
    let (rx, _) = ds.range(3, 99).unwrap();
    assert_eq!(rx.shape(), &[2, 2]);
}

#[test]
fn epoch_batches_cover_every_sample_once_and_shuffle_by_seed() {
    support::checked_cpu_default();
    let ds = toy(10);
    let ordered = ds.batches(4, None).unwrap();
    assert_eq!(
        ordered
            .iter()
            .map(|(x, _)| x.shape()[0])
            .collect::<Vec<_>>(),
        [4, 4, 2]
    );
    let targets =
        |bs: &[(Tensor, Tensor)]| -> Vec<f32> { bs.iter().flat_map(|(_, y)| y.to_vec()).collect() };
    assert_eq!(
        targets(&ordered),
        (0..10).map(|v| v as f32).collect::<Vec<_>>()
    );
    let s1 = targets(&ds.batches(3, Some(1)).unwrap());
    let s1b = targets(&ds.batches(3, Some(1)).unwrap());
    let s2 = targets(&ds.batches(3, Some(2)).unwrap());
    assert_eq!(s1, s1b);
    assert_ne!(s1, s2);
    let mut sorted = s1.clone();
    sorted.sort_by(f32::total_cmp);
    assert_eq!(sorted, (0..10).map(|v| v as f32).collect::<Vec<_>>());
    assert!(ds.batches(0, None).is_err());
    let sh = ds.shuffled(1).unwrap();
    assert_eq!(sh.targets().unwrap().to_vec(), s1);
}

#[test]
fn sampler_steps_walk_epoch_permutations() {
    support::checked_cpu_default();
    let p = epoch_permutation(50, 3, 0).unwrap();
    let mut s = p.clone();
    s.sort();
    assert_eq!(s, (0..50).collect::<Vec<_>>());
    assert_ne!(p, epoch_permutation(50, 3, 1).unwrap());
    assert_ne!(p, (0..50).collect::<Vec<_>>());
    // 7 samples, batches of 3: two whole batches per epoch, the seventh sample of each
    // epoch's permutation left out (PyTorch's drop_last): step k is batch k mod 2 of epoch
    // k div 2, and no batch holds a sample twice
    let mut sampler = BatchSampler::new(7, 3, 9, true).unwrap();
    assert_eq!(sampler.batches_per_epoch(), 2);
    let batches: Vec<Vec<usize>> = (0..8).map(|k| sampler.indices(k).unwrap()).collect();
    for (k, batch) in batches.iter().enumerate() {
        let epoch = epoch_permutation(7, 9, (k / 2) as u64).unwrap();
        assert_eq!(batch.as_slice(), &epoch[(k % 2) * 3..(k % 2) * 3 + 3]);
        let mut distinct = batch.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3, "{batch:?}");
    }
    // any step can be asked for directly (resume), in any order
    let mut other = BatchSampler::new(7, 3, 9, true).unwrap();
    assert_eq!(other.indices(5).unwrap(), batches[5]);
    assert_eq!(other.indices(1).unwrap(), batches[1]);
    let mut ordered = BatchSampler::new(4, 3, 0, false).unwrap();
    assert_eq!(ordered.indices(1).unwrap(), vec![0, 1, 2]);
    let mut ordered = BatchSampler::new(5, 2, 0, false).unwrap();
    assert_eq!(ordered.indices(1).unwrap(), vec![2, 3]);
    assert_eq!(ordered.indices(2).unwrap(), vec![0, 1]);
    assert!(BatchSampler::new(0, 3, 0, true)
        .unwrap()
        .indices(2)
        .unwrap()
        .is_empty());
    // a batch above the samples would repeat one; a length no memory holds is an error
    let err = BatchSampler::new(3, 4, 0, true).unwrap_err().to_string();
    assert!(err.contains("batch size 4 exceeds the 3 samples"), "{err}");
    let mut huge = BatchSampler::new(1 << 62, 1, 0, true).unwrap();
    assert!(huge.indices(0).is_err());
    assert!(epoch_permutation(usize::MAX, 0, 0).is_err());
}

#[test]
fn synthetic_images_are_balanced_patterns() {
    support::checked_cpu_default();
    let ds = synthetic::images(40, 8, 0.0, 1).unwrap();
    assert_eq!(ds.feature_shape(), &[1, 8, 8]);
    let y = ds.targets().unwrap().to_vec();
    for c in 0..4 {
        assert_eq!(y.iter().filter(|&&v| v == c as f32).count(), 10);
    }
    let x = ds.features().unwrap().to_vec();
    // noiseless: a horizontal bar is one full row of ones, a vertical bar one full column
    let img = |i: usize| &x[i * 64..(i + 1) * 64];
    let h = img(0);
    assert_eq!(h.iter().sum::<f32>(), 8.0);
    assert!((0..8).any(|r| (0..8).all(|c| h[r * 8 + c] == 1.0)));
    let v = img(1);
    assert!((0..8).any(|c| (0..8).all(|r| v[r * 8 + c] == 1.0)));
    assert_eq!(synthetic::images(40, 8, 0.0, 1).unwrap(), ds);
    assert_ne!(synthetic::images(40, 8, 0.0, 2).unwrap(), ds);
    let noisy = synthetic::images(4, 16, 0.3, 1).unwrap();
    assert_eq!(noisy.feature_shape(), &[1, 16, 16]);
    assert!(synthetic::images(4, 3, 0.0, 0).is_err());
}

#[test]
fn regression_and_sequence_sets_follow_their_formulas() {
    support::checked_cpu_default();
    let r = synthetic::regression(16, 4).unwrap();
    let (x, y) = (
        r.features().unwrap().to_vec(),
        r.targets().unwrap().to_vec(),
    );
    assert_eq!(r.target_shape(), &[1]);
    for i in 0..16 {
        let v = &x[i * 4..i * 4 + 4];
        let e = (2.0 * v[0]).sin() + 0.5 * v[1] * v[2] - 0.3 * v[3];
        assert!((y[i] - e).abs() < 1e-6);
    }
    let s = synthetic::sequence_regression(8, 5, 2).unwrap();
    assert_eq!(
        (s.feature_shape(), s.target_shape()),
        (&[5, 1][..], &[1][..])
    );
    let (x, y) = (
        s.features().unwrap().to_vec(),
        s.targets().unwrap().to_vec(),
    );
    for i in 0..8 {
        let e: f64 = (0..5)
            .map(|t| 0.7f64.powi(4 - t as i32) * x[i * 5 + t] as f64)
            .sum();
        assert!((y[i] as f64 - e).abs() < 1e-5);
        assert!(x[i * 5..i * 5 + 5].iter().all(|v| v.abs() <= 1.0));
    }
}

#[test]
fn pde_sets_decay_under_heat_and_shift_under_advection() {
    support::checked_cpu_default();
    let heat = synthetic::pde_1d(6, 32, 4, Pde::Heat { nu: 0.01, t: 1.0 }, 3).unwrap();
    assert_eq!(heat.feature_shape(), &[1, 32]);
    let (u0, ut) = (
        heat.features().unwrap().to_vec(),
        heat.targets().unwrap().to_vec(),
    );
    for i in 0..6 {
        let e0: f32 = u0[i * 32..(i + 1) * 32].iter().map(|v| v * v).sum();
        let et: f32 = ut[i * 32..(i + 1) * 32].iter().map(|v| v * v).sum();
        assert!(et < e0 * 0.7, "heat must dissipate energy: {et} vs {e0}");
        // zero mean is preserved
        assert!(ut[i * 32..(i + 1) * 32].iter().sum::<f32>().abs() < 1e-4);
    }
    // advection by a quarter period on a 32-point grid is a shift by 8 points
    let adv = synthetic::pde_1d(3, 32, 4, Pde::Advection { c: 0.25, t: 1.0 }, 5).unwrap();
    let (a0, at) = (
        adv.features().unwrap().to_vec(),
        adv.targets().unwrap().to_vec(),
    );
    for i in 0..3 {
        for j in 0..32 {
            let src = (j + 32 - 8) % 32;
            assert!((at[i * 32 + j] - a0[i * 32 + src]).abs() < 1e-4);
        }
    }
    assert!(synthetic::pde_1d(1, 8, 5, Pde::Heat { nu: 0.1, t: 1.0 }, 0).is_err());
}

#[test]
fn corpus_vocab_and_char_windows() {
    support::checked_cpu_default();
    assert!(CORPUS.len() > 2000 && CORPUS.len() < 8000);
    let v = CharVocab::from_text(CORPUS);
    assert!(v.len() > 20 && v.len() < 80);
    let ids = v.encode(CORPUS).unwrap();
    assert_eq!(v.decode(&ids).unwrap(), CORPUS);
    assert!(v.encode("€").is_err());
    assert!(v.decode(&[v.len() as f32]).is_err());
    assert!(v.decode(&[0.5]).is_err());
    let ds = char_lm_dataset(CORPUS, &v, 16, 8).unwrap();
    assert_eq!(
        (ds.feature_shape(), ds.target_shape()),
        (&[16][..], &[16][..])
    );
    let (x, y) = ds.gather(&[3]).unwrap();
    let (x, y) = (x.to_vec(), y.to_vec());
    assert_eq!(&x[1..], &y[..15]);
    assert_eq!(&x[..], &ids[24..40]);
    assert!(char_lm_dataset("ab", &v, 2, 1).is_err());
}

/// The windows are those a naive walk finds (starts 0, stride, ... while a target window
/// fits), for strides up to past the text's end and up to `usize::MAX` (a start never
/// overflows: a huge stride gives the one window at 0, where it panicked before).
#[test]
fn char_windows_match_a_naive_walk_for_every_stride() {
    support::checked_cpu_default();
    let text = &CORPUS[..200];
    let v = CharVocab::from_text(text);
    let ids = v.encode(text).unwrap();
    for seq_len in [1usize, 7, 64, 199] {
        for stride in [1usize, 2, 5, 64, 198, 199, 1000, usize::MAX / 2, usize::MAX] {
            let ds = char_lm_dataset(text, &v, seq_len, stride).unwrap();
            let starts: Vec<usize> = (0..)
                .map(|k: u128| k * stride as u128)
                .take_while(|&s| s + (seq_len as u128) < ids.len() as u128)
                .map(|s| s as usize)
                .collect();
            assert_eq!(ds.len(), starts.len(), "seq_len {seq_len} stride {stride}");
            for (k, &s) in starts.iter().enumerate() {
                let (x, y) = ds.gather(&[k]).unwrap();
                assert_eq!(x.to_vec(), &ids[s..s + seq_len], "window {k}");
                assert_eq!(y.to_vec(), &ids[s + 1..s + seq_len + 1], "window {k}");
            }
        }
    }
}

#[test]
fn a_batch_too_large_to_hold_is_an_error_before_any_copy() {
    support::checked_cpu_default();
    let wide = Dataset::from_vecs(vec![0.5; 1 << 20], &[1 << 20], vec![1.0], &[1]).unwrap();
    let err = wide.gather(&vec![0; 1 << 20]).unwrap_err().to_string();
    assert!(err.contains("gather"), "{err}");
    assert!(wide.gather(&[1]).is_err());
    let (x, y) = wide.gather(&[0, 0]).unwrap();
    assert_eq!((x.shape(), y.shape()), (&[2, 1 << 20][..], &[2, 1][..]));
}
