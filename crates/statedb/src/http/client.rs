//! [`RemoteTable`]: a table of another process, read through its
//! [`Api`](super::Api).

use std::marker::PhantomData;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::{ChangeKind, Revision};

use super::server::ErrorBody;

/// What can go wrong reading a remote table.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server answered with an error status (its JSON `error` message).
    #[error("{status}: {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// The request did not complete (connection, timeout, body).
    #[error("request failed: {0}")]
    Transport(#[from] reqwest::Error),
    /// A line of the answer is not the JSON expected.
    #[error("bad answer line {line:?}: {source}")]
    Decode {
        /// The line, cut to 200 bytes.
        line: String,
        /// Why it did not decode.
        source: serde_json::Error,
    },
    /// An argument cannot be used (a base URL that does not parse).
    #[error("{0}")]
    Invalid(String),
}

/// An object with the revision of its last write.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RemoteObject<T> {
    /// The revision of the object's last write.
    pub revision: Revision,
    /// The object.
    pub object: T,
}

/// A change read from a remote change stream.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteChange<T> {
    /// The revision of the change.
    pub revision: Revision,
    /// Insert, update or delete.
    pub kind: ChangeKind,
    /// The object (for a delete, its last version).
    pub object: T,
}

#[derive(Deserialize)]
struct ChangeLine<T> {
    revision: Revision,
    kind: String,
    object: T,
}

#[derive(Deserialize)]
struct Dump<T> {
    objects: Vec<RemoteObject<T>>,
}

/// Where the table is and how to ask.
#[derive(Clone, Debug)]
pub struct RemoteTable<T> {
    client: reqwest::Client,
    base: reqwest::Url,
    table: String,
    _objects: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> RemoteTable<T> {
    /// The table `table` of the API served at `base` (`http://127.0.0.1:8080`).
    /// Requests time out after `timeout`, except change streams, which stay
    /// open.
    pub fn new(base: &str, table: &str) -> Result<Self, ClientError> {
        let base = reqwest::Url::parse(base)
            .map_err(|e| ClientError::Invalid(format!("base URL {base:?}: {e}")))?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        Ok(RemoteTable {
            client,
            base,
            table: table.to_string(),
            _objects: PhantomData,
        })
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.table
    }

    fn url(&self, path: &[&str]) -> reqwest::Url {
        let mut u = self.base.clone();
        if let Ok(mut segs) = u.path_segments_mut() {
            segs.pop_if_empty().extend(path);
        }
        u
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let resp = req.send().await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<ErrorBody>(&text)
            .map(|b| b.error)
            .unwrap_or(text);
        Err(ClientError::Status { status, message })
    }

    /// Every object, in primary-key order, and the table's revision.
    pub async fn dump(&self) -> Result<Vec<RemoteObject<T>>, ClientError> {
        let resp = self
            .send(self.client.get(self.url(&["dump", &self.table])))
            .await?;
        let bytes = resp.bytes().await?;
        let dump: Dump<T> = serde_json::from_slice(&bytes).map_err(|e| decode_err(&bytes, e))?;
        Ok(dump.objects)
    }

    async fn query(
        &self,
        index: &str,
        mode: &str,
        key: &str,
    ) -> Result<Vec<RemoteObject<T>>, ClientError> {
        let req = self.client.get(self.url(&["query"])).query(&[
            ("table", self.table.as_str()),
            ("index", index),
            (mode, key),
        ]);
        let mut lines = Lines::new(self.send(req).await?);
        let mut out = Vec::new();
        while let Some(line) = lines.next().await? {
            out.push(serde_json::from_slice(&line).map_err(|e| decode_err(&line, e))?);
        }
        Ok(out)
    }

    /// The objects whose key in `index` is `key` (its text form, as the
    /// server's index parses it).
    pub async fn list(&self, index: &str, key: &str) -> Result<Vec<RemoteObject<T>>, ClientError> {
        self.query(index, "key", key).await
    }

    /// The objects whose key in `index` starts with `prefix`, in key order.
    pub async fn prefix(
        &self,
        index: &str,
        prefix: &str,
    ) -> Result<Vec<RemoteObject<T>>, ClientError> {
        self.query(index, "prefix", prefix).await
    }

    /// The objects whose key in `index` is at or above `key`, in key order.
    pub async fn lower_bound(
        &self,
        index: &str,
        key: &str,
    ) -> Result<Vec<RemoteObject<T>>, ClientError> {
        self.query(index, "lower_bound", key).await
    }

    /// A change stream from the table's beginning: every object, then every
    /// change as it commits. Dropping it closes the connection, and the
    /// server drops its consumer.
    pub async fn changes(&self) -> Result<RemoteChanges<T>, ClientError> {
        let resp = self
            .send(self.client.get(self.url(&["changes", &self.table])))
            .await?;
        Ok(RemoteChanges {
            lines: Lines::new(resp),
            _objects: PhantomData,
        })
    }
}

/// An open change stream ([`RemoteTable::changes`]).
#[derive(Debug)]
pub struct RemoteChanges<T> {
    lines: Lines,
    _objects: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> RemoteChanges<T> {
    /// The next change; `None` once the server ends the stream.
    pub async fn next(&mut self) -> Result<Option<RemoteChange<T>>, ClientError> {
        let Some(line) = self.lines.next().await? else {
            return Ok(None);
        };
        let c: ChangeLine<T> = serde_json::from_slice(&line).map_err(|e| decode_err(&line, e))?;
        let kind = match c.kind.as_str() {
            "insert" => ChangeKind::Insert,
            "update" => ChangeKind::Update,
            "delete" => ChangeKind::Delete,
            other => {
                return Err(ClientError::Invalid(format!(
                    "unknown change kind {other:?}"
                )))
            }
        };
        Ok(Some(RemoteChange {
            revision: c.revision,
            kind,
            object: c.object,
        }))
    }
}

fn decode_err(line: &[u8], source: serde_json::Error) -> ClientError {
    let cut = &line[..line.len().min(200)];
    ClientError::Decode {
        line: String::from_utf8_lossy(cut).into_owned(),
        source,
    }
}

/// The non-empty lines of a streamed body (empty lines are keep-alives).
#[derive(Debug)]
struct Lines {
    resp: reqwest::Response,
    buf: Vec<u8>,
    done: bool,
}

impl Lines {
    fn new(resp: reqwest::Response) -> Self {
        Lines {
            resp,
            buf: Vec::new(),
            done: false,
        }
    }

    async fn next(&mut self) -> Result<Option<Vec<u8>>, ClientError> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=i).collect();
                line.pop();
                if line.is_empty() {
                    continue;
                }
                return Ok(Some(line));
            }
            if self.done {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(std::mem::take(&mut self.buf)));
            }
            match self.resp.chunk().await? {
                Some(c) => self.buf.extend_from_slice(&c),
                None => self.done = true,
            }
        }
    }
}
