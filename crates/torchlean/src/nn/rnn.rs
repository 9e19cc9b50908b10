//! Recurrent layers: single-layer GRU and LSTM over batch-first [B, T, F] inputs, unrolled
//! over time with `linear`, `slice`, `sigmoid`, `tanh`, `mul`, `add` and `concat` ops.
//!
//! Gate formulas and parameter layout follow `torch.nn.GRU` / `torch.nn.LSTM`:
//! GRU gates (r, z, n) stacked in `weight_ih` [3H, F], `weight_hh` [3H, H]:
//!   r = σ(x W_ir + b_ir + h W_hr + b_hr), z = σ(x W_iz + b_iz + h W_hz + b_hz),
//!   n = tanh(x W_in + b_in + r ⊙ (h W_hn + b_hn)), h' = (1 - z) ⊙ n + z ⊙ h.
//! LSTM gates (i, f, g, o) stacked in [4H, F], [4H, H]:
//!   i, f, o = σ(...), g = tanh(...), c' = f ⊙ c + i ⊙ g, h' = o ⊙ tanh(c').
//! All four parameters are initialized U(-1/sqrt(H), 1/sqrt(H)).

use super::init::{self, derive_seed};
use super::module::Module;
use crate::error::{Error, OpError, Result};
use crate::tensor::Tensor;

/// The four parameters shared by both cells: input and hidden weights and biases.
struct CellParams {
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor,
    bias_hh: Tensor,
}

impl CellParams {
    fn new(what: &str, gates: usize, input: usize, hidden: usize, seed: u64) -> Result<Self> {
        if input == 0 || hidden == 0 {
            return Err(Error::Creation(format!(
                "{what} needs positive input and hidden sizes, got {input} and {hidden}"
            )));
        }
        let b = 1.0 / (hidden as f32).sqrt();
        let g = gates.checked_mul(hidden).ok_or_else(|| {
            Error::Creation(format!(
                "{what}: {gates} gates of hidden size {hidden} are more rows than memory can address"
            ))
        })?;
        Ok(CellParams {
            weight_ih: init::uniform(&[g, input], b, derive_seed(seed, 0))?,
            weight_hh: init::uniform(&[g, hidden], b, derive_seed(seed, 1))?,
            bias_ih: init::uniform(&[g], b, derive_seed(seed, 2))?,
            bias_hh: init::uniform(&[g], b, derive_seed(seed, 3))?,
        })
    }

    fn named(&self) -> Vec<(String, &Tensor)> {
        vec![
            ("weight_ih".to_string(), &self.weight_ih),
            ("weight_hh".to_string(), &self.weight_hh),
            ("bias_ih".to_string(), &self.bias_ih),
            ("bias_hh".to_string(), &self.bias_hh),
        ]
    }

    fn named_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![
            ("weight_ih".to_string(), &mut self.weight_ih),
            ("weight_hh".to_string(), &mut self.weight_hh),
            ("bias_ih".to_string(), &mut self.bias_ih),
            ("bias_hh".to_string(), &mut self.bias_hh),
        ]
    }

    fn input_size(&self) -> usize {
        self.weight_ih.shape()[1]
    }

    /// Checks x [B, T, F]; returns (B, T) and the input projection for every step [B, T, G].
    fn project_inputs(&self, op: &'static str, x: &Tensor) -> Result<(usize, usize, Tensor)> {
        let s = x.shape();
        if s.len() != 3 || s[2] != self.input_size() || s[1] == 0 {
            return Err(Error::Op(OpError::Shape {
                op,
                shapes: vec![s.to_vec()],
                expected: format!("batch-first input [B, T >= 1, {}]", self.input_size()),
            }));
        }
        Ok((s[0], s[1], x.linear(&self.weight_ih, Some(&self.bias_ih))?))
    }
}

fn check_state(op: &'static str, t: &Tensor, b: usize, h: usize) -> Result<()> {
    if t.shape() != [b, h] {
        return Err(Error::Op(OpError::Shape {
            op,
            shapes: vec![t.shape().to_vec()],
            expected: format!("a state of shape [{b}, {h}]"),
        }));
    }
    Ok(())
}

/// The input projection of step `t`: [B, T, G] -> [B, G].
fn step_of(xp: &Tensor, t: usize, b: usize) -> Result<Tensor> {
    let g = xp.shape()[2];
    xp.slice(1, t, t + 1)?.reshape(&[b as isize, g as isize])
}

/// Gate `k` (of width `h`) of a stacked [B, G] tensor.
fn gate(x: &Tensor, k: usize, h: usize) -> Result<Tensor> {
    x.slice(1, k * h, (k + 1) * h)
}

/// Stacks per-step states [B, H] into [B, T, H].
fn stack(states: &[Tensor], b: usize, h: usize) -> Result<Tensor> {
    let rows: Vec<Tensor> = states
        .iter()
        .map(|s| s.reshape(&[b as isize, 1, h as isize]))
        .collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = rows.iter().collect();
    Tensor::concat(&refs, 1)
}

/// A single-layer gated recurrent unit; `forward` returns every hidden state [B, T, H].
pub struct Gru {
    params: CellParams,
    hidden: usize,
}

impl Gru {
    pub fn new(input: usize, hidden: usize, seed: u64) -> Result<Gru> {
        Ok(Gru {
            params: CellParams::new("gru", 3, input, hidden, seed)?,
            hidden,
        })
    }

    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// One step from an already projected input `xp` [B, 3H] and state `h` [B, H].
    fn cell(&self, xp: &Tensor, h: &Tensor) -> Result<Tensor> {
        let p = &self.params;
        let n_h = self.hidden;
        let hp = h.linear(&p.weight_hh, Some(&p.bias_hh))?;
        let r = gate(xp, 0, n_h)?.add(&gate(&hp, 0, n_h)?)?.sigmoid()?;
        let z = gate(xp, 1, n_h)?.add(&gate(&hp, 1, n_h)?)?.sigmoid()?;
        let n = gate(xp, 2, n_h)?
            .add(&r.mul(&gate(&hp, 2, n_h)?)?)?
            .tanh()?;
        // (1 - z) n + z h = n + z (h - n)
        n.add(&z.mul(&h.sub(&n)?)?)
    }

    /// One step on a raw input `x` [B, F] from state `h` [B, H]; returns the new state.
    pub fn step(&self, x: &Tensor, h: &Tensor) -> Result<Tensor> {
        let xp = x.linear(&self.params.weight_ih, Some(&self.params.bias_ih))?;
        self.cell(&xp, h)
    }

    /// Runs the sequence from `h0` (zeros when `None`); returns all states [B, T, H] and the
    /// last state [B, H].
    pub fn forward_with_state(&self, x: &Tensor, h0: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let (b, t, xp) = self.params.project_inputs("gru", x)?;
        let mut h = match h0 {
            Some(h0) => {
                check_state("gru", h0, b, self.hidden)?;
                h0.clone()
            }
            // the initial state lives where the input does (never an implicit copy later)
            None => Tensor::zeros_on(&[b, self.hidden], x.device())?,
        };
        let mut states = Vec::with_capacity(t);
        for step in 0..t {
            h = self.cell(&step_of(&xp, step, b)?, &h)?;
            states.push(h.clone());
        }
        Ok((stack(&states, b, self.hidden)?, h))
    }
}

impl Module for Gru {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_state(x, None)?.0)
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        self.params.named()
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.params.named_mut()
    }
}

/// A single-layer long short-term memory; `forward` returns every hidden state [B, T, H].
pub struct Lstm {
    params: CellParams,
    hidden: usize,
}

impl Lstm {
    pub fn new(input: usize, hidden: usize, seed: u64) -> Result<Lstm> {
        Ok(Lstm {
            params: CellParams::new("lstm", 4, input, hidden, seed)?,
            hidden,
        })
    }

    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// One step from a projected input `xp` [B, 4H] and state (h, c); returns (h', c').
    fn cell(&self, xp: &Tensor, h: &Tensor, c: &Tensor) -> Result<(Tensor, Tensor)> {
        let p = &self.params;
        let n_h = self.hidden;
        let pre = xp.add(&h.linear(&p.weight_hh, Some(&p.bias_hh))?)?;
        let i = gate(&pre, 0, n_h)?.sigmoid()?;
        let f = gate(&pre, 1, n_h)?.sigmoid()?;
        let g = gate(&pre, 2, n_h)?.tanh()?;
        let o = gate(&pre, 3, n_h)?.sigmoid()?;
        let c_next = f.mul(c)?.add(&i.mul(&g)?)?;
        let h_next = o.mul(&c_next.tanh()?)?;
        Ok((h_next, c_next))
    }

    /// One step on a raw input `x` [B, F] from state (h, c) [B, H]; returns (h', c').
    pub fn step(&self, x: &Tensor, h: &Tensor, c: &Tensor) -> Result<(Tensor, Tensor)> {
        let xp = x.linear(&self.params.weight_ih, Some(&self.params.bias_ih))?;
        self.cell(&xp, h, c)
    }

    /// Runs the sequence from `(h0, c0)` (zeros when `None`); returns all hidden states
    /// [B, T, H] and the last (h, c).
    pub fn forward_with_state(
        &self,
        x: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (b, t, xp) = self.params.project_inputs("lstm", x)?;
        let (mut h, mut c) = match state {
            Some((h0, c0)) => {
                check_state("lstm", h0, b, self.hidden)?;
                check_state("lstm", c0, b, self.hidden)?;
                (h0.clone(), c0.clone())
            }
            // the initial state lives where the input does (never an implicit copy later)
            None => (
                Tensor::zeros_on(&[b, self.hidden], x.device())?,
                Tensor::zeros_on(&[b, self.hidden], x.device())?,
            ),
        };
        let mut states = Vec::with_capacity(t);
        for step in 0..t {
            (h, c) = self.cell(&step_of(&xp, step, b)?, &h, &c)?;
            states.push(h.clone());
        }
        Ok((stack(&states, b, self.hidden)?, (h, c)))
    }
}

impl Module for Lstm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_state(x, None)?.0)
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        self.params.named()
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.params.named_mut()
    }
}
