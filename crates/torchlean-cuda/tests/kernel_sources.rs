//! The NVRTC program (`torchlean_cuda::nvrtc::program`: every `kernels/*.cu`, as the GPU
//! compiles it) parsed by the host's C++ compiler with `-fsyntax-only`, behind
//! `emu/syntax_prelude.h` (the CPU emulation's CUDA stand-ins, math.h's macros hidden as
//! NVRTC has none). A kernel that does not parse, names something undeclared or uses
//! `INFINITY` fails here, on every machine with a C++ compiler (CI included), instead of at
//! NVRTC time on the GPU machine, where it makes every CUDA test fail (twice in the
//! twenty-ninth session). NVRTC-specific diagnostics beyond C++ still show only on the GPU.
//!
//! Without a C++20 compiler (`$CXX`, else `c++`) the test prints that it was skipped and
//! passes, unless `TORCHLEAN_REQUIRE_EMULATION=1`.

use std::path::Path;
use std::process::Command;

#[test]
fn the_kernel_program_parses_as_cpp_without_math_h() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("torchlean-kernel-syntax-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let program = dir.join("program.cu");
    std::fs::write(&program, torchlean_cuda::nvrtc::program()).expect("write the program");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args(["-std=c++20", "-fsyntax-only", "-x", "c++"])
        .arg(format!("-I{}", root.join("emu").display()))
        .arg("-include")
        .arg(root.join("emu/syntax_prelude.h"))
        .arg(&program)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    match out {
        Err(e) => {
            assert!(
                std::env::var("TORCHLEAN_REQUIRE_EMULATION").as_deref() != Ok("1"),
                "TORCHLEAN_REQUIRE_EMULATION=1 but `{cxx}` cannot run: {e}"
            );
            eprintln!(
                "the_kernel_program_parses_as_cpp_without_math_h: skipped: `{cxx}` cannot run: {e}"
            );
        }
        Ok(out) => assert!(
            out.status.success(),
            "the NVRTC program does not parse:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Every unary derivative that reads the output `y` (`unary_derivative`'s and `unary_grad`'s
/// cases in `elementwise.cu`) is in `unary_vjp`'s `reads_y` list: the vectorized VJP loads
/// `y` only for those and passes `x` in its place otherwise. `tan` (1 + y²) was missing, and
/// the forty-eighth session's H100 run found its VJP wrong everywhere; this finds the class
/// of bug on any machine.
#[test]
fn every_unary_derivative_that_reads_the_output_loads_it() {
    let src = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/elementwise.cu"),
    )
    .expect("elementwise.cu");
    let body = |start: &str| -> String {
        let from = src
            .find(start)
            .unwrap_or_else(|| panic!("`{start}` in elementwise.cu"));
        let rest = &src[from..];
        // up to the function's end: the first line that is exactly "}"
        let end = rest.find("\n}\n").expect("the function's end");
        rest[..end].to_string()
    };
    let reads_y = |expr: &str| {
        expr.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == "y")
    };
    let mut need = std::collections::BTreeSet::new();
    for line in body("float unary_derivative(").lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("case ") {
            if let Some((op, expr)) = rest.split_once(':') {
                if reads_y(expr) {
                    need.insert(op.trim().to_string());
                }
            }
        }
    }
    for line in body("float unary_grad(").lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("if (op == ") {
            if let Some((op, expr)) = rest.split_once(')') {
                if reads_y(expr) {
                    need.insert(op.trim().to_string());
                }
            }
        }
    }
    assert!(
        need.contains("U_EXP"),
        "the parse found no y-reading derivative: {need:?}"
    );
    let vjp = body("void unary_vjp(");
    let list_start = vjp.find("bool reads_y =").expect("reads_y in unary_vjp");
    let list = &vjp[list_start..list_start + vjp[list_start..].find(';').expect("its end")];
    // whole names (`U_TAN` is a prefix of `U_TANH`)
    let loaded: std::collections::BTreeSet<&str> = list
        .split("op ==")
        .skip(1)
        .filter_map(|s| {
            s.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .find(|w| !w.is_empty())
        })
        .collect();
    let missing: Vec<&String> = need
        .iter()
        .filter(|op| !loaded.contains(op.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "derivatives that read y but whose VJP does not load it: {missing:?} (reads_y: {list})"
    );
}

/// The rank limits the `.cu` structs are declared with are the ones their Rust mirrors pass
/// (a mirror larger than its struct would hand the kernel misplaced fields).
#[test]
fn the_kernels_rank_limits_match_their_rust_mirrors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let define = |file: &str, name: &str| -> usize {
        let src =
            std::fs::read_to_string(root.join("kernels").join(file)).expect("a kernel source");
        let line = src
            .lines()
            .find(|l| l.starts_with(&format!("#define {name} ")))
            .unwrap_or_else(|| panic!("#define {name} in {file}"));
        line.rsplit(' ').next().unwrap().parse().expect("a number")
    };
    use torchlean_cuda::kernels::{elementwise, rows};
    assert_eq!(define("elementwise.cu", "MAX_RANK"), elementwise::MAX_RANK);
    assert_eq!(define("rows.cu", "GATHER_MAX_RANK"), rows::MAX_RANK);
    assert_eq!(define("rows.cu", "COPY_MAX_RANK"), rows::MAX_RANK);
}
