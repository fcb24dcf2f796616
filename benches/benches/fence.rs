//! Micro-benches of the fencing paths a protected resource runs on every write: the text
//! form of a claim token (encode with `Display`, parse with `FromStr`) and admission against
//! an in-memory high-water map (`MemoryFence`), for tokens of 3, 5 and 7 claims.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion};
use fencing::{FenceToken, MemoryFence};

/// A token with one claim per node on `n` nodes, stamps offset by `base`.
fn token(n: usize, base: u64) -> FenceToken {
    FenceToken::new((0..n).map(|i| (format!("127.0.0.1:{}", 7001 + i), base + i as u64)))
        .expect("valid token")
}

fn encode_parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("fence_token");
    for n in [3usize, 5, 7] {
        let t = token(n, 1_716_200_000_000_001);
        let text = t.to_string();
        group.bench_with_input(BenchmarkId::new("encode", n), &t, |b, t| {
            b.iter(|| black_box(t).to_string());
        });
        group.bench_with_input(BenchmarkId::new("parse", n), &text, |b, text| {
            b.iter(|| {
                black_box(text.as_str())
                    .parse::<FenceToken>()
                    .expect("parses")
            });
        });
    }
    group.finish();
}

fn admission(c: &mut Criterion) {
    let mut group = c.benchmark_group("fence_admit_memory");
    for n in [3usize, 5, 7] {
        // Every admission advances the high water (the common case: a new grant per write).
        let fence = MemoryFence::new();
        let mut stamp = 1_716_200_000_000_001u64;
        group.bench_function(BenchmarkId::new("advance", n), |b| {
            b.iter_batched(
                || {
                    stamp += 10;
                    token(n, stamp)
                },
                |t| fence.admit("orders:42", &t).expect("admitted"),
                criterion::BatchSize::SmallInput,
            );
        });
        // The same grant writing again (idempotent retry).
        let fence = MemoryFence::new();
        let t = token(n, 1_716_200_000_000_001);
        fence.admit("orders:42", &t).expect("admitted");
        group.bench_function(BenchmarkId::new("repeat", n), |b| {
            b.iter(|| fence.admit("orders:42", black_box(&t)).expect("admitted"));
        });
        // An older grant, rejected as stale.
        let old = token(n, 1);
        group.bench_function(BenchmarkId::new("reject_stale", n), |b| {
            b.iter(|| fence.admit("orders:42", black_box(&old)).is_err());
        });
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    encode_parse(&mut c);
    admission(&mut c);
    c.final_summary();
}
