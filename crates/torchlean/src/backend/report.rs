//! Backend reports: what ran (or would run), with which evidence, under which policy.
//!
//! Text for people: a header line, then per op the capsule line and four obligation lines.
//! JSON with the same content. A row is called "proved" only when its evidence is a theorem.

use super::gate::{GateFailure, KernelAudit, ObligationReport};
use super::planner::LoweredGroup;
use super::profile::BackendProfile;
use super::vocab::{Disposition, ExecutionMode, TrustLevel};
use serde::Serialize;
use std::fmt::Write;

/// A backend report.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    pub profile: String,
    pub device: String,
    pub provider_preference: String,
    pub policy: String,
    pub vjp: String,
    pub mode: ExecutionMode,
    pub verdict: String,
    pub trusted_external_ops: Vec<String>,
    pub kernels: Vec<KernelAudit>,
    pub groups: Vec<LoweredGroup>,
    pub failures: Vec<GateFailure>,
    /// How a compiled plan executes (which executor, and what it runs of each capsule);
    /// absent for eager reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// Where an eager session's profile came from when the program did not install it on
    /// the thread: `process_default` (set by `runtime::set_process_default`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// What the device probe found before the first kernel (e.g. the GPU, its compute
    /// capability, the driver and library versions); absent before a probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The device allocator's statistics, where the device's module keeps them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<serde_json::Value>,
    /// Why the run stopped, for the report of what ran before a failure (a planning
    /// refusal, a checker's rejection, a non-finite loss); its verdict is then `stopped`
    /// (see [`BackendReport::stopped_by`]). Absent for a run that finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// Computation the run did before any plan, outside the gate (an ONNX import's
    /// evaluation of float arithmetic on constants), one line each: no kernel row covers it,
    /// so the report says it apart (see [`BackendReport::with_outside_gate`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outside_gate: Vec<String>,
}

impl BackendReport {
    pub fn new(
        profile: &BackendProfile,
        mode: ExecutionMode,
        kernels: Vec<KernelAudit>,
        groups: Vec<LoweredGroup>,
        failures: Vec<GateFailure>,
    ) -> Self {
        let trusted_external_ops = kernels
            .iter()
            .filter(|k| {
                k.trust_level == TrustLevel::TrustedExternal
                    || k.obligations
                        .iter()
                        .any(|o| o.required && o.disposition == Disposition::Trusted)
            })
            .map(|k| k.op.name().to_string())
            .collect();
        BackendReport {
            profile: profile.name.clone(),
            device: profile.device.label().into(),
            provider_preference: profile.preference.label(),
            policy: profile.policy.name.clone(),
            vjp: profile.vjp.label().into(),
            mode,
            verdict: if failures.is_empty() {
                "accepted".into()
            } else {
                "rejected".into()
            },
            trusted_external_ops,
            kernels,
            groups,
            failures,
            executor: None,
            session: None,
            target: None,
            memory: None,
            stopped: None,
            outside_gate: vec![],
        }
    }

    /// This report with `lines` of computation done outside the gate before the plan (an
    /// ONNX import's evaluation of float arithmetic on constants, which the report did not
    /// mention: the fifty-first session's trust audit).
    pub fn with_outside_gate(mut self, lines: impl IntoIterator<Item = String>) -> Self {
        self.outside_gate.extend(lines);
        self
    }

    /// This report as the report of what ran before the run stopped with `reason`: verdict
    /// `stopped` whatever the kernels' own verdict was — the kernels listed were admitted,
    /// but the run did not do what was asked, and a reader of the verdict alone must not
    /// take it for an accepted run (it said `accepted` after a planning refusal: an audit of
    /// the fifty-first session).
    pub fn stopped_by(mut self, reason: impl Into<String>) -> Self {
        self.verdict = "stopped".into();
        self.stopped = Some(reason.into());
        self
    }

    /// Adds the kernels of `eager` — what ran through the eager session beside a compiled
    /// plan: the optimizer's update, clipping, evaluation — that this report does not list
    /// yet (and their trusted-external ops), so that a compiled step's report covers every
    /// kernel of the step.
    pub fn add_eager_kernels(&mut self, eager: BackendReport) {
        for op in eager.trusted_external_ops {
            if !self.trusted_external_ops.contains(&op) {
                self.trusted_external_ops.push(op);
            }
        }
        // one row per kernel, as the session's own report (a kernel called on the tape and
        // under `no_grad` is one row), and a composite's parts under the composite (both
        // were listed twice, the parts after the optimizer's rows: an audit of the
        // forty-fourth session)
        for k in eager.kernels {
            let at = k.part_of.as_ref().and_then(|c| {
                let top = self.kernels.iter().position(|r| &r.capsule == c)?;
                let parts = self.kernels[top + 1..]
                    .iter()
                    .take_while(|r| r.part_of.as_ref() == Some(c))
                    .count();
                Some(top + 1 + parts)
            });
            let before = self.kernels.len();
            merge_row(&mut self.kernels, &k);
            // the list grew: its last row is the one merge_row pushed, moved under its composite
            if let (Some(at), true) = (at, self.kernels.len() > before) {
                if let Some(row) = self.kernels.pop() {
                    self.kernels.insert(at, row);
                }
            }
        }
    }

    /// The report for people.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let trusted = if self.trusted_external_ops.is_empty() {
            "none".to_string()
        } else {
            self.trusted_external_ops.join(",")
        };
        let _ = writeln!(
            s,
            "backend report: profile={} mode={} device={} provider={} policy={} vjp={} trusted_external_ops={} verdict={}{}",
            self.profile, self.mode, self.device, self.provider_preference, self.policy, self.vjp, trusted, self.verdict,
            self.session.as_deref().map(|s| format!(" session={s}")).unwrap_or_default()
        );
        if let Some(why) = &self.stopped {
            let _ = writeln!(s, "stopped: {why}");
        }
        for line in &self.outside_gate {
            let _ = writeln!(s, "outside the gate: {line}");
        }
        if let Some(t) = &self.target {
            let _ = writeln!(s, "target: {t}");
        }
        if let Some(m) = &self.memory {
            let _ = writeln!(s, "memory: {m}");
        }
        for k in &self.kernels {
            // a composite's parts are rows nested under it
            let indent = if k.part_of.is_some() { "    " } else { "" };
            let _ = writeln!(
                s,
                "{indent}{}{}: {} provider={} trust={} vjp={} runtime={}{}{}",
                k.part_of
                    .as_deref()
                    .map(|c| format!("(part of {c}) "))
                    .unwrap_or_default(),
                k.op.name(),
                k.capsule,
                k.provider,
                k.trust_level,
                k.vjp_mode,
                k.runtime_support,
                if k.precision == super::Precision::F32 {
                    String::new()
                } else {
                    format!(" precision={}", k.precision)
                },
                if k.deterministic {
                    ""
                } else {
                    " nondeterministic"
                }
            );
            if let Some(bound) = &k.declared_bound {
                let _ = writeln!(s, "{indent}  declared bound ({}): {bound}", k.precision);
            }
            for o in &k.obligations {
                let _ = writeln!(
                    s,
                    "{indent}  {}: {}; {} [{}{}{}]",
                    o.obligation.label(),
                    o.claim.render(),
                    o.evidence_detail,
                    o.disposition,
                    if o.recheck_every_call {
                        ", rechecked every call"
                    } else {
                        ""
                    },
                    if o.required { "" } else { ", not required" }
                );
            }
        }
        for g in &self.groups {
            let kind = match g.kind {
                super::planner::GroupKind::Singleton => "singleton",
                super::planner::GroupKind::Coalesced => "coalesced (not fused)",
            };
            let _ = writeln!(s, "group: {kind} {} nodes {:?}", g.capsule, g.nodes);
        }
        if let Some(e) = &self.executor {
            let _ = writeln!(s, "executor: {e}");
        }
        for f in &self.failures {
            let _ = writeln!(s, "gate failure: {f}");
        }
        s
    }

    /// The same content as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        // serializing plain data with derived impls cannot fail
        serde_json::to_value(self).expect("report serializes")
    }
}

/// Adds `a` to `rows`, one row per kernel: a row that differs from `a` only in whether an
/// obligation was required (a call under `no_grad` beside one on the tape) is the same
/// kernel, and takes `a`'s requirements too (required where any call required it).
pub(crate) fn merge_row(rows: &mut Vec<KernelAudit>, a: &KernelAudit) {
    let same_but_required = |x: &ObligationReport, y: &ObligationReport| {
        ObligationReport {
            required: y.required,
            ..x.clone()
        } == *y
    };
    let row = rows.iter_mut().find(|b| {
        b.op == a.op
            && b.capsule == a.capsule
            && b.vjp_mode == a.vjp_mode
            && b.part_of == a.part_of
            && b.obligations.len() == a.obligations.len()
            && a.obligations
                .iter()
                .zip(&b.obligations)
                .all(|(x, y)| same_but_required(x, y))
    });
    match row {
        Some(b) => {
            for (y, x) in b.obligations.iter_mut().zip(&a.obligations) {
                y.required |= x.required;
            }
        }
        None => rows.push(a.clone()),
    }
}
