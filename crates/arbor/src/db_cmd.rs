//! `arbor db`: show, query and watch a table of a running process through
//! statedb's HTTP API (`statedb::http`).

use std::io::Write;

use clap::{Args, Subcommand};
use serde_json::Value;
use statedb::http::{RemoteObject, RemoteTable};

/// Where the process serves its tables.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// Base URL of the process's statedb HTTP API.
    #[arg(long, default_value = "http://127.0.0.1:8080", value_name = "URL")]
    pub url: String,
}

/// `arbor db` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum DbCommand {
    /// Print a table's objects (JSON lines: revision and object), or with
    /// no table, each table's name, revision and object count.
    Show {
        /// The process.
        #[command(flatten)]
        target: Target,
        /// The table.
        table: Option<String>,
    },
    /// Print the objects whose key in an index matches (JSON lines).
    Query {
        /// The process.
        #[command(flatten)]
        target: Target,
        /// The table.
        table: String,
        /// The index (one the process exports for queries).
        index: String,
        /// The key, as text (the index parses it).
        key: String,
        /// Every object whose key starts with KEY.
        #[arg(long, conflicts_with = "lower_bound")]
        prefix: bool,
        /// Every object whose key is KEY or above, in key order.
        #[arg(long)]
        lower_bound: bool,
    },
    /// Print every object, then every change as it commits (JSON lines:
    /// revision, kind, object), until interrupted or the process ends.
    Watch {
        /// The process.
        #[command(flatten)]
        target: Target,
        /// The table.
        table: String,
    },
}

fn rows(out: &mut impl Write, rows: &[RemoteObject<Value>]) -> anyhow::Result<()> {
    for r in rows {
        let line = serde_json::json!({"revision": r.revision, "object": r.object});
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Runs `cmd`, printing to `out`.
pub async fn run(cmd: &DbCommand, out: &mut impl Write) -> anyhow::Result<()> {
    match cmd {
        DbCommand::Show {
            target,
            table: Some(table),
        } => {
            let t = RemoteTable::<Value>::new(&target.url, table)?;
            rows(out, &t.dump().await?)
        }
        DbCommand::Show {
            target,
            table: None,
        } => {
            let url = format!("{}/dump", target.url.trim_end_matches('/'));
            let resp = reqwest::get(&url).await?;
            let status = resp.status();
            let body: Value = resp.json().await?;
            if !status.is_success() {
                anyhow::bail!("{status}: {}", body["error"]);
            }
            let empty = Vec::new();
            for t in body["tables"].as_array().unwrap_or(&empty) {
                let n = t["objects"].as_array().map_or(0, Vec::len);
                writeln!(
                    out,
                    "{}\trevision {}\t{n} objects",
                    t["table"].as_str().unwrap_or("?"),
                    t["revision"]
                )?;
            }
            Ok(())
        }
        DbCommand::Query {
            target,
            table,
            index,
            key,
            prefix,
            lower_bound,
        } => {
            let t = RemoteTable::<Value>::new(&target.url, table)?;
            let found = if *prefix {
                t.prefix(index, key).await?
            } else if *lower_bound {
                t.lower_bound(index, key).await?
            } else {
                t.list(index, key).await?
            };
            rows(out, &found)
        }
        DbCommand::Watch { target, table } => {
            let t = RemoteTable::<Value>::new(&target.url, table)?;
            let mut changes = t.changes().await?;
            while let Some(c) = changes.next().await? {
                let kind = match c.kind {
                    statedb::ChangeKind::Insert => "insert",
                    statedb::ChangeKind::Update => "update",
                    statedb::ChangeKind::Delete => "delete",
                };
                let line =
                    serde_json::json!({"revision": c.revision, "kind": kind, "object": c.object});
                writeln!(out, "{line}")?;
                out.flush()?;
            }
            Ok(())
        }
    }
}
