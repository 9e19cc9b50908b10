//! CSV, NPY and IDX loaders on files written to a temp dir: valid files round-trip, and every
//! malformed file (truncated, bad magic, wrong sizes, huge declared dims, bad text) is a
//! `DataError` naming the file — never a panic or a huge allocation.

mod support;
use std::path::{Path, PathBuf};
use torchlean::data::{
    load_csv, load_csv_classes, load_idx, load_mnist, load_npy, load_npy_dataset, save_npy,
    write_idx, CsvOptions, DataError, Header, LabelColumn,
};
use torchlean::{Error, Tensor};

/// A fresh directory under the system temp dir, removed when dropped.
struct TmpDir(PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

fn tmpdir(name: &str) -> TmpDir {
    let d = std::env::temp_dir().join(format!("torchlean-data-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Asserts a malformed-file error naming `file` and containing `needle`.
fn malformed<T: std::fmt::Debug>(r: torchlean::Result<T>, file: &str, needle: &str) {
    match r {
        Err(Error::Data(DataError::Malformed { path, reason, .. })) => {
            assert!(path.ends_with(file), "path {path} should name {file}");
            assert!(
                reason.contains(needle),
                "reason `{reason}` should mention `{needle}`"
            );
        }
        other => panic!("expected a malformed-file error for {file}, got {other:?}"),
    }
}

/// The default label column: the last, unless the header names another column like a label
/// and not the last (Kaggle's MNIST CSV: `label,pixel0,…`, whose last pixel was read as the
/// label); several such names are refused; another delimiter is named in the error.
#[test]
fn csv_default_label_column_follows_a_label_named_in_the_header() {
    support::checked_cpu_default();
    let d = tmpdir("csv-auto-label");
    let read = |name: &str, text: &[u8]| load_csv(write(&d, name, text), &CsvOptions::default());
    let ds = read("kaggle.csv", b"label,pixel0,pixel1\n3,0,255\n7,12,0\n").unwrap();
    assert_eq!(ds.targets().unwrap().to_vec(), vec![3.0, 7.0]);
    assert_eq!(ds.features().unwrap().to_vec(), vec![0.0, 255.0, 12.0, 0.0]);
    // any case, trimmed; `target` and `class` too
    for name in [" Target ", "CLASS"] {
        let text = format!("a,{name},b\n1,5,2\n3,6,4\n");
        let ds = read("named.csv", text.as_bytes()).unwrap();
        assert_eq!(ds.targets().unwrap().to_vec(), vec![5.0, 6.0], "{name}");
    }
    // not `y`: a header `x,y,cluster` names coordinates (the label was y, 10 classes)
    let ds = read("xy.csv", b"x,y,cluster\n1,5,0\n3,6,1\n").unwrap();
    assert_eq!(ds.targets().unwrap().to_vec(), vec![0.0, 1.0]);
    // a name given twice is ambiguous
    let by_name = CsvOptions {
        label: LabelColumn::Name("label".into()),
        ..Default::default()
    };
    let e = load_csv(write(&d, "dup.csv", b"label,a,label\n1,2,0\n"), &by_name)
        .unwrap_err()
        .to_string();
    assert!(e.contains("several columns `label`"), "{e}");
    // one column named like a label, the last: that one; several, one of them the last:
    // refused (the others were read as features in silence: the fifty-first session's CLI
    // audit); none: the last
    let ds = read("last.csv", b"a,label\n1,2\n3,4\n").unwrap();
    assert_eq!(ds.targets().unwrap().to_vec(), vec![2.0, 4.0]);
    for (file, text) in [
        ("two-last.csv", &b"class,label\n1,2\n3,4\n"[..]),
        ("first-last.csv", &b"label,a,target\n0,1,2\n1,3,4\n"[..]),
    ] {
        let e = read(file, text).unwrap_err().to_string();
        assert!(e.contains("several columns like a label"), "{file}: {e}");
    }
    let ds = read("none.csv", b"a,b,c\n1,2,3\n").unwrap();
    assert_eq!(ds.targets().unwrap().to_vec(), vec![3.0]);
    // no header: the last
    let ds = read("bare.csv", b"1,2,3\n4,5,6\n").unwrap();
    assert_eq!(ds.targets().unwrap().to_vec(), vec![3.0, 6.0]);
    // explicit choices are kept
    let last = CsvOptions {
        label: LabelColumn::Last,
        ..Default::default()
    };
    let ds = load_csv(write(&d, "k2.csv", b"label,p\n3,9\n"), &last).unwrap();
    assert_eq!(ds.targets().unwrap().to_vec(), vec![9.0]);
    let e = read("two.csv", b"label,target,x\n1,2,3\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("several columns like a label") && e.contains("0 `label`"),
        "{e}"
    );
    let e = read("semi.csv", b"a;b;label\n1;2;0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("this line holds ';'"), "{e}");
}

#[test]
fn csv_with_header_label_by_name_and_without_header() {
    support::checked_cpu_default();
    let d = tmpdir("csv-ok");
    let p = write(
        &d,
        "a.csv",
        b"x1,label,x2\n1.5,0,2\n-1, 1 ,\"3e2\"\n\n4,2,5\n",
    );
    let opts = CsvOptions {
        label: LabelColumn::Name("label".into()),
        ..Default::default()
    };
    let ds = load_csv(&p, &opts).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(ds.feature_shape(), &[2]);
    assert_eq!(
        ds.features().unwrap().to_vec(),
        vec![1.5, 2.0, -1.0, 300.0, 4.0, 5.0]
    );
    assert_eq!(ds.targets().unwrap().to_vec(), vec![0.0, 1.0, 2.0]);
    // no header (auto-detected), label first, semicolons
    let p = write(&d, "b.csv", b"7;1;2\n8;3;4\n");
    let opts = CsvOptions {
        header: Header::Auto,
        label: LabelColumn::First,
        delimiter: ';',
        integer_labels: false,
        class_names: false,
    };
    let ds = load_csv(&p, &opts).unwrap();
    assert_eq!(ds.targets().unwrap().to_vec(), vec![7.0, 8.0]);
    assert_eq!(ds.features().unwrap().to_vec(), vec![1.0, 2.0, 3.0, 4.0]);
    // a numeric first row forced to be a header is skipped
    let opts = CsvOptions {
        header: Header::Present,
        label: LabelColumn::Index(1),
        delimiter: ';',
        integer_labels: false,
        class_names: false,
    };
    assert_eq!(load_csv(&p, &opts).unwrap().len(), 1);
    // class indices are checked as written: `1.00000001` and `0.99999999` round to the f32
    // integers 1 and 1 and were read as class 1; `2.0` and `1e0` are integers
    let classes = CsvOptions {
        integer_labels: true,
        ..CsvOptions::default()
    };
    for bad in ["1.00000001", "0.99999999", "-1", "16777217", "2.5"] {
        let p = write(&d, "c.csv", format!("1,2,0\n3,4,{bad}\n").as_bytes());
        let e = load_csv(&p, &classes).unwrap_err().to_string();
        assert!(
            e.contains("line 2, column 3") && e.contains("not a class index"),
            "{bad}: {e}"
        );
        // without the option a label is a number like any target
        assert!(load_csv(&p, &CsvOptions::default()).is_ok(), "{bad}");
    }
    let p = write(&d, "c.csv", b"1,2,2.0\n3,4,1e0\n");
    assert_eq!(
        load_csv(&p, &classes).unwrap().targets().unwrap().to_vec(),
        vec![2.0, 1.0]
    );
}

#[test]
fn malformed_csv_files_are_readable_errors() {
    support::checked_cpu_default();
    let d = tmpdir("csv-bad");
    let o = CsvOptions::default();
    malformed(
        load_csv(write(&d, "ragged.csv", b"1,2,3\n4,5\n"), &o),
        "ragged.csv",
        "line 2",
    );
    malformed(
        load_csv(write(&d, "word.csv", b"1,2\n3,x\n"), &o),
        "word.csv",
        "`x` is not a number",
    );
    malformed(
        load_csv(write(&d, "nan.csv", b"1,2\nnan,3\n"), &o),
        "nan.csv",
        "not finite",
    );
    // a finite number beyond f32's range is said to be one (NPY and IDX say the same)
    malformed(
        load_csv(write(&d, "big.csv", b"1,2\n1e39,3\n"), &o),
        "big.csv",
        "`1e39` is beyond the float32 range",
    );
    malformed(
        load_csv(write(&d, "empty.csv", b"\n\n"), &o),
        "empty.csv",
        "no rows",
    );
    malformed(
        load_csv(write(&d, "hdr.csv", b"a,b\n"), &o),
        "hdr.csv",
        "no data rows",
    );
    malformed(
        load_csv(write(&d, "one.csv", b"1\n2\n"), &o),
        "one.csv",
        "two columns",
    );
    malformed(
        load_csv(write(&d, "utf.csv", &[0xff, 0xfe, b'1']), &o),
        "utf.csv",
        "UTF-8",
    );
    let by_name = CsvOptions {
        label: LabelColumn::Name("y".into()),
        ..Default::default()
    };
    malformed(
        load_csv(write(&d, "noname.csv", b"a,b\n1,2\n"), &by_name),
        "noname.csv",
        "no column named",
    );
    malformed(
        load_csv(write(&d, "nohdr.csv", b"1,2\n"), &by_name),
        "nohdr.csv",
        "no header",
    );
    let idx = CsvOptions {
        label: LabelColumn::Index(5),
        ..Default::default()
    };
    malformed(
        load_csv(write(&d, "idx.csv", b"1,2\n"), &idx),
        "idx.csv",
        "out of range",
    );
    match load_csv(d.join("missing.csv"), &o) {
        Err(Error::Data(DataError::Io { path, .. })) => assert!(path.ends_with("missing.csv")),
        other => panic!("expected an IO error, got {other:?}"),
    }
}

/// An .npy file with the given header dict and payload (version 1.0 unless `v2`).
fn npy(dict: &str, payload: &[u8], v2: bool) -> Vec<u8> {
    let mut h = dict.to_string();
    let pre = if v2 { 12 } else { 10 };
    while (pre + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY".to_vec();
    if v2 {
        out.extend_from_slice(&[2, 0]);
        out.extend_from_slice(&(h.len() as u32).to_le_bytes());
    } else {
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    }
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(payload);
    out
}

#[test]
fn npy_round_trips_and_reads_each_supported_dtype() {
    support::checked_cpu_default();
    let d = tmpdir("npy-ok");
    let t = Tensor::from_vec((0..12).map(|v| v as f32 * 0.5 - 2.0).collect(), &[3, 2, 2]).unwrap();
    let p = d.join("t.npy");
    save_npy(&p, &t).unwrap();
    let back = load_npy(&p).unwrap();
    assert_eq!(back.shape(), &[3, 2, 2]);
    assert_eq!(back.to_vec(), t.to_vec());
    let f8: Vec<u8> = [1.25f64, -3.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let p = write(
        &d,
        "f8.npy",
        &npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
            &f8,
            false,
        ),
    );
    assert_eq!(load_npy(&p).unwrap().to_vec(), vec![1.25, -3.0]);
    let i8: Vec<u8> = [7i64, -9, 1 << 20]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let p = write(
        &d,
        "i8.npy",
        &npy(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (3, 1)}",
            &i8,
            true,
        ),
    );
    let t = load_npy(&p).unwrap();
    assert_eq!(t.shape(), &[3, 1]);
    assert_eq!(t.to_vec(), vec![7.0, -9.0, 1048576.0]);
    // integers beyond 2^24 are refused, not rounded (2^53 + 1 was read as 2^53; 2^24 itself
    // is exact)
    for (descr, bytes) in [
        ("<i8", ((1i64 << 53) + 1).to_le_bytes().to_vec()),
        ("<i4", (-(1i32 << 24) - 1).to_le_bytes().to_vec()),
    ] {
        let p = write(
            &d,
            "big.npy",
            &npy(
                &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (1,)}}"),
                &bytes,
                false,
            ),
        );
        malformed(load_npy(&p), "big.npy", "integer beyond 2^24");
    }
    let p = write(
        &d,
        "u1.npy",
        &npy(
            "{\"descr\": \"|u1\", \"fortran_order\": False, \"shape\": (2, 2), }",
            &[0, 1, 128, 255],
            false,
        ),
    );
    assert_eq!(load_npy(&p).unwrap().to_vec(), vec![0.0, 1.0, 128.0, 255.0]);
    let p = write(
        &d,
        "scalar.npy",
        &npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
            &2.5f32.to_le_bytes(),
            false,
        ),
    );
    let s = load_npy(&p).unwrap();
    assert_eq!((s.shape().len(), s.to_vec()), (0, vec![2.5]));
    // a dataset from two files
    save_npy(d.join("x.npy"), &Tensor::ones(&[4, 3]).unwrap()).unwrap();
    save_npy(d.join("y.npy"), &Tensor::zeros(&[4]).unwrap()).unwrap();
    let ds = load_npy_dataset(d.join("x.npy"), d.join("y.npy")).unwrap();
    assert_eq!(
        (ds.len(), ds.feature_shape(), ds.target_shape()),
        (4, &[3][..], &[][..])
    );
    save_npy(d.join("y5.npy"), &Tensor::zeros(&[5]).unwrap()).unwrap();
    assert!(matches!(
        load_npy_dataset(d.join("x.npy"), d.join("y5.npy")),
        Err(Error::Data(DataError::Invalid(_)))
    ));
}

#[test]
fn malformed_npy_files_are_readable_errors() {
    support::checked_cpu_default();
    let d = tmpdir("npy-bad");
    let good = npy(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        &[0u8; 24],
        false,
    );
    malformed(
        load_npy(write(&d, "magic.npy", b"\x93NUMPZ\x01\x00\x10\x00{}")),
        "magic.npy",
        "magic",
    );
    malformed(
        load_npy(write(&d, "short.npy", b"\x93NU")),
        "short.npy",
        "magic",
    );
    malformed(
        load_npy(write(&d, "trunc.npy", &good[..good.len() - 5])),
        "trunc.npy",
        "does not match",
    );
    malformed(
        load_npy(write(&d, "hdrcut.npy", &good[..40])),
        "hdrcut.npy",
        "header declares",
    );
    let mut extra = good.clone();
    extra.extend_from_slice(&[0; 4]);
    malformed(
        load_npy(write(&d, "extra.npy", &extra)),
        "extra.npy",
        "does not match",
    );
    // declared sizes whose byte count overflows or dwarfs the file: rejected before allocating
    let huge = npy(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296, 1000), }",
        &[0; 8],
        false,
    );
    malformed(
        load_npy(write(&d, "huge.npy", &huge)),
        "huge.npy",
        "does not match",
    );
    let big = npy(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }",
        &[0; 8],
        false,
    );
    malformed(
        load_npy(write(&d, "big.npy", &big)),
        "big.npy",
        "does not match",
    );
    let be = npy(
        "{'descr': '>c8', 'fortran_order': False, 'shape': (1,), }",
        &[0; 8],
        false,
    );
    malformed(
        load_npy(write(&d, "be.npy", &be)),
        "be.npy",
        "not supported",
    );
    let c8 = npy(
        "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }",
        &[0; 8],
        false,
    );
    malformed(
        load_npy(write(&d, "c8.npy", &c8)),
        "c8.npy",
        "not supported",
    );
    let fo = npy(
        "{'descr': '<f4', 'fortran_order': True, 'shape': (3), }",
        &[0; 12],
        false,
    );
    malformed(
        load_npy(write(&d, "fortran.npy", &fo)),
        "fortran.npy",
        "not a tuple",
    );
    let junk = npy(
        "{'descr': '<f4', 'shape': (1,), 'fortran_order': False, 'x': 1}",
        &[0; 4],
        false,
    );
    malformed(
        load_npy(write(&d, "key.npy", &junk)),
        "key.npy",
        "unexpected header key",
    );
    let neg = npy(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
        &[0; 4],
        false,
    );
    malformed(
        load_npy(write(&d, "neg.npy", &neg)),
        "neg.npy",
        "shape entry",
    );
    let nodescr = npy("{'fortran_order': False, 'shape': (1,), }", &[0; 4], false);
    malformed(
        load_npy(write(&d, "nodescr.npy", &nodescr)),
        "nodescr.npy",
        "no `descr`",
    );
    let unterminated = npy("{'descr': '<f4", &[], false);
    malformed(
        load_npy(write(&d, "unterm.npy", &unterminated)),
        "unterm.npy",
        "invalid header",
    );
    let mut v9 = good.clone();
    v9[6] = 9;
    malformed(load_npy(write(&d, "v9.npy", &v9)), "v9.npy", "version 9");
}

#[test]
fn idx_round_trips_u8_f32_and_reads_other_types() {
    support::checked_cpu_default();
    let d = tmpdir("idx-ok");
    let imgs = Tensor::from_vec(
        (0..2 * 3 * 4).map(|v| (v * 10 % 256) as f32).collect(),
        &[2, 3, 4],
    )
    .unwrap();
    write_idx(d.join("img.idx"), &imgs, true).unwrap();
    let bytes = std::fs::read(d.join("img.idx")).unwrap();
    assert_eq!(&bytes[..4], &[0, 0, 0x08, 3]);
    assert_eq!(load_idx(d.join("img.idx")).unwrap().to_vec(), imgs.to_vec());
    let f = Tensor::from_vec(vec![1.5, -2.25, 1e-3], &[3]).unwrap();
    write_idx(d.join("f.idx"), &f, false).unwrap();
    assert_eq!(load_idx(d.join("f.idx")).unwrap().to_vec(), f.to_vec());
    // big-endian i16
    let mut b = vec![0, 0, 0x0B, 1, 0, 0, 0, 2];
    b.extend_from_slice(&(-300i16).to_be_bytes());
    b.extend_from_slice(&(7i16).to_be_bytes());
    assert_eq!(
        load_idx(write(&d, "s.idx", &b)).unwrap().to_vec(),
        vec![-300.0, 7.0]
    );
    // MNIST pair
    let labels = Tensor::from_vec(vec![3.0, 9.0], &[2]).unwrap();
    write_idx(d.join("lab.idx"), &labels, true).unwrap();
    let ds = load_mnist(d.join("img.idx"), d.join("lab.idx"), true).unwrap();
    assert_eq!(ds.feature_shape(), &[1, 3, 4]);
    assert_eq!(ds.targets().unwrap().to_vec(), vec![3.0, 9.0]);
    let x = ds.features().unwrap().to_vec();
    assert!((x[1] - 10.0 / 255.0).abs() < 1e-7);
    // every u8 value k reads as k/255 correctly rounded (numpy's `x / 255`, torchvision's
    // `ToTensor`): the quotient in f64 rounded once; a product by f32(1/255) was one ulp off
    // for 126 of the 256 values
    let all = Tensor::from_vec((0..256).map(|v| v as f32).collect(), &[1, 16, 16]).unwrap();
    write_idx(d.join("all.idx"), &all, true).unwrap();
    write_idx(d.join("lab1.idx"), &Tensor::zeros(&[1]).unwrap(), true).unwrap();
    let ds = load_mnist(d.join("all.idx"), d.join("lab1.idx"), true).unwrap();
    for (k, v) in ds.features().unwrap().to_vec().iter().enumerate() {
        assert_eq!(*v, (k as f64 / 255.0) as f32, "pixel value {k}");
    }
    // an image of no pixels is refused naming the images file
    let flat = Tensor::zeros(&[2, 0, 4]).unwrap();
    write_idx(d.join("flat.idx"), &flat, true).unwrap();
    malformed(
        load_mnist(d.join("flat.idx"), d.join("lab.idx"), true),
        "flat.idx",
        "0×4 pixels",
    );
    write_idx(d.join("lab3.idx"), &Tensor::zeros(&[3]).unwrap(), true).unwrap();
    malformed(
        load_mnist(d.join("img.idx"), d.join("lab3.idx"), true),
        "lab3.idx",
        "labels must be",
    );
    malformed(
        load_mnist(d.join("lab.idx"), d.join("lab.idx"), true),
        "lab.idx",
        "images must be",
    );
    // only u8 pixels are divided by 255: f32 images (here already in [0, 1]) are read as
    // they are (every type was divided, so the model saw [0, 1/255])
    let unit = Tensor::from_vec(
        (0..2 * 3 * 4).map(|v| v as f32 / 24.0).collect(),
        &[2, 3, 4],
    )
    .unwrap();
    write_idx(d.join("unit.idx"), &unit, false).unwrap();
    let ds = load_mnist(d.join("unit.idx"), d.join("lab.idx"), true).unwrap();
    assert_eq!(ds.features().unwrap().to_vec(), unit.to_vec());
    // labels are class indices as written: an f64 1.999999999 rounded to the f32 2 was read
    // as class 2
    let mut l = vec![0, 0, 0x0E, 1, 0, 0, 0, 2];
    l.extend_from_slice(&3.0f64.to_be_bytes());
    l.extend_from_slice(&1.999_999_999f64.to_be_bytes());
    malformed(
        load_mnist(d.join("img.idx"), write(&d, "lab_f8.idx", &l), true),
        "lab_f8.idx",
        "label 1.999999999 at index 1 is not a class index",
    );
    // integers beyond 2^24 are refused, not rounded (i32 2^24 + 1 read as 2^24)
    let mut i = vec![0, 0, 0x0C, 1, 0, 0, 0, 2];
    i.extend_from_slice(&(1i32 << 24).to_be_bytes());
    i.extend_from_slice(&((1i32 << 24) + 1).to_be_bytes());
    malformed(
        load_idx(write(&d, "i32.idx", &i)),
        "i32.idx",
        "value 16777217 at index 1",
    );
}

#[test]
fn malformed_idx_files_are_readable_errors() {
    support::checked_cpu_default();
    let d = tmpdir("idx-bad");
    let mut good = vec![0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3];
    good.extend_from_slice(&[1, 2, 3, 4, 5, 6]);
    assert_eq!(
        load_idx(write(&d, "good.idx", &good)).unwrap().shape(),
        &[2, 3]
    );
    malformed(
        load_idx(write(&d, "tiny.idx", &[0, 0])),
        "tiny.idx",
        "too short",
    );
    let mut m = good.clone();
    m[0] = 0x1f;
    malformed(
        load_idx(write(&d, "magic.idx", &m)),
        "magic.idx",
        "bad magic",
    );
    // the formats an IDX path is often given by mistake are named
    malformed(
        load_idx(write(&d, "x.npy", b"\x93NUMPY\x01\x00rest")),
        "x.npy",
        "this is an .npy file",
    );
    malformed(
        load_idx(write(&d, "x.gz", &[0x1f, 0x8b, 8, 0, 0, 0])),
        "x.gz",
        "gzip-compressed",
    );
    let mut m = good.clone();
    m[2] = 0x07;
    malformed(
        load_idx(write(&d, "type.idx", &m)),
        "type.idx",
        "element type",
    );
    let mut m = good.clone();
    m[3] = 0;
    malformed(
        load_idx(write(&d, "dims0.idx", &m)),
        "dims0.idx",
        "number of dimensions",
    );
    let mut m = good.clone();
    m[3] = 200;
    malformed(
        load_idx(write(&d, "dims200.idx", &m)),
        "dims200.idx",
        "number of dimensions",
    );
    malformed(
        load_idx(write(&d, "hdr.idx", &good[..9])),
        "hdr.idx",
        "truncated header",
    );
    malformed(
        load_idx(write(&d, "trunc.idx", &good[..good.len() - 1])),
        "trunc.idx",
        "do not match",
    );
    let mut m = good.clone();
    m.push(7);
    malformed(
        load_idx(write(&d, "long.idx", &m)),
        "long.idx",
        "do not match",
    );
    // 0xFFFFFFFF^3 f64 values: overflow, rejected from the header alone
    let mut huge = vec![0, 0, 0x0E, 3];
    for _ in 0..3 {
        huge.extend_from_slice(&[0xff; 4]);
    }
    huge.extend_from_slice(&[0; 16]);
    malformed(
        load_idx(write(&d, "huge.idx", &huge)),
        "huge.idx",
        "do not match",
    );
    let mut big = vec![0, 0, 0x08, 1, 0x7f, 0xff, 0xff, 0xff];
    big.extend_from_slice(&[0; 10]);
    malformed(
        load_idx(write(&d, "big.idx", &big)),
        "big.idx",
        "do not match",
    );
}

/// Non-finite values are refused the same way in every format (a NaN pixel in an IDX float
/// file once trained to a checkpoint of NaN weights), naming the element and byte offset;
/// an f64 beyond the float32 range counts as non-finite.
#[test]
fn non_finite_values_are_refused_in_every_format() {
    support::checked_cpu_default();
    let d = tmpdir("non-finite");
    for (bad, name) in [
        (f32::NAN, "nan"),
        (f32::INFINITY, "inf"),
        (f32::NEG_INFINITY, "ninf"),
    ] {
        // IDX f32, big-endian: header 4 + 4·2 bytes, element 2 at offset 12 + 2·4 = 20
        let mut idx = vec![0, 0, 0x0D, 2, 0, 0, 0, 2, 0, 0, 0, 2];
        for v in [1.0f32, 2.0, bad, 4.0] {
            idx.extend_from_slice(&v.to_be_bytes());
        }
        let file = format!("{name}.idx");
        malformed(
            load_idx(write(&d, &file, &idx)),
            &file,
            "element 2 (byte offset 20)",
        );
        let payload: Vec<u8> = [1.0f32, bad].iter().flat_map(|v| v.to_le_bytes()).collect();
        let file = format!("{name}.npy");
        let bytes = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
            &payload,
            false,
        );
        malformed(
            load_npy(write(&d, &file, &bytes)),
            &file,
            "element 1 (byte offset 132)",
        );
        let file = format!("{name}.csv");
        let text = format!("1,2,0\n3,{bad},1\n");
        let r = load_csv(write(&d, &file, text.as_bytes()), &CsvOptions::default());
        malformed(r, &file, "line 2, column 2");
    }
    let payload: Vec<u8> = [1.0f64, 1e300]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let bytes = npy(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
        &payload,
        false,
    );
    malformed(
        load_npy(write(&d, "big.npy", &bytes)),
        "big.npy",
        "element 1",
    );
}

/// The first line of a headerless file is data, whatever its defect: a byte-order mark is
/// ignored (the file has two rows, not one), a first row with a missing or non-numeric
/// field is refused (it was taken as a header and dropped without a word), lone-CR line
/// endings are line breaks, and a BOM before a header leaves the first column's name clean.
#[test]
fn a_defective_first_row_is_never_dropped_as_a_header() {
    support::checked_cpu_default();
    let o = CsvOptions::default();
    let ds = torchlean::data::parse_csv("\u{feff}1,2,3\n4,5,6\n", "bom.csv", &o).unwrap();
    assert_eq!(ds.len(), 2);
    assert_eq!(ds.targets().unwrap().to_vec(), vec![3.0, 6.0]);
    for text in [
        "1,,3\n4,5,6\n7,8,9\n",
        "1,NA,3\n4,5,6\n",
        "1,\u{2212}2,3\n4,5,6\n",
    ] {
        let e = torchlean::data::parse_csv(text, "first.csv", &o)
            .expect_err("a defective first row is refused")
            .to_string();
        assert!(e.contains("mixes numbers and text"), "{text:?}: {e}");
    }
    // a first row with no number at all that does not name its columns either (every field
    // a Unicode-minus number, or empty) was dropped as a header, silently
    for text in [
        "\u{2212}1,\u{2212}2,\u{2212}3\n4,5,6\n",
        ",,\n4,5,6\n",
        "x,,y\n4,5,6\n",
    ] {
        let e = torchlean::data::parse_csv(text, "first.csv", &o)
            .expect_err("a nameless first row is refused")
            .to_string();
        assert!(e.contains("are not column names either"), "{text:?}: {e}");
    }
    // pandas' default column names (`DataFrame(array).to_csv(index=False)`) read as
    // numbers: taken as data they added a row and, as a label, a class
    for text in [
        "0,1,2,3\n0.5,1.5,2.5,1\n1.5,0.5,2,0\n",
        "0,1,2,species\n1,2,3,cat\n4,5,6,dog\n",
    ] {
        let names = CsvOptions {
            class_names: true,
            ..Default::default()
        };
        let e = torchlean::data::parse_csv_classes(text, "pandas.csv", &names)
            .expect_err("numbered column names are refused as ambiguous")
            .to_string();
        assert!(e.contains("pandas writes by default"), "{text:?}: {e}");
        let present = CsvOptions {
            header: Header::Present,
            ..names
        };
        let (ds, _) = torchlean::data::parse_csv_classes(text, "pandas.csv", &present).unwrap();
        assert_eq!(ds.len(), 2, "{text:?}");
    }
    // names with digits and underscores are names
    let ds = torchlean::data::parse_csv("x_1,x2,label\n1,2,0\n", "names.csv", &o).unwrap();
    assert_eq!(ds.len(), 1);
    // explicit options still decide
    let absent = CsvOptions {
        header: Header::Absent,
        ..Default::default()
    };
    let e = torchlean::data::parse_csv("1,NA,3\n4,5,6\n", "first.csv", &absent)
        .expect_err("NA is no number")
        .to_string();
    assert!(e.contains("line 1, column 2"), "{e}");
    let ds = torchlean::data::parse_csv("a,b,c\r1,2,3\r4,5,6\r", "cr.csv", &o).unwrap();
    assert_eq!(ds.len(), 2);
    assert_eq!(ds.features().unwrap().to_vec(), vec![1.0, 2.0, 4.0, 5.0]);
    let by_name = CsvOptions {
        label: LabelColumn::Name("y".into()),
        ..Default::default()
    };
    let ds =
        torchlean::data::parse_csv("\u{feff}y,x\r\n1,2\r\n3,4\r\n", "h.csv", &by_name).unwrap();
    assert_eq!(ds.targets().unwrap().to_vec(), vec![1.0, 3.0]);
}

/// Iris as it is usually written: a header and the species by name. With class names
/// allowed, the classes are the sorted distinct names (scikit-learn's `LabelEncoder`), the
/// header is told by the feature columns, and a column mixing numbers and names is refused;
/// without the option a name is an error, as before.
#[test]
fn class_names_in_the_label_column_number_the_classes_in_sorted_order() {
    support::checked_cpu_default();
    let d = tmpdir("csv-names");
    let iris = "sepal_length,sepal_width,petal_length,petal_width,species\n\
                5.1,3.5,1.4,0.2,setosa\n\
                7.0,3.2,4.7,1.4,versicolor\n\
                6.3,3.3,6.0,2.5,virginica\n\
                4.9,3.0,1.4,0.2,\"setosa\"\n\
                6.4,3.2,4.5,1.5,versicolor\n";
    let p = write(&d, "iris.csv", iris.as_bytes());
    let options = CsvOptions {
        class_names: true,
        integer_labels: true,
        ..CsvOptions::default()
    };
    let (ds, names) = load_csv_classes(&p, &options).unwrap();
    assert_eq!(names, ["setosa", "versicolor", "virginica"]);
    assert_eq!(ds.len(), 5);
    assert_eq!(
        ds.targets().unwrap().to_vec(),
        vec![0.0, 1.0, 2.0, 0.0, 1.0]
    );
    assert_eq!(
        ds.features().unwrap().to_vec()[..4].to_vec(),
        vec![5.1, 3.5, 1.4, 0.2]
    );
    // first-seen order is not the numbering: the same rows in another order, same classes
    // (integer features over a first class seen once could be a header: declared absent)
    let shuffled = "1,virginica\n2,setosa\n3,versicolor\n4,setosa\n";
    let p = write(&d, "shuffled.csv", shuffled.as_bytes());
    let absent = CsvOptions {
        header: torchlean::data::Header::Absent,
        ..options.clone()
    };
    let (ds, names) = load_csv_classes(&p, &absent).unwrap();
    assert_eq!(names, ["setosa", "versicolor", "virginica"]);
    assert_eq!(ds.targets().unwrap().to_vec(), vec![2.0, 0.0, 1.0, 0.0]);
    // numeric labels are read as before, with no names
    let p = write(&d, "numeric.csv", b"x,label\n0.5,1\n0.25,0\n");
    let (ds, names) = load_csv_classes(&p, &options).unwrap();
    assert!(names.is_empty());
    assert_eq!(ds.targets().unwrap().to_vec(), vec![1.0, 0.0]);
    // a typo among class indices is not a class
    let p = write(&d, "mixed.csv", b"0.5,1\n0.25,0\n0.75,l\n");
    malformed(
        load_csv_classes(&p, &options),
        "mixed.csv",
        "mixes numbers (line 1) and class names (line 3: `l`)",
    );
    let p = write(&d, "empty_label.csv", b"0.5,a\n0.25,\n");
    malformed(
        load_csv_classes(&p, &options),
        "empty_label.csv",
        "the label is empty",
    );
    // names in a feature column stay an error; and without the option, in the label column
    let p = write(&d, "feature_name.csv", b"0.5,a\nx,b\n");
    malformed(
        load_csv_classes(&p, &options),
        "feature_name.csv",
        "`x` is not a number",
    );
    let p = write(&d, "iris2.csv", iris.as_bytes());
    malformed(
        load_csv(&p, &CsvOptions::default()),
        "iris2.csv",
        "`setosa` is not a number",
    );
}

/// A CSV field shown in a message has its control characters escaped: a NUL or a terminal
/// escape sequence in a data file can neither cut the message short nor drive the terminal
/// (they were printed raw before the thirty-seventh session).
#[test]
fn csv_fields_in_messages_have_control_characters_escaped() {
    let d = tmpdir("control-chars");
    let p = write(&d, "ctl.csv", b"1,2,0\n3,\x1b[2Jx\x00y,1\n");
    let e = torchlean::data::load_csv(&p, &CsvOptions::default()).unwrap_err();
    let text = e.to_string();
    assert!(!text.chars().any(|c| c.is_control()), "{text:?}");
    malformed(
        torchlean::data::load_csv(&p, &CsvOptions::default()),
        "ctl.csv",
        "`\\u{1b}[2Jx\\u{0}y` is not a number",
    );
}

/// Quoted fields as RFC 4180 writes them: a quoted field may hold the delimiter (it was split
/// there, and the file refused for a wrong field count), `""` inside quotes is one quote (a
/// class name), and a quote left open on its line is a readable refusal naming the line.
#[test]
fn quoted_fields_may_hold_the_delimiter() {
    support::checked_cpu_default();
    let o = CsvOptions::default();
    let ds = torchlean::data::parse_csv(
        "\"x\",\"y\",\"label\"\n\"1.5\", 2 ,\"0\"\n3,\"4\",1\n",
        "quoted.csv",
        &o,
    )
    .unwrap();
    assert_eq!(ds.features().unwrap().to_vec(), vec![1.5, 2.0, 3.0, 4.0]);
    assert_eq!(ds.targets().unwrap().to_vec(), vec![0.0, 1.0]);
    let classes = CsvOptions {
        class_names: true,
        ..CsvOptions::default()
    };
    let read = torchlean::data::parse_csv_read(
        "a,b,kind\n1,2,\"cat, big\"\n3,4,\"the \"\"dog\"\"\"\n5,6,\"cat, big\"\n",
        "names.csv",
        &classes,
    )
    .unwrap();
    assert_eq!(read.dataset.len(), 3);
    assert_eq!(
        read.dataset.features().unwrap().to_vec(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(
        read.class_names,
        vec!["cat, big".to_string(), "the \"dog\"".to_string()]
    );
    assert_eq!(
        read.dataset.targets().unwrap().to_vec(),
        vec![0.0, 1.0, 0.0]
    );
    // a quote inside an unquoted field is a character (Python's csv module reads it so)
    let read =
        torchlean::data::parse_csv_read("a,kind\n1,5\" long\n2,x\n", "inch.csv", &classes).unwrap();
    assert_eq!(
        read.class_names,
        vec!["5\" long".to_string(), "x".to_string()]
    );
    let e = torchlean::data::parse_csv("1,2,3\n4,\"5,6\n", "open.csv", &o)
        .expect_err("an open quote")
        .to_string();
    assert!(e.contains("line 2") && e.contains("not closed"), "{e}");
}

/// Blank lines do not count as rows when the loader reserves memory up front: four rows of
/// 20 000 columns followed by a million empty lines (1.3 MB of text) load as four samples —
/// the reservation counted every line (80 GB) and refused the file as out of memory.
#[test]
fn blank_lines_do_not_inflate_a_csv_files_reservation() {
    support::checked_cpu_default();
    let cols = 20_000;
    let mut text = String::new();
    for r in 0..4 {
        let row: Vec<String> = (0..cols).map(|c| ((r + c) % 7).to_string()).collect();
        text.push_str(&row.join(","));
        text.push('\n');
    }
    text.push_str(&"\n".repeat(1_000_000));
    let ds = torchlean::data::parse_csv(&text, "blank.csv", &CsvOptions::default()).unwrap();
    assert_eq!(ds.len(), 4);
    let last: Vec<f32> = (0..4).map(|r| ((r + cols - 1) % 7) as f32).collect();
    assert_eq!(ds.targets().unwrap().to_vec(), last);
    // nor do short lines: a row of `cols` fields takes at least `cols` bytes, so the text
    // bounds the rows; the first short line is refused for its field count
    let head = text.split("\n\n").next().unwrap().to_string();
    let short = format!("{head}\n{}", "x\n".repeat(1_000_000));
    let e = torchlean::data::parse_csv(&short, "short.csv", &CsvOptions::default())
        .expect_err("short lines")
        .to_string();
    assert!(e.contains("line 5: expected 20000 fields, found 1"), "{e}");
}

/// With class names in the label column, a first line of numbers for feature names and a name
/// over the label column (`400,500,species`: wavelengths) read as a data row of a class no
/// other row has — one invented sample and class, exit 0. It is refused as ambiguous unless
/// the header is declared (since the forty-fourth session also where another class is seen
/// once: `400,500,species` over rows with a singleton class was still trained as a sample of
/// a class `species`), and a label that marks a missing value is refused (`NA`, `?`: pandas
/// reads them as missing; they became a class). A first row whose label recurs is data. The
/// forty-third and forty-fourth sessions' audits.
#[test]
fn numeric_headers_over_named_labels_and_missing_labels_are_not_data() {
    use torchlean::data::{parse_csv_read, Header};
    support::checked_cpu_default();
    let classes = CsvOptions {
        class_names: true,
        ..CsvOptions::default()
    };
    let rows = "0.1,0.2,setosa\n0.3,0.4,virginica\n0.5,0.6,setosa\n0.7,0.8,virginica\n";
    for (header, why) in [
        ("400,500,species\n", "is on no other row"),
        ("1,2,species\n", "is on no other row"),
        // decimal names (the forty-sixth session's audit: read as a sample of `species`)
        ("350.5,351.0,species\n", "is on no other row"),
        ("1e3,2.5e3,species\n", "is on no other row"),
    ] {
        let e = parse_csv_read(&format!("{header}{rows}"), "h.csv", &classes)
            .expect_err(header)
            .to_string();
        assert!(e.contains("line 1") && e.contains(why), "{header}: {e}");
        let declared = CsvOptions {
            header: Header::Present,
            ..classes.clone()
        };
        let read = parse_csv_read(&format!("{header}{rows}"), "h.csv", &declared).unwrap();
        assert_eq!(
            (read.dataset.len(), read.class_names.len()),
            (4, 2),
            "{header}"
        );
    }
    let first = CsvOptions {
        label: torchlean::data::LabelColumn::First,
        ..classes.clone()
    };
    let e = parse_csv_read("species,400,500\nsetosa,1,2\nsetosa,3,4\n", "f.csv", &first)
        .expect_err("label first")
        .to_string();
    assert!(e.contains("is on no other row"), "{e}");
    // a first row whose class recurs is data; one of a class seen once is ambiguous even
    // beside another singleton class (a header over such rows, or a rare first sample), and
    // reads as declared
    let read = parse_csv_read(&format!("0.9,1.0,virginica\n{rows}"), "d.csv", &classes).unwrap();
    assert_eq!((read.dataset.len(), read.class_names.len()), (5, 2));
    let singletons = "0.1,0.2,setosa\n0.3,0.4,setosa\n0.5,0.6,virginica\n";
    for first in ["400,500,species\n", "9,10,versicolor\n"] {
        let e = parse_csv_read(&format!("{first}{singletons}"), "r.csv", &classes)
            .expect_err(first)
            .to_string();
        assert!(e.contains("is on no other row"), "{first}: {e}");
    }
    // features with fractions are data, not names: three rows of three classes read
    let read = parse_csv_read(
        "5.1,3.5,setosa\n7.0,3.2,versicolor\n6.3,3.3,virginica\n",
        "i.csv",
        &classes,
    )
    .unwrap();
    assert_eq!((read.dataset.len(), read.class_names.len()), (3, 3));
    let absent = CsvOptions {
        header: Header::Absent,
        ..classes.clone()
    };
    let rare = format!("9,10,versicolor\n{singletons}");
    let read = parse_csv_read(&rare, "r.csv", &absent).unwrap();
    assert_eq!((read.dataset.len(), read.class_names.len()), (4, 3));
    for missing in ["NA", "?", "null", "None", "N/A", "<NA>"] {
        let text = format!("a,b,species\n1,2,setosa\n3,4,{missing}\n5,6,virginica\n");
        let e = parse_csv_read(&text, "m.csv", &classes)
            .expect_err(missing)
            .to_string();
        assert!(
            e.contains("line 3") && e.contains("missing value"),
            "{missing}: {e}"
        );
    }
}

/// The same f64 numbers read to the same f32 bits as CSV text and as an `<f8` NPY file:
/// numpy's (and pandas') float64 parse then `astype(float32)`. Values halfway between two
/// f32s after the f64 parse (1 + 2⁻²⁴, means of two neighbouring f32s, written in their
/// shortest round-trip form as Python's repr writes them) were rounded straight from the
/// decimal to f32 by the CSV reader, 1 ulp away from the NPY reader and numpy (an audit of
/// the forty-fourth session). A value above f32::MAX that rounds to infinity through f64 is
/// refused as beyond the range.
#[test]
fn csv_numbers_round_through_f64_as_the_npy_reader_and_numpy_do() {
    support::checked_cpu_default();
    let d = tmpdir("csv-f64");
    let mut values = vec![
        1.0 + 2f64.powi(-24),
        -(3.0 + 2f64.powi(-22)),
        0.1,
        1e-45,
        7.0,
    ];
    for k in 0..40u32 {
        // the mean of two neighbouring f32s: an exact f64 halfway between them
        let a = 0.37f32 * (k as f32 + 1.0);
        let b = f32::from_bits(a.to_bits() + 1);
        values.push((a as f64 + b as f64) / 2.0);
    }
    let mut csv = String::new();
    for pair in values.chunks(2) {
        let b = pair.get(1).copied().unwrap_or(0.0);
        csv.push_str(&format!("{:?},{:?},0\n", pair[0], b));
    }
    let from_csv = load_csv(write(&d, "v.csv", csv.as_bytes()), &CsvOptions::default())
        .unwrap()
        .features()
        .unwrap()
        .to_vec();
    let mut padded = values.clone();
    if padded.len() % 2 == 1 {
        padded.push(0.0);
    }
    let f8: Vec<u8> = padded.iter().flat_map(|v| v.to_le_bytes()).collect();
    let dict = format!(
        "{{'descr': '<f8', 'fortran_order': False, 'shape': ({}, 2), }}",
        padded.len() / 2
    );
    let from_npy = load_npy(write(&d, "v.npy", &npy(&dict, &f8, false)))
        .unwrap()
        .to_vec();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&from_csv), bits(&from_npy));
    assert_eq!(from_csv[0], 1.0, "1 + 2^-24 ties to even through f64");
    malformed(
        load_csv(
            write(&d, "max.csv", b"3.4028235677973366e38,1,0\n2,3,1\n"),
            &CsvOptions::default(),
        ),
        "max.csv",
        "beyond the float32 range",
    );
}

/// NPY files as numpy writes them beyond little-endian C order: every float, integer and
/// boolean type in both byte orders (`np.array(v, dtype='>i2')`, …), and Fortran order
/// (`np.save(f, x.T)` writes the transpose's memory with `fortran_order: True`), read as
/// `numpy.load(f).astype(np.float32)` does. Refused until the forty-fourth session; and the
/// versions 1.1 and 2.5, and `'shape': (3)` (the integer 3 in Python), which numpy refuses,
/// were read.
#[test]
fn npy_reads_both_byte_orders_every_dtype_and_fortran_order() {
    support::checked_cpu_default();
    let d = tmpdir("npy-more");
    let signed = [1.0f64, -2.0, 3.0];
    let unsigned = [1.0f64, 2.0, 250.0];
    type Enc = fn(f64, bool) -> Vec<u8>;
    // a little-endian encoding, reversed for big-endian (one element)
    fn order(mut b: Vec<u8>, big_endian: bool) -> Vec<u8> {
        if big_endian {
            b.reverse();
        }
        b
    }
    let cases: [(&str, &[f64], Enc); 12] = [
        ("f2", &[1.5, -2.0, 0.0999755859375], |v, be| {
            order((half::f16::from_f64(v)).to_le_bytes().to_vec(), be)
        }),
        ("f4", &[1.5, -2.0, 0.1f32 as f64], |v, be| {
            order((v as f32).to_le_bytes().to_vec(), be)
        }),
        ("f8", &[1.5, -2.0, 0.1], |v, be| {
            order(v.to_le_bytes().to_vec(), be)
        }),
        ("i1", &signed, |v, _| vec![v as i8 as u8]),
        ("i2", &signed, |v, be| {
            order((v as i16).to_le_bytes().to_vec(), be)
        }),
        ("i4", &signed, |v, be| {
            order((v as i32).to_le_bytes().to_vec(), be)
        }),
        ("i8", &signed, |v, be| {
            order((v as i64).to_le_bytes().to_vec(), be)
        }),
        ("u1", &unsigned, |v, _| vec![v as u8]),
        ("u2", &unsigned, |v, be| {
            order((v as u16).to_le_bytes().to_vec(), be)
        }),
        ("u4", &unsigned, |v, be| {
            order((v as u32).to_le_bytes().to_vec(), be)
        }),
        ("u8", &unsigned, |v, be| {
            order((v as u64).to_le_bytes().to_vec(), be)
        }),
        ("b1", &[1.0, 0.0, 1.0], |v, _| vec![v as u8]),
    ];
    for (code, values, enc) in cases {
        for (mark, be) in [
            ("<", false),
            (">", true),
            ("=", false),
            ("|", false),
            ("", false),
        ] {
            let payload: Vec<u8> = values.iter().flat_map(|&v| enc(v, be)).collect();
            let dict =
                format!("{{'descr': '{mark}{code}', 'fortran_order': False, 'shape': (3,), }}");
            let got = load_npy(write(&d, "t.npy", &npy(&dict, &payload, false)))
                .unwrap_or_else(|e| panic!("{mark}{code}: {e}"))
                .to_vec();
            let want: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            assert_eq!(got, want, "{mark}{code}");
        }
    }
    // a 2×3 array in Fortran order: memory holds column after column
    let x = [[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
    let columns: Vec<u8> = (0..3)
        .flat_map(|j| (0..2).map(move |i| (i, j)))
        .flat_map(|(i, j)| x[i][j].to_le_bytes())
        .collect();
    let t = load_npy(write(
        &d,
        "f.npy",
        &npy(
            "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
            &columns,
            false,
        ),
    ))
    .unwrap();
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.to_vec(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // a 2×3×2 Fortran array: element (i, j, k) at i + 2j + 6k
    let vals: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let fbytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let t = load_npy(write(
        &d,
        "f3.npy",
        &npy(
            "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3, 2), }",
            &fbytes,
            false,
        ),
    ))
    .unwrap();
    let mut want = vec![];
    for i in 0..2 {
        for j in 0..3 {
            for k in 0..2 {
                want.push((i + 2 * j + 6 * k) as f32);
            }
        }
    }
    assert_eq!(t.to_vec(), want);
    // what numpy refuses: another minor version, a shape that is not a tuple, a bool byte 2
    let mut v11 = npy(
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
        &[0; 4],
        false,
    );
    v11[7] = 1;
    malformed(
        load_npy(write(&d, "v11.npy", &v11)),
        "v11.npy",
        "version 1.1",
    );
    let b2 = npy(
        "{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }",
        &[2],
        false,
    );
    malformed(
        load_npy(write(&d, "b2.npy", &b2)),
        "b2.npy",
        "boolean byte 2",
    );
    let word = npy(
        "{'descr': '<f4', 'fortran_order': False, 'shape': ('3',), }",
        &[0; 4],
        false,
    );
    malformed(load_npy(write(&d, "w.npy", &word)), "w.npy", "`'3'`");
}

/// A CSV written by pandas with its row index (`df.to_csv(path)`: a first column with an
/// empty name, then 0, 1, 2, …) is refused naming the index and `index=False`, whether the
/// header is found or declared: declaring it trained on the row index as a feature (the
/// refusal's advice until the forty-fourth session).
#[test]
fn a_pandas_row_index_column_is_refused_naming_it() {
    use torchlean::data::{parse_csv_read, Header};
    support::checked_cpu_default();
    let text = ",a,b,label\n0,1.5,2,0\n1,0.5,1,1\n2,2.5,3,0\n";
    for header in [Header::Auto, Header::Present] {
        let opts = CsvOptions {
            header,
            ..CsvOptions::default()
        };
        let e = parse_csv_read(text, "p.csv", &opts)
            .expect_err("a row index column")
            .to_string();
        assert!(e.contains("index=False"), "{e}");
    }
    // written with index=False, it reads
    let read = parse_csv_read(
        "a,b,label\n1.5,2,0\n0.5,1,1\n2.5,3,0\n",
        "p.csv",
        &CsvOptions::default(),
    )
    .unwrap();
    assert_eq!(read.dataset.feature_shape(), &[2]);
}
