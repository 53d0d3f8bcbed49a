//! `granary._granary`: the Rust half of the `granary` Python package. Every call that
//! waits on the network lets go of the interpreter (`Python::detach`), so other Python
//! threads run meanwhile. Connections belong to the process that opened them: after a
//! fork (DataLoader workers), the child opens its own on first use.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use granary_client::dataset::catalog::Catalog;
use granary_client::dataset::plan::{Round, Split};
use granary_client::dataset::planned::{
    plan_epoch, read_epoch, Delivered, EpochSpec, LocalReads, PlannedRead, ReadSettings, RunFile,
};
use granary_client::dataset::route::Router;
use granary_client::{BatchItem, Credentials, GetOptions, Local, Missing, ObjectReader, TarReader};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyMemoryView, PySlice};

pyo3::create_exception!(
    _granary,
    GranaryError,
    PyException,
    "A request Granary refused or could not serve: args are (message, S3 code or None, HTTP status or None)."
);

/// The Python exception for a client error: its message, S3 code and HTTP status.
fn py_err(e: granary_client::Error) -> PyErr {
    GranaryError::new_err((e.to_string(), e.code().map(str::to_owned), e.status()))
}

fn pid() -> u32 {
    std::process::id()
}

fn credentials(
    access_key: Option<&str>,
    secret_key: Option<&str>,
    region: &str,
) -> PyResult<Option<Credentials>> {
    match (access_key, secret_key) {
        (Some(a), Some(s)) => Ok(Some(Credentials::new(a, s, region))),
        (None, None) => Ok(None),
        _ => Err(PyValueError::new_err(
            "give both access_key and secret_key, or neither",
        )),
    }
}

fn new_client(
    endpoint: &str,
    creds: Option<Credentials>,
    timeout: f64,
) -> Result<granary_client::Client, granary_client::Error> {
    let c = granary_client::Client::new(endpoint)?
        .with_credentials_opt(creds)
        .with_timeout(Duration::from_secs_f64(timeout.max(0.001)));
    Ok(c)
}

/// Where a dataset reads: each shard from its owner, as the cluster's ring says when
/// `route` (a node that cannot say is read through alone), else `endpoint` for all.
fn router_for(
    endpoint: &str,
    creds: &Option<Credentials>,
    timeout: f64,
    route: bool,
) -> granary_client::Result<Router> {
    if !route {
        return Ok(Router::single(endpoint));
    }
    Router::discover(&mut new_client(endpoint, creds.clone(), timeout)?)
}

/// A client of one node (`http://host:port`, or `unix:PATH` on the node's machine).
#[pyclass(module = "granary._granary", subclass)]
struct Client {
    /// The process that opened the connection, and the client.
    inner: Mutex<(u32, granary_client::Client)>,
    /// GPU delivery's readers (pinned buffers and a stream each), by device.
    #[cfg(feature = "cuda")]
    gpus: Mutex<Vec<granary_client::cuda::DeviceReader>>,
}

impl Client {
    /// Runs `f` on this process's client, without the interpreter.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut granary_client::Client) -> granary_client::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if g.0 != pid() {
                // Forked: the parent's connection is not ours to use.
                g.1 = g.1.fresh();
                g.0 = pid();
            }
            f(&mut g.1)
        })
        .map_err(py_err)
    }
}

fn json_to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let json = py.import("json")?;
    Ok(json.call_method1("loads", (v.to_string(),))?.unbind())
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (endpoint, access_key=None, secret_key=None, region="us-east-1", timeout=60.0, local_socket=None))]
    fn new(
        endpoint: &str,
        access_key: Option<&str>,
        secret_key: Option<&str>,
        region: &str,
        timeout: f64,
        local_socket: Option<&str>,
    ) -> PyResult<Self> {
        let creds = credentials(access_key, secret_key, region)?;
        let mut c = new_client(endpoint, creds, timeout).map_err(py_err)?;
        if let Some(path) = local_socket {
            c = c.with_local_socket(path);
        }
        Ok(Client {
            inner: Mutex::new((pid(), c)),
            #[cfg(feature = "cuda")]
            gpus: Mutex::new(Vec::new()),
        })
    }

    /// The node's address.
    #[getter]
    fn endpoint(&self) -> String {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .endpoint()
            .to_owned()
    }

    /// An object's bytes; `range=(start, end_inclusive)` for part of it.
    #[pyo3(signature = (bucket, key, range=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        bucket: &str,
        key: &str,
        range: Option<(u64, u64)>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let opts = GetOptions {
            range: range_of(range)?,
            ..GetOptions::default()
        };
        // The `bytes` is made once the answer's length is known, and the kernel copies
        // the body into it straight from the socket, the interpreter let go meanwhile.
        let mut out: Option<Py<PyBytes>> = None;
        let mut alloc = |n: usize| -> granary_client::Result<*mut u8> {
            Python::attach(|py| {
                let (obj, ptr) = new_bytes(py, n).map_err(|_| {
                    granary_client::Error::Invalid(format!("{n} bytes do not fit in memory"))
                })?;
                out = Some(obj.unbind());
                Ok(ptr)
            })
        };
        // SAFETY: the pointer is the new `bytes`' own buffer of `n` bytes, which nothing
        // else sees until the call returns.
        self.call(py, |c| unsafe {
            c.get_with_alloc(bucket, key, &opts, &mut alloc)
        })?;
        let out = out.ok_or_else(|| PyValueError::new_err("no answer was read"))?;
        Ok(out.into_bound(py))
    }

    /// Reads an object (or `range`) into writable memory at `address`, `len` bytes long
    /// (`Client.get_into` passes a buffer's); the bytes written.
    #[pyo3(signature = (bucket, key, address, len, range=None))]
    fn _get_into(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        address: usize,
        len: usize,
        range: Option<(u64, u64)>,
    ) -> PyResult<usize> {
        let opts = GetOptions {
            range: range_of(range)?,
            ..GetOptions::default()
        };
        if address == 0 && len > 0 {
            return Err(PyValueError::new_err("a null buffer"));
        }
        let mut scratch = [0u8; 0];
        let addr = if len == 0 {
            scratch.as_mut_ptr() as usize
        } else {
            address
        };
        self.call(py, |c| {
            // SAFETY: `Client.get_into` passes the address and length of a writable
            // buffer it holds exported (a ctypes view of it) until this returns.
            let buf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
            c.get_to_slice(bucket, key, &opts, buf)
        })
    }

    /// One file of a tar shard (`?archpath=`).
    fn get_member<'py>(
        &self,
        py: Python<'py>,
        bucket: &str,
        shard_key: &str,
        member: &str,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let data = self.call(py, |c| c.get_member(bucket, shard_key, member))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Where an object's bytes lie in the node's cache file, when the node is on this
    /// machine and has it cached: `(fd, offset, length)`, the descriptor the caller's to
    /// map and close; else `None` (read it with `get`).
    #[pyo3(signature = (bucket, key, range=None))]
    fn open_local(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        range: Option<(u64, u64)>,
    ) -> PyResult<Option<(i32, u64, u64)>> {
        use std::os::fd::IntoRawFd;
        let opts = GetOptions {
            range: range_of(range)?,
            ..GetOptions::default()
        };
        let got = self.call(py, |c| c.open_local(bucket, key, &opts))?;
        Ok(match got {
            Local::File(f) => {
                let (offset, len) = (f.offset(), f.len());
                Some((f.into_fd().into_raw_fd(), offset, len))
            }
            Local::Bytes(..) => None,
        })
    }

    /// Writes an object; returns its ETag.
    fn put(&self, py: Python<'_>, bucket: &str, key: &str, data: Vec<u8>) -> PyResult<String> {
        self.call(py, |c| c.put_bytes(bucket, key, &data))
    }

    /// Every key under `prefix`, all pages.
    #[pyo3(signature = (bucket, prefix=""))]
    fn list(&self, py: Python<'_>, bucket: &str, prefix: &str) -> PyResult<Vec<String>> {
        let listed = self.call(py, |c| c.list(bucket, prefix))?;
        Ok(listed.into_iter().map(|o| o.key).collect())
    }

    /// GetBatch: `items` are `(bucket, key)` or `(bucket, key, member)`; yields
    /// `(name, bytes)` in their order as the tar stream arrives.
    fn batch(&self, py: Python<'_>, items: Vec<Vec<String>>) -> PyResult<BatchIter> {
        let items = items
            .iter()
            .map(|it| match it.as_slice() {
                [b, k] => Ok(BatchItem::object(b, k)),
                [b, k, m] => Ok(BatchItem::member(b, k, m)),
                _ => Err(PyValueError::new_err(
                    "a batch item is (bucket, key) or (bucket, key, member)",
                )),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let reader = self.call(py, |c| c.open_batch(&items, Missing::Error))?;
        Ok(BatchIter {
            tar: Mutex::new(Some(TarReader::new(reader))),
        })
    }

    /// Starts warming the cluster's cache with every object under `prefix`: the job id.
    fn prefetch(&self, py: Python<'_>, bucket: &str, prefix: &str) -> PyResult<String> {
        self.call(py, |c| c.prefetch(bucket, prefix))
    }

    /// A job's progress, as `/_granary/jobs/{id}` says.
    fn job(&self, py: Python<'_>, id: &str) -> PyResult<Py<PyAny>> {
        if id.is_empty() {
            return Err(PyValueError::new_err("empty job id"));
        }
        let path = format!("/_granary/jobs/{}", granary_proto::encode::query_value(id));
        let v = self.json(py, &path)?;
        json_to_py(py, &v)
    }

    /// The cluster as this node sees it (`/_granary/cluster`).
    fn cluster(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = self.json(py, "/_granary/cluster")?;
        json_to_py(py, &v)
    }

    /// An object's bytes (or `range`) in the memory of CUDA device `device`: received
    /// into two pinned buffers in turn, each copied to the device while the other fills.
    /// A `DeviceBytes` (`__cuda_array_interface__`: `torch.as_tensor` takes it).
    #[cfg(feature = "cuda")]
    #[pyo3(signature = (bucket, key, device=0, range=None))]
    fn get_to_device(
        &self,
        py: Python<'_>,
        bucket: &str,
        key: &str,
        device: usize,
        range: Option<(u64, u64)>,
    ) -> PyResult<gpu::DeviceBytes> {
        let opts = GetOptions {
            range: range_of(range)?,
            ..GetOptions::default()
        };
        let mut client = {
            let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.1.fresh()
        };
        py.detach(|| {
            gpu::with_reader(&self.gpus, device, |r| {
                r.read_object(&mut client, bucket, key, &opts)
            })
        })
    }

    /// `GET /_granary/plans`: the plans the cluster holds, as dicts.
    fn plans(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = self.json(py, "/_granary/plans")?;
        json_to_py(py, v.get("plans").unwrap_or(&serde_json::Value::Null))
    }

    /// The node's pipelines, name → definition (`/_granary/pipelines`).
    fn pipelines(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = self.json(py, "/_granary/pipelines")?;
        json_to_py(py, v.get("pipelines").unwrap_or(&serde_json::Value::Null))
    }

    /// The node's counters (`/_granary/stats`).
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let v = self.json(py, "/_granary/stats")?;
        json_to_py(py, &v)
    }
}

impl Client {
    fn json(&self, py: Python<'_>, target: &str) -> PyResult<serde_json::Value> {
        self.call(py, |c| c.get_json(target))
    }
}

fn range_of(range: Option<(u64, u64)>) -> PyResult<Option<std::ops::Range<u64>>> {
    match range {
        None => Ok(None),
        Some((a, b)) if b >= a => Ok(Some(a..b + 1)),
        Some((a, b)) => Err(PyValueError::new_err(format!(
            "range ({a}, {b}): the end (inclusive) is before the start"
        ))),
    }
}

/// The members of a GetBatch answer as they arrive.
#[pyclass(module = "granary._granary")]
struct BatchIter {
    tar: Mutex<Option<TarReader<ObjectReader>>>,
}

#[pymethods]
impl BatchIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<(String, Bound<'py, PyBytes>)>> {
        let next = py.detach(|| {
            let mut g = self.tar.lock().unwrap_or_else(|p| p.into_inner());
            let Some(tar) = g.as_mut() else {
                return Ok(None);
            };
            let got = tar.next_file();
            if !matches!(got, Ok(Some(_))) {
                *g = None;
            }
            got
        });
        match next {
            Ok(Some((name, data))) => Ok(Some((name, PyBytes::new(py, &data)))),
            Ok(None) => Ok(None),
            Err(e) => Err(GranaryError::new_err((
                format!("the batch stream broke: {e}"),
                None::<String>,
                None::<u16>,
            ))),
        }
    }
}

/// A dataset's shards and where their samples lie (`granary.ShardDataset` holds one).
#[pyclass(module = "granary._granary")]
struct Shards {
    catalog: Arc<Catalog>,
}

#[pymethods]
impl Shards {
    /// Lists the shards under `prefix` and their samples.
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (endpoint, bucket, prefix, access_key=None, secret_key=None, region="us-east-1", timeout=60.0))]
    fn list(
        py: Python<'_>,
        endpoint: &str,
        bucket: &str,
        prefix: &str,
        access_key: Option<&str>,
        secret_key: Option<&str>,
        region: &str,
        timeout: f64,
    ) -> PyResult<Shards> {
        let creds = credentials(access_key, secret_key, region)?;
        let catalog = py
            .detach(|| {
                let router = router_for(endpoint, &creds, timeout, true)?;
                let client = new_client(endpoint, creds, timeout)?;
                Catalog::build(&client, &router, bucket, prefix)
            })
            .map_err(py_err)?;
        Ok(Shards {
            catalog: Arc::new(catalog),
        })
    }

    /// The catalog as JSON, to rebuild it elsewhere (pickling).
    fn to_json(&self) -> PyResult<String> {
        serde_json::to_string(&*self.catalog).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Shards> {
        let catalog: Catalog =
            serde_json::from_str(text).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Shards {
            catalog: Arc::new(catalog),
        })
    }

    /// Samples in the dataset.
    fn __len__(&self) -> usize {
        self.catalog.len()
    }

    /// The shard keys, in key order.
    fn keys(&self) -> Vec<String> {
        self.catalog.shards.iter().map(|s| s.key.clone()).collect()
    }

    /// Samples per shard, in key order.
    fn counts(&self) -> Vec<u32> {
        self.catalog.counts()
    }

    /// Samples each rank yields in an epoch of `r` (its resume history and split; the
    /// rank's place is not asked).
    fn count(&self, r: &EpochRead) -> PyResult<usize> {
        plan_epoch(&self.catalog, &r.spec((0, 0, 1, 1)))
            .map(|e| e.len())
            .map_err(py_err)
    }

    /// The rank's epoch in `r`'s order (all its workers together, as a DataLoader yields
    /// them): for each sample, its shard's index (in key order) and its place in the
    /// rank's span, which reads the rank's shards front to back.
    fn order(&self, r: &EpochRead) -> PyResult<Vec<(u32, u32)>> {
        plan_epoch(&self.catalog, &r.spec((r.rank, 0, 1, r.batch_size)))
            .map(|e| e.into_iter().map(|(id, place)| (id.shard, place)).collect())
            .map_err(py_err)
    }

    /// Registers an epoch's plan with the cluster (`r` as for `read`; the worker and
    /// read-ahead are not asked): the plan's id, or `None` where the node takes no
    /// plans.
    fn register(&self, py: Python<'_>, r: &EpochRead) -> PyResult<Option<String>> {
        let creds = r.credentials()?;
        let spec = r.spec((0, 0, 1, r.batch_size));
        let catalog = self.catalog.clone();
        Ok(py.detach(|| {
            let settings = ReadSettings {
                router: Router::single(&r.endpoint),
                credentials: creds,
                timeout: r.timeout(),
                read_ahead: 0,
                ahead_here: true,
                local: LocalReads::Off,
                plan: true,
                pipeline: r.pipeline.clone(),
            };
            granary_client::dataset::planned::register(&catalog, &spec, &settings)
        }))
    }

    /// Starts reading one rank's (and worker's) part of an epoch, as `r` says.
    fn read(&self, py: Python<'_>, r: &EpochRead) -> PyResult<SampleIter> {
        let creds = r.credentials()?;
        let spec = r.spec((r.rank, r.worker, r.workers, r.batch_size));
        let catalog = self.catalog.clone();
        let read = py
            .detach(|| {
                let router = router_for(&r.endpoint, &creds, r.timeout, r.route)?;
                let settings = ReadSettings {
                    router,
                    credentials: creds,
                    timeout: r.timeout(),
                    read_ahead: r.read_ahead,
                    ahead_here: r.ahead_here,
                    local: if r.zero_copy {
                        LocalReads::Mapped
                    } else {
                        LocalReads::Copied
                    },
                    plan: r.plan,
                    pipeline: r.pipeline.clone(),
                };
                read_epoch(catalog, &spec, settings)
            })
            .map_err(py_err)?;
        Ok(SampleIter {
            read: Mutex::new(Some(read)),
            maps: Mutex::new(Vec::new()),
        })
    }
}

/// How one rank (or one of its DataLoader workers) reads an epoch of a dataset: what
/// `Shards.count`, `register` and `read` take, every field named
/// (`EpochRead(endpoint=..., epoch=..., ...)`; `ShardDataset` fills it in).
/// - `rounds`: the resume history, `(world_size, shuffle_buffer, drop_last, consumed)`
///   each;
/// - `route`: read each shard from its owner, as the cluster's ring says;
/// - `zero_copy`: members a node on this machine passes as a file arrive as
///   `memoryview`s of its mapping;
/// - `plan`: register the epoch's plan, and mark each read with its place;
/// - `ahead_here`: a reader that reads from a node on this machine fetches ahead too;
/// - `pipeline`: the node's pipeline the members arrive prepared by, for `seed` and
///   `epoch`.
#[pyclass(module = "granary._granary")]
#[derive(Clone)]
struct EpochRead {
    endpoint: String,
    epoch: u64,
    seed: u64,
    shuffle_shards: bool,
    rounds: Vec<(usize, usize, bool, u64)>,
    world_size: usize,
    shuffle_buffer: usize,
    drop_last: bool,
    rank: usize,
    worker: usize,
    workers: usize,
    batch_size: usize,
    read_ahead: usize,
    route: bool,
    access_key: Option<String>,
    secret_key: Option<String>,
    region: String,
    timeout: f64,
    zero_copy: bool,
    plan: bool,
    ahead_here: bool,
    pipeline: Option<String>,
}

impl Default for EpochRead {
    fn default() -> EpochRead {
        EpochRead {
            endpoint: String::new(),
            epoch: 0,
            seed: 0,
            shuffle_shards: true,
            rounds: Vec::new(),
            world_size: 1,
            shuffle_buffer: 0,
            drop_last: false,
            rank: 0,
            worker: 0,
            workers: 1,
            batch_size: 1,
            read_ahead: 0,
            route: true,
            access_key: None,
            secret_key: None,
            region: "us-east-1".to_owned(),
            timeout: 60.0,
            zero_copy: false,
            plan: true,
            ahead_here: true,
            pipeline: None,
        }
    }
}

#[pymethods]
impl EpochRead {
    /// Every field by name; one not given keeps its default, one unknown is an error.
    #[new]
    #[pyo3(signature = (**fields))]
    fn new(fields: Option<&Bound<'_, PyDict>>) -> PyResult<EpochRead> {
        let mut r = EpochRead::default();
        for (k, v) in fields.into_iter().flat_map(|f| f.iter()) {
            let name: String = k.extract()?;
            match name.as_str() {
                "endpoint" => r.endpoint = v.extract()?,
                "epoch" => r.epoch = v.extract()?,
                "seed" => r.seed = v.extract()?,
                "shuffle_shards" => r.shuffle_shards = v.extract()?,
                "rounds" => r.rounds = v.extract()?,
                "world_size" => r.world_size = v.extract()?,
                "shuffle_buffer" => r.shuffle_buffer = v.extract()?,
                "drop_last" => r.drop_last = v.extract()?,
                "rank" => r.rank = v.extract()?,
                "worker" => r.worker = v.extract()?,
                "workers" => r.workers = v.extract()?,
                "batch_size" => r.batch_size = v.extract()?,
                "read_ahead" => r.read_ahead = v.extract()?,
                "route" => r.route = v.extract()?,
                "access_key" => r.access_key = v.extract()?,
                "secret_key" => r.secret_key = v.extract()?,
                "region" => r.region = v.extract()?,
                "timeout" => r.timeout = v.extract()?,
                "zero_copy" => r.zero_copy = v.extract()?,
                "plan" => r.plan = v.extract()?,
                "ahead_here" => r.ahead_here = v.extract()?,
                "pipeline" => r.pipeline = v.extract()?,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "EpochRead has no field `{other}`"
                    )))
                }
            }
        }
        Ok(r)
    }
}

impl EpochRead {
    /// The epoch's spec, for the rank's place `(rank, worker, workers, batch size)`.
    fn spec(&self, place: (usize, usize, usize, usize)) -> EpochSpec {
        spec_of(
            self.epoch,
            self.seed,
            self.shuffle_shards,
            self.rounds.clone(),
            (self.world_size, self.shuffle_buffer, self.drop_last),
            place,
        )
    }

    fn credentials(&self) -> PyResult<Option<Credentials>> {
        credentials(
            self.access_key.as_deref(),
            self.secret_key.as_deref(),
            &self.region,
        )
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout.max(0.001))
    }
}

/// A new `bytes` of `n` bytes whose contents the caller writes, through the pointer,
/// before handing it on (not zeroed first, as `PyBytes::new_with` would).
fn new_bytes(py: Python<'_>, n: usize) -> PyResult<(Bound<'_, PyBytes>, *mut u8)> {
    let len = isize::try_from(n).map_err(|_| PyValueError::new_err("too many bytes"))?;
    // SAFETY: a new `bytes` of `len` bytes, its contents to be written; nothing else
    // sees it until it is handed on.
    unsafe {
        let obj = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        let ptr = pyo3::ffi::PyBytes_AsString(obj).cast::<u8>();
        Ok((Bound::from_owned_ptr(py, obj).cast_into_unchecked(), ptr))
    }
}

/// An epoch's spec: `split` is (world size, buffer, drop_last), `place` (rank, worker,
/// workers, batch size).
fn spec_of(
    epoch: u64,
    seed: u64,
    shuffle_shards: bool,
    rounds: Vec<(usize, usize, bool, u64)>,
    split: (usize, usize, bool),
    place: (usize, usize, usize, usize),
) -> EpochSpec {
    let split_of = |(world_size, shuffle_buffer, drop_last): (usize, usize, bool)| Split {
        world_size,
        shuffle_buffer,
        drop_last,
    };
    EpochSpec {
        seed,
        epoch,
        shuffle_shards,
        rounds: rounds
            .into_iter()
            .map(|(w, s, d, consumed)| Round {
                split: split_of((w, s, d)),
                consumed,
            })
            .collect(),
        split: split_of(split),
        rank: place.0,
        worker: place.1,
        workers: place.2,
        batch_size: place.3,
    }
}

/// Samples as dicts: `{"__key__", "__url__", ext: bytes, ...}`; with `zero_copy`,
/// members the node passed as a file are read-only `memoryview`s of its mapping.
#[pyclass(module = "granary._granary")]
struct SampleIter {
    read: Mutex<Option<PlannedRead>>,
    /// The last runs' files, each mapped once: the file, the mapping's `memoryview` and
    /// where the mapping starts in the file.
    maps: Mutex<Vec<Mapped>>,
}

/// A run's file, the `memoryview` of its mapping, and where the mapping starts.
type Mapped = (Arc<RunFile>, Py<PyAny>, u64);

/// Runs' mappings kept at once (a shuffle buffer may hold samples of a few runs).
const MAPS_KEPT: usize = 16;

impl SampleIter {
    /// The `memoryview` over `file`'s mapping and where it starts in the file.
    fn mapping<'py>(
        &self,
        py: Python<'py>,
        file: &Arc<RunFile>,
    ) -> PyResult<(Bound<'py, PyAny>, u64)> {
        use std::os::fd::AsRawFd;
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, view, start)) = maps.iter().find(|(f, _, _)| Arc::ptr_eq(f, file)) {
            return Ok((view.bind(py).clone(), *start));
        }
        let mmap = py.import("mmap")?;
        let gran: u64 = mmap.getattr("ALLOCATIONGRANULARITY")?.extract()?;
        let start = file.offset / gran * gran;
        let kwargs = PyDict::new(py);
        kwargs.set_item("access", mmap.getattr("ACCESS_READ")?)?;
        kwargs.set_item("offset", start)?;
        // Python's mmap keeps its own duplicate of the descriptor.
        let m = mmap.getattr("mmap")?.call(
            (file.file.as_raw_fd(), file.offset + file.len - start),
            Some(&kwargs),
        )?;
        let view = PyMemoryView::from(&m)?.into_any();
        if maps.len() >= MAPS_KEPT {
            maps.remove(0);
        }
        maps.push((file.clone(), view.clone().unbind(), start));
        Ok((view, start))
    }
}

#[pymethods]
impl SampleIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let next = py.detach(|| {
            let mut g = self.read.lock().unwrap_or_else(|p| p.into_inner());
            let got = g.as_mut().and_then(Iterator::next);
            if !matches!(got, Some(Ok(_))) {
                *g = None;
            }
            got
        });
        let Some(sample) = next else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        match sample.map_err(py_err)? {
            Delivered::Owned(sample) => {
                d.set_item("__key__", &sample.key)?;
                d.set_item("__url__", &sample.shard)?;
                for (ext, data) in &sample.fields {
                    d.set_item(ext, PyBytes::new(py, data))?;
                }
            }
            Delivered::Buffered(sample) => {
                d.set_item("__key__", &sample.key)?;
                d.set_item("__url__", &sample.shard)?;
                for (ext, range) in &sample.fields {
                    d.set_item(ext, PyBytes::new(py, &sample.run[range.clone()]))?;
                }
            }
            Delivered::Resident(sample) => {
                d.set_item("__key__", &sample.key)?;
                d.set_item("__url__", &sample.shard)?;
                let (mut members, mut ptrs) = (Vec::new(), Vec::new());
                for (ext, range) in &sample.fields {
                    let (bytes, ptr) = new_bytes(py, range.len())?;
                    members.push((ext, bytes));
                    ptrs.push(ptr as usize);
                }
                // Each copied once, straight out of the page cache (or from the node,
                // where its pages left memory), the GIL released.
                py.detach(|| {
                    let mut g = self.read.lock().unwrap_or_else(|p| p.into_inner());
                    let Some(read) = g.as_mut() else {
                        return Err(granary_client::Error::Invalid("the epoch ended".into()));
                    };
                    for (i, ptr) in ptrs.iter().enumerate() {
                        // SAFETY: each `bytes` was made with room for its member, and
                        // is handed on only once it is written.
                        unsafe { read.copy_member(&sample, i, *ptr as *mut u8)? };
                    }
                    Ok(())
                })
                .map_err(py_err)?;
                for (ext, bytes) in members {
                    d.set_item(ext, bytes)?;
                }
            }
            Delivered::Mapped(sample) => {
                d.set_item("__key__", &sample.key)?;
                d.set_item("__url__", &sample.shard)?;
                let (view, start) = self.mapping(py, &sample.file)?;
                for (ext, offset, len) in &sample.fields {
                    let a = (offset - start) as isize;
                    let slice = PySlice::new(py, a, a + *len as isize, 1);
                    d.set_item(ext, view.get_item(slice)?)?;
                }
            }
        }
        Ok(Some(d))
    }
}

/// GPU delivery: device memory handed to Python with `__cuda_array_interface__`.
#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Mutex;

    use granary_client::cuda::{DeviceBuf, DeviceReader, GpuError};
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    use super::GranaryError;

    /// Device memory holding bytes: alive while Python (a tensor made from it) holds it.
    #[pyclass(module = "granary._granary")]
    pub struct DeviceBytes {
        buf: DeviceBuf,
        ptr: u64,
        device: usize,
    }

    #[pymethods]
    impl DeviceBytes {
        /// The CUDA Array Interface (version 3): a byte array, ready on every stream.
        #[getter]
        fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
            let d = PyDict::new(py);
            d.set_item("shape", (self.buf.len(),))?;
            d.set_item("typestr", "|u1")?;
            d.set_item("data", (self.ptr, false))?;
            d.set_item("version", 3)?;
            d.set_item("strides", py.None())?;
            d.set_item("stream", py.None())?;
            Ok(d)
        }

        /// The device's ordinal.
        #[getter]
        fn device(&self) -> usize {
            self.device
        }

        fn __len__(&self) -> usize {
            self.buf.len()
        }
    }

    fn gpu_err(e: GpuError) -> PyErr {
        GranaryError::new_err((e.to_string(), None::<String>, None::<u16>))
    }

    /// Runs `f` with this client's reader for `device` (made on first use), and wraps
    /// the memory it fills.
    pub fn with_reader(
        readers: &Mutex<Vec<DeviceReader>>,
        device: usize,
        f: impl FnOnce(&mut DeviceReader) -> Result<DeviceBuf, GpuError>,
    ) -> PyResult<DeviceBytes> {
        use granary_client::cuda::cudarc::driver::DevicePtr;
        let mut readers = readers.lock().unwrap_or_else(|p| p.into_inner());
        let i = match readers.iter().position(|r| r.ordinal() == device) {
            Some(i) => i,
            None => {
                readers.push(DeviceReader::new(device).map_err(gpu_err)?);
                readers.len() - 1
            }
        };
        let reader = &mut readers[i];
        let buf = f(reader).map_err(gpu_err)?;
        let ptr = {
            let (ptr, _sync) = buf.slice().device_ptr(reader.stream());
            ptr
        };
        Ok(DeviceBytes { buf, ptr, device })
    }

    /// Bytes already in memory, copied to device `device` through the same pinned
    /// buffers (`ShardDataset(device=...)`).
    #[pyfunction]
    pub fn to_device(py: Python<'_>, data: Vec<u8>, device: usize) -> PyResult<DeviceBytes> {
        static READERS: Mutex<Vec<DeviceReader>> = Mutex::new(Vec::new());
        py.detach(|| with_reader(&READERS, device, |r| r.copy_from_host(&data)))
    }

    /// Whether a CUDA driver loads and shows a device.
    #[pyfunction]
    pub fn cuda_available() -> bool {
        granary_client::cuda::available()
    }
}

/// A pipeline, prepared here on the caller's CPU: the same bytes a node prepares for the
/// same (seed, epoch, sample key). Built from the definition as JSON (a
/// `[pipelines.NAME]` table).
#[pyclass(frozen)]
struct Pipeline {
    inner: granary_prep::Pipeline,
}

#[pymethods]
impl Pipeline {
    #[new]
    fn new(spec_json: &str) -> PyResult<Pipeline> {
        let spec: granary_prep::PipelineSpec = serde_json::from_str(spec_json)
            .map_err(|e| PyValueError::new_err(format!("pipeline: {e}")))?;
        let inner = granary_prep::Pipeline::new(spec)
            .map_err(|e| PyValueError::new_err(format!("pipeline: {e}")))?;
        Ok(Pipeline { inner })
    }

    /// Whether a member with this name (`0001.jpg`) is one the pipeline prepares.
    fn prepares(&self, member: &str) -> bool {
        self.inner.prepares(member)
    }

    /// The definition's hash, which its random draws are keyed by.
    #[getter]
    fn fingerprint(&self) -> u64 {
        self.inner.fingerprint()
    }

    /// The key a shard's sample is prepared under (what `prepare` takes as `key`): the
    /// same on the node and here.
    #[staticmethod]
    fn sample_key(shard: &str, sample: &str) -> String {
        granary_prep::sample_key(shard, sample)
    }

    /// Prepares `data` as sample `key` of `epoch` in a job seeded `seed`: `(bytes, width,
    /// height)`. Runs with the GIL released.
    fn prepare<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
        seed: u64,
        epoch: u64,
        key: &str,
    ) -> PyResult<(Bound<'py, PyBytes>, u32, u32)> {
        let got = py.detach(|| self.inner.prepare(data, seed, epoch, key));
        let p = got.map_err(|e| {
            GranaryError::new_err((format!("{key}: {e}"), None::<String>, None::<u16>))
        })?;
        Ok((PyBytes::new(py, &p.bytes), p.width, p.height))
    }
}

#[pymodule]
fn _granary(m: &Bound<'_, PyModule>) -> PyResult<()> {
    #[cfg(feature = "cuda")]
    {
        m.add_class::<gpu::DeviceBytes>()?;
        m.add_function(wrap_pyfunction!(gpu::to_device, m)?)?;
        m.add_function(wrap_pyfunction!(gpu::cuda_available, m)?)?;
    }
    m.add_class::<Client>()?;
    m.add_class::<BatchIter>()?;
    m.add_class::<Shards>()?;
    m.add_class::<EpochRead>()?;
    m.add_class::<SampleIter>()?;
    m.add_class::<Pipeline>()?;
    m.add("GranaryError", m.py().get_type::<GranaryError>())?;
    Ok(())
}
