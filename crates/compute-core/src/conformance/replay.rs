//! The suite through the async API ([`AsyncOps`]), for targets where nothing
//! may block (the browser).
//!
//! A group's checks are written once, against the blocking [`Backend`] trait.
//! [`run_group_async`] runs that same code twice with the same seed, so the
//! cases, inputs, references and tolerances are the blocking suite's own:
//!
//! 1. on a *recording* backend, which answers every call at once (outputs
//!    left as they were) and notes each call with its inputs;
//! 2. then each recorded call goes to the real backend through its futures
//!    ([`AsyncOps::run_async_into`], [`AsyncOps::download_async_into`]; tensor
//!    uploads and ops are queued without waiting), and the answers are kept;
//! 3. on a *replaying* backend, which hands each call the real backend's
//!    answer (its result and output bytes): the group's checks judge them as
//!    they judge a blocking backend.
//!
//! The group's code decides which calls it makes from `supports()`, its
//! random draws and whether a call failed, never from an answer's values: the
//! recording (where every call succeeds) makes every call the replay can
//! make, and the replay skips the recorded calls that an error led it past.
//! A replay that meets a call the recording lacks fails the group. Costs
//! the group's reference computations twice, and memory for every call's
//! inputs and outputs at once.

use std::sync::Mutex;

use super::{Config, Group, group_failures};
use crate::async_ops::AsyncOps;
use crate::backend::{Backend, Location, Tensor, TensorStorage};
use crate::dtype::DType;
use crate::error::{BackendKind, ComputeError, Result};
use crate::host::{HostSlice, HostSliceMut, HostVec};
use crate::op::Op;
use crate::rng::Rng;

/// The outcome of one group run through [`run_group_async`].
#[derive(Clone, Debug)]
pub struct GroupReport {
    /// Which group.
    pub group: Group,
    /// The seed its inputs were drawn from (pass it again to replay).
    pub seed: u64,
    /// Backend calls the group made.
    pub calls: usize,
    /// Ops the backend declined, by dtypes (each failed cleanly).
    pub skipped: Vec<String>,
    /// Every failed check; empty when the group passed.
    pub failures: Vec<String>,
}

impl GroupReport {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs conformance `group` on `backend` through its futures, never blocking
/// (see the module documentation), with inputs drawn from `seed`. Returns
/// the failures rather than panicking, so a caller in the browser can print
/// them. The futures are awaited one after the other.
pub async fn run_group_async<B: AsyncOps>(backend: &B, group: Group, cfg: Config, seed: u64) -> GroupReport {
    let recorder = Replay::new(backend, Mode::Record(Vec::new()));
    let _ = group_failures(&recorder, group, cfg, &mut Rng::new(seed), &mut Vec::new());
    let calls = match recorder.into_mode() {
        Mode::Record(calls) => calls,
        Mode::Replay { .. } => Vec::new(),
    };
    let count = calls.len();
    let answered = answer_all(backend, calls).await;
    let replay = Replay::new(backend, Mode::Replay { answers: answered.into_iter(), diverged: None });
    let mut skipped = Vec::new();
    let mut failures = group_failures(&replay, group, cfg, &mut Rng::new(seed), &mut skipped);
    if let Mode::Replay { diverged: Some(what), .. } = replay.into_mode() {
        failures.push(what);
    }
    GroupReport { group, seed, calls: count, skipped, failures }
}

/// One backend call the group made.
#[derive(Debug)]
enum Call {
    /// `run_typed`: the op, its inputs and the output as it was before.
    Run { op: Op, inputs: Vec<HostVec>, output: HostVec },
    /// `upload_typed`, making recorded tensor `id`.
    Upload { id: usize, data: HostVec },
    /// `alloc_typed`, making recorded tensor `id`.
    Alloc { id: usize, len: usize, dtype: DType },
    /// `run_tensors` on recorded tensors.
    RunTensors { op: Op, inputs: Vec<usize>, output: usize },
    /// `download_typed` of a recorded tensor into an output of this length and dtype.
    Download { id: usize, len: usize, dtype: DType },
    /// `synchronize`.
    Synchronize,
}

/// The real backend's answer to a call: its result and, for calls that
/// write host memory, the bytes it left there.
type Answer = (Result<()>, Option<HostVec>);

/// Sends every call to `backend`, awaiting the ones that read back.
async fn answer_all<B: AsyncOps>(backend: &B, calls: Vec<Call>) -> Vec<(Call, Answer)> {
    let mut tensors: Vec<Option<Tensor>> = Vec::new();
    let keep = |tensors: &mut Vec<Option<Tensor>>, id: usize, made: Result<Tensor>| -> Result<()> {
        if tensors.len() <= id {
            tensors.resize(id + 1, None);
        }
        made.map(|t| tensors[id] = Some(t))
    };
    let mut answered = Vec::with_capacity(calls.len());
    for call in calls {
        let answer: Answer = match &call {
            Call::Run { op, inputs, output } => {
                let views: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
                let mut out = output.clone();
                let r = backend.run_async_into(*op, &views, out.as_mut()).await;
                (r, Some(out))
            }
            Call::Upload { id, data } => (keep(&mut tensors, *id, backend.upload_typed(data.as_slice())), None),
            Call::Alloc { id, len, dtype } => (keep(&mut tensors, *id, backend.alloc_typed(*len, *dtype)), None),
            Call::RunTensors { op, inputs, output } => {
                let r = (|| {
                    let ins = inputs.iter().map(|&i| real(&tensors, i)).collect::<Result<Vec<&Tensor>>>()?;
                    backend.run_tensors(op, &ins, real(&tensors, *output)?)
                })();
                (r, None)
            }
            Call::Download { id, len, dtype } => {
                let mut out = HostVec::zeros(*dtype, *len);
                let r = match real(&tensors, *id) {
                    Ok(t) => backend.download_async_into(t, out.as_mut()).await,
                    Err(e) => Err(e),
                };
                (r, Some(out))
            }
            Call::Synchronize => (backend.synchronize(), None),
        };
        answered.push((call, answer));
    }
    answered
}

/// The real tensor made for recorded tensor `id`, or why there is none.
fn real(tensors: &[Option<Tensor>], id: usize) -> Result<&Tensor> {
    tensors.get(id).and_then(Option::as_ref).ok_or_else(|| {
        ComputeError::shape("replay", "a tensor whose upload or allocation failed", format!("tensor={id}"))
    })
}

/// What the stand-in backend does with each call.
enum Mode {
    /// Answers at once and notes the call.
    Record(Vec<Call>),
    /// Hands out the real answers in order; after the first call that is
    /// not the recorded one, only errors (`diverged` says where).
    Replay { answers: std::vec::IntoIter<(Call, Answer)>, diverged: Option<String> },
}

/// The stand-in backend of both passes; `supports`, `kind` and
/// `device_name` are the real backend's.
struct Replay<'b, B> {
    real: &'b B,
    mode: Mutex<Mode>,
    next_id: Mutex<usize>,
}

/// A tensor of the stand-in backend: its recorded id, length and dtype.
#[derive(Debug)]
struct Recorded {
    id: usize,
    len: usize,
    dtype: DType,
    location: Location,
}

impl TensorStorage for Recorded {
    fn len(&self) -> usize {
        self.len
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn location(&self) -> Location {
        self.location
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl<'b, B: Backend> Replay<'b, B> {
    fn new(real: &'b B, mode: Mode) -> Self {
        Replay { real, mode: Mutex::new(mode), next_id: Mutex::new(0) }
    }

    fn into_mode(self) -> Mode {
        self.mode.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    /// A new recorded id (each upload and allocation of the recording gets one).
    fn next_id(&self) -> usize {
        let mut next = self.next_id.lock().unwrap_or_else(|p| p.into_inner());
        *next += 1;
        *next - 1
    }

    /// A stand-in tensor for recorded tensor `id`.
    fn tensor(&self, id: usize, len: usize, dtype: DType) -> Tensor {
        let location = Location { backend: self.real.kind(), device: 0 };
        Tensor::from_storage(std::sync::Arc::new(Recorded { id, len, dtype, location }))
    }

    /// Records `call` (answering `Ok` with nothing written), or takes the
    /// answer recorded for it. The group may make fewer calls on replay
    /// than it recorded (after an error it skips what depends on the
    /// result), never others: recorded calls are skipped up to the first
    /// that is `same`; if none is, the replay has diverged, and this and
    /// every later call is a `Driver` error that fails the group. Returns
    /// the recorded tensor id of a matched upload or allocation.
    fn call(&self, call: Call, same: impl Fn(&Call) -> bool) -> (Answer, Option<usize>) {
        let mut mode = self.mode.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *mode {
            Mode::Record(calls) => {
                calls.push(call);
                ((Ok(()), None), None)
            }
            Mode::Replay { answers, diverged } => {
                if diverged.is_none() {
                    for (recorded, answer) in answers.by_ref() {
                        if same(&recorded) {
                            let id = match recorded {
                                Call::Upload { id, .. } | Call::Alloc { id, .. } => Some(id),
                                _ => None,
                            };
                            return (answer, id);
                        }
                    }
                    *diverged = Some(format!("the replay met {} that the recording lacks", describe(&call)));
                }
                let what = diverged.clone().unwrap_or_default();
                ((Err(ComputeError::driver("replay", self.real.kind(), what)), None), None)
            }
        }
    }
}

/// A call's kind and op, for the report of a diverged replay.
fn describe(call: &Call) -> String {
    match call {
        Call::Run { op, .. } => format!("run {} {}", op.name(), op.shapes()),
        Call::Upload { id, data } => format!("upload #{id} of {} {}", data.len(), data.dtype()),
        Call::Alloc { id, len, dtype } => format!("alloc #{id} of {len} {dtype}"),
        Call::RunTensors { op, .. } => format!("run_tensors {} {}", op.name(), op.shapes()),
        Call::Download { id, .. } => format!("download #{id}"),
        Call::Synchronize => "synchronize".into(),
    }
}

/// Whether two ops are the same call (by name and shapes: a NaN parameter
/// makes `==` false).
fn same_op(a: &Op, b: &Op) -> bool {
    a.name() == b.name() && a.shapes() == b.shapes() && a.dtypes() == b.dtypes()
}

/// The recorded id of a stand-in tensor.
fn id_of(t: &Tensor) -> usize {
    t.storage::<Recorded>().map_or(usize::MAX, |r| r.id)
}

impl<B: Backend> Backend for Replay<'_, B> {
    fn kind(&self) -> BackendKind {
        self.real.kind()
    }

    fn device_name(&self) -> String {
        self.real.device_name()
    }

    fn supports(&self, op: &Op) -> bool {
        self.real.supports(op)
    }

    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], mut output: HostSliceMut<'_>) -> Result<()> {
        let call = Call::Run {
            op: *op,
            inputs: inputs.iter().map(|x| x.to_vec()).collect(),
            output: output.as_slice().to_vec(),
        };
        let ((result, written), _) = self.call(call, |c| matches!(c, Call::Run { op: o, .. } if same_op(o, op)));
        if let Some(w) = written {
            let dst = output.as_bytes_mut();
            if w.as_slice().as_bytes().len() == dst.len() {
                dst.copy_from_slice(w.as_slice().as_bytes());
            }
        }
        result
    }

    fn upload_typed(&self, data: HostSlice<'_>) -> Result<Tensor> {
        let (len, dtype) = (data.len(), data.dtype());
        let id = self.next_id();
        let call = Call::Upload { id, data: data.to_vec() };
        let same = |c: &Call| matches!(c, Call::Upload { data, .. } if data.len() == len && data.dtype() == dtype);
        let ((result, _), recorded) = self.call(call, same);
        result.map(|()| self.tensor(recorded.unwrap_or(id), len, dtype))
    }

    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Tensor> {
        let id = self.next_id();
        let same = |c: &Call| matches!(c, Call::Alloc { len: l, dtype: d, .. } if *l == len && *d == dtype);
        let ((result, _), recorded) = self.call(Call::Alloc { id, len, dtype }, same);
        result.map(|()| self.tensor(recorded.unwrap_or(id), len, dtype))
    }

    fn download_typed(&self, tensor: &Tensor, mut out: HostSliceMut<'_>) -> Result<()> {
        let id = id_of(tensor);
        let call = Call::Download { id, len: out.len(), dtype: out.dtype() };
        let ((result, written), _) = self.call(call, |c| matches!(c, Call::Download { id: i, .. } if *i == id));
        if let (Ok(()), Some(w)) = (&result, written) {
            let dst = out.as_bytes_mut();
            if w.as_slice().as_bytes().len() == dst.len() {
                dst.copy_from_slice(w.as_slice().as_bytes());
            }
        }
        result
    }

    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()> {
        let call = Call::RunTensors { op: *op, inputs: inputs.iter().map(|t| id_of(t)).collect(), output: id_of(output) };
        self.call(call, |c| matches!(c, Call::RunTensors { op: o, .. } if same_op(o, op))).0.0
    }

    fn synchronize(&self) -> Result<()> {
        self.call(Call::Synchronize, |c| matches!(c, Call::Synchronize)).0.0
    }
}
