//! statedb over HTTP (feature `http`): [`Api`] serves a database's tables
//! as JSON (dumps, queries, change streams) on axum; [`RemoteTable`] reads
//! them from another process.
//!
//! ```no_run
//! use statedb::http::{Api, QueryIndex};
//! use statedb::{Db, Index, Table};
//!
//! #[derive(Clone, Debug, serde::Serialize)]
//! struct Node { id: u64, name: String }
//!
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! let db = Db::new();
//! let by_id = Index::unique("id", |n: &Node| n.id);
//! let by_name = Index::unique("name", |n: &Node| n.name.clone());
//! let nodes: Table<Node> = db.create_table("nodes", &by_id, &[by_name.erase()])?;
//!
//! let app = Api::new(&db)
//!     .export(&nodes, &[QueryIndex::parsed(&by_id), QueryIndex::parsed(&by_name)])
//!     .router();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```

mod client;
mod server;

pub use client::{ClientError, RemoteChange, RemoteChanges, RemoteObject, RemoteTable};
pub use server::{Api, ApiOptions, Closer, QueryIndex};
