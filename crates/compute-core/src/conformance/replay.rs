//! The suite through the async API ([`AsyncOps`]), for targets where nothing
//! may block (the browser).
//!
//! A group's checks are written once, against the blocking [`Backend`] trait.
//! [`run_group_async`] runs that same code on a stand-in backend, with the
//! same seed each time, so the cases, inputs, references and tolerances are
//! the blocking suite's own:
//!
//! 1. the stand-in answers every call at once (`Ok`, outputs left as they
//!    were) and notes each call with its inputs;
//! 2. the noted calls go to the real backend in order, through its futures
//!    ([`AsyncOps::run_async_into`], [`AsyncOps::download_async_into`]; tensor
//!    uploads and ops are queued without waiting), and the answers are kept;
//! 3. the group runs again on the stand-in, which hands each call the real
//!    answer of the identical noted call (same op, same input bytes): the
//!    group's checks judge them as they judge a blocking backend.
//!
//! A call with no identical noted call (its inputs came from an earlier
//! call's answer, as in a chain of host calls) is answered `Ok` untouched
//! and noted again: then steps 2 and 3 repeat with this run's calls, until
//! a run meets only answered calls (a chain of `d` dependent calls needs
//! `d + 1` runs; at most [`MAX_RUNS`]). The group's code chooses its calls
//! from `supports()`, its random draws and whether a call failed, so a run
//! that met an error skips the noted calls that followed from success.
//! Costs the group's reference computations once per run (twice for most
//! groups), and memory for every call's inputs and outputs at once.

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

/// Most runs of a group before [`run_group_async`] gives up on calls whose
/// inputs keep changing.
pub const MAX_RUNS: usize = 8;

/// Runs conformance `group` on `backend` through its futures, never blocking
/// (see the module documentation), with inputs drawn from `seed`. Returns
/// the failures rather than panicking, so a caller in the browser can print
/// them. The futures are awaited one after the other.
pub async fn run_group_async<B: AsyncOps>(backend: &B, group: Group, cfg: Config, seed: u64) -> GroupReport {
    let mut answered: Vec<(Call, Answer)> = Vec::new();
    for _ in 0..MAX_RUNS {
        let stand_in = Replay::new(backend, std::mem::take(&mut answered));
        let mut skipped = Vec::new();
        let failures = group_failures(&stand_in, group, cfg, &mut Rng::new(seed), &mut skipped);
        let (calls, complete) = stand_in.finish();
        if complete {
            return GroupReport { group, seed, calls: calls.len(), skipped, failures };
        }
        answered = answer_all(backend, calls).await;
    }
    let failures = vec![format!("{group:?}: calls still waiting for answers after {MAX_RUNS} runs")];
    GroupReport { group, seed, calls: answered.len(), skipped: Vec::new(), failures }
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

/// The stand-in backend of every run; `supports`, `kind` and `device_name`
/// are the real backend's.
struct Replay<'b, B> {
    real: &'b B,
    state: Mutex<State>,
}

/// What a run has met so far.
struct State {
    /// The previous run's calls with the real answers, in order (taken as used).
    answers: Vec<Option<(Call, Answer)>>,
    /// Where the search for the next answer starts.
    cursor: usize,
    /// This run's calls, in order.
    calls: Vec<Call>,
    /// Whether every call of this run found its answer.
    complete: bool,
    /// The next id for a tensor no answered call made.
    next_id: usize,
}

/// A tensor of the stand-in backend: its id, length and dtype.
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
    fn new(real: &'b B, answers: Vec<(Call, Answer)>) -> Self {
        let next_id = answers
            .iter()
            .filter_map(|(c, _)| match c {
                Call::Upload { id, .. } | Call::Alloc { id, .. } => Some(id + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let complete = !answers.is_empty();
        let answers = answers.into_iter().map(Some).collect();
        let state = State { answers, cursor: 0, calls: Vec::new(), complete, next_id };
        Replay { real, state: Mutex::new(state) }
    }

    /// This run's calls, and whether each found its answer.
    fn finish(self) -> (Vec<Call>, bool) {
        let state = self.state.into_inner().unwrap_or_else(|p| p.into_inner());
        (state.calls, state.complete)
    }

    /// A stand-in tensor for tensor `id`.
    fn tensor(&self, id: usize, len: usize, dtype: DType) -> Tensor {
        let location = Location { backend: self.real.kind(), device: 0 };
        Tensor::from_storage(std::sync::Arc::new(Recorded { id, len, dtype, location }))
    }

    /// Notes `call` and returns the answer of the first identical call of
    /// the previous run at or after the last one used (calls an error led
    /// past are skipped); with none, `Ok` with nothing written, and the run
    /// is incomplete. An upload or allocation that found its answer keeps
    /// its tensor id; a new one gets a fresh id (`call` is built by `make`
    /// from the id).
    fn call(&self, make: impl Fn(usize) -> Call) -> (Answer, usize) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = state.next_id;
        let probe = make(fresh);
        let start = state.cursor.min(state.answers.len());
        let at = state.answers[start..]
            .iter()
            .position(|a| a.as_ref().is_some_and(|(noted, _)| noted.same(&probe)))
            .map(|i| start + i);
        match at.and_then(|i| state.answers[i].take().map(|a| (i, a))) {
            Some((i, (noted, answer))) => {
                state.cursor = i + 1;
                let id = noted.tensor_id().unwrap_or(fresh);
                state.calls.push(noted);
                (answer, id)
            }
            None => {
                if probe.tensor_id().is_some() {
                    state.next_id += 1;
                }
                state.calls.push(probe);
                state.complete = false;
                ((Ok(()), None), fresh)
            }
        }
    }
}

/// The bytes a host vector holds. Free.
fn bytes(v: &HostVec) -> &[u8] {
    v.as_slice().as_bytes()
}

impl Call {
    /// Whether `self` and `other` are the same call on the same data.
    fn same(&self, other: &Call) -> bool {
        match (self, other) {
            (Call::Run { op: a, inputs: ia, output: oa }, Call::Run { op: b, inputs: ib, output: ob }) => {
                same_op(a, b)
                    && ia.len() == ib.len()
                    && ia.iter().zip(ib).all(|(x, y)| x.dtype() == y.dtype() && bytes(x) == bytes(y))
                    && oa.dtype() == ob.dtype()
                    && bytes(oa) == bytes(ob)
            }
            (Call::Upload { data: a, .. }, Call::Upload { data: b, .. }) => {
                a.dtype() == b.dtype() && bytes(a) == bytes(b)
            }
            (Call::Alloc { len: a, dtype: da, .. }, Call::Alloc { len: b, dtype: db, .. }) => a == b && da == db,
            (
                Call::RunTensors { op: a, inputs: ia, output: oa },
                Call::RunTensors { op: b, inputs: ib, output: ob },
            ) => same_op(a, b) && ia == ib && oa == ob,
            (Call::Download { id: a, len: la, dtype: da }, Call::Download { id: b, len: lb, dtype: db }) => {
                a == b && la == lb && da == db
            }
            (Call::Synchronize, Call::Synchronize) => true,
            _ => false,
        }
    }

    /// The tensor an upload or allocation makes.
    fn tensor_id(&self) -> Option<usize> {
        match self {
            Call::Upload { id, .. } | Call::Alloc { id, .. } => Some(*id),
            _ => None,
        }
    }
}

/// Whether two ops are the same call (by name, shapes and dtypes: a NaN
/// parameter makes `==` false).
fn same_op(a: &Op, b: &Op) -> bool {
    a.name() == b.name() && a.shapes() == b.shapes() && a.dtypes() == b.dtypes()
}

/// The id of a stand-in tensor.
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
        let inputs: Vec<HostVec> = inputs.iter().map(HostSlice::to_vec).collect();
        let before = output.as_slice().to_vec();
        let ((result, written), _) =
            self.call(|_| Call::Run { op: *op, inputs: inputs.clone(), output: before.clone() });
        write_back(written, &mut output);
        result
    }

    fn upload_typed(&self, data: HostSlice<'_>) -> Result<Tensor> {
        let (len, dtype) = (data.len(), data.dtype());
        let data = data.to_vec();
        let ((result, _), id) = self.call(|id| Call::Upload { id, data: data.clone() });
        result.map(|()| self.tensor(id, len, dtype))
    }

    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Tensor> {
        let ((result, _), id) = self.call(|id| Call::Alloc { id, len, dtype });
        result.map(|()| self.tensor(id, len, dtype))
    }

    fn download_typed(&self, tensor: &Tensor, mut out: HostSliceMut<'_>) -> Result<()> {
        let (id, len, dtype) = (id_of(tensor), out.len(), out.dtype());
        let ((result, written), _) = self.call(|_| Call::Download { id, len, dtype });
        if result.is_ok() {
            write_back(written, &mut out);
        }
        result
    }

    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()> {
        let ids: Vec<usize> = inputs.iter().map(|t| id_of(t)).collect();
        let out = id_of(output);
        self.call(|_| Call::RunTensors { op: *op, inputs: ids.clone(), output: out }).0.0
    }

    fn synchronize(&self) -> Result<()> {
        self.call(|_| Call::Synchronize).0.0
    }
}

/// Copies an answer's output bytes into `out` (same size; nothing otherwise).
fn write_back(written: Option<HostVec>, out: &mut HostSliceMut<'_>) {
    if let Some(w) = written {
        let dst = out.as_bytes_mut();
        if w.as_slice().as_bytes().len() == dst.len() {
            dst.copy_from_slice(w.as_slice().as_bytes());
        }
    }
}
