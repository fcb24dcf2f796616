//! `RedisFence` against a real redis-server started by the testkit.

use fencing::{Admission, FenceError, FenceToken, HighWater, RedisFence, ScalarToken};
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
    assert!(matches!(
        fence.admit(&mut conn, "s", &t("f1,a=1")).await,
        Err(FenceError::Redis(_))
    ));
}
