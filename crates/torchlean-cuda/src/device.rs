//! The CUDA execution context of this process: one device (ordinal 0), one stream on which
//! every kernel, copy and library call of the module is ordered, the cuBLAS handle bound to
//! that stream, the compiled kernel functions, and the caching allocator.
//!
//! It is created by the first probe and shared by every session (one stream: the host waits
//! only where it reads values — `DeviceBuffer::read`). Kernels reach it through
//! [`context`], whose guard ([`Cx`]) counts the use, so that a device-graph recording runs
//! alone (`exclusive.rs`); a CUDA error becomes [`torchlean::Error::DeviceFailure`] naming the op that
//! launched the failing call.
//!
//! Owns: the context, stream, handles, functions and pool. Must not plan or gate.

pub use crate::exclusive::Cx;
use crate::memory::Pool;
use crate::probe;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use std::sync::{Arc, Mutex, OnceLock};
use torchlean::Error;

/// The kernel entry points of the `kernels/*.cu` sources.
pub struct Functions {
    pub binary_same: CudaFunction,
    pub binary_bcast: CudaFunction,
    pub binary_grad: CudaFunction,
    pub binary_grad_same: CudaFunction,
    pub where_forward: CudaFunction,
    pub where_grad: CudaFunction,
    pub unary_forward: CudaFunction,
    pub unary_vjp: CudaFunction,
    pub sum_partial: CudaFunction,
    pub sum_finish: CudaFunction,
    pub fill_from: CudaFunction,
    pub sum_rows: CudaFunction,
    pub add_row_bias: CudaFunction,
    pub random_fill: CudaFunction,
    pub softmax_rows: CudaFunction,
    pub softmax_rows_vjp: CudaFunction,
    pub softmax_lastdim: CudaFunction,
    pub softmax_lastdim_vjp: CudaFunction,
    pub gather_forward: CudaFunction,
    pub gather_vjp: CudaFunction,
    pub strided_copy: CudaFunction,
    /// The same copy moving float4s (innermost axis dense, everything a multiple of 4).
    pub strided_copy4: CudaFunction,
    pub copy_segments: CudaFunction,
    /// The launch queue's kernel (`queue.rs`).
    pub queued_maps: CudaFunction,
    pub index_select_forward: CudaFunction,
    pub index_select_vjp: CudaFunction,
    pub norm_rows: CudaFunction,
    pub norm_rows_vjp: CudaFunction,
    pub norm_params_partial: CudaFunction,
    pub norm_params_finish: CudaFunction,
    pub ema_update: CudaFunction,
    pub adam_update: CudaFunction,
    pub adam_step_many: CudaFunction,
    pub conv2d_forward: CudaFunction,
    pub conv2d_grad_input: CudaFunction,
    pub conv2d_grad_weight: CudaFunction,
    pub conv2d_grad_bias: CudaFunction,
    pub conv_transpose2d_forward: CudaFunction,
    pub conv_transpose2d_grad_input: CudaFunction,
    pub conv_transpose2d_grad_weight: CudaFunction,
    pub pool2d_forward: CudaFunction,
    pub pool2d_vjp: CudaFunction,
    pub batch_norm_forward: CudaFunction,
    pub batch_norm_vjp: CudaFunction,
    pub clamp_forward: CudaFunction,
    pub clamp_vjp: CudaFunction,
    pub mse_vjp: CudaFunction,
    pub scan_forward: CudaFunction,
    pub scan_vjp: CudaFunction,
    pub fused_forward: CudaFunction,
    pub fused_derivative: CudaFunction,
    pub reduce_to: CudaFunction,
    pub expand: CudaFunction,
    pub argmax_rows: CudaFunction,
    pub spectral_dft: CudaFunction,
    pub spectral_idft: CudaFunction,
    pub spectral_mix: CudaFunction,
    pub spectral_mix_vjp_x: CudaFunction,
    pub spectral_mix_vjp_w: CudaFunction,
    pub fft_take: CudaFunction,
    pub fft_put: CudaFunction,
    pub rows_nonfinite: CudaFunction,
    pub flash_pack_mask: CudaFunction,
    pub flash_tile_any: CudaFunction,
    pub flash_nonfinite: CudaFunction,
    pub flash_flags: CudaFunction,
    pub flash_sum_batches: CudaFunction,
    pub flash_sum_parts: CudaFunction,
    pub flash_row_dot: CudaFunction,
    pub flash_forward: CudaFunction,
    pub flash_bwd_kv: CudaFunction,
    pub flash_bwd_q: CudaFunction,
    /// The flash kernels that skip the tiles a boolean mask blocks (tile words present).
    pub flash_forward_tiles: CudaFunction,
    pub flash_bwd_kv_tiles: CudaFunction,
    pub flash_bwd_q_tiles: CudaFunction,
    /// The forward on tensor cores (split-TF32 products; d, dv <= 64), with and without the
    /// tile test.
    pub flash_forward_mma: CudaFunction,
    pub flash_forward_mma_tiles: CudaFunction,
    /// The key/value VJP on tensor cores (split-TF32; d, dv <= 64).
    pub flash_bwd_kv_mma: CudaFunction,
    pub flash_bwd_kv_mma_tiles: CudaFunction,
}

/// cuBLAS behind a lock: one handle, used by one thread at a time.
pub struct Blas(pub CudaBlas);
// SAFETY: a cuBLAS handle may be used from any thread as long as calls do not overlap; the
// `Mutex` in `Context` serializes every use.
unsafe impl Send for Blas {}

/// Everything a native_cuda or cublas kernel needs to run.
pub struct Context {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: Mutex<Blas>,
    /// cuBLASLt (single products, where [`Context::lt_products`] says so).
    pub lt: Mutex<crate::lt::Lt>,
    /// Which single products run through cuBLASLt.
    pub lt_products: LtProducts,
    pub functions: Functions,
    pub pool: Arc<Pool>,
    /// cuBLAS's workspace, set on the handle at creation so that cuBLAS never allocates
    /// while a device graph is being recorded (`graph.rs`).
    pub blas_workspace: cudarc::driver::CudaSlice<u8>,
    /// The probe's description of the device and libraries.
    pub detail: String,
    /// Which of flash attention's kernels run their products on tensor cores in split-TF32
    /// (`flash_forward_mma`, `flash_bwd_kv_mma`). The report's target line says which.
    pub flash_mma: FlashMma,
    /// Blocks of the f32 key/value VJP resident on the whole device at once (SMs × blocks
    /// per SM), for `kernels::attention_split`; 0 (no split) when unknown or when
    /// `TORCHLEAN_FLASH_SPLIT=0`.
    pub flash_kv_slots: usize,
    /// Blocks of the f32 key/value VJP resident on the whole device at once, whatever
    /// `TORCHLEAN_FLASH_SPLIT` says (0 when unknown): for `kernels::attention_slots`.
    pub flash_kv_resident: usize,
    /// Whether the deterministic flash VJP may add dQ in slots (`kernels::attention_slots`;
    /// `TORCHLEAN_FLASH_DQ_SLOTS=0`: the query kernel wherever the ordered dQ does not run).
    pub flash_dq_slots: bool,
    /// Whether the deterministic flash VJP adds dQ in key-tile order where it can (the key
    /// kernel's fuse_dq 4; on unless `TORCHLEAN_FLASH_DQ_ORDERED=0`; elsewhere, or when
    /// off, slots or the query kernel).
    /// [`with_flash_dq_ordered`] overrides it on one thread (tests compare both ways).
    flash_dq_ordered: bool,
    /// Calls whose dQ was added in key-tile order (tests check that the path ran).
    flash_dq_ordered_calls: std::sync::atomic::AtomicU64,
    /// Why the fused flash-attention kernels cannot run on this GPU (their shared memory
    /// exceeds its per-block limit), or `None`.
    pub flash_unavailable: Option<String>,
    /// Small element-wise calls waiting for their launch (`queue.rs`).
    queue: Mutex<crate::queue::LaunchQueue>,
}

/// Where flash attention's split-TF32 tensor-core kernels run: compute capability 8.0 or
/// newer, and `TORCHLEAN_FLASH_MMA` = 1 (both), 0 (neither) or unset ([`FLASH_MMA_DEFAULT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashMma {
    /// The forward (`flash_forward_mma`).
    pub forward: bool,
    /// The key/value VJP (`flash_bwd_kv_mma`).
    pub vjp: bool,
}

/// Which single (unbatched) products of the `cublas` capsules go through cuBLASLt
/// ([`crate::lt`]: linear's, with its bias in the epilogues, and unbatched matmuls'):
/// `TORCHLEAN_CUBLASLT` = `0` (none: the classic API, the bias added and summed by
/// native kernels), `forward` (the forward product with its bias epilogue), `1` (forward and
/// VJP, the bias gradient fused into the weight gradient's product), unset:
/// [`LT_PRODUCTS_DEFAULT`]. A shape cuBLASLt has no algorithm for takes the classic API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LtProducts {
    pub forward: bool,
    pub vjp: bool,
}

/// Where single products run when `TORCHLEAN_CUBLASLT` is unset.
pub const LT_PRODUCTS_DEFAULT: LtProducts = LtProducts {
    forward: true,
    vjp: true,
};

fn lt_products() -> LtProducts {
    match std::env::var("TORCHLEAN_CUBLASLT").as_deref() {
        Ok("0") => LtProducts {
            forward: false,
            vjp: false,
        },
        Ok("forward") => LtProducts {
            forward: true,
            vjp: false,
        },
        Ok("1") => LtProducts {
            forward: true,
            vjp: true,
        },
        _ => LT_PRODUCTS_DEFAULT,
    }
}

/// The target line's account of the single products.
fn lt_description(p: LtProducts) -> &'static str {
    match (p.forward, p.vjp) {
        (true, true) => "cuBLASLt, linear's bias in the epilogues (forward and VJP)",
        (true, false) => "cuBLASLt, linear's bias in the epilogue (forward), cuBLAS (VJP)",
        (false, true) => "cuBLAS (forward), cuBLASLt, linear's bias gradient in the epilogue (VJP)",
        (false, false) => "cuBLAS",
    }
}

// SAFETY: the CUDA driver's handles (functions, modules) are context-global and may be used
// from any thread once the context is bound, which cudarc does on every call.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

static CONTEXT: OnceLock<Result<Context, String>> = OnceLock::new();

/// Where the split-TF32 tensor-core flash kernels run when `TORCHLEAN_FLASH_MMA` is unset.
/// Measured on the H200 (docs/BENCHMARKS.md, seventeenth session): the forward beats the f32
/// FMA kernel in every case (B=8 H=16 L=2048 D=64: 4.16 against 5.10 ms unmasked, 2.85
/// against 3.33 with a mask, 2.55 against 2.83 causal), so it is on; the key/value VJP was
/// slower than the f32 one (sixteenth and seventeenth sessions: 21.5 against 20.9 ms forward
/// + backward at the same shape), so it stays opt-in.
pub const FLASH_MMA_DEFAULT: FlashMma = FlashMma {
    forward: true,
    vjp: false,
};

/// The target line's account of flash attention's products.
fn flash_description(major: i32, m: FlashMma) -> String {
    const MMA: &str = "split-TF32 tensor-core products when d, dv <= 64 and every |value| < 2^24";
    const FMA: &str = "f32 FMA products";
    if major < 8 {
        return format!("{FMA} (no TF32 tensor cores below sm_80)");
    }
    let part = |on: bool| if on { MMA } else { FMA };
    format!(
        "forward {}, key/value VJP {} (TORCHLEAN_FLASH_MMA=1: both on tensor cores, =0: neither)",
        part(m.forward),
        part(m.vjp)
    )
}

/// cuBLAS's workspace (32 MiB: what NVIDIA's cuBLAS documentation recommends for Hopper).
const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// The device failure of a CUDA call made for `op`.
/// The device time of the work launched on the module's stream between two events
/// (`TORCHLEAN_OP_TIMES=device`): recording an event does not wait for anything.
pub struct EventSpan {
    stream: Arc<CudaStream>,
    start: cudarc::driver::CudaEvent,
    end: Option<cudarc::driver::CudaEvent>,
}

impl EventSpan {
    /// Records the start event (with timing) on `cx`'s stream.
    pub fn start(cx: &Context) -> torchlean::Result<EventSpan> {
        let start = cx
            .stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| failure("a timing event", e))?;
        Ok(EventSpan {
            stream: cx.stream.clone(),
            start,
            end: None,
        })
    }
}

impl torchlean::module::DeviceSpan for EventSpan {
    fn end(&mut self) -> torchlean::Result<()> {
        // the span's queued calls run inside it (`context` launches them; its guard keeps a
        // recording on another thread from capturing the event)
        let _in_use = context()?;
        let end = self
            .stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| failure("a timing event", e))?;
        self.end = Some(end);
        Ok(())
    }
    fn elapsed(&self) -> torchlean::Result<std::time::Duration> {
        let end = self
            .end
            .as_ref()
            .ok_or_else(|| failure("a timing event", "the span was not ended"))?;
        let ms = self
            .start
            .elapsed_ms(end)
            .map_err(|e| failure("a timing event", e))?;
        Ok(std::time::Duration::from_secs_f64(
            f64::from(ms.max(0.0)) / 1e3,
        ))
    }
}

pub fn failure(op: &str, e: impl std::fmt::Display) -> Error {
    Error::DeviceFailure {
        op: op.to_string(),
        device: "cuda".into(),
        reason: e.to_string(),
    }
}

fn unavailable(reason: String) -> Error {
    Error::DeviceUnavailable {
        device: "cuda".into(),
        reason,
    }
}

/// The context, created on first use (an error naming what is missing when the libraries,
/// the driver or a device are not there; the same answer every time after). Launches the
/// calls waiting in the launch queue first (`queue.rs`): whoever takes the
/// context to use the stream finds every earlier call on it.
pub fn context() -> torchlean::Result<Cx> {
    let cx = context_for_queue()?;
    cx.launch_queued()?;
    Ok(cx)
}

/// The context without launching the queue: for the queue's own calls (`queue::forward`).
pub(crate) fn context_for_queue() -> torchlean::Result<Cx> {
    CONTEXT
        .get_or_init(create)
        .as_ref()
        .map(Cx::enter)
        .map_err(|r| unavailable(r.clone()))
}

/// Launches the queued calls, when the context exists (before a read to the host, a
/// synchronization or the end of a timing span).
pub fn launch_queued() -> torchlean::Result<()> {
    match context_if_created() {
        Some(cx) => cx.launch_queued(),
        None => Ok(()),
    }
}

fn create() -> Result<Context, String> {
    let missing = probe::missing_libraries();
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|l| l.file()).collect();
        return Err(format!(
            "the dynamic loader cannot find {} (searched the default library path and LD_LIBRARY_PATH)",
            names.join(", ")
        ));
    }
    let incomplete = probe::incomplete_libraries();
    if !incomplete.is_empty() {
        let names: Vec<String> = incomplete
            .iter()
            .map(|(l, sym)| format!("{} lacks `{sym}`", l.file()))
            .collect();
        return Err(format!(
            "a CUDA library the loader found is not a usable one: {} (another library under that name, or a version older than the CUDA 13 this build targets)",
            names.join(", ")
        ));
    }
    let count = CudaContext::device_count().map_err(|e| format!("the CUDA driver: {e}"))?;
    if count < 1 {
        return Err("the CUDA driver reports no device".into());
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("cannot open CUDA device 0: {e}"))?;
    // SAFETY: one stream orders every use of the module's memory, so cudarc's per-buffer
    // event tracking (for several streams) has nothing to order.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx
        .new_stream()
        .map_err(|e| format!("cannot create a stream: {e}"))?;
    let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| format!("cannot read the compute capability: {e}"))?;
    let total = ctx.total_mem().unwrap_or(0);
    let sms = ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .unwrap_or(0);
    let nvrtc = probe::nvrtc_version().unwrap_or_else(|| "unknown".into());
    let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cuBLAS: {e}"))?;
    let blas_workspace = stream
        .alloc_zeros::<u8>(BLAS_WORKSPACE_BYTES)
        .map_err(|e| format!("cannot allocate cuBLAS's workspace: {e}"))?;
    {
        use cudarc::driver::DevicePtr;
        let (ptr, _sync) = blas_workspace.device_ptr(&stream);
        // SAFETY: `blas` holds a live handle; the workspace is a live allocation of
        // `BLAS_WORKSPACE_BYTES` that the context keeps for as long as the handle.
        let status = unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                ptr as *mut std::ffi::c_void,
                BLAS_WORKSPACE_BYTES,
            )
        };
        if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(format!("cuBLAS refused its workspace: {status:?}"));
        }
    }
    let lt = crate::lt::Lt::new(&stream)?;
    let lt_products = lt_products();
    let mut cublas_v = 0;
    // SAFETY: `blas` holds a live handle; the out pointer is valid.
    unsafe { cudarc::cublas::sys::cublasGetVersion_v2(*blas.handle(), &mut cublas_v) };
    let arch = format!("compute_{major}{minor}");
    let compiled = crate::nvrtc::compile(&crate::nvrtc::program(), &arch, &nvrtc)?;
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_src(compiled.ptx))
        .map_err(|e| format!("cannot load the native_cuda kernels: {e}"))?;
    let f = |name: &str| {
        module
            .load_function(name)
            .map_err(|e| format!("kernel `{name}` missing from the compiled module: {e}"))
    };
    let functions = Functions {
        binary_same: f("binary_same")?,
        binary_bcast: f("binary_bcast")?,
        binary_grad: f("binary_grad")?,
        binary_grad_same: f("binary_grad_same")?,
        where_forward: f("where_forward")?,
        where_grad: f("where_grad")?,
        unary_forward: f("unary_forward")?,
        unary_vjp: f("unary_vjp")?,
        sum_partial: f("sum_partial")?,
        sum_finish: f("sum_finish")?,
        fill_from: f("fill_from")?,
        sum_rows: f("sum_rows")?,
        add_row_bias: f("add_row_bias")?,
        random_fill: f("random_fill")?,
        softmax_rows: f("softmax_rows")?,
        softmax_rows_vjp: f("softmax_rows_vjp")?,
        softmax_lastdim: f("softmax_lastdim")?,
        softmax_lastdim_vjp: f("softmax_lastdim_vjp")?,
        gather_forward: f("gather_forward")?,
        gather_vjp: f("gather_vjp")?,
        strided_copy: f("strided_copy")?,
        strided_copy4: f("strided_copy4")?,
        copy_segments: f("copy_segments")?,
        queued_maps: f("queued_maps")?,
        index_select_forward: f("index_select_forward")?,
        index_select_vjp: f("index_select_vjp")?,
        norm_rows: f("norm_rows")?,
        norm_rows_vjp: f("norm_rows_vjp")?,
        norm_params_partial: f("norm_params_partial")?,
        norm_params_finish: f("norm_params_finish")?,
        ema_update: f("ema_update")?,
        adam_update: f("adam_update")?,
        adam_step_many: f("adam_step_many")?,
        conv2d_forward: f("conv2d_forward")?,
        conv2d_grad_input: f("conv2d_grad_input")?,
        conv2d_grad_weight: f("conv2d_grad_weight")?,
        conv2d_grad_bias: f("conv2d_grad_bias")?,
        conv_transpose2d_forward: f("conv_transpose2d_forward")?,
        conv_transpose2d_grad_input: f("conv_transpose2d_grad_input")?,
        conv_transpose2d_grad_weight: f("conv_transpose2d_grad_weight")?,
        pool2d_forward: f("pool2d_forward")?,
        pool2d_vjp: f("pool2d_vjp")?,
        batch_norm_forward: f("batch_norm_forward")?,
        batch_norm_vjp: f("batch_norm_vjp")?,
        clamp_forward: f("clamp_forward")?,
        clamp_vjp: f("clamp_vjp")?,
        mse_vjp: f("mse_vjp")?,
        scan_forward: f("scan_forward")?,
        scan_vjp: f("scan_vjp")?,
        fused_forward: f("fused_forward")?,
        fused_derivative: f("fused_derivative")?,
        reduce_to: f("reduce_to")?,
        expand: f("expand")?,
        argmax_rows: f("argmax_rows")?,
        spectral_dft: f("spectral_dft")?,
        spectral_idft: f("spectral_idft")?,
        spectral_mix: f("spectral_mix")?,
        spectral_mix_vjp_x: f("spectral_mix_vjp_x")?,
        spectral_mix_vjp_w: f("spectral_mix_vjp_w")?,
        fft_take: f("fft_take")?,
        fft_put: f("fft_put")?,
        rows_nonfinite: f("rows_nonfinite")?,
        flash_pack_mask: f("flash_pack_mask")?,
        flash_tile_any: f("flash_tile_any")?,
        flash_nonfinite: f("flash_nonfinite")?,
        flash_flags: f("flash_flags")?,
        flash_sum_batches: f("flash_sum_batches")?,
        flash_sum_parts: f("flash_sum_parts")?,
        flash_row_dot: f("flash_row_dot")?,
        flash_forward: f("flash_forward")?,
        flash_bwd_kv: f("flash_bwd_kv")?,
        flash_bwd_q: f("flash_bwd_q")?,
        flash_forward_tiles: f("flash_forward_tiles")?,
        flash_bwd_kv_tiles: f("flash_bwd_kv_tiles")?,
        flash_bwd_q_tiles: f("flash_bwd_q_tiles")?,
        flash_forward_mma: f("flash_forward_mma")?,
        flash_forward_mma_tiles: f("flash_forward_mma_tiles")?,
        flash_bwd_kv_mma: f("flash_bwd_kv_mma")?,
        flash_bwd_kv_mma_tiles: f("flash_bwd_kv_mma_tiles")?,
    };
    // a GPU that cannot give the flash kernels their shared memory keeps every other kernel:
    // the flash calls are refused naming why (kernels::attention::usable)
    let flash_unavailable = crate::kernels::attention::allow_shared_memory(&functions).err();
    let cublas = format!(
        "{}.{}.{}",
        cublas_v / 10000,
        (cublas_v % 10000) / 100,
        cublas_v % 100
    );
    let cufft = probe::cufft_version()
        .map(|v| format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100))
        .unwrap_or_else(|| "unknown".into());
    let driver = probe::driver_version()
        .map(probe::cuda_version)
        .unwrap_or_else(|| "unknown".into());
    let source = if compiled.from_cache {
        "from the disk cache"
    } else {
        "compiled now"
    };
    let wanted = match std::env::var("TORCHLEAN_FLASH_MMA").as_deref() {
        Ok("1") => FlashMma {
            forward: true,
            vjp: true,
        },
        Ok("0") => FlashMma {
            forward: false,
            vjp: false,
        },
        _ => FLASH_MMA_DEFAULT,
    };
    let flash_mma = FlashMma {
        forward: major >= 8 && wanted.forward,
        vjp: major >= 8 && wanted.vjp,
    };
    let flash_kv_resident = crate::kernels::attention::key_kernel_blocks_per_sm(&functions)
        .map_or(0, |per_sm| per_sm * sms.max(0) as usize);
    let flash_kv_slots = if std::env::var("TORCHLEAN_FLASH_SPLIT").as_deref() == Ok("0") {
        0
    } else {
        flash_kv_resident
    };
    let flash_dq_slots = std::env::var("TORCHLEAN_FLASH_DQ_SLOTS").as_deref() != Ok("0");
    // on since the fifty-third session's GPU run measured it against the slots
    // (docs/attention.md); `0` keeps the slots
    let flash_dq_ordered = std::env::var("TORCHLEAN_FLASH_DQ_ORDERED").as_deref() != Ok("0");
    let dq_ordered = if flash_dq_ordered {
        "added in a fixed order of key tiles by the f32 key kernel where it runs one chunk (TORCHLEAN_FLASH_DQ_ORDERED=0: not), else "
    } else {
        "TORCHLEAN_FLASH_DQ_ORDERED=0: "
    };
    let dq_rest = if flash_dq_slots {
        format!("in at most {} slots summed in order where the f32 key kernel runs, else the query kernel (TORCHLEAN_FLASH_DQ_SLOTS=0: no slots)", crate::kernels::attention_slots::MAX_SLOTS)
    } else {
        "the query kernel (TORCHLEAN_FLASH_DQ_SLOTS=0)".to_string()
    };
    let flash = format!(
        "{}; key/value VJP's last wave split along the queries: {}; deterministic dQ: {dq_ordered}{dq_rest}",
        flash_description(major, flash_mma),
        if flash_kv_slots > 0 {
            format!("on where the f32 kernel runs ({flash_kv_slots} resident blocks; TORCHLEAN_FLASH_SPLIT=0: off)")
        } else {
            "off".to_string()
        },
    );
    let flash = match &flash_unavailable {
        Some(why) => format!("the fused kernels cannot run on this GPU ({why}): their calls are refused, --provider prefer:torchlean plans the composition"),
        None => flash,
    };
    let detail = format!(
        "{name} (sm_{major}{minor}, {sms} SMs, {:.1} GiB), CUDA driver API {driver}, NVRTC {nvrtc} (kernels {source}), cuBLAS {cublas}, cuFFT {cufft}, single products: {}, flash attention: {flash}, small element-wise maps: {}",
        total as f64 / (1u64 << 30) as f64,
        lt_description(lt_products),
        crate::queue::description(),
    );
    Ok(Context {
        blas_workspace,
        pool: Pool::new(stream.clone()),
        ctx,
        stream,
        blas: Mutex::new(Blas(blas)),
        lt: Mutex::new(lt),
        lt_products,
        functions,
        detail,
        flash_mma,
        flash_kv_slots,
        flash_kv_resident,
        flash_dq_slots,
        flash_dq_ordered,
        flash_dq_ordered_calls: Default::default(),
        flash_unavailable,
        queue: Mutex::new(crate::queue::LaunchQueue::default()),
    })
}

thread_local! {
    /// [`with_flash_dq_ordered`]'s setting on this thread.
    static DQ_ORDERED_HERE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the deterministic flash VJP's ordered dQ turned on or off on this thread
/// only (tests and comparisons; the report's target line describes the process's setting).
/// Both ways are deterministic; they add dQ's terms in different orders, so a call's bits
/// depend on the setting.
pub fn with_flash_dq_ordered<R>(on: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DQ_ORDERED_HERE.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(DQ_ORDERED_HERE.with(|c| c.replace(Some(on))));
    f()
}

impl Context {
    /// Whether the deterministic flash VJP adds dQ in key-tile order where it can, on
    /// this thread ([`with_flash_dq_ordered`], else the process's setting).
    pub fn flash_dq_ordered(&self) -> bool {
        DQ_ORDERED_HERE
            .with(|c| c.get())
            .unwrap_or(self.flash_dq_ordered)
    }

    /// Calls so far whose dQ was added in key-tile order.
    pub fn flash_dq_ordered_calls(&self) -> u64 {
        self.flash_dq_ordered_calls
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn count_flash_dq_ordered(&self) {
        self.flash_dq_ordered_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The cuBLAS handle (serialized).
    pub fn blas(&self) -> std::sync::MutexGuard<'_, Blas> {
        // a poisoned lock only means another thread panicked during a call
        self.blas.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The launch queue (serialized).
    pub(crate) fn queue(&self) -> std::sync::MutexGuard<'_, crate::queue::LaunchQueue> {
        // a poisoned lock only means another thread panicked while queueing; the queue's
        // vectors are extended together after every fallible step
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Launches the calls waiting in the launch queue (nothing when none waits).
    pub fn launch_queued(&self) -> torchlean::Result<()> {
        crate::queue::launch(self, &mut self.queue())
    }

    /// The cuBLASLt handle and plans (serialized).
    pub fn lt(&self) -> std::sync::MutexGuard<'_, crate::lt::Lt> {
        // a poisoned lock only means another thread panicked during a call
        self.lt.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The context if a probe already created it (never creates it).
pub fn context_if_created() -> Option<Cx> {
    CONTEXT.get().and_then(|c| c.as_ref().ok()).map(Cx::enter)
}
