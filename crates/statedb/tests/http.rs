//! statedb's HTTP API and `RemoteTable` against a real server on loopback
//! (feature `http`; `cargo test -p statedb --features http --test http`).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use statedb::http::{Api, ApiOptions, ClientError, QueryIndex, RemoteTable};
use statedb::{ChangeKind, Db, Index, Table};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Node {
    id: u64,
    name: String,
    zone: String,
}

fn node(id: u64, zone: &str) -> Node {
    Node {
        id,
        name: format!("node-{id:05}"),
        zone: zone.into(),
    }
}

struct Fixture {
    db: Db,
    nodes: Table<Node>,
    base: String,
}

/// A database with a `nodes` table served on a free loopback port.
async fn serve(opts: ApiOptions) -> Fixture {
    let db = Db::new();
    let by_id = Index::unique("id", |n: &Node| n.id);
    let by_name = Index::unique("name", |n: &Node| n.name.clone());
    let by_zone = Index::non_unique("zone", |n: &Node| n.zone.clone());
    let nodes: Table<Node> = db
        .create_table("nodes", &by_id, &[by_name.erase(), by_zone.erase()])
        .unwrap();
    let app = Api::new(&db)
        .with_options(opts)
        .export(
            &nodes,
            &[
                QueryIndex::parsed(&by_id),
                QueryIndex::parsed(&by_name),
                QueryIndex::parsed(&by_zone),
            ],
        )
        .router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Fixture { db, nodes, base }
}

fn write(f: &Fixture, ops: impl FnOnce(&mut statedb::WriteTxn)) {
    let mut txn = f.db.write_txn(&[&f.nodes]).unwrap();
    ops(&mut txn);
    txn.commit().unwrap();
}

fn names(rows: &[statedb::http::RemoteObject<Node>]) -> Vec<u64> {
    rows.iter().map(|r| r.object.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_and_queries() {
    let f = serve(ApiOptions::default()).await;
    write(&f, |t| {
        for id in 0..10 {
            f.nodes
                .insert(t, node(id, if id % 2 == 0 { "a" } else { "b" }))
                .unwrap();
        }
    });
    let remote = RemoteTable::<Node>::new(&f.base, "nodes").unwrap();

    let dump = remote.dump().await.unwrap();
    assert_eq!(names(&dump), (0..10).collect::<Vec<_>>());
    // Each write takes the next revision.
    let revs: Vec<u64> = dump.iter().map(|r| r.revision).collect();
    assert_eq!(revs, (1..=10).collect::<Vec<_>>());

    let a = remote.list("zone", "a").await.unwrap();
    assert_eq!(names(&a), vec![0, 2, 4, 6, 8]);
    let one = remote.list("name", "node-00003").await.unwrap();
    assert_eq!(names(&one), vec![3]);
    assert_eq!(one[0].object, node(3, "b"));
    assert!(remote.list("id", "42").await.unwrap().is_empty());
    let pre = remote.prefix("name", "node-0000").await.unwrap();
    assert_eq!(pre.len(), 10);
    let lb = remote.lower_bound("id", "7").await.unwrap();
    assert_eq!(names(&lb), vec![7, 8, 9]);

    // The whole-database dump holds the table.
    let all: serde_json::Value = reqwest::get(format!("{}/dump", f.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(all["tables"][0]["table"], "nodes");
    assert_eq!(all["tables"][0]["objects"].as_array().unwrap().len(), 10);
}

/// A query's answer larger than many chunks arrives whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_streams_in_chunks() {
    let opts = ApiOptions::default().with_chunks(1024, 2);
    let f = serve(opts).await;
    write(&f, |t| {
        for id in 0..5000 {
            f.nodes.insert(t, node(id, "z")).unwrap();
        }
    });
    let remote = RemoteTable::<Node>::new(&f.base, "nodes").unwrap();
    let rows = remote.lower_bound("id", "0").await.unwrap();
    assert_eq!(names(&rows), (0..5000).collect::<Vec<_>>());
    let zone = remote.list("zone", "z").await.unwrap();
    assert_eq!(zone.len(), 5000);
}

async fn status_of(url: &str) -> (u16, String) {
    let resp = reqwest::get(url).await.unwrap();
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await.unwrap();
    (
        status,
        body["error"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_json_with_their_status() {
    let f = serve(ApiOptions::default()).await;
    let b = &f.base;
    for (url, want, says) in [
        (format!("{b}/dump/nope"), 404, "no table \"nope\""),
        (format!("{b}/changes/nope"), 404, "no table"),
        (
            format!("{b}/query?table=nope&index=id&key=1"),
            404,
            "no table",
        ),
        (
            format!("{b}/query?table=nodes&index=ip&key=1"),
            400,
            "no queryable index \"ip\"",
        ),
        (
            format!("{b}/query?table=nodes&index=id&key=abc"),
            400,
            "key \"abc\"",
        ),
        (
            format!("{b}/query?table=nodes&index=id"),
            400,
            "exactly one of",
        ),
        (
            format!("{b}/query?table=nodes&index=id&key=1&prefix=1"),
            400,
            "exactly one of",
        ),
        (
            format!("{b}/query?index=id&key=1"),
            400,
            "missing parameter table",
        ),
        (
            format!("{b}/query?table=nodes&key=1"),
            400,
            "missing parameter index",
        ),
    ] {
        let (status, error) = status_of(&url).await;
        assert_eq!(status, want, "{url}: {error}");
        assert!(error.contains(says), "{url}: {error:?} lacks {says:?}");
    }
    // The client reports them as typed errors.
    let missing = RemoteTable::<Node>::new(b, "nope").unwrap();
    match missing.dump().await {
        Err(ClientError::Status {
            status: 404,
            message,
        }) => assert!(message.contains("nope")),
        other => panic!("{other:?}"),
    }
    let remote = RemoteTable::<Node>::new(b, "nodes").unwrap();
    match remote.list("id", "x").await {
        Err(ClientError::Status { status: 400, .. }) => {}
        other => panic!("{other:?}"),
    }
    // An object that is not a Node: a decode error, not a panic.
    write(&f, |t| {
        f.nodes.insert(t, node(1, "a")).unwrap();
    });
    let wrong = RemoteTable::<Vec<u8>>::new(b, "nodes").unwrap();
    assert!(matches!(
        wrong.list("id", "1").await,
        Err(ClientError::Decode { .. })
    ));
    assert!(matches!(
        RemoteTable::<Node>::new("not a url", "nodes"),
        Err(ClientError::Invalid(_))
    ));
    // Nothing listening: a transport error.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let gone = RemoteTable::<Node>::new(&format!("http://127.0.0.1:{port}"), "nodes").unwrap();
    assert!(matches!(gone.dump().await, Err(ClientError::Transport(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_stream_follows_commits_and_ends_with_the_client() {
    let opts = ApiOptions::default().with_keepalive(Duration::from_millis(30));
    let f = serve(opts).await;
    write(&f, |t| {
        f.nodes.insert(t, node(1, "a")).unwrap();
        f.nodes.insert(t, node(2, "a")).unwrap();
    });
    let remote = RemoteTable::<Node>::new(&f.base, "nodes").unwrap();
    let mut changes = remote.changes().await.unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        let c = changes.next().await.unwrap().unwrap();
        got.push((c.revision, c.kind, c.object.id));
    }
    assert_eq!(
        got,
        vec![(1, ChangeKind::Insert, 1), (2, ChangeKind::Insert, 2)]
    );
    // Keep-alives pass unseen while nothing commits.
    tokio::time::sleep(Duration::from_millis(100)).await;
    write(&f, |t| {
        f.nodes.insert(t, node(1, "b")).unwrap();
    });
    write(&f, |t| {
        f.nodes.delete(t, &node(2, "a")).unwrap();
        f.nodes.insert(t, node(3, "c")).unwrap();
    });
    let mut later = Vec::new();
    for _ in 0..3 {
        let c = changes.next().await.unwrap().unwrap();
        later.push((c.revision, c.kind, c.object.id, c.object.zone));
    }
    assert_eq!(
        later,
        vec![
            (3, ChangeKind::Update, 1, "b".to_string()),
            (4, ChangeKind::Delete, 2, "a".to_string()),
            (5, ChangeKind::Insert, 3, "c".to_string()),
        ]
    );

    // The keep-alives on the wire: empty lines between commits.
    let mut raw = reqwest::get(format!("{}/changes/nodes", f.base))
        .await
        .unwrap();
    let mut text = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    while !text.ends_with(b"\n\n") && Instant::now() < until {
        text.extend_from_slice(&raw.chunk().await.unwrap().unwrap());
    }
    assert!(text.ends_with(b"\n\n"), "no keep-alive: {text:?}");
    drop(raw);

    // A client gone: the server drops its consumer, so deleted objects are
    // no longer kept for it.
    drop(changes);
    write(&f, |t| {
        f.nodes.delete(t, &node(3, "c")).unwrap();
    });
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        f.db.collect_garbage();
        let kept = f.nodes.graveyard_len(&f.db.read_txn()).unwrap();
        if kept == 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "{kept} deletes still kept for gone clients"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A graceful shutdown ends the open change streams instead of waiting
/// for them forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_change_streams() {
    let db = Db::new();
    let by_id = Index::unique("id", |n: &Node| n.id);
    let nodes: Table<Node> = db.create_table("nodes", &by_id, &[]).unwrap();
    let mut txn = db.write_txn(&[&nodes]).unwrap();
    nodes.insert(&mut txn, node(1, "a")).unwrap();
    txn.commit().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(Api::new(&db).export(&nodes, &[]).serve(listener, async {
        let _ = stopped.await;
    }));
    let remote = RemoteTable::<Node>::new(&base, "nodes").unwrap();
    let mut changes = remote.changes().await.unwrap();
    assert_eq!(changes.next().await.unwrap().unwrap().object.id, 1);
    stop.send(()).unwrap();
    let done = tokio::time::timeout(Duration::from_secs(5), server).await;
    assert!(matches!(done, Ok(Ok(Ok(())))), "{done:?}");
    assert!(changes.next().await.unwrap().is_none());
}
