//! `--plot`: the loss curve as a PNG line plot — axes, the curve, the axes' titles and the
//! values at their ends and middle (the first, middle and last step; the lowest, middle and
//! highest finite loss, the middle a geometric one on a log scale) — drawn with a tiny
//! rasterizer and a 5 × 7 pixel font (`glyphs`), encoded with the `png` crate.

use super::glyphs;
use crate::{CliError, CliResult};
use std::path::Path;

const W: usize = 640;
const H: usize = 400;
/// Room left of the y axis for its values (up to nine characters and a tick).
const LEFT: i64 = 66;
const RIGHT: i64 = 24;
/// Room above the plot for the y axis's title.
const TOP: i64 = 24;
/// Room below the x axis for its values and title.
const BOTTOM: i64 = 40;
const INK: [u8; 3] = [60, 60, 60];

struct Canvas {
    rgb: Vec<u8>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas {
            rgb: vec![255; W * H * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if (0..W as i64).contains(&x) && (0..H as i64).contains(&y) {
            let i = (y as usize * W + x as usize) * 3;
            self.rgb[i..i + 3].copy_from_slice(&c);
        }
    }

    /// `text` with its top-left corner at (x, y).
    fn text(&mut self, x: i64, y: i64, text: &str) {
        for (k, ch) in text.chars().enumerate() {
            let Some(rows) = glyphs::glyph(ch) else {
                continue;
            };
            let x0 = x + k as i64 * glyphs::ADVANCE;
            for (dy, bits) in rows.iter().enumerate() {
                for dx in 0..5 {
                    if bits & (0x10 >> dx) != 0 {
                        self.set(x0 + dx, y + dy as i64, INK);
                    }
                }
            }
        }
    }

    /// A 2-pixel-thick line (Bresenham).
    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3]) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.set(x, y, c);
            self.set(x, y + 1, c);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }
}

/// A value as an axis label: up to four significant digits, in scientific notation below
/// 1e-3 and from 1e5 on.
fn label(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v == 0.0 { "0".into() } else { String::new() };
    }
    let mag = v.abs().log10().floor();
    if !(-3.0..5.0).contains(&mag) {
        return format!("{v:.2e}");
    }
    let decimals = (3.0 - mag).clamp(0.0, 6.0) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Writes the plot of `losses` (one point per step, the first being step `first_step`; a log
/// scale when the positive losses span more than a factor 10) to `path`.
pub fn write_loss_plot(path: &Path, losses: &[f32], first_step: u64) -> CliResult {
    let canvas = draw(losses, first_step);
    let fail = |e: &dyn std::fmt::Display| {
        CliError::runtime(format!("cannot write plot {}: {e}", path.display()))
    };
    let file = torchlean::files::create_output(path).map_err(|e| fail(&e))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), W as u32, H as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(|e| fail(&e))?;
    writer.write_image_data(&canvas.rgb).map_err(|e| fail(&e))?;
    writer.finish().map_err(|e| fail(&e))
}

/// The plot of `losses` (see [`write_loss_plot`]).
fn draw(losses: &[f32], first_step: u64) -> Canvas {
    let mut canvas = Canvas::new();
    let (left, bottom) = (LEFT, H as i64 - BOTTOM);
    let (right, top) = (W as i64 - RIGHT, TOP);
    let axis = [90, 90, 90];
    canvas.line((left, top), (left, bottom), axis);
    canvas.line((left, bottom), (right, bottom), axis);
    // the x axis: the first, middle and last step, and its title
    let n = losses.len().max(2) - 1;
    let x_of = |i: usize| left + ((right - left) as f64 * i as f64 / n as f64).round() as i64;
    // the row of a value at fraction `frac` of the plotted range
    let y_of = |frac: f64| bottom - 2 - ((bottom - top - 4) as f64 * frac).round() as i64;
    let mut ticks = vec![0];
    if losses.len() > 2 {
        ticks.push(n / 2);
    }
    if losses.len() > 1 {
        ticks.push(n);
    }
    for i in ticks {
        let text = (first_step.saturating_add(i as u64)).to_string();
        let x = x_of(i);
        canvas.line((x, bottom), (x, bottom + 3), axis);
        let tx =
            (x - glyphs::width(&text) / 2).clamp(2, (W as i64 - glyphs::width(&text) - 2).max(2));
        canvas.text(tx, bottom + 7, &text);
    }
    canvas.text(
        (left + right - glyphs::width("step")) / 2,
        bottom + 22,
        "step",
    );
    let finite: Vec<f32> = losses.iter().copied().filter(|v| v.is_finite()).collect();
    if !finite.is_empty() {
        let lo = finite.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = finite.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log = lo > 0.0 && hi / lo > 10.0;
        let tr = |v: f32| if log { (v as f64).ln() } else { v as f64 };
        let (lo, hi) = (tr(lo), tr(hi));
        let span = if hi > lo { hi - lo } else { 1.0 };
        canvas.text(4, 6, if log { "loss (log)" } else { "loss" });
        // the y axis: the lowest, middle and highest finite loss (one when they are equal)
        let ys: &[f64] = if hi > lo { &[0.0, 0.5, 1.0] } else { &[0.0] };
        for &frac in ys {
            let v = lo + frac * span;
            let text = label(if log { v.exp() } else { v });
            let y = y_of(frac);
            canvas.line((left - 3, y), (left, y), axis);
            canvas.text(
                left - 5 - glyphs::width(&text),
                y - glyphs::HEIGHT / 2,
                &text,
            );
        }
        let mut prev: Option<(i64, i64)> = None;
        for (i, &v) in losses.iter().enumerate() {
            if !v.is_finite() {
                prev = None;
                continue;
            }
            let x = x_of(i);
            let y = y_of((tr(v) - lo) / span);
            let p = (x, y);
            canvas.line(prev.unwrap_or(p), p, [31, 119, 180]);
            if losses.len() == 1 {
                // one step: a mark, where a line of one point would be a lone pixel
                canvas.line((x - 3, y), (x + 3, y), [31, 119, 180]);
                canvas.line((x, y - 3), (x, y + 3), [31, 119, 180]);
            }
            prev = Some(p);
        }
    }
    canvas
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_read_back_as_their_values_and_every_character_has_a_glyph() {
        let values = [
            0.0,
            1.0,
            -1.0,
            0.6875,
            2.30759,
            1234.5,
            99999.4,
            1.0e5,
            3.7e7,
            0.001,
            0.00099,
            1.5e-9,
            -4.25e-6,
            12.0,
            9.99996,
            0.1 + 0.2,
        ];
        for v in values {
            let text = label(v);
            let back: f64 = text
                .parse()
                .unwrap_or_else(|e| panic!("{v}: {text:?}: {e}"));
            // four significant digits, three in scientific notation
            let tol = if text.contains('e') { 5e-3 } else { 5e-4 };
            assert!(
                (back - v).abs() <= tol * v.abs(),
                "{v} labelled {text:?} reads back as {back}"
            );
            assert!(
                text.chars().count() <= 9,
                "{text:?} is wider than the margin"
            );
            for c in text.chars() {
                assert!(glyphs::glyph(c).is_some(), "no glyph for {c:?} of {text:?}");
            }
        }
        for title in ["step", "loss", "loss (log)"] {
            assert!(title.chars().all(|c| glyphs::glyph(c).is_some()));
        }
        assert_eq!(label(f64::NAN), "");
    }

    /// Whether any pixel of the rectangle [x0, x1) × [y0, y1) is not white.
    fn inked(c: &Canvas, (x0, x1): (i64, i64), (y0, y1): (i64, i64)) -> bool {
        (y0..y1).any(|y| {
            (x0..x1).any(|x| {
                let i = (y as usize * W + x as usize) * 3;
                c.rgb[i..i + 3] != [255, 255, 255]
            })
        })
    }

    #[test]
    fn the_axes_carry_their_values_and_titles() {
        let losses = [2.3f32, 1.2, f32::NAN, 0.4, 0.05];
        let c = draw(&losses, 11);
        let (bottom, top) = (H as i64 - BOTTOM, TOP);
        // y values left of the axis at the top, middle and bottom of the plot
        for y in [top, (top + bottom) / 2, bottom - 2] {
            assert!(
                inked(&c, (0, LEFT - 3), (y - 4, y + 4)),
                "no y label near row {y}"
            );
        }
        // x values under the axis at the first, middle and last step; the titles
        for x in [LEFT, (LEFT + W as i64 - RIGHT) / 2, W as i64 - RIGHT] {
            assert!(
                inked(&c, (x - 6, x + 6), (bottom + 7, bottom + 14)),
                "no x label near {x}"
            );
        }
        assert!(inked(&c, (0, 80), (0, TOP - 4)), "no y title");
        assert!(
            inked(&c, (LEFT, W as i64 - RIGHT), (bottom + 20, H as i64)),
            "no x title"
        );
        // nothing but the curve and axes inside the plot: its labels stay in the margins
        let blank = draw(&[], 1);
        assert!(!inked(&blank, (LEFT + 1, W as i64 - RIGHT), (top, bottom)));
    }
}
