//! The HTTP API over a database's exported tables: dumps, queries and
//! change streams as JSON.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::{ChangeKind, Changes, Db, Index, Key, Obj, ReadTxn, Revision, Storable, Table};

/// Limits and pacing of the API.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ApiOptions {
    /// A change stream with nothing to send writes an empty line this often,
    /// so that clients and proxies see the connection alive (default 15 s).
    pub keepalive: Duration,
    /// Bytes of JSON lines gathered before a chunk of a query or change
    /// stream is sent (default 64 KiB).
    pub chunk_bytes: usize,
    /// Chunks a slow client may leave unread before the producer waits
    /// (default 8).
    pub chunks_queued: usize,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            keepalive: Duration::from_secs(15),
            chunk_bytes: 64 << 10,
            chunks_queued: 8,
        }
    }
}

impl ApiOptions {
    /// Sets [`ApiOptions::keepalive`].
    pub fn with_keepalive(mut self, every: Duration) -> Self {
        self.keepalive = every;
        self
    }

    /// Sets [`ApiOptions::chunk_bytes`] and [`ApiOptions::chunks_queued`].
    pub fn with_chunks(mut self, bytes: usize, queued: usize) -> Self {
        self.chunk_bytes = bytes;
        self.chunks_queued = queued;
        self
    }
}

/// How a query matches its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Objects whose key equals it.
    Exact,
    /// Objects whose key starts with it.
    Prefix,
    /// Objects whose key is at or above it.
    LowerBound,
}

/// Runs one query on a snapshot, handing each object found to the sink
/// until it returns false; `Err` is a key the index's parser refused.
type QueryFn<T> = dyn Fn(&Table<T>, &ReadTxn, Mode, &str, &mut dyn FnMut(&Obj<T>) -> bool) -> Result<(), String>
    + Send
    + Sync;

/// An index a client may query by a key given as text.
pub struct QueryIndex<T> {
    name: String,
    run: Arc<QueryFn<T>>,
}

impl<T> Clone for QueryIndex<T> {
    fn clone(&self) -> Self {
        QueryIndex {
            name: self.name.clone(),
            run: self.run.clone(),
        }
    }
}

impl<T> std::fmt::Debug for QueryIndex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryIndex")
            .field("name", &self.name)
            .finish()
    }
}

impl<T: Storable> QueryIndex<T> {
    /// `idx`, its keys parsed from text with [`FromStr`].
    pub fn parsed<K>(idx: &Index<T, K>) -> Self
    where
        K: Key + FromStr + 'static,
        K::Err: std::fmt::Display,
    {
        Self::with(idx, |s| K::from_str(s).map_err(|e| e.to_string()))
    }

    /// `idx`, its keys parsed from text by `parse`.
    pub fn with<K>(
        idx: &Index<T, K>,
        parse: impl Fn(&str) -> Result<K, String> + Send + Sync + 'static,
    ) -> Self
    where
        K: Key + 'static,
    {
        let index = idx.clone();
        QueryIndex {
            name: idx.name().to_string(),
            run: Arc::new(move |table, txn, mode, text, sink| {
                let key = parse(text)?;
                let read = table.read(txn).map_err(|e| e.to_string())?;
                let found = match mode {
                    Mode::Exact => read.list(&index, &key),
                    Mode::Prefix => read.prefix(&index, &key),
                    Mode::LowerBound => read.lower_bound(&index, &key),
                };
                for o in found {
                    if !sink(o) {
                        break;
                    }
                }
                Ok(())
            }),
        }
    }
}

/// What the API needs of a table, whatever its object type.
trait Exported: Send + Sync {
    /// `{"table", "revision", "objects"}` as [`Table::write_json`] writes it.
    fn dump(&self, txn: &ReadTxn, out: &mut Vec<u8>) -> crate::Result<()>;
    /// Whether a query may name the index.
    fn has_index(&self, name: &str) -> bool;
    /// The names a query may use.
    fn index_names(&self) -> Vec<String>;
    /// Runs a query, one JSON line per object into `line` until it returns
    /// false.
    fn query(
        &self,
        txn: &ReadTxn,
        index: &str,
        mode: Mode,
        key: &str,
        line: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<(), ApiError>;
    /// A change consumer registered now, from the table's beginning.
    fn changes(&self, db: &Db) -> crate::Result<Box<dyn ChangeFeed>>;
}

/// A registered change consumer, whatever its object type.
trait ChangeFeed: Send {
    /// The changes committed up to `txn` as JSON lines, and a watch that
    /// fires when more are.
    fn next(&mut self, txn: &ReadTxn, out: &mut Vec<u8>) -> crate::Result<crate::Watch>;
}

/// One object in a query's answer.
#[derive(Serialize)]
struct Row<'a, T> {
    revision: Revision,
    object: &'a T,
}

/// One change in a change stream.
#[derive(Serialize)]
struct ChangeRow<'a, T> {
    revision: Revision,
    kind: &'static str,
    object: &'a T,
}

/// The wire name of a change kind.
pub(crate) fn kind_name(k: ChangeKind) -> &'static str {
    match k {
        ChangeKind::Insert => "insert",
        ChangeKind::Update => "update",
        ChangeKind::Delete => "delete",
    }
}

struct ExportedTable<T> {
    table: Table<T>,
    indexes: BTreeMap<String, QueryIndex<T>>,
}

impl<T: Storable + Serialize> Exported for ExportedTable<T> {
    fn dump(&self, txn: &ReadTxn, out: &mut Vec<u8>) -> crate::Result<()> {
        self.table.write_json(txn, out)
    }

    fn has_index(&self, name: &str) -> bool {
        self.indexes.contains_key(name)
    }

    fn index_names(&self) -> Vec<String> {
        self.indexes.keys().cloned().collect()
    }

    fn query(
        &self,
        txn: &ReadTxn,
        index: &str,
        mode: Mode,
        key: &str,
        line: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<(), ApiError> {
        let Some(q) = self.indexes.get(index) else {
            return Err(ApiError::unknown_index(
                self.table.name(),
                index,
                self.index_names(),
            ));
        };
        let mut buf = Vec::new();
        let mut failed = None;
        (q.run)(&self.table, txn, mode, key, &mut |o| {
            buf.clear();
            let row = Row {
                revision: o.revision(),
                object: o.value(),
            };
            if let Err(e) = serde_json::to_writer(&mut buf, &row) {
                failed = Some(e);
                return false;
            }
            buf.push(b'\n');
            line(&buf)
        })
        .map_err(|e| ApiError::bad_request(format!("key {key:?} for index {index:?}: {e}")))?;
        match failed {
            Some(e) => Err(ApiError::internal(format!("encoding an object: {e}"))),
            None => Ok(()),
        }
    }

    fn changes(&self, db: &Db) -> crate::Result<Box<dyn ChangeFeed>> {
        let mut txn = db.write_txn(&[&self.table])?;
        let changes = self.table.changes(&mut txn)?;
        txn.abort()?;
        Ok(Box::new(TableFeed { changes }))
    }
}

struct TableFeed<T> {
    changes: Changes<T>,
}

impl<T: Storable + Serialize> ChangeFeed for TableFeed<T> {
    fn next(&mut self, txn: &ReadTxn, out: &mut Vec<u8>) -> crate::Result<crate::Watch> {
        let (changes, watch) = self.changes.iter(txn)?;
        for c in changes {
            let row = ChangeRow {
                revision: c.revision,
                kind: kind_name(c.kind),
                object: c.object.value(),
            };
            serde_json::to_writer(&mut *out, &row)?;
            out.push(b'\n');
        }
        Ok(watch)
    }
}

/// A JSON error: `{"error": "..."}` with its HTTP status.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: String,
}

impl ApiError {
    fn bad_request(message: String) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message,
        }
    }
    fn internal(message: String) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message,
        }
    }
    fn unknown_table(name: &str, known: Vec<&String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("no table {name:?} (tables: {known:?})"),
        }
    }
    fn unknown_index(table: &str, index: &str, known: Vec<String>) -> Self {
        ApiError::bad_request(format!(
            "table {table:?} has no queryable index {index:?} (indexes: {known:?})"
        ))
    }
}

impl From<crate::Error> for ApiError {
    fn from(e: crate::Error) -> Self {
        ApiError::internal(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&ErrorBody {
            error: self.message,
        })
        .unwrap_or_default();
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

/// The API's state: the database and the tables it exports.
struct Shared {
    db: Db,
    tables: BTreeMap<String, Arc<dyn Exported>>,
    opts: ApiOptions,
    /// Set when the server shuts down: change streams end, so that the
    /// graceful shutdown does not wait for them forever.
    closing: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    fn table(&self, name: &str) -> Result<Arc<dyn Exported>, ApiError> {
        self.tables
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError::unknown_table(name, self.tables.keys().collect()))
    }
}

/// The HTTP API of a database: tables are exported one by one (with the
/// indexes a query may name), then [`Api::router`] serves them.
///
/// * `GET /dump`: every exported table, `{"tables": [dump, ...]}`;
/// * `GET /dump/{table}`: `{"table", "revision", "objects": [{"revision", "object"}]}`;
/// * `GET /query?table=T&index=I&key=K` (or `prefix=K`, or `lower_bound=K`):
///   JSON lines `{"revision", "object"}` in key order, streamed;
/// * `GET /changes/{table}`: every object, then every change as it
///   commits, as JSON lines `{"revision", "kind", "object"}` (`kind`:
///   `insert`, `update` or `delete`), flushed per committed batch; an empty
///   line is a keep-alive. The consumer goes away with the connection.
///
/// Unknown tables are 404, unknown indexes and bad keys 400, both with a
/// JSON body `{"error": "..."}`.
pub struct Api {
    db: Db,
    tables: BTreeMap<String, Arc<dyn Exported>>,
    opts: ApiOptions,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("tables", &self.tables.keys().collect::<Vec<_>>())
            .field("opts", &self.opts)
            .finish()
    }
}

impl Api {
    /// An API over `db` exporting no table yet.
    pub fn new(db: &Db) -> Self {
        Api {
            db: db.clone(),
            tables: BTreeMap::new(),
            opts: ApiOptions::default(),
        }
    }

    /// Replaces the options.
    pub fn with_options(mut self, opts: ApiOptions) -> Self {
        self.opts = opts;
        self
    }

    /// Exports `table`; queries may name the `indexes` given. A table
    /// exported twice keeps the last export.
    pub fn export<T>(mut self, table: &Table<T>, indexes: &[QueryIndex<T>]) -> Self
    where
        T: Storable + Serialize,
    {
        let exported = ExportedTable {
            table: table.clone(),
            indexes: indexes
                .iter()
                .map(|q| (q.name.clone(), q.clone()))
                .collect(),
        };
        self.tables
            .insert(table.name().to_string(), Arc::new(exported));
        self
    }

    /// Serves the API on `listener` until `shutdown` completes, then lets
    /// requests in flight finish (change streams end with the server).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let shared = self.shared();
        let closing = shared.clone();
        let signal = async move {
            shutdown.await;
            closing.closing.send_replace(true);
        };
        axum::serve(listener, routes(shared))
            .with_graceful_shutdown(signal)
            .await
    }

    /// The routes, to serve or to merge into an application's router.
    /// Their change streams end only with their clients: to serve them
    /// with a graceful shutdown, use [`Api::serve`] or
    /// [`Api::router_with_closer`].
    pub fn router(self) -> Router {
        routes(self.shared())
    }

    /// The routes and a handle that ends their open change streams (call
    /// [`Closer::close`] when the server shuts down, so that it need not
    /// wait for them).
    pub fn router_with_closer(self) -> (Router, Closer) {
        let shared = self.shared();
        (routes(shared.clone()), Closer(shared))
    }

    fn shared(self) -> Arc<Shared> {
        Arc::new(Shared {
            db: self.db,
            tables: self.tables,
            opts: self.opts,
            closing: tokio::sync::watch::Sender::new(false),
        })
    }
}

/// Ends the change streams of routes made by [`Api::router_with_closer`].
pub struct Closer(Arc<Shared>);

impl std::fmt::Debug for Closer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Closer").finish_non_exhaustive()
    }
}

impl Closer {
    /// Ends every open change stream (each closes its connection's body);
    /// new ones end at once.
    pub fn close(&self) {
        self.0.closing.send_replace(true);
    }
}

fn routes(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/dump", get(dump_all))
        .route("/dump/{table}", get(dump_table))
        .route("/query", get(query))
        .route("/changes/{table}", get(changes))
        .with_state(shared)
}

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn dump_all(State(s): State<Arc<Shared>>) -> Result<Response, ApiError> {
    let body = blocking(move || {
        let txn = s.db.read_txn();
        let mut out = b"{\"tables\":[".to_vec();
        for (i, t) in s.tables.values().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            t.dump(&txn, &mut out)?;
        }
        out.extend_from_slice(b"]}");
        Ok(out)
    })
    .await?;
    Ok(json(StatusCode::OK, body))
}

async fn dump_table(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let table = s.table(&name)?;
    let body = blocking(move || {
        let mut out = Vec::new();
        table.dump(&s.db.read_txn(), &mut out)?;
        Ok(out)
    })
    .await?;
    Ok(json(StatusCode::OK, body))
}

/// Runs `f` on the blocking pool: dumps and queries walk whole tables.
async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> Result<R, ApiError> + Send + 'static,
) -> Result<R, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
}

/// `GET /query`'s parameters.
#[derive(Deserialize)]
struct QueryParams {
    table: Option<String>,
    index: Option<String>,
    key: Option<String>,
    prefix: Option<String>,
    lower_bound: Option<String>,
}

impl QueryParams {
    fn check(self) -> Result<(String, String, Mode, String), ApiError> {
        let table = self
            .table
            .ok_or_else(|| ApiError::bad_request("missing parameter table".into()))?;
        let index = self
            .index
            .ok_or_else(|| ApiError::bad_request("missing parameter index".into()))?;
        let (mode, key) = match (self.key, self.prefix, self.lower_bound) {
            (Some(k), None, None) => (Mode::Exact, k),
            (None, Some(k), None) => (Mode::Prefix, k),
            (None, None, Some(k)) => (Mode::LowerBound, k),
            _ => {
                return Err(ApiError::bad_request(
                    "give exactly one of key, prefix and lower_bound".into(),
                ))
            }
        };
        Ok((table, index, mode, key))
    }
}

type Chunk = Result<Bytes, Infallible>;

/// A body streamed from a channel of chunks.
fn streamed(rx: mpsc::Receiver<Chunk>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((chunk, rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn query(
    State(s): State<Arc<Shared>>,
    params: Result<Query<QueryParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (table_name, index, mode, key) = params.check()?;
    let table = s.table(&table_name)?;
    if !table.has_index(&index) {
        return Err(ApiError::unknown_index(
            &table_name,
            &index,
            table.index_names(),
        ));
    }
    // The first chunk (or the error) comes back before the status is sent,
    // so that a bad key is a 400, not a broken stream.
    let (tx, mut rx) = mpsc::channel::<Chunk>(s.opts.chunks_queued.max(1));
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<Result<(), ApiError>>();
    let chunk_bytes = s.opts.chunk_bytes.max(1);
    tokio::task::spawn_blocking(move || {
        let txn = s.db.read_txn();
        let mut buf = Vec::with_capacity(chunk_bytes);
        let mut first = Some(first_tx);
        let res = table.query(&txn, &index, mode, &key, &mut |line| {
            buf.extend_from_slice(line);
            if buf.len() >= chunk_bytes {
                if let Some(f) = first.take() {
                    let _ = f.send(Ok(()));
                }
                let chunk =
                    Bytes::from(std::mem::replace(&mut buf, Vec::with_capacity(chunk_bytes)));
                // A client gone: stop walking.
                return tx.blocking_send(Ok(chunk)).is_ok();
            }
            true
        });
        match (res, first.take()) {
            (Err(e), Some(f)) => {
                let _ = f.send(Err(e));
            }
            (res, f) => {
                if let Some(f) = f {
                    let _ = f.send(Ok(()));
                }
                if res.is_ok() && !buf.is_empty() {
                    let _ = tx.blocking_send(Ok(Bytes::from(buf)));
                }
                // An error after the first chunk: the stream ends short
                // (the status is sent); the server logs nothing more here.
            }
        }
    });
    match first_rx.await {
        Ok(Ok(())) => Ok(streamed(rx)),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            rx.close();
            Err(ApiError::internal("query worker failed".into()))
        }
    }
}

async fn changes(
    State(s): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let table = s.table(&name)?;
    let mut feed = table.changes(&s.db)?;
    let (tx, rx) = mpsc::channel::<Chunk>(s.opts.chunks_queued.max(1));
    let mut closing = s.closing.subscribe();
    tokio::spawn(async move {
        let keepalive = s.opts.keepalive.max(Duration::from_millis(1));
        loop {
            if *closing.borrow_and_update() {
                return;
            }
            let mut out = Vec::new();
            let next = feed.next(&s.db.read_txn(), &mut out);
            let watch = match next {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(table = %name, error = %e, "change stream ended");
                    return;
                }
            };
            if !out.is_empty() && tx.send(Ok(Bytes::from(out))).await.is_err() {
                return;
            }
            // Wait for a commit, sending keep-alives meanwhile; a closed
            // channel is a client gone.
            loop {
                tokio::select! {
                    _ = watch.changed() => break,
                    _ = tx.closed() => return,
                    _ = closing.changed() => return,
                    _ = tokio::time::sleep(keepalive) => {
                        if tx.send(Ok(Bytes::from_static(b"\n"))).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    Ok(streamed(rx))
}
