//! NPY files: seeds of every supported dtype and order, and a mutator of the header dict.

use super::{ramp, Res, Scratch};
use crate::fuzz::mutate::{interesting_u64, mutate_bytes, poison_f32, Rng};

/// The bytes of an `.npy` file: format `major.minor`, the header dict text (padded with
/// spaces and a newline), the data.
fn npy_bytes(major: u8, minor: u8, dict: &str, data: &[u8], pad: bool) -> Vec<u8> {
    let mut header = dict.to_string();
    let pre = if major == 1 { 10 } else { 12 };
    if pad {
        while (pre + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
    }
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[major, minor]);
    if major == 1 {
        out.extend_from_slice(&(header.len().min(u16::MAX as usize) as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn npy_dict(descr: &str, fortran: &str, shape: &str) -> String {
    format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}")
}

pub(super) fn npy_seeds() -> Res<Vec<Vec<u8>>> {
    let dir = Scratch::new()?;
    let mut out = Vec::new();
    for (k, shape) in [&[3usize, 4][..], &[5], &[2, 3, 2], &[1, 1]]
        .iter()
        .enumerate()
    {
        let p = dir.0.join(format!("{k}.npy"));
        crate::data::save_npy(&p, &ramp(shape, 0.25)?)?;
        out.push(dir.read(&format!("{k}.npy"))?);
    }
    let f8: Vec<u8> = (0..6)
        .flat_map(|i| (i as f64 * 1.5).to_le_bytes())
        .collect();
    out.push(npy_bytes(
        2,
        0,
        &npy_dict("<f8", "False", "(2, 3)"),
        &f8,
        true,
    ));
    let i4: Vec<u8> = (0..4i32).flat_map(|i| (i - 2).to_le_bytes()).collect();
    out.push(npy_bytes(
        1,
        0,
        &npy_dict("<i4", "False", "(4,)"),
        &i4,
        true,
    ));
    let i8: Vec<u8> = (0..4)
        .flat_map(|i| (i as i64 * 1000).to_le_bytes())
        .collect();
    out.push(npy_bytes(
        3,
        0,
        &npy_dict("<i8", "False", "(2, 2)"),
        &i8,
        true,
    ));
    out.push(npy_bytes(
        1,
        0,
        &npy_dict("|u1", "False", "(2, 4)"),
        &[0, 1, 2, 3, 250, 251, 252, 255],
        true,
    ));
    out.push(npy_bytes(
        1,
        0,
        &npy_dict("<f4", "False", "(0, 3)"),
        &[],
        true,
    ));
    out.push(npy_bytes(
        1,
        0,
        &npy_dict("<f4", "False", "()"),
        &1.5f32.to_le_bytes(),
        false,
    ));
    Ok(out)
}

fn dtype_size(descr: &str) -> usize {
    match descr {
        "<f8" | "<i8" => 8,
        "|u1" | "<u1" => 1,
        _ => 4,
    }
}

/// NPY mutations: the dict's descr, fortran_order and shape (extremes, other
/// factorizations, syntax), its keys and syntax; the version; the header length field; the
/// data (poisoned values, truncation, extension).
pub(super) fn mutate_npy(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let text = String::from_utf8_lossy(seed);
    let between = |a: &str, b: &str| -> Option<String> {
        let s = text.find(a)? + a.len();
        let e = text[s..].find(b)? + s;
        Some(text[s..e].to_string())
    };
    let mut descr = between("'descr': '", "'").unwrap_or_else(|| "<f4".into());
    let mut fortran = "False".to_string();
    let mut shape = between("'shape': ", "), ")
        .map(|s| s + ")")
        .unwrap_or_else(|| "(1,)".into());
    let (mut major, mut minor) = (seed.get(6).copied().unwrap_or(1), 0u8);
    let hl = if major == 1 { 10 } else { 12 };
    let header_len = if major == 1 {
        seed.get(8..10)
            .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as usize)
    } else {
        seed.get(8..12)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let mut data = seed.get(hl + header_len..).unwrap_or_default().to_vec();
    let mut dict_edit: Option<u8> = None;
    let mut len_field: Option<u64> = None;
    let mut pad = true;
    for _ in 0..rng.range(1, 3) {
        match rng.below(11) {
            0 => {
                descr = [
                    "<f4", "<f8", "<i4", "<i8", "|u1", "<u1", ">f4", ">i8", "<f2", "|b1", "<c8",
                    "O", "", "<f16", "<U3", "|S4", "<f4'", "f4",
                ][rng.below(18)]
                .into()
            }
            1 => {
                fortran = ["True", "False", "true", "1", "None", "", "Falsey"][rng.below(7)].into()
            }
            2 => {
                // another factorization of the data, or extremes
                let n = (data.len() / dtype_size(&descr)) as u64;
                let dims: Vec<String> = match rng.below(6) {
                    0 => vec![n.to_string()],
                    1 => vec!["1".into(), n.to_string(), "1".into()],
                    2 => vec![interesting_u64(rng).to_string(), "0".into()],
                    3 => (0..rng.range(2, 5))
                        .map(|_| interesting_u64(rng).to_string())
                        .collect(),
                    4 => vec!["-1".into(), n.to_string()],
                    _ => (0..rng.range(30, 36)).map(|_| "1".to_string()).collect(),
                };
                shape = match rng.below(5) {
                    0 => format!("[{}]", dims.join(", ")),
                    1 => format!("({})", dims.join(",")),
                    _ if dims.len() == 1 => format!("({},)", dims[0]),
                    _ => format!("({})", dims.join(", ")),
                };
            }
            3 => {
                shape = [
                    "()",
                    "(,)",
                    "(1,,)",
                    "(",
                    ")",
                    "(3L,)",
                    "(1.5,)",
                    "(0x10,)",
                    "(-0,)",
                    "(18446744073709551616,)",
                    "(   4   ,   )",
                    "((2,),)",
                    "(2, 'a')",
                ][rng.below(13)]
                .into()
            }
            4 => dict_edit = Some(rng.below(8) as u8),
            5 => {
                major = *rng.pick(&[0u8, 1, 2, 3, 4, 255]);
                minor = *rng.pick(&[0u8, 1, 255]);
            }
            6 => len_field = Some(interesting_u64(rng)),
            7 => {
                if descr == "<f8" {
                    // f64 values beyond the f32 range become infinities
                    let n = data.len() / 8;
                    if n > 0 {
                        let i = rng.below(n) * 8;
                        let v = *rng.pick(&[f64::NAN, f64::INFINITY, 1e300, -1e39, 3.5e38, 1e-320]);
                        data[i..i + 8].copy_from_slice(&v.to_le_bytes());
                    }
                } else {
                    poison_f32(&mut data, rng, true);
                }
            }
            8 => {
                let len = data.len();
                if rng.one_in(2) {
                    data.truncate(rng.below(len + 1));
                } else {
                    data.extend(std::iter::repeat_n(0x41u8, rng.range(1, 16)));
                }
            }
            9 => pad = !pad,
            _ => mutate_bytes(&mut data, rng, 1),
        }
    }
    let mut dict = npy_dict(&descr, &fortran, &shape);
    match dict_edit {
        Some(0) => dict = dict.replace("'fortran_order': False, ", ""),
        Some(1) => dict = dict.replace("{", "{'descr': '<f8', "),
        Some(2) => dict = dict.replace("}", "'extra': 1, }"),
        Some(3) => dict = dict.replace('\'', "\""),
        Some(4) => dict = dict.replace("{", "").replace("}", ""),
        Some(5) => dict.push_str(" junk"),
        Some(6) => dict = dict.replace("'descr'", "'d\u{e9}scr'"),
        Some(_) => {
            let mut b = dict.into_bytes();
            mutate_bytes(&mut b, rng, 1);
            dict = String::from_utf8_lossy(&b).into_owned();
        }
        None => {}
    }
    let mut out = npy_bytes(major.clamp(1, 3), minor, &dict, &data, pad);
    out[6] = major;
    if let Some(l) = len_field {
        if major == 1 {
            out[8..10].copy_from_slice(&(l as u16).to_le_bytes());
        } else if out.len() >= 12 {
            out[8..12].copy_from_slice(&(l as u32).to_le_bytes());
        }
    }
    out
}
