//! A lock's fence token names every node that granted it, not only the first quorum to answer.
//!
//! A node that restarts without its data comes back under a new identity, so a token naming
//! only restarted nodes shares no node with a resource's high water and is refused as
//! `Unrelated` — for good, once every node the high water knows has restarted. Tokens that
//! also name the nodes which granted after the quorum decision keep sharing a node with it.

use std::time::Duration;

use fencing::{Admission, MemoryFence};
use redlock::Redlock;
use redlock_testkit::{Cluster, DataOnRestart};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_name_the_nodes_that_granted_after_the_quorum() {
    two_grants_across_a_wipe(false).await;
}

/// The same, with each token taken right after its `acquire` returned, as a caller fences its
/// first write (and as `redlock run` hands the token to its command): `fence()` then named only
/// the quorum that decided, the high water learned only those names, and the second grant was
/// refused as `Unrelated`. `fence_settled()` waits for the late grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_taken_right_after_acquire_names_the_late_nodes_once_settled() {
    two_grants_across_a_wipe(true).await;
}

/// A lock's token: with `settled`, `fence_settled()` right after the acquire; else `fence()`
/// 200 ms later, once the late grants have arrived.
async fn token_of(lock: &redlock::Lock, settled: bool) -> redlock::FenceToken {
    if settled {
        return lock.fence_settled().await.expect("claim stamps are on");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    lock.fence().expect("claim stamps are on")
}

/// Two grants of one resource, five nodes of which 3 and 4 answer 40 ms late, with nodes 0–2
/// restarted without their data between the grants: both tokens (see [`token_of`]) must name
/// all five nodes, and the second must be admitted after the first.
async fn two_grants_across_a_wipe(settled: bool) {
    let cluster = Cluster::builder()
        .nodes(5)
        .proxied(true)
        .start()
        .await
        .expect("cluster");
    let client = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(300))
        .build()
        .expect("valid config");
    let fence = MemoryFence::new();
    // Connections (and their handshakes) first, at full speed.
    client.connect().await;
    // Nodes 3 and 4 answer 40 ms late: the quorum that decides is {0, 1, 2}.
    for i in [3, 4] {
        let proxy = cluster.node(i).proxy().expect("proxied");
        proxy.set_delay(Duration::from_millis(40), Duration::ZERO);
    }
    let first = client.acquire("orders").await.expect("free");
    if !settled {
        assert_eq!(first.claims().len(), 3, "decided at the quorum");
    }
    let first_token = token_of(&first, settled).await;
    assert!(matches!(
        fence.admit("orders", &first_token),
        Ok(Admission::Advanced)
    ));
    client.release(first).await.expect("release");

    // Nodes 0, 1, 2 restart without their data (new identities); 3 and 4 are still slow, so
    // the next grant's quorum is made of restarted nodes only.
    for i in [0, 1, 2] {
        cluster
            .node(i)
            .restart(DataOnRestart::Wipe)
            .await
            .expect("restart");
    }
    // Reconnect first, through a lock on another resource: an attempt failing on the broken
    // connections leaves grants on nodes 3 and 4 whose cleanup can still be on its way when the
    // next attempt arrives there, which then refuse it.
    let warm = client.acquire("warm-up").await.expect("free");
    client.release(warm).await.expect("release");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = client.acquire("orders").await.expect("free again");
    let token = token_of(&second, settled).await;
    let admitted = fence.admit("orders", &token);
    assert!(
        matches!(admitted, Ok(Admission::Advanced)),
        "a newer grant was refused ({admitted:?}): {token} against {}",
        fence.high_water("orders")
    );
    // Both tokens name all five nodes, the late grants included.
    assert_eq!(first_token.len(), 5, "{first_token}");
    assert_eq!(token.len(), 5, "{token}");
    client.release(second).await.expect("release");
}

/// `fence_settled` waits for a node that does not answer only until its node timeout passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_settled_waits_for_a_hung_node_only_its_node_timeout() {
    let cluster = Cluster::start(3).await.expect("cluster");
    let client = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(300))
        .build()
        .expect("valid config");
    client.connect().await;
    cluster.node(2).pause();
    let started = tokio::time::Instant::now();
    let lock = client.acquire("hung").await.expect("two of three grant");
    let token = lock.fence_settled().await.expect("claim stamps are on");
    let waited = started.elapsed();
    cluster.node(2).resume();
    assert_eq!(token.len(), 2, "{token}");
    assert!(
        waited < Duration::from_millis(300 + 500),
        "acquire and fence_settled took {waited:?} with a 300 ms node timeout"
    );
    client.release(lock).await.expect("release");
}
