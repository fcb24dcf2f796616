//! `RedisFence` against a real redis-server started by the testkit.

use std::time::Duration;

use fencing::{Admission, Expiry, FenceError, FenceToken, HighWater, RedisFence, ScalarToken};
use redlock_testkit::Cluster;
use redlock_testkit::redis::AsyncCommands;

fn t(s: &str) -> FenceToken {
    s.parse().unwrap()
}

#[tokio::test]
async fn register_admits_in_order_and_rejects_stale_writes() {
    let cluster = Cluster::start(1).await.unwrap();
    let mut conn = cluster.node(0).connection().await.unwrap();
    let fence = RedisFence::new();

    let old = t("f1,a=10,b=10,c=10");
    let new = t("f1,b=20,c=20,d=20");
    assert_eq!(fence.get(&mut conn, "reg").await.unwrap(), None);
    assert_eq!(
        fence
            .set_if_admitted(&mut conn, "reg", &new, "B")
            .await
            .unwrap(),
        Admission::Advanced
    );
    // The same grant retrying its write is admitted and writes again.
    assert_eq!(
        fence
            .set_if_admitted(&mut conn, "reg", &new, "B2")
            .await
            .unwrap(),
        Admission::Repeated
    );
    match fence.set_if_admitted(&mut conn, "reg", &old, "A").await {
        Err(FenceError::Stale {
            offered,
            high_water,
        }) => {
            assert_eq!(offered, old.clone().into());
            assert_eq!(high_water, HighWater::from(&new));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    assert_eq!(
        fence.get(&mut conn, "reg").await.unwrap().as_deref(),
        Some(&b"B2"[..])
    );
    let err = fence
        .set_if_admitted(&mut conn, "reg", &t("f1,x=1"), "X")
        .await
        .unwrap_err();
    assert!(err.is_unrelated(), "{err}");
    let err = fence
        .admit(&mut conn, "reg", ScalarToken(1 << 60))
        .await
        .unwrap_err();
    assert!(err.is_unrelated(), "{err}");
    assert_eq!(
        fence.high_water(&mut conn, "reg").await.unwrap(),
        HighWater::from(&new)
    );
}

/// Under memory pressure with a `volatile-*` eviction policy (what the docs require), the high
/// water — a key without TTL — stays while cache entries with a TTL are evicted, and a stale
/// holder is still refused. (Under `allkeys-lru` the high water was evicted while the
/// often-read register stayed, and the stale write was admitted.)
#[tokio::test]
async fn the_high_water_survives_memory_pressure_under_a_volatile_policy() {
    let cluster = Cluster::start(1).await.unwrap();
    let mut conn = cluster.node(0).connection().await.unwrap();
    let fence = RedisFence::new();
    let old = t("f1,n1=10,n2=10,n3=10");
    let new = t("f1,n2=20,n3=20,n4=20");
    // The register is a cache entry: evictable under the policy.
    fence
        .set_if_admitted_with(
            &mut conn,
            "reg",
            &new,
            "NEW",
            Expiry::After(Duration::from_secs(600)),
        )
        .await
        .unwrap();
    let used = info_field(&mut conn, "memory", "used_memory").await;
    let () = redlock_testkit::redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("volatile-lru")
        .arg("maxmemory")
        .arg(used + 2 * 1024 * 1024)
        .query_async(&mut conn)
        .await
        .unwrap();
    let filler = "x".repeat(1024);
    for i in 0..8_000 {
        let () = conn
            .pset_ex(format!("cache:{i}"), &filler, 600_000)
            .await
            .unwrap();
    }
    let evicted = info_field(&mut conn, "stats", "evicted_keys").await;
    assert!(
        evicted > 0,
        "the server evicted nothing: no memory pressure"
    );
    let hw: bool = conn.exists("fence:hw:reg").await.unwrap();
    assert!(hw, "the high water was evicted ({evicted} keys evicted)");
    let err = fence
        .set_if_admitted(&mut conn, "reg", &old, "OLD")
        .await
        .unwrap_err();
    assert!(err.is_stale(), "{err}");
}

/// A numeric field of `INFO section`.
async fn info_field(
    conn: &mut redlock_testkit::redis::aio::MultiplexedConnection,
    section: &str,
    field: &str,
) -> u64 {
    let info: String = redlock_testkit::redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn stamps_compare_exactly_beyond_double_precision() {
    // 2^53 + 1 and 2^53 are equal as Lua numbers; the script compares decimal strings.
    let cluster = Cluster::start(1).await.unwrap();
    let mut conn = cluster.node(0).connection().await.unwrap();
    let fence = RedisFence::with_prefix("t:");
    let big = 1u64 << 53;
    fence
        .admit(&mut conn, "r", ScalarToken(big + 1))
        .await
        .unwrap();
    assert!(
        fence
            .admit(&mut conn, "r", ScalarToken(big))
            .await
            .unwrap_err()
            .is_stale()
    );
    assert_eq!(
        fence
            .admit(&mut conn, "r", ScalarToken(big + 1))
            .await
            .unwrap(),
        Admission::Repeated
    );
    // Different lengths: 9 < 10.
    fence.admit(&mut conn, "s", ScalarToken(10)).await.unwrap();
    assert!(
        fence
            .admit(&mut conn, "s", ScalarToken(9))
            .await
            .unwrap_err()
            .is_stale()
    );
    let stored: String = conn.hget("t:hw:r", "").await.unwrap();
    assert_eq!(stored, (big + 1).to_string());
    assert!(matches!(
        fence.admit(&mut conn, "r", ScalarToken(u64::MAX)).await,
        Err(FenceError::StampOutOfRange { .. })
    ));
}

#[tokio::test]
async fn foreign_data_under_a_fence_key_is_reported() {
    let cluster = Cluster::start(1).await.unwrap();
    let mut conn = cluster.node(0).connection().await.unwrap();
    let fence = RedisFence::new();
    let () = conn.hset("fence:hw:r", "a", "junk").await.unwrap();
    assert!(matches!(
        fence.high_water(&mut conn, "r").await,
        Err(FenceError::UnexpectedReply { .. })
    ));
    let () = conn.set("fence:hw:s", "not a hash").await.unwrap();
    let err = fence.admit(&mut conn, "s", &t("f1,a=1")).await.unwrap_err();
    // A server error (WRONGTYPE) is a backend failure, with redis-rs's error as its source.
    assert!(err.is_backend() && !err.is_malformed(), "{err:?}");
    let FenceError::Backend(backend) = &err else {
        unreachable!()
    };
    assert_eq!(backend.backend(), fencing::Backend::Redis);
    let source = std::error::Error::source(&err).expect("a source");
    let redis_err = source
        .downcast_ref::<redlock_testkit::redis::RedisError>()
        .expect("the source is redis-rs's error");
    assert_eq!(redis_err.code(), Some("WRONGTYPE"), "{err}");
    assert!(err.to_string().starts_with("redis: "), "{err}");
}

/// A high water that holds a node name which is not UTF-8 (written before node names were
/// checked as they are now) still answers a stale token with `Stale`: the verdict is the
/// script's, and the name is only shown. Decoding the names as UTF-8 turned the rejection into
/// a backend error, which callers may retry as if the outcome were unknown (found in review).
#[tokio::test]
async fn a_stale_token_is_stale_even_beside_a_node_name_that_is_not_utf8() {
    let cluster = Cluster::start(1).await.unwrap();
    let mut conn = cluster.node(0).connection().await.unwrap();
    let fence = RedisFence::new();
    assert_eq!(
        fence.admit(&mut conn, "r", &t("f1,a=10")).await.unwrap(),
        Admission::Advanced
    );
    let () = conn.hset("fence:hw:r", &b"n\xff"[..], "7").await.unwrap();
    let err = fence.admit(&mut conn, "r", &t("f1,a=5")).await.unwrap_err();
    assert!(err.is_stale(), "{err:?}");
}

// ---------------------------------------------------------------------------------------------
// The admission script called with raw arguments (as a client in another language would):
// malformed input is an error reply `FENCEMALFORMED …` and changes nothing.

type RawReply = Result<(i64, Vec<String>), redlock_testkit::redis::RedisError>;

/// `EVAL` of the admission script on `hw:<resource>` (and `val:<resource>` when `value` is
/// given) with `args` as they are.
async fn eval_raw(
    conn: &mut redlock_testkit::redis::aio::MultiplexedConnection,
    resource: &str,
    args: &[&str],
    value: Option<&str>,
) -> RawReply {
    let fence = RedisFence::new();
    let mut cmd = redlock_testkit::redis::cmd("EVAL");
    cmd.arg(RedisFence::script_source());
    match value {
        Some(v) => cmd
            .arg(2)
            .arg(fence.high_water_key(resource))
            .arg(fence.register_key(resource))
            .arg(args)
            .arg(v),
        None => cmd.arg(1).arg(fence.high_water_key(resource)).arg(args),
    };
    cmd.query_async(conn).await
}

fn expect_malformed(what: &str, reply: RawReply) -> redlock_testkit::redis::RedisError {
    match reply {
        Err(e) if e.code() == Some("FENCEMALFORMED") => e,
        Err(e) => panic!("{what}: expected a FENCEMALFORMED error reply, got {e:?}"),
        Ok(r) => panic!("{what}: answered {r:?} instead of rejecting malformed input"),
    }
}

async fn a_at_10() -> (Cluster, redlock_testkit::redis::aio::MultiplexedConnection) {
    let cluster = Cluster::start(1).await.unwrap();
    let mut conn = cluster.node(0).connection().await.unwrap();
    assert_eq!(
        eval_raw(&mut conn, "r", &["1", "a", "10"], Some("v10"))
            .await
            .unwrap()
            .0,
        1
    );
    (cluster, conn)
}

/// The resource's high water and register value are still those of `{a:10}`.
async fn assert_unchanged(
    conn: &mut redlock_testkit::redis::aio::MultiplexedConnection,
    what: &str,
) {
    let fence = RedisFence::new();
    assert_eq!(
        fence.high_water(conn, "r").await.unwrap(),
        HighWater::from_entries([("a", 10)]),
        "{what}"
    );
    assert_eq!(
        fence.get(conn, "r").await.unwrap().as_deref(),
        Some(&b"v10"[..]),
        "{what}"
    );
}

#[tokio::test]
async fn script_rejects_duplicate_nodes_and_never_lowers_the_high_water() {
    let (_cluster, mut conn) = a_at_10().await;
    let fence = RedisFence::new();
    let res = eval_raw(&mut conn, "r", &["2", "a", "12", "a", "10"], Some("dup")).await;
    let after = fence.high_water(&mut conn, "r").await.unwrap();
    let err = expect_malformed(&format!("a=12,a=10 (high water now {after})"), res);
    assert!(
        matches!(FenceError::from_malformed_message(err.detail().unwrap_or_default()), FenceError::DuplicateNode { ref node } if node == "a"),
        "maps to DuplicateNode"
    );
    assert_unchanged(&mut conn, "a=12,a=10").await;
    // The malformed call changed nothing: {a:11} is a genuine later grant.
    assert_eq!(
        eval_raw(&mut conn, "r", &["1", "a", "11"], None)
            .await
            .unwrap()
            .0,
        1
    );
    assert_eq!(
        eval_raw(&mut conn, "r", &["1", "a", "10"], None)
            .await
            .unwrap()
            .0,
        -1
    );
}

#[tokio::test]
async fn script_rejects_stamps_that_are_not_canonical_decimals() {
    let (_cluster, mut conn) = a_at_10().await;
    for stamp in [
        "",
        "x",
        "-1",
        "-10",
        "011",
        "00",
        "1e3",
        " 11",
        "11 ",
        "+11",
        "11.0",
        "0x20",
        "9223372036854775808",
        "99999999999999999999",
    ] {
        let what = format!("stamp {stamp:?}");
        let res = eval_raw(&mut conn, "r", &["2", "a", "11", "b", stamp], Some("bad")).await;
        let after = RedisFence::new().high_water(&mut conn, "r").await;
        let err = expect_malformed(&format!("{what} (high water now {after:?})"), res);
        let mapped = FenceError::from_malformed_message(err.detail().unwrap_or_default());
        assert!(
            matches!(mapped, FenceError::MalformedToken { .. }),
            "{what}: {mapped:?}"
        );
        assert_unchanged(&mut conn, &what).await;
    }
    // The largest stamp is fine.
    assert_eq!(
        eval_raw(&mut conn, "r", &["1", "a", "9223372036854775807"], None)
            .await
            .unwrap()
            .0,
        1
    );
}

#[tokio::test]
async fn script_rejects_a_claim_count_that_does_not_match_its_arguments() {
    let (_cluster, mut conn) = a_at_10().await;
    for (args, value) in [
        (&["2", "a", "11"][..], Some("v")),
        (&["2", "a", "11"][..], None),
        (&["1", "a", "11", "b"][..], None),
        (&["1", "a", "11", "b", "12"][..], None),
        (&["1", "a"][..], None),
        (&["0"][..], Some("v")),
        (&["0"][..], None),
        (&[][..], None),
        (&["x", "a", "11"][..], None),
        (&["-1", "a", "11"][..], None),
        (&["1.0", "a", "11"][..], None),
        (&["01", "a", "11"][..], None),
        (&["0x1", "a", "11"][..], None),
    ] {
        let what = format!("args {args:?}, value {value:?}");
        let res = eval_raw(&mut conn, "r", args, value).await;
        let after = RedisFence::new().high_water(&mut conn, "r").await;
        expect_malformed(&format!("{what} (high water now {after:?})"), res);
        assert_unchanged(&mut conn, &what).await;
    }
    // A first "token" without claims is not admitted either, and creates nothing.
    expect_malformed(
        "no claims on a fresh resource",
        eval_raw(&mut conn, "fresh", &["0"], Some("v")).await,
    );
    let fence = RedisFence::new();
    assert!(
        fence
            .high_water(&mut conn, "fresh")
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(fence.get(&mut conn, "fresh").await.unwrap(), None);
}

/// Which typed error a malformed input must map to.
type IsVariant = fn(&FenceError) -> bool;

#[tokio::test]
async fn script_enforces_the_token_caps_and_maps_to_typed_errors() {
    let (_cluster, mut conn) = a_at_10().await;
    let claims = |n: usize| {
        let mut args = vec![n.to_string()];
        for i in 0..n {
            args.push(if i == 0 { "a".into() } else { format!("n{i}") });
            args.push("11".into());
        }
        args
    };
    let x129 = "x".repeat(129);
    let e65 = "é".repeat(65); // 130 bytes
    let cases: Vec<(&str, Vec<String>, IsVariant)> = vec![
        ("no claims", vec!["0".into()], |e| {
            matches!(e, FenceError::EmptyToken)
        }),
        ("33 claims", claims(33), |e| {
            matches!(e, FenceError::TooManyClaims { max: 32 })
        }),
        (
            "129-byte name",
            vec!["2".into(), "a".into(), "11".into(), x129, "11".into()],
            |e| matches!(e, FenceError::InvalidNodeName { .. }),
        ),
        (
            "130-byte UTF-8 name",
            vec!["2".into(), "a".into(), "11".into(), e65, "11".into()],
            |e| matches!(e, FenceError::InvalidNodeName { .. }),
        ),
        (
            "empty name beside another claim",
            vec!["2".into(), "a".into(), "11".into(), "".into(), "11".into()],
            |e| matches!(e, FenceError::InvalidNodeName { .. }),
        ),
        (
            "count mismatch",
            vec!["2".into(), "a".into(), "11".into()],
            |e| matches!(e, FenceError::MalformedToken { .. }),
        ),
    ];
    for (what, args, typed) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let res = eval_raw(&mut conn, "r", &args, Some("bad")).await;
        let after = RedisFence::new().high_water(&mut conn, "r").await;
        let err = expect_malformed(&format!("{what} (high water now {after:?})"), res);
        let mapped = FenceError::from_malformed_message(err.detail().unwrap_or_default());
        assert!(typed(&mapped), "{what}: mapped to {mapped:?}");
        assert_unchanged(&mut conn, what).await;
    }
    // The caps themselves are fine: 32 claims, a 128-byte name, the empty name alone.
    let c32 = claims(32);
    let c32: Vec<&str> = c32.iter().map(String::as_str).collect();
    assert_eq!(eval_raw(&mut conn, "r", &c32, None).await.unwrap().0, 1);
    let e64 = "é".repeat(64);
    assert_eq!(
        eval_raw(&mut conn, "r", &["2", "a", "12", &e64, "1"], None)
            .await
            .unwrap()
            .0,
        1
    );
    assert_eq!(
        eval_raw(&mut conn, "r", &["1", "", "5"], None)
            .await
            .unwrap()
            .0,
        -2
    );
    let hw = RedisFence::new().high_water(&mut conn, "r").await.unwrap();
    assert_eq!(
        (hw.len(), hw.get("a"), hw.get(&e64)),
        (33, Some(12), Some(1))
    );
}

/// A fenced write can set a TTL (`PX`) or keep the key's (`KEEPTTL`); the plain write removes
/// it; a rejected write changes neither the value nor its TTL; a bad expiry sends nothing.
#[tokio::test]
async fn fenced_writes_set_or_keep_an_expiry() {
    let cluster = Cluster::start(1).await.unwrap();
    let mut conn = cluster.node(0).connection().await.unwrap();
    let fence = RedisFence::new();
    let key = fence.register_key("cache");
    let pttl = |conn: &mut redlock_testkit::redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        let key = key.clone();
        async move { conn.pttl::<_, i64>(key).await.unwrap() }
    };

    let first = t("f1,a=10,b=10");
    fence
        .set_if_admitted_with(
            &mut conn,
            "cache",
            &first,
            "v1",
            Expiry::After(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let after_px = pttl(&mut conn).await;
    assert!((4000..=5000).contains(&after_px), "PTTL {after_px}");

    let second = t("f1,a=20,b=20");
    fence
        .set_if_admitted_with(&mut conn, "cache", &second, "v2", Expiry::Keep)
        .await
        .unwrap();
    let kept = pttl(&mut conn).await;
    assert!(
        kept > 0 && kept <= after_px,
        "PTTL {kept} after KEEPTTL (was {after_px})"
    );
    assert_eq!(
        fence.get(&mut conn, "cache").await.unwrap(),
        Some(b"v2".to_vec())
    );

    // A stale write with an expiry is rejected whole: value and TTL stay.
    let e = fence
        .set_if_admitted_with(
            &mut conn,
            "cache",
            &first,
            "old",
            Expiry::After(Duration::from_millis(50)),
        )
        .await
        .unwrap_err();
    assert!(e.is_stale(), "{e}");
    let still = pttl(&mut conn).await;
    assert!(still > 1000 && still <= kept, "PTTL {still}");
    assert_eq!(
        fence.get(&mut conn, "cache").await.unwrap(),
        Some(b"v2".to_vec())
    );

    // The plain write removes the expiry; KEEPTTL on a key without one keeps none.
    let third = t("f1,a=30,b=30");
    fence
        .set_if_admitted(&mut conn, "cache", &third, "v3")
        .await
        .unwrap();
    assert_eq!(pttl(&mut conn).await, -1);
    let fourth = t("f1,a=40,b=40");
    fence
        .set_if_admitted_with(&mut conn, "cache", &fourth, "v4", Expiry::Keep)
        .await
        .unwrap();
    assert_eq!(pttl(&mut conn).await, -1);

    // Out-of-range expiries: nothing is sent.
    for bad in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::from_secs(101 * 365 * 24 * 3600),
    ] {
        let e = fence
            .set_if_admitted_with(
                &mut conn,
                "cache",
                &t("f1,a=50,b=50"),
                "v5",
                Expiry::After(bad),
            )
            .await
            .unwrap_err();
        assert!(matches!(e, FenceError::InvalidExpiry { .. }), "{e}");
    }
    assert_eq!(
        fence.get(&mut conn, "cache").await.unwrap(),
        Some(b"v4".to_vec())
    );
    assert_eq!(
        fence.high_water(&mut conn, "cache").await.unwrap().get("a"),
        Some(40)
    );

    // A raw caller's bad PX count is an error reply before anything is written.
    for ms in ["0", "-5", "abc", "1.5"] {
        let reply: Result<(i64, Vec<String>), _> = redlock_testkit::redis::cmd("EVAL")
            .arg(RedisFence::script_source())
            .arg(2)
            .arg(fence.high_water_key("cache"))
            .arg(&key)
            .arg(1)
            .arg("a")
            .arg("60")
            .arg("v6")
            .arg("PX")
            .arg(ms)
            .query_async(&mut conn)
            .await;
        let e = reply.unwrap_err();
        assert!(e.to_string().contains("fence write"), "{ms}: {e}");
    }
    assert_eq!(
        fence.get(&mut conn, "cache").await.unwrap(),
        Some(b"v4".to_vec())
    );
    assert_eq!(
        fence.high_water(&mut conn, "cache").await.unwrap().get("a"),
        Some(40)
    );
}

/// `eval_raw` with arguments that need not be UTF-8.
async fn eval_bytes(
    conn: &mut redlock_testkit::redis::aio::MultiplexedConnection,
    args: &[&[u8]],
    value: &str,
) -> RawReply {
    let fence = RedisFence::new();
    let mut cmd = redlock_testkit::redis::cmd("EVAL");
    cmd.arg(RedisFence::script_source())
        .arg(2)
        .arg(fence.high_water_key("r"))
        .arg(fence.register_key("r"));
    for a in args {
        cmd.arg(*a);
    }
    cmd.arg(value).query_async(conn).await
}

/// Node names the token types refuse (a NUL byte; bytes that are not UTF-8) are refused by the
/// script too, as malformed and before anything is written. It admitted both; with a name that
/// is not UTF-8 stored, `RedisFence::high_water` failed on the resource, and a stale token came
/// back as a backend error (outcome unknown) instead of `Stale`.
#[tokio::test]
async fn script_rejects_node_names_the_token_types_refuse() {
    let (_cluster, mut conn) = a_at_10().await;
    let cases: [(&str, &[u8], &str); 3] = [
        ("a NUL byte", b"n\0x", "node name contains a NUL byte"),
        (
            "bytes that are not UTF-8",
            b"\xff\xfe",
            "node name is not UTF-8",
        ),
        (
            "a UTF-16 surrogate in UTF-8 form",
            b"\xed\xa0\x80",
            "node name is not UTF-8",
        ),
    ];
    for (what, name, reason) in cases {
        let reply = eval_bytes(&mut conn, &[b"2", b"a", b"11", name, b"11"], "bad").await;
        let err = expect_malformed(what, reply);
        let typed = FenceError::from_malformed_message(err.detail().unwrap_or_default());
        assert!(
            typed.to_string().contains(reason),
            "{what}: maps to {typed:?}, not the token types' reason {reason:?}"
        );
        assert_unchanged(&mut conn, what).await;
    }
    // Names that are UTF-8 beyond ASCII stay valid.
    let reply = eval_bytes(
        &mut conn,
        &[
            b"2",
            b"a",
            b"11",
            "n\u{e9}\u{4e2d}\u{1f512}".as_bytes(),
            b"11",
        ],
        "ok",
    )
    .await;
    assert_eq!(reply.unwrap().0, 1);
}

/// The admission of `{a: stamp}` on `r` with the write of `v<stamp>`, expiring `ms` later.
async fn eval_px(
    conn: &mut redlock_testkit::redis::aio::MultiplexedConnection,
    stamp: &str,
    ms: &str,
) -> RawReply {
    let fence = RedisFence::new();
    redlock_testkit::redis::cmd("EVAL")
        .arg(RedisFence::script_source())
        .arg(2)
        .arg(fence.high_water_key("r"))
        .arg(fence.register_key("r"))
        .arg(&["1", "a", stamp, &format!("v{stamp}"), "PX", ms])
        .query_async(conn)
        .await
}

/// A `PX` count the script let through but `SET` refuses (it overflows the server's clock)
/// failed only after the high water had been raised: the mark rose and the write was lost,
/// against "a bad count is an `ERR fence write: …` reply before anything is written". Counts
/// are capped at 100 years, as `Expiry::After` is.
#[tokio::test]
async fn script_rejects_a_px_count_set_would_refuse_before_writing() {
    let (_cluster, mut conn) = a_at_10().await;
    for ms in ["9223372036854775807", "3153600000001"] {
        let reply = eval_px(&mut conn, "70", ms).await;
        let hw = RedisFence::new().high_water(&mut conn, "r").await.unwrap();
        match reply {
            Err(e) if e.to_string().contains("fence write") => {}
            other => panic!("PX {ms}: answered {other:?} (high water now {hw})"),
        }
        assert_eq!(hw, HighWater::from_entries([("a", 10)]), "PX {ms}");
        assert_unchanged(&mut conn, &format!("PX {ms}")).await;
    }
    // The longest count allowed is written with its expiry.
    let reply = eval_px(&mut conn, "70", "3153600000000").await;
    assert_eq!(reply.unwrap().0, 1);
}
