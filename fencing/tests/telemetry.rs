//! Every backend counts the tokens it refuses in `fencing_rejections_total{backend, kind}`;
//! admissions, repeats and malformed input are not counted.

use fencing::{FenceToken, MemoryFence, PgFence, RedisFence};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use redlock_testkit::{Cluster, PgServer};

fn token(s: &str) -> FenceToken {
    s.parse().unwrap()
}

// A current-thread runtime keeps every call on this thread, where the local recorder is.
#[tokio::test(flavor = "current_thread")]
async fn rejections_are_counted_by_backend_and_kind() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    let newer = token("f1,a=20,b=20");
    let older = token("f1,a=10,b=10");
    let unrelated = token("f1,x=5,y=5");

    // Memory: one stale, two unrelated.
    let memory = MemoryFence::new();
    memory.admit("r", &newer).unwrap();
    memory.admit("r", &newer).unwrap(); // a repeat is admitted
    assert!(memory.admit("r", &older).unwrap_err().is_stale());
    assert!(memory.admit("r", &unrelated).unwrap_err().is_unrelated());
    assert!(
        memory
            .admit_with("r", &unrelated, |_| ())
            .unwrap_err()
            .is_unrelated()
    );

    // Redis: two stale (admit and the fenced write), one unrelated.
    let cluster = Cluster::start(1).await.unwrap();
    let mut conn = cluster.node(0).connection().await.unwrap();
    let redis = RedisFence::new();
    redis.admit(&mut conn, "r", &newer).await.unwrap();
    assert!(
        redis
            .admit(&mut conn, "r", &older)
            .await
            .unwrap_err()
            .is_stale()
    );
    assert!(
        redis
            .set_if_admitted(&mut conn, "r", &older, "v")
            .await
            .unwrap_err()
            .is_stale()
    );
    assert!(
        redis
            .admit(&mut conn, "r", &unrelated)
            .await
            .unwrap_err()
            .is_unrelated()
    );

    // PostgreSQL: one stale.
    let pg = PgServer::start().await.expect("PostgreSQL for this test");
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    let tx = client.transaction().await.unwrap();
    fence.admit(&tx, "r", &newer).await.unwrap();
    assert!(fence.admit(&tx, "r", &older).await.unwrap_err().is_stale());
    tx.commit().await.unwrap();

    let mut counts = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() != "fencing_rejections_total" {
            continue;
        }
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        let DebugValue::Counter(n) = value else {
            panic!("not a counter")
        };
        counts.push((label("backend"), label("kind"), n));
    }
    counts.sort();
    let expected = [
        ("memory", "stale", 1),
        ("memory", "unrelated", 2),
        ("postgres", "stale", 1),
        ("redis", "stale", 2),
        ("redis", "unrelated", 1),
    ]
    .map(|(b, k, n)| (b.to_owned(), k.to_owned(), n));
    assert_eq!(counts, expected);
}
