//! Numeric CSV files: one sample per line, an optional header, one label column (the
//! target) and the other columns as features [N, F]; targets [N]. The label column may hold
//! class names instead of numbers ([`CsvOptions::class_names`], [`load_csv_classes`]).

use super::dataset::Dataset;
use super::error::DataError;
use super::file;
use crate::error::Result;
use std::borrow::Cow;
use std::path::Path;

const FORMAT: &str = "CSV";

/// Whether the first line is a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// A header when no field of the first line is a number, data when every field is; a
    /// first line that mixes numbers and other text is refused (it is a header with a number
    /// for a name, or a data row with a defect: reading it either way could silently drop
    /// or invent a row). A header whose names are all numbers (pandas' `0,1,2,…` for
    /// unnamed columns) cannot be told from data: it is read as a row — say `Present`.
    Auto,
    Present,
    Absent,
}

/// Which column holds the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelColumn {
    /// The last column, unless the header names one column like a label (`label`,
    /// `labels`, `target`, `class`, any case): then that one (Kaggle's MNIST CSV has `label`
    /// first; reading its last pixel as the label trained a model on the wrong target
    /// without a word). Several such names are refused, also when one of them is the last
    /// (the others would be features): say [`LabelColumn::Name`].
    Auto,
    First,
    Last,
    /// 0-based column index.
    Index(usize),
    /// Column named in the header.
    Name(String),
}

/// How to read a CSV file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    pub header: Header,
    pub label: LabelColumn,
    pub delimiter: char,
    /// The label column holds class indices: each must be a non-negative integer as written
    /// — checked on the value read at f64, before the f32 rounding that made `1.00000001`
    /// the class 1 — and below 2^24 (every such integer is exact in f32).
    pub integer_labels: bool,
    /// The label column may hold class names (`setosa`, `versicolor`, …) instead of numbers:
    /// when none of its fields is a number, the classes are its distinct names in sorted
    /// (byte) order, numbered from 0, as scikit-learn's `LabelEncoder` numbers them;
    /// [`parse_csv_classes`] returns the names. A label column that mixes numbers and names
    /// is refused (a typo among class indices must not become a class). With `Header::Auto`,
    /// the header is told from data by the feature columns alone (a data row's label may be
    /// a name). Without this option a name in the label column is an error, as in any column.
    pub class_names: bool,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            header: Header::Auto,
            label: LabelColumn::Auto,
            delimiter: ',',
            integer_labels: false,
            class_names: false,
        }
    }
}

/// Loads a numeric CSV file (see [`parse_csv`]).
pub fn load_csv(path: impl AsRef<Path>, options: &CsvOptions) -> Result<Dataset> {
    load_csv_classes(path, options).map(|(ds, _)| ds)
}

/// Loads a CSV file whose label column may hold class names (see [`parse_csv_classes`]).
pub fn load_csv_classes(
    path: impl AsRef<Path>,
    options: &CsvOptions,
) -> Result<(Dataset, Vec<String>)> {
    load_csv_read(path, options).map(|r| (r.dataset, r.class_names))
}

/// Loads a CSV file and says which label column it took (see [`parse_csv_read`]).
pub fn load_csv_read(path: impl AsRef<Path>, options: &CsvOptions) -> Result<CsvRead> {
    let path = path.as_ref();
    let bytes = file::read_bytes(path, FORMAT)?;
    let name = file::name(path);
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| DataError::malformed(&name, FORMAT, format!("not UTF-8 text: {e}")))?;
    parse_csv_read(text, &name, options)
}

fn field(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .map_or(s, str::trim)
}

/// The fields of one line, split at `delimiter` outside double quotes (RFC 4180: a quoted
/// field may hold the delimiter, and `""` inside quotes is one quote), each trimmed and
/// unquoted by [`field`] (which removes the quotes kept around a field; an escaped quote
/// inside stays one quote). A line without a quote is split as is (no copy); a quote left
/// open at the end of the line is an error (a field spanning lines is not read).
fn fields(line: &str, delimiter: char) -> std::result::Result<Vec<Cow<'_, str>>, String> {
    // (with `"` itself as the delimiter there are no quoted fields)
    if !line.contains('"') || delimiter == '"' {
        return Ok(line
            .split(delimiter)
            .map(|f| Cow::Borrowed(field(f)))
            .collect());
    }
    let mut out = Vec::new();
    let (mut current, mut quoted, mut chars) = (String::new(), false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                current.push('"');
            }
            // a quote opens a quoted field only at the field's start (after blanks), as
            // Python's csv module reads it: `5" long` is a field with a quote in it
            '"' if quoted || current.trim().is_empty() => {
                quoted = !quoted;
                current.push('"');
            }
            c if c == delimiter && !quoted => {
                out.push(Cow::Owned(field(&current).to_string()));
                current.clear();
            }
            c => current.push(c),
        }
    }
    if quoted {
        return Err(
            "a quoted field is not closed on its line (a field spanning lines is not read)".into(),
        );
    }
    out.push(Cow::Owned(field(&current).to_string()));
    Ok(out)
}

/// The lines of `text`: broken at LF, CRLF and a lone CR (the line ending of old Mac
/// files, which would otherwise read as one long line).
fn split_lines(text: &str) -> impl Iterator<Item = &str> {
    text.split('\n')
        .flat_map(|l| l.strip_suffix('\r').unwrap_or(l).split('\r'))
}

/// A hint for a first line that another delimiter would split (`;`, a tab, `|`), or nothing.
fn delimiter_hint(first: &str, delimiter: char) -> String {
    match [';', '\t', '|']
        .into_iter()
        .find(|&c| c != delimiter && first.contains(c))
    {
        Some(c) => format!(
            " (the fields are split at {delimiter:?}; this line holds {c:?}: a file delimited by another character must be converted, or read with the library's `CsvOptions::delimiter`)"
        ),
        None => String::new(),
    }
}

/// The names that mark a header's column as the label ([`LabelColumn::Auto`]).
/// (Not `y`: a header `x,y,cluster` names coordinates, and `y` was taken as the label.)
const LABEL_NAMES: [&str; 4] = ["label", "labels", "target", "class"];

/// [`LabelColumn::Auto`]'s column of a file of `cols` columns with `header` (if any).
fn auto_label(header: Option<&[String]>, cols: usize) -> std::result::Result<usize, String> {
    let last = cols - 1;
    let Some(names) = header else {
        return Ok(last);
    };
    let named: Vec<usize> = (0..cols)
        .filter(|&c| LABEL_NAMES.contains(&names[c].trim().to_ascii_lowercase().as_str()))
        .collect();
    // several label-like names are ambiguous even when one of them is the last column: the
    // others would be read as features in silence (`label,a,target` trained on `label` as
    // a feature: the fifty-first session's CLI audit)
    match named.as_slice() {
        [] => Ok(last),
        [one] => Ok(*one),
        several => Err(format!(
            "the header names several columns like a label ({}): say which (the CLI's `--label-column NAME` or `--label-column INDEX`, the library's `LabelColumn`); the others would be read as features",
            several
                .iter()
                .map(|&c| format!("{c} `{}`", names[c]))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Parses CSV text (`name` is used in messages). A leading byte-order mark is ignored, empty
/// lines are skipped; every row must have the header's (or first row's) number of fields,
/// all finite numbers.
pub fn parse_csv(text: &str, name: &str, options: &CsvOptions) -> Result<Dataset> {
    parse_csv_classes(text, name, options).map(|(ds, _)| ds)
}

/// [`parse_csv`], with class names in the label column when [`CsvOptions::class_names`]
/// allows them: the dataset's targets are the names' indices in the returned list (sorted);
/// the list is empty when the labels are numbers.
pub fn parse_csv_classes(
    text: &str,
    name: &str,
    options: &CsvOptions,
) -> Result<(Dataset, Vec<String>)> {
    parse_csv_read(text, name, options).map(|r| (r.dataset, r.class_names))
}

/// What [`parse_csv_read`] read: the dataset, the class names (empty for class indices), and
/// the label column it took (0-based, and its header name when there is a header) — so that
/// a caller can say which column [`LabelColumn::Auto`] chose.
#[derive(Debug, Clone)]
pub struct CsvRead {
    pub dataset: Dataset,
    pub class_names: Vec<String>,
    pub label_column: usize,
    pub label_name: Option<String>,
    /// The number of columns.
    pub columns: usize,
}

/// Label spellings that mean a missing value: pandas' default `na_values` and UCI's `?`. In a
/// column of class names they are refused, not taken for a class.
const MISSING_MARKERS: &[&str] = &[
    "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
    "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null", "?",
];

/// [`parse_csv_classes`], with the label column taken.
pub fn parse_csv_read(text: &str, name: &str, options: &CsvOptions) -> Result<CsvRead> {
    let bad =
        |reason: String| -> crate::Error { DataError::malformed(name, FORMAT, reason).into() };
    // a UTF-8 byte-order mark (spreadsheets write one) is not part of the first field
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = split_lines(text)
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .peekable();
    let Some(&(first_line, first)) = lines.peek() else {
        return Err(bad("the file has no rows".into()));
    };
    let first_fields = fields(first, options.delimiter)
        .map_err(|why| bad(format!("line {}: {why}", first_line + 1)))?;
    let first_fields: Vec<&str> = first_fields.iter().map(|f| f.as_ref()).collect();
    // a first line of numbers over a named label column: ambiguous (refused unless the header
    // is declared) if its label is a class no other row has (checked once the rows are read)
    let (mut suspect_header, mut suspect_decimal_header) = (false, false);
    let has_header = match options.header {
        Header::Present => true,
        Header::Absent => false,
        Header::Auto => {
            // with class names allowed, a data row's label may be a name: the header is told
            // by the other columns (when the label column is known without a header)
            let named_label = match (&options.label, options.class_names) {
                (LabelColumn::First, true) => Some(0),
                // (Auto picks another column only by a header's name: a header row is
                // judged the same either way)
                (LabelColumn::Last | LabelColumn::Auto, true) => {
                    Some(first_fields.len().saturating_sub(1))
                }
                (LabelColumn::Index(i), true) => Some(*i),
                _ => None,
            };
            let judged: Vec<&&str> = first_fields
                .iter()
                .enumerate()
                .filter(|(c, _)| Some(*c) != named_label || first_fields.len() < 2)
                .map(|(_, f)| f)
                .collect();
            // `0,1,…,n-1`: the column names pandas writes by default (`DataFrame(array)
            // .to_csv(index=False)`), which read as numbers; taken as data they add a row (and,
            // as a label, a class). (Not `1,2,…`: a row of small integers is common data.)
            let numbered = first_fields.len() >= 2
                && first_fields
                    .iter()
                    .enumerate()
                    .all(|(c, f)| Some(c) == named_label || f.trim() == c.to_string());
            if numbered {
                return Err(bad(format!(
                    "line {}, the first: it reads 0, 1, 2, … in column order, the column names \
                     pandas writes by default, so it could be a header or a data row; say which \
                     (the CLI's `--csv-header present|absent`, the library's `Header::Present` / \
                     `Header::Absent`)",
                    first_line + 1
                )));
            }
            // numbers for feature names (wavelengths, years) and a name over the label column:
            // with class names allowed that reads as a data row of a class that no other row
            // has — the column's name, which would add a sample and a class. Told apart from
            // a data row of a rare class only when its class recurs (judged below).
            if let Some(c) = named_label.filter(|_| first_fields.len() >= 2) {
                let name = first_fields.get(c).map(|f| f.trim()).unwrap_or("");
                // names that are numbers: integers (wavelengths, years, pixel numbers), or
                // decimals (wavelengths `350.5`, time points), which are also how features are
                // written (`5.1`), so those are suspected only where another class recurs
                // (below): until the forty-sixth session decimals were never suspected, and
                // `350.5,351.0,species` over class names trained its header as a sample of a
                // class `species` (pandas reads it as a header)
                let numbers = |integers: bool| {
                    first_fields.iter().enumerate().all(|(i, f)| {
                        let f = f.trim();
                        let digits = f.strip_prefix(['-', '+']).unwrap_or(f);
                        i == c
                            || if integers {
                                !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
                            } else {
                                f.parse::<f32>().is_ok_and(f32::is_finite)
                            }
                    })
                };
                let named = !name.is_empty() && name.parse::<f32>().is_err();
                // judged after the rows are read (their classes counted there, no second pass)
                suspect_header = named && numbers(true);
                suspect_decimal_header = named && !suspect_header && numbers(false);
            }
            let text: Vec<&&str> = judged
                .iter()
                .copied()
                .filter(|f| f.parse::<f32>().is_err())
                .collect();
            if !text.is_empty() && text.len() < judged.len() {
                return Err(bad(format!(
                    "line {}, the first: it mixes numbers and text ({text:?} are not numbers), \
                     so it could be a header with numbers for names or a data row with a \
                     defect; fix the row, or say whether the file has a header (the CLI's \
                     `--csv-header present|absent`, the library's `Header::Present` / \
                     `Header::Absent`){}",
                    first_line + 1,
                    delimiter_hint(first, options.delimiter)
                )));
            }
            // a header names its columns: a first row of no numbers whose fields are not
            // all names (empty fields, `−1` written with a Unicode minus) is a defective data
            // row, which was dropped as a header without a word
            let nameless: Vec<&&&str> = text
                .iter()
                .filter(|f| !f.chars().any(|c| c.is_alphabetic() || c == '_'))
                .collect();
            if !text.is_empty()
                && first_fields.len() >= 2
                && first_fields[0].trim().is_empty()
                && nameless.len() == 1
            {
                return Err(bad(format!(
                    "line {}, the first: a header whose first column has no name, as pandas \
                     writes its row index (`df.to_csv(path)`); a row index is not a feature: \
                     write the file with `df.to_csv(path, index=False)`",
                    first_line + 1
                )));
            }
            if !text.is_empty() && !nameless.is_empty() {
                return Err(bad(format!(
                    "line {}, the first: no field is a number, yet {nameless:?} are not column names either, \
                     so it is neither a header nor a data row; fix the row, or say whether the file has a \
                     header (the CLI's `--csv-header present|absent`, the library's `Header::Present` / \
                     `Header::Absent`){}",
                    first_line + 1,
                    delimiter_hint(first, options.delimiter)
                )));
            }
            !text.is_empty()
        }
    };
    let header: Option<Vec<String>> = if has_header {
        lines.next();
        Some(first_fields.iter().map(|s| s.to_string()).collect())
    } else {
        None
    };
    // pandas' `df.to_csv()` writes its row index as a first column with an empty name: an
    // index is not a feature (declaring the header trained on it, an audit of the
    // forty-fourth session)
    if header
        .as_ref()
        .is_some_and(|h| h.len() >= 2 && h[0].trim().is_empty())
    {
        return Err(bad(format!(
            "line {}: the first column has no name, as in the file pandas writes with its row \
             index (`df.to_csv(path)`); a row index is not a feature: write the file with \
             `df.to_csv(path, index=False)`",
            first_line + 1
        )));
    }
    let cols = first_fields.len();
    if cols < 2 {
        return Err(bad(format!(
            "need at least two columns (features and a label), found {cols} (delimiter {:?}){}",
            options.delimiter,
            delimiter_hint(first, options.delimiter)
        )));
    }
    let label = match &options.label {
        LabelColumn::Auto => auto_label(header.as_deref(), cols).map_err(bad)?,
        LabelColumn::First => 0,
        LabelColumn::Last => cols - 1,
        LabelColumn::Index(i) if *i < cols => *i,
        LabelColumn::Index(i) => {
            return Err(bad(format!(
                "label column {i} is out of range for {cols} columns"
            )))
        }
        LabelColumn::Name(n)
            if header
                .as_ref()
                .is_some_and(|h| h.iter().filter(|c| *c == n).count() > 1) =>
        {
            return Err(bad(format!(
                "the header names several columns `{}`: give the label column by its 0-based index",
                printable(n)
            )))
        }
        LabelColumn::Name(n) => match &header {
            Some(h) => h.iter().position(|c| c == n).ok_or_else(|| {
                // the first names and the count (a header may have 785 columns)
                let shown: Vec<&String> = h.iter().take(8).collect();
                let more = if h.len() > 8 {
                    format!(" … ({} columns)", h.len())
                } else {
                    String::new()
                };
                bad(format!(
                    "no column named `{}` in the header {shown:?}{more}",
                    printable(n)
                ))
            })?,
            None => {
                return Err(bad(format!(
                    "label column `{n}` given by name, but the file has no header"
                )))
            }
        },
    };
    // reserved up front, fallibly: every row read has `cols` fields (so at least cols - 1
    // delimiters), so this is at most a few times the text's size, and a text the process has
    // no memory for is an error. Only the lines read count: blank ones are skipped (a
    // million empty lines after four rows of 20 000 columns reserved 80 GB and failed)
    // (and a row of `cols` fields holds at least `cols` bytes, so no more rows than that fit
    // in the text: lines of other lengths are refused below, row by row)
    let rows = split_lines(text)
        .filter(|l| !l.trim().is_empty())
        .count()
        .min(text.len() / cols.max(1) + 1);
    let mut features: Vec<f32> = Vec::new();
    let mut targets: Vec<f32> = Vec::new();
    let want = rows.saturating_mul(cols);
    if features.try_reserve_exact(want).is_err() || targets.try_reserve_exact(rows).is_err() {
        return Err(DataError::OutOfMemory {
            path: name.to_string(),
            format: FORMAT,
            bytes: (want as u64 + rows as u64).saturating_mul(4),
        }
        .into());
    }
    // class names met so far, numbered in the order first seen (renumbered sorted below),
    // and the first line of a numeric and of a named label (a column may not mix them)
    let mut classes: std::collections::HashMap<String, usize> = Default::default();
    let (mut numeric_at, mut named_at): (Option<usize>, Option<(usize, String)>) = (None, None);
    for (lineno, line) in lines {
        let owned = fields(line, options.delimiter)
            .map_err(|why| bad(format!("line {}: {why}", lineno + 1)))?;
        let fields: Vec<&str> = owned.iter().map(|f| f.as_ref()).collect();
        if fields.len() != cols {
            return Err(bad(format!(
                "line {}: expected {cols} fields, found {}",
                lineno + 1,
                fields.len()
            )));
        }
        for (c, f) in fields.iter().enumerate() {
            if c == label && options.class_names && f.parse::<f32>().is_err() {
                if f.is_empty() {
                    return Err(bad(format!(
                        "line {}, column {}: the label is empty",
                        lineno + 1,
                        c + 1
                    )));
                }
                if MISSING_MARKERS.contains(&f.trim()) {
                    return Err(bad(format!(
                        "line {}, column {}: the label `{f}` marks a missing value (as pandas \
                         reads it), not a class; drop or fill the row",
                        lineno + 1,
                        c + 1
                    )));
                }
                named_at.get_or_insert_with(|| (lineno + 1, f.to_string()));
                let next = classes.len();
                let id = *classes.entry(f.to_string()).or_insert(next);
                targets.push(id as f32);
                continue;
            }
            if c == label {
                numeric_at.get_or_insert(lineno + 1);
            }
            // read as f64, then rounded to f32: numpy's (and pandas') float64 parse followed by
            // `astype(float32)`, which the NPY and IDX readers' f64 files match too. Rounding
            // the decimal straight to f32 differs where the f64 lands halfway between two f32s
            // (`1.0000000596046448`, an f64 mean of two f32s written by repr: 1.0000001
            // straight, 1.0 through f64), a 1-ulp difference between the same data as CSV and
            // as NPY until the forty-fourth session
            let wide: f64 = f.parse().map_err(|_| {
                bad(format!(
                    "line {}, column {}: `{}` is not a number",
                    lineno + 1,
                    c + 1,
                    printable(f)
                ))
            })?;
            let v = wide as f32;
            if !v.is_finite() {
                // a finite number beyond f32's range, or a spelled NaN / infinity
                let beyond = wide.is_finite();
                return Err(bad(format!(
                    "line {}, column {}: value `{}` is {}",
                    lineno + 1,
                    c + 1,
                    printable(f),
                    if beyond {
                        "beyond the float32 range"
                    } else {
                        "not finite"
                    }
                )));
            }
            if c == label && options.integer_labels {
                // the written value (`wide`), not its f32 rounding
                let exact = wide;
                if !(exact >= 0.0
                    && exact.fract() == 0.0
                    && exact < super::finite::EXACT_F32_INTEGER)
                {
                    return Err(bad(format!(
                        "line {}, column {}: label `{}` is not a class index (a non-negative integer below 2^24)",
                        lineno + 1,
                        c + 1,
                        printable(f)
                    )));
                }
            }
            if c == label {
                targets.push(v);
            } else {
                features.push(v);
            }
        }
    }
    if targets.is_empty() {
        return Err(bad("the file has a header but no data rows".into()));
    }
    if let (Some(n), Some((m, class))) = (numeric_at, named_at) {
        // a name on the first line with numbers below: most likely a header whose other
        // names are numbers (pandas' `0,1,…`), which the default detection reads as data
        let hint = if m == first_line + 1 && options.header == Header::Auto {
            " (if the first line is a header, say so: the CLI's `--csv-header present`, the library's `Header::Present`)"
        } else {
            ""
        };
        return Err(bad(format!(
            "the label column mixes numbers (line {n}) and class names (line {m}: `{}`); \
             labels are either all class indices or all class names{hint}",
            printable(&class)
        )));
    }
    if suspect_header || suspect_decimal_header {
        // targets are first-seen class ids here: the first row's is 0
        let mut counts = vec![0usize; classes.len()];
        for &t in &targets {
            counts[t as usize] += 1;
        }
        // the first row's class on no other row: a header or a data row of a class seen
        // once cannot be told apart (until the forty-fourth session this needed every other
        // class to recur too, and `400,500,species` over rows with another singleton class
        // trained the header as a sample of a class `species`)
        let others = &counts[1.min(counts.len())..];
        let alone = counts.first() == Some(&1)
            && if suspect_header {
                others.iter().sum::<usize>() >= 1
            } else {
                // decimal names: where every class is seen once (three iris rows), the
                // first row reads as data, as it always did
                others.iter().any(|&n| n >= 2)
            };
        if alone {
            let name = classes
                .iter()
                .find(|(_, &id)| id == 0)
                .map(|(n, _)| printable(n))
                .unwrap_or_default();
            return Err(bad(format!(
                "line {}, the first: its label `{name}` is on no other row, so it could be a \
                 header (numbers for feature names, the label column's name) or a data row of \
                 a class seen once; say which (the CLI's \
                 `--csv-header present|absent`, the library's `Header::Present` / \
                 `Header::Absent`)",
                first_line + 1
            )));
        }
    }
    if classes.len() as f64 >= super::finite::EXACT_F32_INTEGER {
        return Err(bad(format!(
            "{} distinct class names: more classes than a float32 target numbers exactly (2^24)",
            classes.len()
        )));
    }
    // the names sorted, and every target renumbered from first-seen to sorted order
    let mut names: Vec<String> = classes.keys().cloned().collect();
    names.sort();
    if !names.is_empty() {
        let sorted: Vec<f32> = {
            let mut by_seen = vec![0f32; names.len()];
            for (rank, n) in names.iter().enumerate() {
                by_seen[classes[n]] = rank as f32;
            }
            by_seen
        };
        for t in targets.iter_mut() {
            *t = sorted[*t as usize];
        }
    }
    Ok(CsvRead {
        dataset: Dataset::from_vecs(features, &[cols - 1], targets, &[])?,
        class_names: names,
        label_column: label,
        label_name: header.as_ref().map(|h| h[label].clone()),
        columns: cols,
    })
}

/// `text` from a data file as a message shows it: control characters (a NUL, a terminal's
/// escape sequences) escaped (`\u{1b}`), so that a hostile field can neither garble nor
/// drive the terminal the message is printed on; everything else as written.
pub fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| -> Box<dyn Iterator<Item = char>> {
            if c.is_control() {
                Box::new(c.escape_default())
            } else {
                Box::new(std::iter::once(c))
            }
        })
        .collect()
}
