//! Admission overhead per write: in memory (ns), in Redis (the admission script vs a plain
//! `SET` on the same node), in PostgreSQL (a fenced `UPDATE` inside an open transaction vs the
//! same `UPDATE` unfenced). Servers are real and started by the testkit. Read ratios, not
//! absolute times: these machines are noisy.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use fencing::{FenceToken, MemoryFence, PgFence, RedisFence};
use redlock_testkit::{Cluster, PgServer};

/// Fenced statements per transaction in the PostgreSQL benches.
const BATCH: u64 = 20;

/// A 5-node grant (a quorum of 3 claims) newer than every earlier one.
fn next_token(counter: &AtomicU64) -> FenceToken {
    let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
    let base = 1_716_000_000_000_000 + n;
    let nodes = [
        "127.0.0.1:7001",
        "127.0.0.1:7002",
        "127.0.0.1:7003",
        "127.0.0.1:7004",
        "127.0.0.1:7005",
    ];
    let first = (n % 5) as usize;
    FenceToken::new((0..3).map(|k| (nodes[(first + k) % 5], base))).unwrap()
}

fn memory(c: &mut Criterion) {
    let mut g = c.benchmark_group("memory");
    let fence = MemoryFence::new();
    let counter = AtomicU64::new(0);
    let same = next_token(&counter);
    fence.admit("r", &same).unwrap();
    g.bench_function("admit_repeated", |b| {
        b.iter(|| fence.admit("r", &same).unwrap())
    });
    g.bench_function("admit_advancing", |b| {
        b.iter_batched(
            || next_token(&counter),
            |t| fence.admit("r", &t).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn redis(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cluster = rt.block_on(Cluster::start(1)).unwrap();
    let mut conn = rt.block_on(cluster.node(0).connection()).unwrap();
    let fence = RedisFence::new();
    let counter = AtomicU64::new(0);
    let mut g = c.benchmark_group("redis");
    g.bench_function("plain_set", |b| {
        b.iter(|| {
            rt.block_on(async {
                redlock_testkit::redis::cmd("SET")
                    .arg("fence:val:plain")
                    .arg("value")
                    .query_async::<()>(&mut conn)
                    .await
                    .unwrap()
            })
        })
    });
    g.bench_function("fenced_set", |b| {
        b.iter_batched(
            || next_token(&counter),
            |t| {
                rt.block_on(fence.set_if_admitted(&mut conn, "reg", &t, "value"))
                    .unwrap()
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn postgres(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pg = rt
        .block_on(PgServer::start())
        .expect("PostgreSQL for the bench");
    let mut client = rt.block_on(pg.connect()).unwrap();
    let fence = PgFence::new();
    rt.block_on(async {
        fence.create_schema(&client).await.unwrap();
        client
            .batch_execute(
                "CREATE TABLE items (id int PRIMARY KEY, v bigint NOT NULL); INSERT INTO items VALUES (1, 0)",
            )
            .await
            .unwrap();
    });
    let update = rt
        .block_on(client.prepare("UPDATE items SET v = v + 1 WHERE id = 1"))
        .unwrap();
    let counter = AtomicU64::new(0);
    let mut g = c.benchmark_group("postgres");
    // Iterations run inside open transactions of BATCH statements each; only the statements
    // are timed, not BEGIN/COMMIT. (Committing between batches keeps the updated rows' version
    // chains short, as in real traffic.)
    g.bench_function("update_unfenced", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut elapsed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(BATCH);
                    left -= n;
                    let tx = client.transaction().await.unwrap();
                    let start = Instant::now();
                    for _ in 0..n {
                        tx.execute(&update, &[]).await.unwrap();
                    }
                    elapsed += start.elapsed();
                    tx.commit().await.unwrap();
                }
                elapsed
            })
        })
    });
    g.bench_function("update_fenced", |b| {
        b.iter_custom(|iters| {
            let tokens: Vec<FenceToken> = (0..iters).map(|_| next_token(&counter)).collect();
            rt.block_on(async {
                let mut elapsed = Duration::ZERO;
                for batch in tokens.chunks(BATCH as usize) {
                    let tx = client.transaction().await.unwrap();
                    let start = Instant::now();
                    for t in batch {
                        fence.admit(&tx, "items:1", t).await.unwrap();
                        tx.execute(&update, &[]).await.unwrap();
                    }
                    elapsed += start.elapsed();
                    tx.commit().await.unwrap();
                }
                elapsed
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = memory, redis, postgres
}
criterion_main!(benches);
