//! The three places that keep a high water — in memory (`HighWater`), the Redis admission
//! script and the PostgreSQL admission function — give the same verdict on the same random
//! sequence of admissions, malformed ones included, and hold the same high water after every
//! step; the Redis register is written exactly by the admitted calls.
//!
//! Redis and PostgreSQL are called with raw arguments (`EVAL` of the script, the SQL function
//! with arrays), as a client in another language would, so that malformed input can be
//! expressed: duplicate nodes, lists of different lengths, NULL lists and elements (garbage
//! strings in Redis, which has no NULL), negative stamps, too many claims, over-long or empty
//! names. The reference for what is well-formed is this crate's own `FenceToken::new` (and a
//! lone empty name for a scalar token); the reference for the verdict is `HighWater`.
//!
//! One PostgreSQL server and one redis-server serve the whole run; every case uses fresh
//! resource names.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use fencing::{
    Admission, FenceError, FenceToken, HighWater, PgFence, RedisFence, ScalarToken, Token,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, TestCaseError, TestRng, TestRunner,
};
use redlock_testkit::redis::aio::MultiplexedConnection;
use redlock_testkit::tokio_postgres::Client;
use redlock_testkit::{Cluster, PgServer};

/// Resources per case (distinct high waters, so interleavings across resources are covered).
const RESOURCES: usize = 3;
/// The usual node names: few, so that tokens share nodes and verdicts are interesting.
const NAMES: [&str; 4] = ["a", "b", "c", "d"];
/// What Redis gets for a stamp that is NULL in PostgreSQL.
const GARBAGE: [&str; 8] = [
    "",
    "x",
    "007",
    "+7",
    "7.0",
    "1e3",
    " 7",
    "9223372036854775808",
];

/// A stamp as sent.
#[derive(Debug, Clone)]
enum Stamp {
    Value(i64),
    /// NULL in PostgreSQL; `GARBAGE[i % len]` in Redis.
    Garbage(usize),
}

/// How a call departs from a clean token (most calls are clean).
#[derive(Debug, Clone)]
enum Defect {
    Clean,
    /// The claim at this index again, with another stamp.
    Duplicate(usize, Stamp),
    /// A NULL name (Redis: a 129-byte name, its nearest malformed name).
    NullName(usize),
    /// An empty name: malformed beside other claims, a scalar token when alone.
    EmptyName(usize),
    /// A 129-byte name (malformed) or a 128-byte one (fine).
    LongName(usize, bool),
    /// `a` and then `m1`, `m2`, … : this many claims (32 is the cap).
    Many(usize),
    NoClaims,
    /// One stamp fewer than nodes.
    DropStamp,
    /// One stamp more than nodes.
    ExtraStamp(Stamp),
    NullNodes,
    NullStamps,
}

/// One admission as sent to the backends.
#[derive(Debug, Clone)]
struct Call {
    resource: usize,
    nodes: Option<Vec<Option<String>>>,
    stamps: Option<Vec<Stamp>>,
}

/// The outcome, compared across backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Advanced,
    Repeated,
    Stale,
    Unrelated,
    Malformed,
}

fn stamp() -> impl Strategy<Value = Stamp> {
    prop_oneof![
        40 => (0i64..40).prop_map(Stamp::Value),
        1 => (-3i64..0).prop_map(Stamp::Value),
        1 => (i64::MAX - 2..=i64::MAX).prop_map(Stamp::Value),
        1 => any::<usize>().prop_map(Stamp::Garbage),
    ]
}

fn defect() -> impl Strategy<Value = Defect> {
    prop_oneof![
        40 => Just(Defect::Clean),
        2 => (any::<usize>(), stamp()).prop_map(|(i, s)| Defect::Duplicate(i, s)),
        1 => any::<usize>().prop_map(Defect::NullName),
        2 => any::<usize>().prop_map(Defect::EmptyName),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(i, bad)| Defect::LongName(i, bad)),
        1 => (31usize..=34).prop_map(Defect::Many),
        1 => Just(Defect::NoClaims),
        1 => Just(Defect::DropStamp),
        1 => stamp().prop_map(Defect::ExtraStamp),
        1 => Just(Defect::NullNodes),
        1 => Just(Defect::NullStamps),
    ]
}

fn call() -> impl Strategy<Value = Call> {
    (
        0..RESOURCES,
        proptest::sample::subsequence(NAMES.to_vec(), 1..=3),
        proptest::collection::vec(stamp(), 3),
        any::<usize>(),
        defect(),
    )
        .prop_map(|(resource, names, stamps, rotate, defect)| {
            let mut nodes: Vec<Option<String>> =
                names.iter().map(|n| Some((*n).to_owned())).collect();
            let mut stamps: Vec<Stamp> = stamps[..nodes.len()].to_vec();
            // Any order: the backends must not depend on sorted input.
            let r = rotate % nodes.len();
            nodes.rotate_left(r);
            stamps.rotate_left(r);
            let len = nodes.len();
            let (n, s) = (&mut nodes, &mut stamps);
            match &defect {
                Defect::Clean | Defect::NullNodes | Defect::NullStamps => {}
                Defect::Duplicate(i, st) => {
                    n.push(n[i % len].clone());
                    s.push(st.clone());
                }
                Defect::NullName(i) => n[i % len] = None,
                Defect::EmptyName(i) => n[i % len] = Some(String::new()),
                Defect::LongName(i, bad) => {
                    n[i % len] = Some(if *bad {
                        "x".repeat(129)
                    } else {
                        "é".repeat(64) // 128 bytes
                    });
                }
                Defect::Many(count) => {
                    let first = s[0].clone();
                    *n = std::iter::once(Some("a".to_owned()))
                        .chain((1..*count).map(|i| Some(format!("m{i}"))))
                        .collect();
                    *s = vec![first; *count];
                }
                Defect::NoClaims => {
                    n.clear();
                    s.clear();
                }
                Defect::DropStamp => {
                    s.pop();
                }
                Defect::ExtraStamp(st) => s.push(st.clone()),
            }
            let nodes = (!matches!(defect, Defect::NullNodes)).then_some(nodes);
            let stamps = (!matches!(defect, Defect::NullStamps)).then_some(stamps);
            Call {
                resource,
                nodes,
                stamps,
            }
        })
}

/// Calls; about one in five repeats an earlier one exactly (a retried write of the same grant,
/// or of the same malformed input).
fn sequence() -> impl Strategy<Value = Vec<Call>> {
    proptest::collection::vec(
        (call(), proptest::option::weighted(0.2, any::<usize>())),
        1..30,
    )
    .prop_map(|items| {
        let mut calls: Vec<Call> = Vec::with_capacity(items.len());
        for (call, again) in items {
            let call = match again {
                Some(k) if !calls.is_empty() => calls[k % calls.len()].clone(),
                _ => call,
            };
            calls.push(call);
        }
        calls
    })
}

/// The token the crate's own types make of `call`, or which kind of defect stops them.
fn reference_token(call: &Call) -> Result<Token, &'static str> {
    let (Some(nodes), Some(stamps)) = (&call.nodes, &call.stamps) else {
        return Err("NULL list");
    };
    if nodes.len() != stamps.len() {
        return Err("lengths differ");
    }
    let mut claims = Vec::with_capacity(nodes.len());
    for (node, stamp) in nodes.iter().zip(stamps) {
        let Some(node) = node else {
            return Err("NULL name");
        };
        let stamp = match stamp {
            Stamp::Value(v) => u64::try_from(*v).map_err(|_| "negative stamp")?,
            Stamp::Garbage(_) => return Err("NULL stamp"),
        };
        claims.push((node.as_str(), stamp));
    }
    if let [("", v)] = claims[..] {
        return Ok(Token::Scalar(ScalarToken(v)));
    }
    FenceToken::new(claims)
        .map(Token::Claims)
        .map_err(|e| match e {
            FenceError::EmptyToken => "no claims",
            FenceError::TooManyClaims { .. } => "too many claims",
            FenceError::InvalidNodeName { .. } => "bad name",
            FenceError::DuplicateNode { .. } => "duplicate node",
            other => panic!("FenceToken::new: {other:?}"),
        })
}

fn memory_admit(hw: &mut HighWater, call: &Call) -> Verdict {
    let Ok(token) = reference_token(call) else {
        return Verdict::Malformed;
    };
    match hw.admit(&token) {
        Ok(Admission::Advanced) => Verdict::Advanced,
        Ok(Admission::Repeated) => Verdict::Repeated,
        Ok(other) => panic!("unknown admission {other:?}"),
        Err(e) if e.is_stale() => Verdict::Stale,
        Err(e) if e.is_unrelated() => Verdict::Unrelated,
        Err(e) => panic!("HighWater::admit on a well-formed token: {e:?}"),
    }
}

fn from_code(code: i64) -> Result<Verdict, TestCaseError> {
    Ok(match code {
        1 => Verdict::Advanced,
        2 => Verdict::Repeated,
        -1 => Verdict::Stale,
        -2 => Verdict::Unrelated,
        other => return Err(TestCaseError::fail(format!("verdict code {other}"))),
    })
}

/// A backend's error: `Malformed` if it maps to a malformed-input error, else a failure.
fn from_error(backend: &str, e: FenceError) -> Result<Verdict, TestCaseError> {
    if e.is_malformed() {
        Ok(Verdict::Malformed)
    } else {
        Err(TestCaseError::fail(format!("{backend} failed: {e:?}")))
    }
}

async fn pg_admit(client: &Client, resource: &str, call: &Call) -> Result<Verdict, TestCaseError> {
    let nodes: Option<Vec<Option<&str>>> = call
        .nodes
        .as_ref()
        .map(|v| v.iter().map(Option::as_deref).collect());
    let stamps: Option<Vec<Option<i64>>> = call.stamps.as_ref().map(|v| {
        v.iter()
            .map(|s| match s {
                Stamp::Value(v) => Some(*v),
                Stamp::Garbage(_) => None,
            })
            .collect()
    });
    match client
        .query_one(
            "SELECT verdict FROM fencing_high_water_admit($1, $2, $3)",
            &[&resource, &nodes, &stamps],
        )
        .await
    {
        Ok(row) => from_code(row.get::<_, i16>(0).into()),
        Err(e) => match e.as_db_error() {
            Some(db) if db.code().code() == "FN003" => {
                from_error("postgres", FenceError::from_malformed_message(db.message()))
            }
            _ => Err(TestCaseError::fail(format!("postgres failed: {e}"))),
        },
    }
}

/// `value` is written to the resource's register when the call is admitted.
async fn redis_admit(
    conn: &mut MultiplexedConnection,
    resource: &str,
    call: &Call,
    value: &str,
) -> Result<Verdict, TestCaseError> {
    let fence = RedisFence::new();
    let mut cmd = redlock_testkit::redis::cmd("EVAL");
    cmd.arg(RedisFence::script_source())
        .arg(2)
        .arg(fence.high_water_key(resource))
        .arg(fence.register_key(resource));
    let nodes = call.nodes.as_deref().unwrap_or_default();
    let stamps = call.stamps.as_deref().unwrap_or_default();
    match &call.nodes {
        Some(n) => cmd.arg(n.len()),
        None => cmd.arg("null"),
    };
    for i in 0..nodes.len().max(stamps.len()) {
        if let Some(node) = nodes.get(i) {
            match node {
                Some(name) => cmd.arg(name),
                None => cmd.arg("x".repeat(129)),
            };
        }
        if let Some(stamp) = stamps.get(i) {
            match stamp {
                Stamp::Value(v) => cmd.arg(v.to_string()),
                Stamp::Garbage(g) => cmd.arg(GARBAGE[g % GARBAGE.len()]),
            };
        }
    }
    cmd.arg(value);
    let reply: Result<(i64, Vec<String>), _> = cmd.query_async(conn).await;
    match reply {
        Ok((code, _)) => from_code(code),
        Err(e) => match e.detail() {
            Some(detail) if e.code() == Some("FENCEMALFORMED") => {
                from_error("redis", FenceError::from_malformed_message(detail))
            }
            _ => Err(TestCaseError::fail(format!("redis failed: {e}"))),
        },
    }
}

struct Backends {
    rt: tokio::runtime::Runtime,
    pg: Client,
    redis: Mutex<MultiplexedConnection>,
    pg_fence: PgFence,
    // Dropped last: the servers outlive the connections.
    _servers: (PgServer, Cluster),
}

fn backends() -> Backends {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (pg_server, cluster, pg, redis) = rt.block_on(async {
        let pg_server = PgServer::start()
            .await
            .expect("this test needs PostgreSQL: could not start a throwaway server");
        let cluster = Cluster::start(1)
            .await
            .expect("this test needs redis-server");
        let pg = pg_server.connect().await.unwrap();
        let redis = cluster.node(0).connection().await.unwrap();
        (pg_server, cluster, pg, redis)
    });
    let pg_fence = PgFence::new();
    rt.block_on(pg_fence.create_schema(&pg)).unwrap();
    Backends {
        rt,
        pg,
        redis: Mutex::new(redis),
        pg_fence,
        _servers: (pg_server, cluster),
    }
}

#[test]
fn memory_redis_and_postgres_give_the_same_verdicts() {
    let b = backends();
    let case_no = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/backends_agree.txt",
        ))),
        ..Config::default()
    });
    let strategy = sequence();
    let result = runner.run(&strategy, |calls| {
        let case = case_no.fetch_add(1, Ordering::Relaxed);
        let names: Vec<String> = (0..RESOURCES).map(|r| format!("c{case}:r{r}")).collect();
        let mut memory = vec![HighWater::new(); RESOURCES];
        let mut registers: Vec<Option<String>> = vec![None; RESOURCES];
        let mut redis = b.redis.lock().unwrap();
        b.rt.block_on(async {
            for (step, call) in calls.iter().enumerate() {
                let r = call.resource;
                let value = format!("step {step}");
                let mem = memory_admit(&mut memory[r], call);
                let pg = pg_admit(&b.pg, &names[r], call).await?;
                let rd = redis_admit(&mut redis, &names[r], call, &value).await?;
                prop_assert!(
                    mem == pg && mem == rd,
                    "step {step}, {call:?}: memory {mem:?}, postgres {pg:?}, redis {rd:?} \
                     (high water before: {:?})",
                    memory[r]
                );
                if matches!(mem, Verdict::Advanced | Verdict::Repeated) {
                    registers[r] = Some(value);
                }
                // Rejections, malformed calls included, leave every store as it was.
                let in_pg = b.pg_fence.high_water(&b.pg, &names[r]).await;
                let in_redis = RedisFence::new().high_water(&mut *redis, &names[r]).await;
                prop_assert!(
                    in_pg.as_ref().ok() == Some(&memory[r])
                        && in_redis.as_ref().ok() == Some(&memory[r]),
                    "after step {step}, {call:?} ({mem:?}): memory {:?}, postgres {in_pg:?}, \
                     redis {in_redis:?}",
                    memory[r]
                );
            }
            for r in 0..RESOURCES {
                let stored = RedisFence::new()
                    .get(&mut *redis, &names[r])
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                prop_assert_eq!(
                    stored.map(|v| String::from_utf8(v).unwrap()),
                    registers[r].clone(),
                    "register of resource {}",
                    r
                );
            }
            Ok::<(), TestCaseError>(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Guards against a vacuous property: the generator, replayed deterministically through the
/// reference, yields every verdict and every kind of malformed input, in useful numbers.
#[test]
fn generated_sequences_cover_every_verdict_and_defect() {
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = sequence();
    let mut verdicts = BTreeMap::<String, usize>::new();
    let mut defects = BTreeMap::<&str, usize>::new();
    for _ in 0..64 {
        let calls = strategy.new_tree(&mut runner).unwrap().current();
        let mut memory = vec![HighWater::new(); RESOURCES];
        for call in &calls {
            if let Err(kind) = reference_token(call) {
                *defects.entry(kind).or_default() += 1;
            }
            let v = memory_admit(&mut memory[call.resource], call);
            *verdicts.entry(format!("{v:?}")).or_default() += 1;
        }
    }
    eprintln!("{verdicts:?} {defects:?}");
    for v in ["Advanced", "Repeated", "Stale", "Unrelated", "Malformed"] {
        let n = verdicts.get(v).copied().unwrap_or(0);
        assert!(n >= 30, "only {n} {v} verdicts: {verdicts:?}");
    }
    let malformed = verdicts["Malformed"];
    let total: usize = verdicts.values().sum();
    assert!(malformed * 2 < total, "mostly malformed: {verdicts:?}");
    for kind in [
        "NULL list",
        "lengths differ",
        "NULL name",
        "negative stamp",
        "NULL stamp",
        "no claims",
        "too many claims",
        "bad name",
        "duplicate node",
    ] {
        let n = defects.get(kind).copied().unwrap_or(0);
        assert!(n >= 3, "only {n} of {kind:?}: {defects:?}");
    }
}
