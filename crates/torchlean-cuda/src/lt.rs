//! cuBLASLt for the `cublas` capsules' single products (linear's, unbatched matmuls'): one
//! handle, its own workspace, and a plan per product shape (descriptors and the algorithm
//! cuBLASLt's heuristic picked), so a training step asks the heuristic once per shape, not
//! once per call.
//!
//! Why cuBLASLt beside cuBLAS: its epilogues fuse linear's bias into the product (`BIAS`:
//! added to the f32 accumulator before the one store) and the bias gradient into the weight
//! gradient's product (`BGRADB`: the column sums of dY over the product's inner dimension),
//! saving a pass over the output each; and for the forward products of linear, given a
//! workspace, its heuristic picks faster kernels than the classic API's (PyTorch's `addmm`
//! runs cuBLASLt too; measured on the H200: docs/BENCHMARKS.md, twenty-fifth session). Arithmetic: compute type `CUBLAS_COMPUTE_32F` — f32 inputs, f32 accumulation,
//! never TF32 (the `cublas.tf32.*` capsules keep the classic API with TF32 math).
//!
//! Owns: the handle, the workspace, the plans. Must not choose which products run here (the
//! kernels in `kernels/blas.rs` do, falling back to the classic API when a plan is refused).

use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdeviceptr;
use std::collections::HashMap;
use std::ffi::c_void;

/// The workspace cuBLASLt may use (NVIDIA's recommendation for Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// What the product's epilogue does besides storing D.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    /// D = op(A)·op(B).
    Plain,
    /// D = op(A)·op(B) + bias, the bias (length m: rows of column-major D) broadcast over
    /// D's columns.
    Bias,
    /// D = op(A)·op(B), and bias = the sums of op(B) over the inner dimension (length n:
    /// columns of column-major D).
    BiasGradB,
}

/// One column-major product D[m, n] = op(A)·op(B) in cuBLAS's terms (`ta`: A is stored
/// [k, m]; `tb`: B is stored [n, k]), leading dimensions those of dense storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub ta: bool,
    pub tb: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    shape: Shape,
    epilogue: Epilogue,
}

/// The descriptors and algorithm of one product shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by this plan and is destroyed once, here.
        // Statuses are ignored: nothing can be done about a failed destroy at drop.
        unsafe {
            sys::cublasLtMatmulDescDestroy(self.desc);
            for layout in [self.a, self.b, self.d] {
                if !layout.is_null() {
                    sys::cublasLtMatrixLayoutDestroy(layout);
                }
            }
        }
    }
}

/// The cuBLASLt handle with its workspace and plans (behind the context's lock).
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    /// Kept alive (and freed after the handle) for the address below.
    _workspace: cudarc::driver::CudaSlice<u8>,
    /// The workspace's device address.
    workspace_ptr: CUdeviceptr,
    /// Plans by shape; `None`: cuBLASLt has no algorithm for it (the caller falls back).
    plans: HashMap<Key, Option<Plan>>,
    stats: LtStats,
}

/// What cuBLASLt ran since the context was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LtStats {
    /// Products launched through cuBLASLt.
    pub products: u64,
    /// Calls cuBLASLt had no algorithm for, or refused before launching (run by the classic
    /// API instead).
    pub declined: u64,
}

// SAFETY: the handle and descriptors may be used from any thread as long as calls do not
// overlap; the `Mutex` in `Context` serializes every use.
unsafe impl Send for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: the handle was created by `Lt::new` and is destroyed once, after its plans.
        unsafe {
            sys::cublasLtDestroy(self.handle);
        }
    }
}

fn ok(what: &str, s: sys::cublasStatus_t) -> Result<(), String> {
    if s == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {s:?}"))
    }
}

/// Sets one attribute of a matmul descriptor from a plain value.
///
/// # Safety
/// `desc` is a live descriptor and `T` is the attribute's documented type.
unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), String> {
    ok(
        "cublasLtMatmulDescSetAttribute",
        sys::cublasLtMatmulDescSetAttribute(
            desc,
            attr,
            value as *const T as *const c_void,
            std::mem::size_of::<T>(),
        ),
    )
}

impl Lt {
    /// A handle and its workspace on `stream` (the library is present: the probe checked).
    pub fn new(stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<Lt, String> {
        let handle =
            cudarc::cublaslt::result::create_handle().map_err(|e| format!("cuBLASLt: {e:?}"))?;
        let workspace = match stream.alloc_zeros::<u8>(WORKSPACE_BYTES) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: the handle was just created and is not used again.
                unsafe { sys::cublasLtDestroy(handle) };
                return Err(format!("cannot allocate cuBLASLt's workspace: {e}"));
            }
        };
        let workspace_ptr = {
            use cudarc::driver::DevicePtr;
            // no synchronization to record: the module has one stream and event tracking
            // off (`device.rs`)
            let (p, _sync) = workspace.device_ptr(stream);
            p
        };
        Ok(Lt {
            handle,
            workspace_ptr,
            _workspace: workspace,
            plans: HashMap::new(),
            stats: LtStats::default(),
        })
    }

    fn plan(&self, key: Key) -> Result<Option<Plan>, String> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        let Shape { m, n, k, ta, tb } = key.shape;
        let f32t = sys::cudaDataType_t::CUDA_R_32F;
        let layout = |rows: u64, cols: u64| -> Result<sys::cublasLtMatrixLayout_t, String> {
            cudarc::cublaslt::result::create_matrix_layout(f32t, rows, cols, rows as i64)
                .map_err(|e| format!("cublasLtMatrixLayoutCreate: {e:?}"))
        };
        let desc = cudarc::cublaslt::result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            f32t,
        )
        .map_err(|e| format!("cublasLtMatmulDescCreate: {e:?}"))?;
        // the plan owns each descriptor as soon as it exists (dropped on any error below)
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            // SAFETY: a plain-data struct of integers; overwritten by the heuristic below
            // before any use.
            algo: unsafe { std::mem::zeroed() },
        };
        plan.a = if ta { layout(k, m)? } else { layout(m, k)? };
        plan.b = if tb { layout(n, k)? } else { layout(k, n)? };
        plan.d = layout(m, n)?;
        // cublasOperation_t's values: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
        let op = |t: bool| t as i32;
        let epilogue = match key.epilogue {
            Epilogue::Plain => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::BiasGradB => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BGRADB,
        };
        // SAFETY: `desc` is live; TRANSA/TRANSB take a cublasOperation_t (an int) and EPILOGUE a
        // cublasLtEpilogue_t (cuBLASLt's documented attribute types).
        unsafe {
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &op(ta))?;
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &op(tb))?;
            set_desc(plan.desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
        }
        if key.epilogue != Epilogue::Plain {
            // the heuristic needs to know a bias is there; the pointer is set per call
            let placeholder = self.workspace_ptr;
            // SAFETY: `desc` is live; BIAS_POINTER takes a device pointer.
            unsafe {
                set_desc(
                    plan.desc,
                    A::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &placeholder,
                )?
            };
        }
        let pref = cudarc::cublaslt::result::create_matmul_pref()
            .map_err(|e| format!("cublasLtMatmulPreferenceCreate: {e:?}"))?;
        let bytes = WORKSPACE_BYTES as u64;
        let mut found = 0;
        // SAFETY: all-integer plain data, written by the heuristic before it is read.
        let mut result: sys::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptors and the preference are live (the preference is destroyed
        // right after); MAX_WORKSPACE_BYTES takes a u64; the result array holds the one
        // element requested.
        let status = unsafe {
            let set = ok(
                "cublasLtMatmulPreferenceSetAttribute",
                sys::cublasLtMatmulPreferenceSetAttribute(
                    pref,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &bytes as *const u64 as *const c_void,
                    std::mem::size_of::<u64>(),
                ),
            );
            let status = set.map(|()| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.d,
                    plan.d,
                    pref,
                    1,
                    &mut result,
                    &mut found,
                )
            });
            sys::cublasLtMatmulPreferenceDestroy(pref);
            status?
        };
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            || found < 1
            || result.state != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
        {
            // no algorithm for this shape and epilogue: the caller uses the classic API
            return Ok(None);
        }
        plan.algo = result.algo;
        Ok(Some(plan))
    }

    /// Runs D = op(A)·op(B) (with `epilogue`, its vector at `bias`) on `stream`. Returns
    /// `Ok(false)` without launching when cuBLASLt has no algorithm for the shape.
    ///
    /// # Safety
    /// `a`, `b`, `d` (and `bias` unless the epilogue is `Plain`) are live device
    /// allocations holding at least the elements the shape addresses (A: m·k, B: k·n, D:
    /// m·n, bias: m for `Bias`, n for `BiasGradB`), dense with the shape's leading
    /// dimensions, and every use of them is ordered on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn matmul(
        &mut self,
        stream: sys::cudaStream_t,
        shape: Shape,
        epilogue: Epilogue,
        a: CUdeviceptr,
        b: CUdeviceptr,
        d: CUdeviceptr,
        bias: CUdeviceptr,
    ) -> Result<bool, String> {
        let key = Key { shape, epilogue };
        if !self.plans.contains_key(&key) {
            let plan = self.plan(key)?;
            self.plans.insert(key, plan);
        }
        let Some(Some(plan)) = self.plans.get(&key) else {
            self.stats.declined += 1;
            return Ok(false);
        };
        if epilogue != Epilogue::Plain {
            set_desc(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &bias,
            )?;
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ws = self.workspace_ptr;
        let status = sys::cublasLtMatmul(
            self.handle,
            plan.desc,
            &alpha as *const f32 as *const c_void,
            a as *const c_void,
            plan.a,
            b as *const c_void,
            plan.b,
            &beta as *const f32 as *const c_void,
            d as *const c_void,
            plan.d,
            d as *mut c_void,
            plan.d,
            &plan.algo,
            ws as *mut c_void,
            WORKSPACE_BYTES,
            stream,
        );
        if status == sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED {
            // refused before launching anything (the call's validation): the shape goes to
            // the classic API from now on
            self.plans.insert(key, None);
            self.stats.declined += 1;
            return Ok(false);
        }
        ok("cublasLtMatmul", status)?;
        self.stats.products += 1;
        Ok(true)
    }

    /// What ran so far.
    pub fn stats(&self) -> LtStats {
        self.stats
    }
}
