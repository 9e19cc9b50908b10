//! Sizes and structures a library user passes are checked before anything is derived from
//! them: a size that overflows, an allocation no memory holds, or a hand-built structure
//! whose public fields disagree is an `Err` naming the problem — never a panic, an abort, a
//! hang or a silently wrapped size.

mod support;
use torchlean::data::text::{char_lm_dataset, CharVocab};
use torchlean::graph::{append_backward, Graph, OutputDecl};
use torchlean::nn::{
    key_padding_mask, models::small_cnn, Conv2d, Conv2dOptions, Fno1d, FnoConfig, Gru, Lstm,
    Module, SpectralConv1d,
};
use torchlean::spec::{self, Array};
use torchlean::{Result, Tensor};

#[test]
fn key_padding_masks_are_built_checked() {
    support::checked_cpu_default();
    // the mask of each batch row repeats its keep flags for every query
    let keep = Tensor::from_vec(vec![1.0, 0.0, 2.0, 0.0, 0.0, 1.0], &[2, 3]).unwrap();
    let m = key_padding_mask(&keep, 2).unwrap();
    assert_eq!(m.shape(), &[2, 2, 3]);
    let flags = keep.to_vec();
    let mut expected = vec![];
    for b in 0..2 {
        for _ in 0..2 {
            expected.extend(
                flags[b * 3..b * 3 + 3]
                    .iter()
                    .map(|&v| (v != 0.0) as u8 as f32),
            );
        }
    }
    assert_eq!(m.to_vec(), expected);
    // a query length no memory holds (it aborted), and one beside an empty key axis (it
    // looped usize::MAX times)
    for keep in [
        Tensor::ones(&[1, 1]).unwrap(),
        Tensor::zeros(&[1, 0]).unwrap(),
    ] {
        for len in [usize::MAX, 1 << 40] {
            let err = key_padding_mask(&keep, len).unwrap_err().to_string();
            assert!(err.contains("elements"), "{err}");
        }
    }
}

#[test]
fn layer_sizes_that_overflow_are_refused() {
    support::checked_cpu_default();
    let big = 1usize << 62;
    assert!(Conv2d::new(big, 4, 3, Conv2dOptions::default(), 0).is_err());
    assert!(Conv2d::new(4, 4, 1 << 33, Conv2dOptions::default(), 0).is_err());
    assert!(small_cnn(1, 8, 4, big, 0).is_err());
    assert!(Lstm::new(4, big, 0).is_err());
    assert!(Gru::new(4, 1 << 63, 0).is_err());
    assert!(SpectralConv1d::new(big, big, 2, 0).is_err());
}

#[test]
fn a_context_longer_than_any_text_is_refused_plainly() {
    support::checked_cpu_default();
    let text = "hello, world";
    let vocab = CharVocab::from_text(text);
    for seq_len in [usize::MAX, usize::MAX - 1, text.chars().count()] {
        let err = char_lm_dataset(text, &vocab, seq_len, 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than seq_len characters"), "{err}");
    }
    let ds = char_lm_dataset(text, &vocab, text.chars().count() - 1, 1).unwrap();
    assert_eq!(ds.len(), 1);
}

#[test]
fn a_hand_built_graph_is_validated_before_its_backward_is_appended() {
    let mut g = Graph {
        format: "torchlean.ir.v1".into(),
        inputs: vec![],
        parameters: vec![],
        nodes: vec![],
        outputs: vec![OutputDecl {
            name: "loss".into(),
            node: 7,
        }],
    };
    assert!(append_backward(&mut g, "loss", None).is_err());
}

#[test]
fn spec_arrays_whose_fields_disagree_are_refused() {
    let bad = Array {
        shape: vec![2, 2],
        data: vec![1.0f64],
    };
    let good = Array::from_vec(vec![2, 2], vec![1.0f64; 4]).unwrap();
    let err = spec::forward(&torchlean::graph::Op::Matmul, &[&bad, &good])
        .unwrap_err()
        .to_string();
    assert!(err.contains("got 1 elements of data"), "{err}");
    let out = spec::forward(&torchlean::graph::Op::Matmul, &[&good, &good]).unwrap();
    assert!(spec::vjp(&torchlean::graph::Op::Matmul, &[&good, &good], &out, &bad).is_err());
}

#[test]
fn an_fno_whose_blocks_were_edited_out_of_step_is_an_error() {
    support::checked_cpu_default();
    let config = FnoConfig {
        in_channels: 1,
        out_channels: 1,
        width: 4,
        modes: 2,
        blocks: 2,
    };
    let mut fno = Fno1d::new(config, 0).unwrap();
    let x = Tensor::randn(&[1, 1, 8], 1).unwrap();
    assert_eq!(fno.forward(&x).unwrap().shape(), &[1, 1, 8]);
    fno.spectral.pop();
    let err = fno.forward(&x).unwrap_err().to_string();
    assert!(
        err.contains("1 spectral blocks and 2 pointwise layers"),
        "{err}"
    );
    fno.spectral.clear();
    fno.pointwise.clear();
    assert!(fno.forward(&x).is_err());
}

/// A module of the user's own that names two parameters alike.
struct Twins {
    a: Tensor,
    b: Tensor,
}

impl Module for Twins {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        vec![("w".into(), &self.a), ("w".into(), &self.b)]
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("w".into(), &mut self.a), ("w".into(), &mut self.b)]
    }
}

#[test]
fn a_checkpoint_is_not_loaded_into_a_module_that_names_two_tensors_alike() {
    support::checked_cpu_default();
    let dir = std::env::temp_dir().join(format!("torchlean-twins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    torchlean::tensor::io::write_safetensors(
        &path,
        &[("w".to_string(), Tensor::ones(&[3]).unwrap())],
        None,
    )
    .unwrap();
    let mut twins = Twins {
        a: Tensor::zeros(&[3]).unwrap(),
        b: Tensor::zeros(&[5]).unwrap(),
    };
    let err = torchlean::nn::load_checkpoint(&path, &mut twins, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("names two of its parameters or buffers `w`"),
        "{err}"
    );
    assert_eq!(twins.b.to_vec(), vec![0.0; 5]);
    let _ = std::fs::remove_dir_all(&dir);
}
