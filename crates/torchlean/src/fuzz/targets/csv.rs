//! CSV files: seeds under each parse option (chosen by a leading directive line), a
//! mutator of cells and structure, and the parse under its invariants.

use super::{check_loaded, fnv};
use crate::data::{parse_csv, CsvOptions, Header, LabelColumn};
use crate::fuzz::mutate::{interesting_u64, mutate_bytes, Rng};
use crate::fuzz::{Executed, Refusal};

/// The directive a CSV input may start with, choosing the parse options:
/// `#torchlean-fuzz header=auto|present|absent label=first|last|<index>|name:<column>
/// delimiter=<char>`. Without it, the defaults (`CsvOptions::default()`).
const CSV_DIRECTIVE: &str = "#torchlean-fuzz ";

fn csv_options(text: &str) -> (CsvOptions, &str) {
    let mut o = CsvOptions::default();
    let Some(rest) = text.strip_prefix(CSV_DIRECTIVE) else {
        return (o, text);
    };
    let (line, body) = rest.split_once('\n').unwrap_or((rest, ""));
    for tok in line.split(' ') {
        match tok.split_once('=') {
            Some(("header", "present")) => o.header = Header::Present,
            Some(("header", "absent")) => o.header = Header::Absent,
            Some(("label", "first")) => o.label = LabelColumn::First,
            Some(("label", v)) if v.starts_with("name:") => {
                o.label = LabelColumn::Name(v["name:".len()..].to_string())
            }
            Some(("label", v)) => {
                if let Ok(i) = v.parse() {
                    o.label = LabelColumn::Index(i)
                }
            }
            Some(("delimiter", v)) => {
                if let Some(c) = v.chars().next() {
                    o.delimiter = c;
                }
            }
            _ => {}
        }
    }
    (o, body)
}

pub(super) fn csv_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let row = |i: usize, cols: usize, sep: &str| -> String {
        let mut f: Vec<String> = (0..cols - 1)
            .map(|c| format!("{}", ((i * 7 + c * 3) % 13) as f32 * 0.25 - 1.0))
            .collect();
        f.push(format!("{}", i % 3));
        f.join(sep)
    };
    let body = |cols: usize, rows: usize, sep: &str| -> String {
        (0..rows).map(|i| row(i, cols, sep) + "\n").collect()
    };
    out.push(format!("a,b,label\n{}", body(3, 6, ",")));
    out.push(body(4, 12, ","));
    out.push(format!(
        "{CSV_DIRECTIVE}header=present label=name:y delimiter=;\nx1;y;x2\n{}",
        body(3, 5, ";")
    ));
    out.push(format!(
        "{CSV_DIRECTIVE}label=first delimiter=\t\n{}",
        body(5, 4, "\t")
    ));
    out.push("\"f1\",\"f2\",\"class\"\r\n\"1.5\",\" -2e3 \",\"1\"\r\n\r\n4,5e-3,0\r\n".to_string());
    out.push(format!(
        "{CSV_DIRECTIVE}header=absent label=0\n{}",
        body(2, 3, ",")
    ));
    out.into_iter().map(String::into_bytes).collect()
}

const CSV_FIELDS: &[&str] = &[
    "",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "infinity",
    "1e39",
    "-1e39",
    "3.4028236e38",
    "1e-46",
    "-0",
    "0x10",
    "1_0",
    "\u{663}",
    "\u{2212}1",
    "\"1\"",
    "\"1",
    "1\"",
    "'1'",
    " 1 ",
    "1e",
    "e5",
    "+5",
    ".5",
    "5.",
    "1,5",
    "50000000",
    "1e9",
    "4294967296",
    "-1",
    "0.5",
    "label",
    "x",
    "\u{feff}1",
    "\"\"",
    "\"a,b\"",
    "1;2",
    "\t",
    "9999999999999999999999999999999999999999",
];

/// CSV mutations: fields replaced (non-finite, huge, malformed, quoted, unicode), rows made
/// ragged, duplicated, dropped, swapped or multiplied, delimiters and line ends changed, a
/// BOM or a header inserted, the options directive rewritten.
pub(super) fn mutate_csv(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let text = String::from_utf8_lossy(seed).into_owned();
    let (directive, body) = match text.strip_prefix(CSV_DIRECTIVE) {
        Some(r) => {
            let (d, b) = r.split_once('\n').unwrap_or((r, ""));
            (Some(d.to_string()), b.to_string())
        }
        None => (None, text.clone()),
    };
    let mut directive = directive;
    let sep = if body.contains('\t') {
        '\t'
    } else if body.contains(';') {
        ';'
    } else {
        ','
    };
    let mut rows: Vec<Vec<String>> = body
        .split('\n')
        .map(|l| l.split(sep).map(str::to_string).collect())
        .collect();
    let mut out_sep = sep.to_string();
    let mut eol = "\n".to_string();
    let mut bom = false;
    for _ in 0..rng.range(1, 4) {
        let r = rng.below(rows.len().max(1));
        match rng.below(14) {
            0..=3 => {
                if let Some(row) = rows.get_mut(r) {
                    if !row.is_empty() {
                        let c = rng.below(row.len());
                        row[c] = if rng.one_in(8) {
                            "9".repeat(rng.range(40, 400))
                        } else {
                            rng.pick(CSV_FIELDS).to_string()
                        };
                    }
                }
            }
            4 => {
                if let Some(row) = rows.get_mut(r) {
                    let at = rng.below(row.len() + 1);
                    row.insert(at, rng.pick(CSV_FIELDS).to_string());
                }
            }
            5 => {
                if let Some(row) = rows.get_mut(r) {
                    if !row.is_empty() {
                        let at = rng.below(row.len());
                        row.remove(at);
                    }
                }
            }
            6 if !rows.is_empty() => {
                let copy = rows[r].clone();
                for _ in 0..*rng.pick(&[1usize, 2, 100, 2000]) {
                    rows.push(copy.clone());
                }
            }
            7 if !rows.is_empty() => {
                rows.remove(r);
            }
            8 if rows.len() > 1 => {
                let o = rng.below(rows.len());
                rows.swap(r, o);
            }
            9 => out_sep = [",", ";", "\t", " ", "|", ",,", "\u{e9}", ""][rng.below(8)].to_string(),
            10 => eol = ["\n", "\r\n", "\r", "\n\n", "\n \n"][rng.below(5)].to_string(),
            11 => bom = !bom,
            12 => {
                let header: Vec<String> = (0..rng.range(1, 6))
                    .map(|_| rng.pick(CSV_FIELDS).to_string())
                    .collect();
                rows.insert(0, header);
            }
            _ => {
                let header = ["auto", "present", "absent"][rng.below(3)];
                let label = match rng.below(5) {
                    0 => "first".to_string(),
                    1 => "last".to_string(),
                    2 => interesting_u64(rng).to_string(),
                    3 => rng.below(6).to_string(),
                    _ => format!(
                        "name:{}",
                        rng.pick(&["label", "y", "a", "", "class", "nope"])
                    ),
                };
                let delim =
                    [",", ";", "\t", " ", "|", "\"", "\u{e9}", "1", "-", ".", "e"][rng.below(11)];
                directive = Some(format!("header={header} label={label} delimiter={delim}"));
            }
        }
    }
    let mut s = String::new();
    if bom {
        s.push('\u{feff}');
    }
    if let Some(d) = &directive {
        s.push_str(CSV_DIRECTIVE);
        s.push_str(d);
        s.push('\n');
    }
    let lines: Vec<String> = rows.iter().map(|r| r.join(&out_sep)).collect();
    s.push_str(&lines.join(&eol));
    let mut b = s.into_bytes();
    if rng.one_in(10) {
        mutate_bytes(&mut b, rng, 1);
    }
    b
}

pub(super) fn execute_csv(input: &[u8]) -> Result<Executed, Refusal> {
    // as `load_csv`: the bytes must be UTF-8 text
    let text = std::str::from_utf8(input).map_err(Refusal::of)?;
    let (options, body) = csv_options(text);
    let ds = parse_csv(body, "fuzz.csv", &options).map_err(Refusal::of)?;
    let (f, t) = (
        ds.features().map_err(Refusal::of)?,
        ds.targets().map_err(Refusal::of)?,
    );
    let width: usize = ds.feature_shape().iter().product();
    if f.numel() != ds.len() * width || t.numel() != ds.len() || ds.is_empty() {
        return Ok(Executed::Invariant(format!(
            "{} samples of {:?}, but {} feature and {} target values",
            ds.len(),
            ds.feature_shape(),
            f.numel(),
            t.numel()
        )));
    }
    if let Executed::Invariant(m) = check_loaded(&f) {
        return Ok(Executed::Invariant(m));
    }
    if let Executed::Invariant(m) = check_loaded(&t) {
        return Ok(Executed::Invariant(m));
    }
    // the dataset operations a trainer applies next work on what was accepted
    let shuffled = ds.shuffled(fnv(input));
    let split = ds.split(ds.len() / 2);
    if let Err(e) = shuffled.and(split) {
        return Ok(Executed::Invariant(format!(
            "an accepted dataset cannot be split: {e}"
        )));
    }
    Ok(Executed::Accepted)
}
