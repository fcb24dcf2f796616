//! `PgFence` and `PgSequence` against a real PostgreSQL server started by the testkit.

use std::sync::Arc;

use fencing::{Admission, FenceError, FenceToken, HighWater, PgFence, PgSequence, ScalarToken};
use rand::Rng;
use rand::seq::SliceRandom;
use redlock_testkit::PgServer;

async fn server() -> PgServer {
    PgServer::start()
        .await
        .expect("these tests need PostgreSQL: could not start a throwaway server")
}

fn token(s: &str) -> FenceToken {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_rule_in_a_transaction() {
    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    fence.create_schema(&client).await.unwrap(); // idempotent

    let old = token("f1,a=10,b=10,c=10");
    let new = token("f1,b=20,c=20,d=20");

    let tx = client.transaction().await.unwrap();
    assert_eq!(
        fence.admit(&tx, "r", &new).await.unwrap(),
        Admission::Advanced
    );
    tx.commit().await.unwrap();

    let tx = client.transaction().await.unwrap();
    assert_eq!(
        fence.admit(&tx, "r", &new).await.unwrap(),
        Admission::Repeated
    );
    match fence.admit(&tx, "r", &old).await {
        Err(FenceError::Stale {
            offered,
            high_water,
        }) => {
            assert_eq!(offered, old.clone().into());
            assert_eq!(high_water, HighWater::from(&new));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    // A rejection leaves the transaction usable.
    tx.execute("SELECT 1", &[]).await.unwrap();
    let err = fence
        .admit(&tx, "r", &token("f1,x=1,y=1"))
        .await
        .unwrap_err();
    assert!(err.is_unrelated(), "{err}");
    let err = fence.admit(&tx, "r", ScalarToken(99)).await.unwrap_err();
    assert!(err.is_unrelated(), "scalar on a claims resource: {err}");
    tx.commit().await.unwrap();

    assert_eq!(
        fence.high_water(&client, "r").await.unwrap(),
        HighWater::from(&new)
    );
    assert!(fence.high_water(&client, "other").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_undoes_the_admission_with_the_write() {
    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::with_table("public.fence_hw").unwrap();
    fence.create_schema(&client).await.unwrap();
    client
        .batch_execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL); INSERT INTO accounts VALUES (1, 0)")
        .await
        .unwrap();

    let t1 = token("f1,a=1,b=1");
    let t2 = token("f1,a=2,b=2");
    let tx = client.transaction().await.unwrap();
    fence.admit(&tx, "acct:1", &t2).await.unwrap();
    tx.execute("UPDATE accounts SET balance = 50 WHERE id = 1", &[])
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    // Neither the write nor the advance happened: the older t1 is still admissible.
    assert!(
        fence
            .high_water(&client, "acct:1")
            .await
            .unwrap()
            .is_empty()
    );
    let tx = client.transaction().await.unwrap();
    assert_eq!(
        fence.admit(&tx, "acct:1", &t1).await.unwrap(),
        Admission::Advanced
    );
    tx.execute("UPDATE accounts SET balance = 10 WHERE id = 1", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let row = client
        .query_one("SELECT balance FROM accounts WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_sql_fencing_raises_on_stale() {
    let pg = server().await;
    let client = pg.connect().await.unwrap();
    PgFence::new().create_schema(&client).await.unwrap();
    client
        .batch_execute(
            "BEGIN; SELECT fencing_high_water_admit_or_raise('r', '{a,b}', '{5,5}'); COMMIT;",
        )
        .await
        .unwrap();
    let err = client
        .batch_execute(
            "BEGIN; SELECT fencing_high_water_admit_or_raise('r', '{a,b}', '{4,9}'); COMMIT;",
        )
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("FN001"), "{err}");
    client.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_scalar_tokens() {
    let pg = server().await;
    let mut client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    let seq = PgSequence::new("fence_seq").unwrap();
    seq.create(&client).await.unwrap();
    seq.create(&client).await.unwrap();
    let a = seq.next(&client).await.unwrap();
    let b = seq.next(&client).await.unwrap();
    assert!(a < b);

    let tx = client.transaction().await.unwrap();
    assert_eq!(fence.admit(&tx, "s", b).await.unwrap(), Admission::Advanced);
    assert_eq!(fence.admit(&tx, "s", b).await.unwrap(), Admission::Repeated);
    let err = fence.admit(&tx, "s", a).await.unwrap_err();
    assert!(err.is_stale(), "{err}");
    assert!(err.to_string().contains(&format!("scalar {b}")), "{err}");
    let err = fence
        .admit(&tx, "s", ScalarToken(u64::MAX))
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::StampOutOfRange { .. }), "{err}");
    tx.commit().await.unwrap();
    assert_eq!(
        fence.high_water(&client, "s").await.unwrap().scalar(),
        Some(b.0)
    );
}

#[test]
fn names_are_validated_before_they_reach_sql() {
    for bad in [
        "",
        "Fence",
        "a;drop table x",
        "a.b.c",
        "1abc",
        "a b",
        &"x".repeat(49),
    ] {
        assert!(
            matches!(
                PgFence::with_table(bad),
                Err(FenceError::InvalidConfig { .. })
            ),
            "{bad:?}"
        );
        assert!(PgSequence::new(bad).is_err(), "{bad:?}");
    }
    assert!(PgFence::with_table("app.fence_2").is_ok());
}

/// A history of grants on 5 nodes in which every grant holds a quorum (3 nodes) and per-node
/// stamps increase in grant order: what a healthy Redlock issues.
fn grants(count: usize, rng: &mut impl Rng) -> Vec<FenceToken> {
    let nodes = ["n1", "n2", "n3", "n4", "n5"];
    let mut stamp = [0u64; 5];
    (0..count)
        .map(|_| {
            let mut idx: Vec<usize> = (0..5).collect();
            idx.shuffle(rng);
            let claims: Vec<(&str, u64)> = idx[..3]
                .iter()
                .map(|&i| {
                    stamp[i] += rng.random_range(1..1000);
                    (nodes[i], stamp[i])
                })
                .collect();
            FenceToken::new(claims).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_keep_the_high_water_consistent() {
    const TASKS: usize = 16;
    const PER_TASK: usize = 40;
    let pg = server().await;
    let client = pg.connect().await.unwrap();
    let fence = PgFence::new();
    fence.create_schema(&client).await.unwrap();
    client
        .batch_execute("CREATE TABLE fenced_log (id bigserial PRIMARY KEY, token text NOT NULL)")
        .await
        .unwrap();
    let history = Arc::new(grants(120, &mut rand::rng()));

    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let mut client = pg.connect().await.unwrap();
        let fence = fence.clone();
        let history = Arc::clone(&history);
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            let mut rejected = 0;
            for _ in 0..PER_TASK {
                // Interleaved and out of order: each task picks random grants of the history.
                let t = &history[rand::rng().random_range(0..history.len())];
                let tx = client.transaction().await.unwrap();
                match fence.admit(&tx, "hot", t).await {
                    Ok(_) => {
                        // The business write, after the admission in the same transaction.
                        tx.execute(
                            "INSERT INTO fenced_log (token) VALUES ($1)",
                            &[&t.to_string()],
                        )
                        .await
                        .unwrap();
                        tx.commit().await.unwrap();
                        admitted += 1;
                    }
                    Err(e) if e.is_stale() => {
                        tx.rollback().await.unwrap();
                        rejected += 1;
                    }
                    Err(e) => panic!("unexpected: {e}"),
                }
            }
            (admitted, rejected)
        }));
    }
    let mut admitted = 0;
    let mut rejected = 0;
    for t in tasks {
        let (a, r) = t.await.unwrap();
        admitted += a;
        rejected += r;
    }
    assert_eq!(admitted + rejected, TASKS * PER_TASK);
    assert!(
        admitted > 0 && rejected > 0,
        "{admitted} admitted, {rejected} rejected"
    );

    // The log in commit order (ids are drawn while the fence row is locked) must replay through
    // the in-memory rule without a single rejection, and end at the stored high water.
    let rows = client
        .query("SELECT token FROM fenced_log ORDER BY id", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), admitted);
    let mut replay = HighWater::new();
    let mut max_per_node = std::collections::BTreeMap::<String, u64>::new();
    for row in rows {
        let t: FenceToken = row.get::<_, String>(0).parse().unwrap();
        replay
            .admit(&t)
            .unwrap_or_else(|e| panic!("committed admissions out of order: {e}"));
        for (n, s) in t.iter() {
            let m = max_per_node.entry(n.to_owned()).or_default();
            *m = (*m).max(s);
        }
    }
    let stored = fence.high_water(&client, "hot").await.unwrap();
    assert_eq!(stored, replay);
    assert_eq!(stored, HighWater::from_entries(max_per_node));
}
