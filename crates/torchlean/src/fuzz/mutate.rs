//! The mutation engine: a seeded generator, byte-level mutations, and structure-aware
//! mutations of JSON values and text that every format's mutator builds on.

use crate::spec::splitmix64;
use serde_json::{Map, Number, Value};

/// A SplitMix64 generator: deterministic, fast, and seeded per input.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The generator of input `iteration` of a campaign seeded `seed` (independent of every
    /// other input, so one input is reproduced without replaying the ones before it).
    pub fn for_input(seed: u64, iteration: u64) -> Rng {
        Rng(splitmix64(
            seed ^ splitmix64(iteration.wrapping_add(0x5eed)),
        ))
    }

    pub fn next_u64(&mut self) -> u64 {
        let r = splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        r
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
}

/// Integers at the edges of every size computation.
pub const INTERESTING_U64: &[u64] = &[
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    15,
    16,
    31,
    32,
    63,
    64,
    127,
    128,
    255,
    256,
    1023,
    1024,
    65535,
    65536,
    (1 << 31) - 1,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    (1 << 32) + 1,
    1 << 34,
    1 << 40,
    1 << 53,
    (1 << 53) + 1,
    (1 << 62) + 1,
    (1 << 63) - 1,
    1 << 63,
    u64::MAX - 1,
    u64::MAX,
];

/// Floats at the edges (f32 range, subnormals, signed zero).
pub const INTERESTING_F64: &[f64] = &[
    0.0,
    -0.0,
    0.5,
    -1.0,
    1e-45,
    1e-300,
    5e-324,
    3.4028235e38,
    3.5e38,
    1e39,
    1e300,
    -1e308,
    1.7976931348623157e308,
];

/// Number tokens serde_json cannot produce, written into JSON text directly.
pub const WILD_NUMBERS: &[&str] = &[
    "1e400",
    "-1e400",
    "NaN",
    "nan",
    "Infinity",
    "-Infinity",
    "-0",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "-9223372036854775809",
    "1.0",
    "2.5e1",
    "00",
    "0x10",
    "-",
    "1e",
    ".5",
    "+1",
    "1_000",
];

/// An interesting integer, sometimes perturbed by one.
pub fn interesting_u64(rng: &mut Rng) -> u64 {
    let v = *rng.pick(INTERESTING_U64);
    match rng.below(4) {
        0 => v.wrapping_add(1),
        1 => v.wrapping_sub(1),
        _ => v,
    }
}

/// A replacement JSON value: extreme numbers of every kind, strings, other types.
pub fn interesting_value(rng: &mut Rng, strings: &[&str]) -> Value {
    match rng.below(10) {
        0..=3 => Value::Number(interesting_u64(rng).into()),
        4 => Value::Number(
            (*rng.pick(&[-1i64, -2, -255, i32::MIN as i64, -(1 << 53), i64::MIN])).into(),
        ),
        5 => Number::from_f64(*rng.pick(INTERESTING_F64)).map_or(Value::Null, Value::Number),
        6 => Value::String(rng.pick(strings).to_string()),
        7 => match rng.below(4) {
            0 => Value::Null,
            1 => Value::Bool(rng.one_in(2)),
            2 => Value::Array(vec![]),
            _ => Value::Object(Map::new()),
        },
        8 => Value::String(["NaN", "inf", "-inf", "1e400", "0", "-1"][rng.below(6)].to_string()),
        _ => Value::Number((rng.below(10) as u64).into()),
    }
}

/// Strings every format's mutator may insert.
pub const STRINGS: &[&str] = &[
    "",
    "x",
    "y",
    "loss",
    "grad.x",
    "grad.seed",
    "__metadata__",
    "f32",
    "F32",
    "f16",
    "F16",
    "BF16",
    "F64",
    "I64",
    "I32",
    "U8",
    "BOOL",
    "f64",
    "\u{0}",
    "é∂\u{202e}",
    "\u{fffd}\u{fffd}",
    "torchlean.ir.v1",
    "torchlean.ir.v2",
    "op",
    "input",
    "parameter",
    "constant",
    "vjp",
    "prediction",
    "w",
    "0.weight",
    "optim.adam.m.0.weight",
    "adam",
    "sgd",
    "-1",
    "18446744073709551616",
];

/// Number of nodes (every value) of `v`.
pub fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(o) => o.values().map(count).sum(),
        _ => 0,
    }
}

/// The `n`-th node of `v` in preorder (0 = `v`).
pub fn nth_mut(v: &mut Value, n: usize) -> Option<&mut Value> {
    fn go<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
        if *n == 0 {
            return Some(v);
        }
        *n -= 1;
        match v {
            Value::Array(a) => {
                for c in a.iter_mut() {
                    let k = count(c);
                    if *n < k {
                        return go(c, n);
                    }
                    *n -= k;
                }
                None
            }
            Value::Object(o) => {
                for c in o.values_mut() {
                    let k = count(c);
                    if *n < k {
                        return go(c, n);
                    }
                    *n -= k;
                }
                None
            }
            _ => None,
        }
    }
    let mut n = n;
    go(v, &mut n)
}

/// A copy of a random node of `v`.
pub fn random_subtree(v: &Value, rng: &mut Rng) -> Value {
    let mut copy = v.clone();
    let n = rng.below(count(v));
    nth_mut(&mut copy, n)
        .map(|x| x.clone())
        .unwrap_or(Value::Null)
}

/// One structure-aware mutation of a random node of `doc`: numbers to extremes, strings from
/// `strings`, keys dropped, renamed or added (from `keys`), arrays shuffled, truncated,
/// duplicated or extended, subtrees copied elsewhere, and deep nesting.
pub fn mutate_json(doc: &mut Value, rng: &mut Rng, strings: &[&str], keys: &[&str]) {
    let donor = random_subtree(doc, rng);
    let n = rng.below(count(doc));
    let Some(node) = nth_mut(doc, n) else {
        return;
    };
    if rng.one_in(12) {
        *node = donor;
        return;
    }
    if rng.one_in(40) {
        // deep nesting
        let depth = rng.range(2, 300);
        let mut inner = std::mem::take(node);
        for _ in 0..depth {
            inner = if rng.one_in(2) {
                Value::Array(vec![inner])
            } else {
                let mut m = Map::new();
                m.insert(rng.pick(keys).to_string(), inner);
                Value::Object(m)
            };
        }
        *node = inner;
        return;
    }
    match node {
        Value::Number(num) => {
            *node = match rng.below(5) {
                0 => {
                    let v = num.as_u64().unwrap_or(0);
                    Value::Number(v.wrapping_add(rng.range(1, 3) as u64).into())
                }
                1 => {
                    let v = num.as_u64().unwrap_or(1);
                    Value::Number(v.saturating_sub(1).into())
                }
                2 => {
                    let v = num.as_u64().unwrap_or(1);
                    Value::Number(
                        v.wrapping_mul(*rng.pick(&[2u64, 4, 1 << 16, 1 << 31, 1 << 32]))
                            .into(),
                    )
                }
                _ => interesting_value(rng, strings),
            }
        }
        Value::String(s) => match rng.below(5) {
            0 => {
                let t = *rng.pick(strings);
                s.push_str(t)
            }
            1 => *s = "a".repeat(rng.range(100, 5000)),
            2 => s.clear(),
            _ => *node = interesting_value(rng, strings),
        },
        Value::Bool(b) => {
            if rng.one_in(2) {
                *b = !*b;
            } else {
                *node = interesting_value(rng, strings);
            }
        }
        Value::Null => *node = interesting_value(rng, strings),
        Value::Array(a) => {
            let len = a.len();
            match rng.below(9) {
                0 if len > 0 => {
                    a.remove(rng.below(len));
                }
                1 if len > 0 => {
                    let i = rng.below(len);
                    let c = a[i].clone();
                    a.insert(i, c);
                }
                2 if len > 1 => {
                    let (i, j) = (rng.below(len), rng.below(len));
                    a.swap(i, j);
                }
                3 => a.reverse(),
                4 => a.truncate(rng.below(len + 1)),
                5 => a.push(interesting_value(rng, strings)),
                6 => a.push(donor),
                7 if len > 0 => {
                    let i = rng.below(len);
                    let c = a[i].clone();
                    for _ in 0..rng.range(1, 64) {
                        a.push(c.clone());
                    }
                }
                _ => *node = interesting_value(rng, strings),
            }
        }
        Value::Object(o) => {
            let ks: Vec<String> = o.keys().cloned().collect();
            match rng.below(6) {
                0 | 1 if !ks.is_empty() => {
                    o.remove(&ks[rng.below(ks.len())]);
                }
                2 if !ks.is_empty() => {
                    let k = &ks[rng.below(ks.len())];
                    if let Some(v) = o.remove(k) {
                        o.insert(rng.pick(keys).to_string(), v);
                    }
                }
                3 => {
                    let v = if rng.one_in(2) {
                        donor
                    } else {
                        interesting_value(rng, strings)
                    };
                    o.insert(rng.pick(keys).to_string(), v);
                }
                4 => {
                    o.insert(format!("unknown_{}", rng.below(3)), Value::Number(1.into()));
                }
                _ => *node = interesting_value(rng, strings),
            }
        }
    }
}

/// Text-level mutations of JSON that a `Value` cannot express: number tokens serde_json
/// would never write (`1e400`, `NaN`, `-0`, 2^64), duplicate keys, unbalanced brackets,
/// stray bytes.
pub fn mutate_json_text(text: &mut Vec<u8>, rng: &mut Rng, keys: &[&str]) {
    if text.is_empty() {
        return;
    }
    match rng.below(6) {
        0 | 1 => {
            // replace one number token
            let starts: Vec<usize> = (0..text.len())
                .filter(|&i| {
                    (text[i].is_ascii_digit() || text[i] == b'-')
                        && (i == 0 || !(text[i - 1].is_ascii_alphanumeric() || text[i - 1] == b'.'))
                })
                .collect();
            if starts.is_empty() {
                return;
            }
            let s = *rng.pick(&starts);
            let mut e = s + 1;
            while e < text.len() && (text[e].is_ascii_alphanumeric() || b".+-".contains(&text[e])) {
                e += 1;
            }
            let token = rng.pick(WILD_NUMBERS).as_bytes().to_vec();
            text.splice(s..e, token);
        }
        2 => {
            // duplicate key after an opening brace
            let opens: Vec<usize> = (0..text.len()).filter(|&i| text[i] == b'{').collect();
            if opens.is_empty() {
                return;
            }
            let at = *rng.pick(&opens) + 1;
            let entry = format!(
                "\"{}\":{},",
                rng.pick(keys),
                ["0", "1", "\"x\"", "[]", "{}", "null", "1e400"][rng.below(7)]
            );
            text.splice(at..at, entry.into_bytes());
        }
        3 => {
            // drop or add a bracket, brace, comma, colon or quote
            let structural: Vec<usize> = (0..text.len())
                .filter(|&i| b"{}[],:\"".contains(&text[i]))
                .collect();
            if structural.is_empty() {
                return;
            }
            let at = *rng.pick(&structural);
            if rng.one_in(2) {
                text.remove(at);
            } else {
                let c = *rng.pick(b"{}[],:\"");
                text.insert(at, c);
            }
        }
        4 => {
            // a string token replaced with an escape-heavy one
            let quotes: Vec<usize> = (0..text.len()).filter(|&i| text[i] == b'"').collect();
            if quotes.is_empty() {
                return;
            }
            let at = *rng.pick(&quotes) + 1;
            let s = [
                "\\u0000",
                "\\ud800",
                "\\uDFFF",
                "\\\\",
                "\\\"",
                "\\x",
                "\u{1F600}",
                "\\u00e9",
            ][rng.below(8)];
            text.splice(at..at, s.bytes());
        }
        _ => mutate_bytes(text, rng, 1),
    }
}

/// `rounds` byte-level mutations: bit flips, interesting bytes and words (both endians),
/// inserted, deleted, duplicated and overwritten ranges, truncation and extension.
pub fn mutate_bytes(data: &mut Vec<u8>, rng: &mut Rng, rounds: usize) {
    for _ in 0..rounds {
        let len = data.len();
        match rng.below(11) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xff, b'0', b'9', b' ', b'\n', b'"']);
            }
            2 if len >= 4 => {
                let i = rng.below(len - 3);
                let v = interesting_u64(rng) as u32;
                let b = if rng.one_in(2) {
                    v.to_le_bytes()
                } else {
                    v.to_be_bytes()
                };
                data[i..i + 4].copy_from_slice(&b);
            }
            3 if len >= 8 => {
                let i = rng.below(len - 7);
                let v = interesting_u64(rng);
                let b = if rng.one_in(2) {
                    v.to_le_bytes()
                } else {
                    v.to_be_bytes()
                };
                data[i..i + 8].copy_from_slice(&b);
            }
            4 => {
                let i = rng.below(len + 1);
                let n = rng.range(1, 16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                data.splice(i..i, bytes);
            }
            5 if len > 0 => {
                let i = rng.below(len);
                let n = rng.range(1, (len - i).min(64));
                data.drain(i..i + n);
            }
            6 if len > 0 => {
                let i = rng.below(len);
                let n = rng.range(1, (len - i).min(256));
                let chunk = data[i..i + n].to_vec();
                let at = rng.below(len + 1);
                data.splice(at..at, chunk);
            }
            7 => data.truncate(rng.below(len + 1)),
            8 => {
                let n = rng.range(1, 4096);
                let fill = if rng.one_in(2) {
                    0
                } else {
                    rng.next_u64() as u8
                };
                data.extend(std::iter::repeat_n(fill, n));
            }
            9 if len > 1 => {
                let (i, j) = (rng.below(len), rng.below(len));
                data.swap(i, j);
            }
            _ if len > 0 => {
                let i = rng.below(len);
                data[i] = rng.next_u64() as u8;
            }
            _ => data.push(rng.next_u64() as u8),
        }
    }
}

/// Plain random bytes (sometimes starting with a format's magic `prefix`).
pub fn random_bytes(rng: &mut Rng, prefix: &[u8]) -> Vec<u8> {
    let n = rng.range(0, 512);
    let mut v: Vec<u8> = if rng.one_in(2) {
        prefix.to_vec()
    } else {
        Vec::new()
    };
    v.extend((0..n).map(|_| rng.next_u64() as u8));
    v
}

/// The data bytes of an f32 buffer with a few values replaced by NaN, infinities,
/// subnormals, signed zero or the extremes (little-endian `le`, else big-endian).
pub fn poison_f32(data: &mut [u8], rng: &mut Rng, le: bool) {
    let n = data.len() / 4;
    if n == 0 {
        return;
    }
    for _ in 0..rng.range(1, 3) {
        let i = rng.below(n) * 4;
        let v = *rng.pick(&[
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE / 2.0,
            -0.0,
            1e30,
            2147483648.0,
            -1.0,
            0.5,
        ]);
        let b = if le { v.to_le_bytes() } else { v.to_be_bytes() };
        data[i..i + 4].copy_from_slice(&b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_reproducible_and_independent() {
        let a: Vec<u64> = (0..4).map(|_| Rng::for_input(7, 3).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            Rng::for_input(7, 3).next_u64(),
            Rng::for_input(7, 4).next_u64()
        );
        assert_ne!(
            Rng::for_input(7, 3).next_u64(),
            Rng::for_input(8, 3).next_u64()
        );
    }

    #[test]
    fn nth_mut_visits_every_node() {
        let mut v: Value = serde_json::json!({"a": [1, {"b": 2}], "c": "x"});
        let n = count(&v);
        assert_eq!(n, 6);
        for i in 0..n {
            assert!(nth_mut(&mut v, i).is_some());
        }
        assert!(nth_mut(&mut v, n).is_none());
    }
}
