//! A desired-state table reconciled into files: each memo in the `memos`
//! table is a file of that name in a directory, written, rewritten and
//! removed by a reconciler as the table changes; files in the directory
//! that no memo names are pruned. An HTTP API edits the table, and
//! statedb's own API (under `/db`) shows it with each memo's status.
//!
//! ```sh
//! cargo run -p reconciler --example memos -- /tmp/memos 127.0.0.1:8080
//! curl -X PUT --data 'hello' http://127.0.0.1:8080/memos/greeting
//! cat /tmp/memos/greeting
//! arbor db show --url http://127.0.0.1:8080/db memos      # statuses: done
//! curl http://127.0.0.1:8080/health
//! curl -X DELETE http://127.0.0.1:8080/memos/greeting
//! ```
//!
//! The directory belongs to the example: at start, files no memo names
//! are removed. SIGTERM or Ctrl-C stops it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::{get, put};
use axum::{Json, Router};
use reconciler::{Config, Health, OpError, Operations, Reconciler, Status, Target};
use serde::ser::SerializeStruct;
use statedb::http::{Api, QueryIndex};
use statedb::{Db, Index, Objects, ReadTxn, Revision, Table};

/// Largest memo accepted, in bytes.
const MAX_MEMO_BYTES: usize = 64 << 10;

/// A memo: its name (the file's), its text, and its reconciliation status.
#[derive(Clone, Debug)]
struct Memo {
    name: String,
    content: String,
    status: Status,
}

impl serde::Serialize for Memo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("Memo", 3)?;
        m.serialize_field("name", &self.name)?;
        m.serialize_field("content", &self.content)?;
        m.serialize_field("status", &self.status.to_string())?;
        m.end()
    }
}

/// A name that is a plain file name: 1 to 64 of `[A-Za-z0-9_.-]`, not
/// starting with a dot.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Writes and removes the memo files.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn path(&self, m: &Memo) -> Result<PathBuf, OpError> {
        if !valid_name(&m.name) {
            return Err(format!("bad name {:?}", m.name).into());
        }
        Ok(self.dir.join(&m.name))
    }
}

fn io_err(what: &str, p: &Path, e: std::io::Error) -> OpError {
    format!("{what} {}: {e}", p.display()).into()
}

impl Operations<Memo> for Files {
    fn update(&mut self, _: &ReadTxn, _: Revision, m: &Memo) -> Result<(), OpError> {
        let path = self.path(m)?;
        // Written aside, then renamed: a reader never sees half a memo.
        let tmp = self.dir.join(format!(".{}.tmp", m.name));
        let mut f = std::fs::File::create(&tmp).map_err(|e| io_err("create", &tmp, e))?;
        f.write_all(m.content.as_bytes())
            .map_err(|e| io_err("write", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io_err("rename", &path, e))
    }

    fn delete(&mut self, _: &ReadTxn, _: Revision, m: &Memo) -> Result<(), OpError> {
        let path = self.path(m)?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err("remove", &path, e)),
            _ => Ok(()),
        }
    }

    fn prune(&mut self, _: &ReadTxn, desired: Objects<'_, Memo>) -> Result<(), OpError> {
        let keep: std::collections::HashSet<String> = desired.map(|m| m.name.clone()).collect();
        let entries = std::fs::read_dir(&self.dir).map_err(|e| io_err("list", &self.dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io_err("list", &self.dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !keep.contains(&name) && entry.path().is_file() {
                let p = entry.path();
                std::fs::remove_file(&p).map_err(|e| io_err("prune", &p, e))?;
            }
        }
        Ok(())
    }
}

#[derive(Clone)]
struct App {
    db: Db,
    memos: Table<Memo>,
    rec: Arc<Reconciler>,
}

type Reply = (StatusCode, Json<serde_json::Value>);

fn reply(code: StatusCode, body: serde_json::Value) -> Reply {
    (code, Json(body))
}

/// `PUT /memos/{name}`: the body becomes the memo, pending.
async fn put_memo(State(app): State<App>, UrlPath(name): UrlPath<String>, body: String) -> Reply {
    if !valid_name(&name) {
        return reply(
            StatusCode::BAD_REQUEST,
            serde_json::json!({"error": "a name is 1 to 64 of [A-Za-z0-9_.-], not starting with a dot"}),
        );
    }
    let write = || -> statedb::Result<Revision> {
        let mut txn = app.db.write_txn(&[&app.memos])?;
        app.memos.insert(
            &mut txn,
            Memo {
                name: name.clone(),
                content: body,
                status: Status::pending(),
            },
        )?;
        app.memos.revision(&txn.commit()?)
    };
    match write() {
        Ok(rev) => reply(StatusCode::OK, serde_json::json!({"revision": rev})),
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({"error": e.to_string()}),
        ),
    }
}

/// `DELETE /memos/{name}`.
async fn delete_memo(State(app): State<App>, UrlPath(name): UrlPath<String>) -> Reply {
    let delete = || -> statedb::Result<bool> {
        let mut txn = app.db.write_txn(&[&app.memos])?;
        let gone = app.memos.delete_key(&mut txn, name.as_str())?.is_some();
        txn.commit()?;
        Ok(gone)
    };
    match delete() {
        Ok(true) => reply(StatusCode::OK, serde_json::json!({"deleted": name})),
        Ok(false) => reply(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": format!("no memo {name:?}")}),
        ),
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({"error": e.to_string()}),
        ),
    }
}

/// `GET /health`: the reconciler's report; 503 while degraded.
async fn health(State(app): State<App>) -> Reply {
    match app.rec.health() {
        Health::Ok { objects } => reply(StatusCode::OK, serde_json::json!({"ok": objects})),
        Health::Degraded { failing, errors } => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"failing": failing, "errors": errors}),
        ),
        other => reply(
            StatusCode::OK,
            serde_json::json!({"state": format!("{other:?}")}),
        ),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let term = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "memos".into()));
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8080".into());
    std::fs::create_dir_all(&dir)?;

    let db = Db::new();
    let by_name = Index::unique("name", |m: &Memo| m.name.clone());
    let memos: Table<Memo> = db.create_table("memos", &by_name, &[])?;
    let target = Target::new(
        &memos,
        &by_name,
        |m: &Memo| m.name.clone(),
        |m: &Memo| &m.status,
        |m: &Memo, status| Memo {
            status,
            ..m.clone()
        },
    );
    let rec = Arc::new(Reconciler::start(
        &db,
        target,
        Files { dir: dir.clone() },
        Config::default(),
    )?);
    // Nothing to load: the table is complete from the start, so the
    // directory is pruned to it at once.
    let mut txn = db.write_txn(&[&memos])?;
    let init = memos.register_initializer(&mut txn, "startup")?;
    memos.initializer_done(&mut txn, &init)?;
    txn.commit()?;

    let app = App {
        db: db.clone(),
        memos: memos.clone(),
        rec,
    };
    let (db_api, db_api_closer) = Api::new(&db)
        .export(&memos, &[QueryIndex::parsed(&by_name)])
        .router_with_closer();
    let router = Router::new()
        .route("/memos/{name}", put(put_memo).delete(delete_memo))
        .route("/health", get(health))
        .with_state(app)
        .nest("/db", db_api)
        .layer(DefaultBodyLimit::max(MAX_MEMO_BYTES));
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    eprintln!(
        "memos in {} reconciled from http://{}",
        dir.display(),
        listener.local_addr()?
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            // Open change streams end, so the shutdown does not wait on them.
            db_api_closer.close();
        })
        .await?;
    Ok(())
}
