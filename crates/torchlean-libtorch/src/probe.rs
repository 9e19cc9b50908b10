//! The LibTorch probe: what LibTorch is loaded (its version, read at run time from the
//! library this process loaded) and whether it can use the device. The detail line is
//! provenance for the report's target line, never evidence.

use crate::BridgeError;
use torchlean::backend::Device;

/// The torch version this crate was built against (tch 0.24 / torch-sys 0.24 expect 2.11).
pub const BUILT_AGAINST: &str = "2.11";

/// The directory of the `libtorch_cpu` this process loaded (from `/proc/self/maps`).
fn loaded_library() -> Option<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            std::path::Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libtorch_cpu"))
        })
        .map(std::path::PathBuf::from)
}

/// Loads LibTorch's CUDA library (`libtorch_cuda.so`, from the directory of the
/// `libtorch_cpu` this process loaded), once. The linker drops it from the binaries
/// (`--as-needed`: no symbol of it is referenced), and without it LibTorch registers no CUDA
/// backend, so `tch::Cuda::is_available()` is false even on a GPU machine; loading it runs its
/// static initializers, which register the backend (what `import torch` does). Returns why it
/// could not be loaded, if so (a CPU-only LibTorch, or missing CUDA libraries).
///
/// LibTorch looks its CUDA hooks up once, at the first CUDA query, and keeps what it found:
/// this must run before any (`crate::link` calls it first thing).
pub fn load_cuda() -> Result<(), String> {
    static LOADED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            let lib =
                loaded_library().ok_or("no libtorch_cpu library is mapped into this process")?;
            let path = lib.with_file_name("libtorch_cuda.so");
            if !path.exists() {
                return Err(format!(
                    "{} does not exist (a CPU-only LibTorch)",
                    path.display()
                ));
            }
            let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
                .map_err(|_| format!("{} contains a NUL byte", path.display()))?;
            // SAFETY: dlopen with a valid NUL-terminated path; RTLD_GLOBAL so that its
            // symbols serve later lookups, as when Python loads it. The handle is never
            // closed (the library stays loaded for the process's lifetime, as LibTorch
            // expects). dlerror is read right after a failure, on this thread.
            let handle =
                unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            if handle.is_null() {
                // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next
                // dl* call on this thread; it is copied at once.
                let why = unsafe {
                    let e = libc::dlerror();
                    if e.is_null() {
                        "unknown dlopen error".to_string()
                    } else {
                        std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
                    }
                };
                return Err(format!("cannot load {}: {why}", path.display()));
            }
            Ok(())
        })
        .clone()
}

/// The version of the loaded LibTorch, read beside the library: `torch/version.py` of a
/// pip-installed PyTorch (`__version__ = '2.11.0+cu130'`) or `build-version` of a LibTorch
/// archive.
pub fn runtime_version() -> Result<(String, String), String> {
    let lib = loaded_library().ok_or("no libtorch_cpu library is mapped into this process")?;
    let lib_dir = lib.parent().ok_or("the loaded library has no directory")?;
    let root = lib_dir
        .parent()
        .ok_or("the library directory has no parent")?;
    let from_py = std::fs::read_to_string(root.join("version.py"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("__version__ = "))
                .map(|v| v.trim().trim_matches(['\'', '"']).to_string())
        });
    let from_archive = || {
        std::fs::read_to_string(root.join("build-version"))
            .ok()
            .map(|s| s.trim().to_string())
    };
    match from_py.or_else(from_archive) {
        Some(v) => Ok((v, lib.display().to_string())),
        None => Err(format!(
            "no version.py or build-version beside {}",
            lib.display()
        )),
    }
}

/// Probes LibTorch for `device`: the detail names its version (read at run time), the
/// library's path, and on `cuda` the CUDA runtime and cuDNN versions LibTorch reports and
/// its device count. An error when LibTorch cannot use `device`.
pub fn probe(device: Device) -> Result<String, BridgeError> {
    let version = match runtime_version() {
        Ok((v, path)) => format!("libtorch {v} ({path})"),
        Err(why) => format!("libtorch of unknown version ({why})"),
    };
    match device {
        Device::Cpu => Ok(format!("{version}, cpu")),
        Device::Cuda => {
            crate::bridge::tch_device(device)?;
            Ok(format!(
                "{version}, cuda: {} device(s), CUDA runtime {}, cuDNN {}",
                tch::Cuda::device_count(),
                tch::utils::version_cudart(),
                tch::utils::version_cudnn()
            ))
        }
        other => Err(BridgeError::Device {
            device: other.label().into(),
            reason: "the bridge runs on `cpu` and `cuda` only".into(),
        }),
    }
}
