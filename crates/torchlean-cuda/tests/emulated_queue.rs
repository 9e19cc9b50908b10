//! The launch queue's kernel (`queued_maps` in `kernels/elementwise.cu`), unchanged, run on
//! the CPU under the thread-per-CUDA-thread emulation (`emu/emu.h`, driven by
//! `emu/queue_driver.cpp`) on a table written by the queue's own encoder
//! (`torchlean_cuda::queue::table_entry`): a chain of dependent calls (each reading what an
//! earlier one wrote), binary and unary maps, lengths above and below the block's 256 threads
//! and of one element, against the same arithmetic done here in f32. Only correctly rounded
//! operations are used, so the expected bits are the IEEE ones on any machine. This checks the
//! table's layout, the kernel's decoding and its order on every machine with a C++ compiler
//! (CI included); the GPU test (`gpu_only_conformance.rs::queued_maps_give_the_direct_launches_bits`)
//! checks the queue on the device.
//!
//! Without a C++ compiler to run (`$CXX`, else `c++`) the test prints that it was skipped and
//! passes, unless `TORCHLEAN_REQUIRE_EMULATION=1`; a compiler that runs and rejects the
//! driver fails it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use torchlean_cuda::queue::table_entry;

/// Builds the driver into `dir`: `Err` only when the compiler cannot be run (a compiler that
/// runs and fails is a failure of the test).
fn build(dir: &Path) -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join("queue_driver");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-pthread", "-w"])
        .arg(format!(
            "-DELEMENTWISE_CU=\"{}\"",
            root.join("kernels/elementwise.cu").display()
        ))
        .arg(root.join("emu/queue_driver.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("cannot run `{cxx}`: {e}"))?;
    assert!(
        out.status.success(),
        "`{cxx}` cannot build the driver: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(exe)
}

/// One call: `Some(p)` for a unary map with parameter p; its opcode; n; the arena buffers
/// (indices) it reads (a, b) and writes.
struct Call {
    unary: Option<f32>,
    code: u16,
    n: usize,
    a: usize,
    b: usize,
    out: usize,
}

/// The kernel's per-element function for the opcodes used here (`binary_apply`,
/// `unary_apply`), in f32.
fn apply(c: &Call, x: f32, y: f32) -> f32 {
    match (c.unary, c.code) {
        (None, 0) => x + y,
        (None, 1) => x - y,
        (None, 2) => x * y,
        (None, 3) => x / y,
        (None, 4) => {
            if x < y || y.is_nan() {
                y
            } else {
                x
            }
        }
        (Some(_), 0) => -x,
        (Some(_), 6) => x.max(0.0),
        (Some(p), 7) => x * p,
        (Some(p), 8) => x + p,
        (Some(_), 9) => x.sqrt(),
        (Some(_), 12) => x.abs(),
        other => panic!("opcode {other:?} is not used by this test"),
    }
}

#[test]
fn queued_maps_run_a_dependent_chain_under_cpu_emulation() {
    let dir = std::env::temp_dir().join(format!("torchlean-emu-queue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = match build(&dir) {
        Ok(e) => e,
        Err(why) => {
            if std::env::var("TORCHLEAN_REQUIRE_EMULATION").as_deref() == Ok("1") {
                panic!("TORCHLEAN_REQUIRE_EMULATION=1 but the emulation cannot be built: {why}");
            }
            eprintln!("queued_maps_run_a_dependent_chain_under_cpu_emulation: skipped: {why}");
            return;
        }
    };
    // buffers of LEN floats in one arena: 0 and 1 are inputs, the rest outputs
    const LEN: usize = 300;
    const BUFFERS: usize = 12;
    let b = |u: Option<f32>, code, n, a, b_, out| Call {
        unary: u,
        code,
        n,
        a,
        b: b_,
        out,
    };
    let calls = [
        b(None, 0, LEN, 0, 1, 2),        // x + y
        b(None, 2, LEN, 2, 1, 3),        // (x + y)·y
        b(Some(0.0), 12, LEN, 3, 3, 4),  // |·|
        b(Some(0.0), 9, LEN, 4, 4, 5),   // √
        b(Some(0.5), 7, LEN, 5, 5, 6),   // ·0.5
        b(None, 4, LEN, 6, 0, 7),        // max(·, x)
        b(Some(1.25), 8, 5, 7, 7, 8),    // + 1.25 on 5 elements
        b(Some(0.0), 0, 1, 2, 2, 9),     // −(x + y) on one element
        b(None, 3, 200, 7, 1, 10),       // max(…)/y on 200 elements
        b(None, 1, LEN, 10, 2, 11),      // minus (x + y), past 200: 0 − (x + y)
        b(Some(0.0), 6, LEN, 11, 11, 2), // relu, written over buffer 2 (read by calls 1, 7, 9)
    ];
    let mut arena = vec![0.0f32; LEN * BUFFERS];
    for i in 0..LEN {
        arena[i] = ((i * 37 % 101) as f32 - 50.0) / 7.0;
        arena[LEN + i] = ((i * 11 % 53) as f32 + 1.0) / 13.0;
    }
    let mut want = arena.clone();
    let mut input = Vec::new();
    input.extend((calls.len() as i32).to_le_bytes());
    input.extend((arena.len() as i64).to_le_bytes());
    for v in &arena {
        input.extend(v.to_le_bytes());
    }
    for c in &calls {
        let at = |k: usize| (k * LEN * 4) as u64;
        let words = table_entry(c.unary, c.code, c.n as u32, [at(c.a), at(c.b), at(c.out)]);
        for w in words {
            input.extend(w.to_bits().to_le_bytes());
        }
        for i in 0..c.n {
            want[c.out * LEN + i] = apply(c, want[c.a * LEN + i], want[c.b * LEN + i]);
        }
    }
    let (inp, outp) = (dir.join("queue.bin"), dir.join("arena.bin"));
    std::fs::File::create(&inp)
        .and_then(|mut f| f.write_all(&input))
        .expect("write the table");
    let run = Command::new(&exe)
        .arg(&inp)
        .arg(&outp)
        .output()
        .expect("run the driver");
    assert!(
        run.status.success(),
        "driver failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let got: Vec<f32> = std::fs::read(&outp)
        .expect("read the arena")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(got.len(), want.len(), "the arena's length");
    assert_ne!(want, arena, "the calls change the arena");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "buffer {} element {}: {g} against {w}",
            k / LEN,
            k % LEN
        );
    }
}
