//! Fencing end to end on real nodes: Kleppmann's paused-client scenario against each
//! resource-side backend (memory, Redis, PostgreSQL), and claim tokens across node data loss.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use fencing::{Admission, FenceError, FenceToken, MemoryFence, PgFence, RedisFence};
use redlock::{Lock, Redlock};
use redlock_testkit::{Cluster, DataOnRestart, PgServer};

const TTL: Duration = Duration::from_millis(300);

/// A's lock, then (after A "pauses" past its validity) B's lock on the same resource. Tokens
/// travel in their text form, as they would in an HTTP header.
async fn paused_holder_then_new_holder(rl: &Redlock) -> (String, String) {
    // `acquire` (bounded retries), not one attempt: on a loaded machine a single attempt with
    // the tests' 50 ms node timeout can time out on a majority.
    let a: Lock = rl.acquire("file").await.expect("A acquires");
    let a_token = a.fence().expect("claims on").to_string();
    // A stops (GC pause, SIGSTOP, swap) for longer than the lock's validity, without releasing.
    tokio::time::sleep(TTL + Duration::from_millis(50)).await;
    assert!(!a.is_valid());
    let b = rl
        .acquire("file")
        .await
        .expect("B acquires once A's lease expired");
    let b_token = b.fence().expect("claims on").to_string();
    let (ta, tb): (FenceToken, FenceToken) = (a_token.parse().unwrap(), b_token.parse().unwrap());
    for (node, stamp) in tb.iter() {
        if let Some(old) = ta.stamp(node) {
            assert!(stamp > old, "B's stamp on {node} must exceed A's");
        }
    }
    drop(a); // A's process never released; its keys expired.
    rl.release(b).await.unwrap();
    (a_token, b_token)
}

fn assert_stale(err: FenceError, a_token: &str, b_token: &str) {
    match &err {
        FenceError::Stale {
            offered,
            high_water,
        } => {
            assert_eq!(offered.to_string(), a_token);
            assert_eq!(high_water.to_string(), b_token);
        }
        other => panic!("A's late write must be Stale, got {other:?}"),
    }
    assert!(err.to_string().contains(a_token), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kleppmann_memory() {
    let cluster = Cluster::start(5).await.unwrap();
    let rl = common::client(cluster.urls(), TTL);
    let (a, b) = paused_holder_then_new_holder(&rl).await;
    let fence = MemoryFence::new();
    let storage = Mutex::new(String::new());
    let write = |token: &str, data: &str| {
        let token: FenceToken = token.parse().unwrap();
        fence
            .admit_with("file", &token, |_| {
                *storage.lock().unwrap() = data.to_owned()
            })
            .map(|(admission, ())| admission)
    };
    assert_eq!(write(&b, "B").unwrap(), Admission::Advanced);
    assert_stale(write(&a, "A").unwrap_err(), &a, &b);
    assert_eq!(write(&b, "B").unwrap(), Admission::Repeated);
    assert_eq!(*storage.lock().unwrap(), "B");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kleppmann_redis() {
    let cluster = Cluster::start(5).await.unwrap();
    let storage = Cluster::start(1).await.unwrap();
    let rl = common::client(cluster.urls(), TTL);
    let (a, b) = paused_holder_then_new_holder(&rl).await;
    let fence = RedisFence::new();
    let mut conn = storage.node(0).connection().await.unwrap();
    let (ta, tb): (FenceToken, FenceToken) = (a.parse().unwrap(), b.parse().unwrap());
    assert_eq!(
        fence
            .set_if_admitted(&mut conn, "file", &tb, "B")
            .await
            .unwrap(),
        Admission::Advanced
    );
    let err = fence
        .set_if_admitted(&mut conn, "file", &ta, "A")
        .await
        .unwrap_err();
    assert_stale(err, &a, &b);
    assert_eq!(
        fence
            .set_if_admitted(&mut conn, "file", &tb, "B")
            .await
            .unwrap(),
        Admission::Repeated
    );
    assert_eq!(
        fence.get(&mut conn, "file").await.unwrap().as_deref(),
        Some(&b"B"[..])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kleppmann_postgres() {
    let cluster = Cluster::start(5).await.unwrap();
    let pg = PgServer::start()
        .await
        .expect("this test needs PostgreSQL: could not start a throwaway server");
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    client
        .batch_execute("CREATE TABLE files (name text PRIMARY KEY, data text); INSERT INTO files VALUES ('file', '')")
        .await
        .unwrap();
    let rl = common::client(cluster.urls(), TTL);
    let (a, b) = paused_holder_then_new_holder(&rl).await;

    async fn write(
        client: &mut redlock_testkit::tokio_postgres::Client,
        fence: &PgFence,
        token: &str,
        data: &str,
    ) -> Result<Admission, FenceError> {
        let token: FenceToken = token.parse().unwrap();
        let tx = client.transaction().await.expect("BEGIN");
        let admission = fence.admit(&tx, "file", &token).await?;
        tx.execute("UPDATE files SET data = $1 WHERE name = 'file'", &[&data])
            .await
            .expect("UPDATE");
        tx.commit().await.expect("COMMIT");
        Ok(admission)
    }
    assert_eq!(
        write(&mut client, &fence, &b, "B").await.unwrap(),
        Admission::Advanced
    );
    assert_stale(
        write(&mut client, &fence, &a, "A").await.unwrap_err(),
        &a,
        &b,
    );
    assert_eq!(
        write(&mut client, &fence, &b, "B").await.unwrap(),
        Admission::Repeated
    );
    let row = client
        .query_one("SELECT data FROM files", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "B");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_token_matches_claims_and_survives_node_data_loss() {
    let cluster = Cluster::start(3).await.unwrap();
    let rl = common::client(cluster.urls(), TTL);
    let first = rl.try_acquire("r").await.unwrap();
    let t1 = first.fence().unwrap();
    // The token names every node that granted so far — the quorum's claims, and the last
    // node's too when its grant arrived after the decision.
    assert!(t1.len() >= first.claims().len());
    for c in first.claims() {
        assert_eq!(t1.stamp(&c.node), Some(c.stamp_us));
    }
    rl.release(first).await.unwrap();

    // Every node restarts without its data: stamp keys are gone, but wall clocks moved on.
    for i in 0..3 {
        cluster.node(i).restart(DataOnRestart::Wipe).await.unwrap();
    }
    let second = rl.acquire("r").await.unwrap();
    let t2 = second.fence().unwrap();
    let fence = MemoryFence::new();
    assert_eq!(fence.admit("r", &t2).unwrap(), Admission::Advanced);
    // A server that lost its data comes back with a new identity (its identity record was
    // lost too), so the old token names servers the high water no longer knows: rejected.
    let err = fence.admit("r", &t1).unwrap_err();
    assert!(err.is_stale() || err.is_unrelated(), "{err}");
    rl.release(second).await.unwrap();

    let unstamped = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(TTL)
        .claim_stamps(false)
        .build()
        .unwrap();
    let lock = unstamped.try_acquire("q").await.unwrap();
    assert!(lock.fence().is_none());
    unstamped.release(lock).await.unwrap();
}
