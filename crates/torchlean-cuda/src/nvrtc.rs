//! Run-time compilation of the `.cu` kernel sources by NVRTC, cached on disk.
//!
//! The cache key is a hash of the source, the target architecture and the NVRTC version, so
//! a changed kernel, another GPU or another NVRTC never reuses stale code. The cache lives in
//! `$TORCHLEAN_CACHE_DIR/nvrtc`, else `$XDG_CACHE_HOME/torchlean/nvrtc`, else
//! `$HOME/.cache/torchlean/nvrtc`; an unwritable cache only costs a recompilation. A compile
//! failure is an error carrying NVRTC's log.
//!
//! Owns: compilation and the cache. Must not launch kernels.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;

/// The kernel sources of this module other than flash attention's.
const KERNELS: &[&str] = &[
    include_str!("../kernels/elementwise.cu"),
    include_str!("../kernels/rows.cu"),
    include_str!("../kernels/conv.cu"),
    include_str!("../kernels/spectral.cu"),
];

/// Flash attention's sources (`kernels/attention/`), in the order they are compiled: each
/// uses what the ones before it define.
const ATTENTION: &[&str] = &[
    include_str!("../kernels/attention/common.cu"),
    include_str!("../kernels/attention/split_tf32.cu"),
    include_str!("../kernels/attention/forward.cu"),
    include_str!("../kernels/attention/backward.cu"),
    include_str!("../kernels/attention/backward_mma.cu"),
];

/// The flash-attention part of [`program`]: what the CPU emulation of the flash kernels
/// compiles (tests/emulated_flash.rs).
pub fn attention_program() -> String {
    ATTENTION.join("\n")
}

/// The program NVRTC compiles: every source, in order, compiled together.
pub fn program() -> String {
    KERNELS
        .iter()
        .chain(ATTENTION)
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("TORCHLEAN_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("torchlean")))
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("torchlean"))
        })?;
    Some(base.join("nvrtc"))
}

/// What a compilation produced and whether the cache served it.
pub struct Compiled {
    pub ptx: String,
    pub from_cache: bool,
}

/// PTX for `src` on `arch` (e.g. `compute_90`), from the cache or NVRTC.
pub fn compile(src: &str, arch: &str, nvrtc_version: &str) -> Result<Compiled, String> {
    // a stable hash (the std hasher's output may change between Rust releases)
    let mut h = torchlean::hash::Fnv1a::default();
    (src, arch, nvrtc_version).hash(&mut h);
    let key = format!("{:016x}-{arch}.ptx", h.finish());
    let path = cache_dir().map(|d| d.join(&key));
    if let Some(p) = &path {
        if let Ok(ptx) = std::fs::read_to_string(p) {
            if ptx.contains(".entry") {
                return Ok(Compiled {
                    ptx,
                    from_cache: true,
                });
            }
        }
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts)
        .map_err(|e| format!("NVRTC failed to compile the native_cuda kernels for {arch}: {e}"))?
        .to_src();
    if let Some(p) = &path {
        // best effort: a cache that cannot be written only costs the next compilation
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &ptx).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok(Compiled {
        ptx,
        from_cache: false,
    })
}
