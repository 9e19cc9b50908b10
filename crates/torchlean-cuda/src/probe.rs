//! The CUDA probe: every library is checked present before cudarc touches it (cudarc panics
//! on a missing library), then the device is opened and described.
//!
//! Owns: library presence, the device description (name, compute capability, memory, driver
//! and library versions). Must not launch kernels.

/// A CUDA library the module loads dynamically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Library {
    Driver,
    Nvrtc,
    Cublas,
    Cublaslt,
    Cufft,
}

impl Library {
    pub const ALL: [Library; 5] = [
        Library::Driver,
        Library::Nvrtc,
        Library::Cublas,
        Library::Cublaslt,
        Library::Cufft,
    ];

    /// The library's file name stem, as the loader searches it.
    pub fn file(self) -> &'static str {
        match self {
            Library::Driver => "libcuda (the CUDA driver)",
            Library::Nvrtc => "libnvrtc (NVRTC)",
            Library::Cublas => "libcublas (cuBLAS)",
            Library::Cublaslt => "libcublasLt (cuBLASLt)",
            Library::Cufft => "libcufft (cuFFT)",
        }
    }

    /// Whether the dynamic loader finds it.
    pub fn present(self) -> bool {
        // SAFETY: each call only tries to dlopen the named system library (running its
        // initializers, as any load of it would) and closes it again; nothing is called.
        unsafe {
            match self {
                Library::Driver => cudarc::driver::sys::is_culib_present(),
                Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Library::Cublas => cudarc::cublas::sys::is_culib_present(),
                Library::Cublaslt => cudarc::cublaslt::sys::is_culib_present(),
                Library::Cufft => cudarc::cufft::sys::is_culib_present(),
            }
        }
    }
}

impl Library {
    /// Entry points the module calls, which every supported version of the library has:
    /// checked before cudarc calls any (cudarc resolves each symbol at its first call and
    /// panics when it is missing — a library that loads but is not the CUDA one, or one too
    /// old, ended the process with exit 101 and a backtrace instead of the clean refusal).
    fn symbols(self) -> &'static [&'static str] {
        match self {
            Library::Driver => &[
                "cuInit",
                "cuDriverGetVersion",
                "cuDeviceGetCount",
                "cuDeviceGet",
                "cuDevicePrimaryCtxRetain",
                "cuStreamCreate",
                "cuModuleLoadData",
                "cuLaunchKernel",
                "cuMemcpyHtoDAsync_v2",
                "cuStreamSynchronize",
            ],
            Library::Nvrtc => &[
                "nvrtcVersion",
                "nvrtcCreateProgram",
                "nvrtcCompileProgram",
                "nvrtcGetProgramLog",
            ],
            Library::Cublas => &["cublasCreate_v2", "cublasSetStream_v2", "cublasSgemm_v2"],
            Library::Cublaslt => &["cublasLtCreate", "cublasLtMatmul"],
            Library::Cufft => &["cufftGetVersion", "cufftPlanMany", "cufftExecR2C"],
        }
    }

    /// The first of [`Library::symbols`] the loaded library lacks (the library present).
    fn missing_symbol(self) -> Option<&'static str> {
        // SAFETY: the library was found by the loader ([`Library::present`]); cudarc loads it
        // once and keeps it; `get` only looks a symbol up (dlsym), nothing is called.
        unsafe {
            let lib = match self {
                Library::Driver => cudarc::driver::sys::culib(),
                Library::Nvrtc => cudarc::nvrtc::sys::culib(),
                Library::Cublas => cudarc::cublas::sys::culib(),
                Library::Cublaslt => cudarc::cublaslt::sys::culib(),
                Library::Cufft => cudarc::cufft::sys::culib(),
            };
            self.symbols()
                .iter()
                .copied()
                .find(|name| lib.get::<unsafe extern "C" fn()>(name.as_bytes()).is_err())
        }
    }
}

/// The libraries the loader cannot find (empty when all are there).
pub fn missing_libraries() -> Vec<Library> {
    Library::ALL.into_iter().filter(|l| !l.present()).collect()
}

/// Present libraries that lack an entry point the module calls, with the first one missing
/// (call after [`missing_libraries`] found none).
pub fn incomplete_libraries() -> Vec<(Library, &'static str)> {
    Library::ALL
        .into_iter()
        .filter_map(|l| l.missing_symbol().map(|s| (l, s)))
        .collect()
}

/// "major.minor" of a CUDA-style version number (e.g. 13000 -> 13.0).
pub fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The driver API version (all libraries present already checked).
pub fn driver_version() -> Option<i32> {
    let mut v = 0;
    // SAFETY: the driver library is loaded (checked present); the out pointer is valid.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    (r == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some(v)
}

/// NVRTC's version as "major.minor".
pub fn nvrtc_version() -> Option<String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked present); the out pointers are valid.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then(|| format!("{major}.{minor}"))
}

/// cuFFT's version number.
pub fn cufft_version() -> Option<i32> {
    cudarc::cufft::result::get_version().ok()
}
