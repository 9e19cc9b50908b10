//! `--plot`: the loss curve as a PNG line plot (axes and curve, no text), drawn with a tiny
//! rasterizer and encoded with the `png` crate.

use crate::{CliError, CliResult};
use std::path::Path;

const W: usize = 640;
const H: usize = 400;
const MARGIN: usize = 30;

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

/// Writes the plot of `losses` (one point per step; a log scale when the positive losses
/// span more than a factor 10) to `path`.
pub fn write_loss_plot(path: &Path, losses: &[f32]) -> CliResult {
    let mut canvas = Canvas::new();
    let (left, bottom) = (MARGIN as i64, (H - MARGIN) as i64);
    let (right, top) = ((W - MARGIN) as i64, MARGIN as i64);
    let axis = [90, 90, 90];
    canvas.line((left, top), (left, bottom), axis);
    canvas.line((left, bottom), (right, bottom), axis);
    let finite: Vec<f32> = losses.iter().copied().filter(|v| v.is_finite()).collect();
    if !finite.is_empty() {
        let lo = finite.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = finite.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log = lo > 0.0 && hi / lo > 10.0;
        let tr = |v: f32| if log { (v as f64).ln() } else { v as f64 };
        let (lo, hi) = (tr(lo), tr(hi));
        let span = if hi > lo { hi - lo } else { 1.0 };
        let n = losses.len().max(2) - 1;
        let mut prev: Option<(i64, i64)> = None;
        for (i, &v) in losses.iter().enumerate() {
            if !v.is_finite() {
                prev = None;
                continue;
            }
            let x = left + ((right - left) as f64 * i as f64 / n as f64).round() as i64;
            let frac = (tr(v) - lo) / span;
            let y = bottom - 2 - ((bottom - top - 4) as f64 * frac).round() as i64;
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
