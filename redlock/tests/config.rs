//! Bad input gives typed errors, never a panic; secrets stay out of messages.

use std::time::Duration;

use redlock::{ConfigError, Error, Redlock, ResourceError, RetryPolicy};

fn build(
    f: impl FnOnce(redlock::RedlockBuilder) -> redlock::RedlockBuilder,
) -> Result<Redlock, Error> {
    f(Redlock::builder().nodes([
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ]))
    .build()
}

fn unbounded() -> RetryPolicy {
    let mut p = RetryPolicy::default();
    p.max_attempts = None;
    p
}

fn config_err(r: Result<Redlock, Error>) -> ConfigError {
    match r {
        Err(Error::Config(c)) => c,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn configuration_errors_are_typed() {
    assert_eq!(config_err(Redlock::builder().build()), ConfigError::NoNodes);
    assert!(matches!(
        config_err(build(|b| b.ttl(Duration::ZERO))),
        ConfigError::InvalidTtl { .. }
    ));
    // 2 ms is exactly the constant drift: nothing would be left.
    assert!(matches!(
        config_err(build(|b| b.ttl(Duration::from_millis(2)))),
        ConfigError::InvalidTtl { .. }
    ));
    assert!(matches!(
        config_err(build(|b| b.drift_factor(f64::NAN))),
        ConfigError::InvalidDriftFactor(_)
    ));
    assert!(matches!(
        config_err(build(|b| b.drift_factor(-0.1))),
        ConfigError::InvalidDriftFactor(_)
    ));
    assert!(matches!(
        config_err(build(|b| b
            .ttl(Duration::from_millis(40))
            .node_timeout(Duration::from_millis(50)))),
        ConfigError::InvalidNodeTimeout { .. }
    ));
    assert!(matches!(
        config_err(build(|b| b.node_timeout(Duration::ZERO))),
        ConfigError::InvalidNodeTimeout { .. }
    ));
    // A zero connect timeout expires at once: every connection failed, for ever, and every
    // acquire was QuorumUnreachable (found in review).
    assert!(matches!(
        config_err(build(|b| b.connect_timeout(Duration::ZERO))),
        ConfigError::InvalidConnectTimeout(_)
    ));
    assert!(matches!(
        config_err(build(|b| b.retry(unbounded()))),
        ConfigError::InvalidRetry(_)
    ));
    assert!(matches!(
        config_err(build(|b| b.key_prefix("has space"))),
        ConfigError::InvalidKeyPrefix(_)
    ));
    assert!(matches!(
        config_err(build(|b| b.max_resource_len(0))),
        ConfigError::InvalidMaxResourceLen
    ));
}

/// Two clients on the same servers whose prefixes nest (`app:` and `app:lock:`) would share
/// keys: the second one's stamp key is the first one's lock key of the resource `stamp`, which
/// its stamp writes then leave without a TTL (seen on real servers: the first client could
/// never take `stamp` again). Prefixes that could be one half of such a pair are refused.
#[test]
fn key_prefixes_that_could_share_keys_with_another_clients_are_refused() {
    for bad in ["app:lock:", "lock:", "app", "red", "a:lock:b:", "x/lock:"] {
        match config_err(build(|b| b.key_prefix(bad))) {
            ConfigError::OverlappingKeyPrefix(p) => assert_eq!(p, bad),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    let good = [
        "",
        "redlock:",
        "app:",
        "app:locks:",
        "app:unlock:",
        "my_app.",
        "a/b/",
    ];
    for ok in good {
        if let Err(e) = build(|b| b.key_prefix(ok)) {
            panic!("{ok:?} refused: {e}");
        }
    }
    let message = config_err(build(|b| b.key_prefix("app:lock:"))).to_string();
    assert!(message.contains("\"myapp:\""), "{message}");
}

#[test]
fn malformed_and_duplicate_urls_are_rejected_without_echoing_passwords() {
    for bad in [
        "",
        "not a url",
        "http://127.0.0.1:1",
        "redis://:pw-secret@127.0.0.1:notaport",
        "redis://",
    ] {
        let e = config_err(Redlock::builder().nodes([bad]).build());
        assert!(
            matches!(e, ConfigError::InvalidNodeUrl { index: 0, .. }),
            "{bad}: {e:?}"
        );
        let text = format!("{e} {e:?}");
        assert!(!text.contains("pw-secret"), "{text}");
    }
    let e = config_err(
        Redlock::builder()
            .nodes(["redis://127.0.0.1:1", "redis://127.0.0.1:1/0"])
            .build(),
    );
    assert!(
        matches!(
            e,
            ConfigError::DuplicateNode {
                first: 0,
                second: 1,
                ..
            }
        ),
        "{e:?}"
    );
    // Different databases on one server are still one server... only if the db matches.
    let e = config_err(
        Redlock::builder()
            .named_node("a", "redis://127.0.0.1:1")
            .named_node("a", "redis://127.0.0.1:2")
            .build(),
    );
    assert!(matches!(e, ConfigError::DuplicateName { .. }), "{e:?}");
    for bad in [String::new(), "x".repeat(129), "tab\there".into()] {
        let e = config_err(
            Redlock::builder()
                .named_node(bad.clone(), "redis://127.0.0.1:1")
                .build(),
        );
        assert!(
            matches!(e, ConfigError::InvalidNodeName { index: 0, .. }),
            "{bad:?}: {e:?}"
        );
    }
}

#[test]
fn debug_output_never_shows_passwords() {
    let b = Redlock::builder().nodes(["redis://alice:hunter2-secret@127.0.0.1:1"]);
    assert!(!format!("{b:?}").contains("hunter2-secret"));
    let rl = b.build().unwrap();
    let text = format!("{rl:?}");
    assert!(!text.contains("hunter2-secret"), "{text}");
    assert!(text.contains("127.0.0.1:1"), "{text}");
}

#[tokio::test]
async fn bad_resources_are_rejected_before_anything_is_sent() {
    // Nothing listens on these ports; validation must fail first, without a connection attempt.
    let rl = build(|b| b).unwrap();
    let res = |r: Result<redlock::Lock, Error>| match r {
        Err(Error::InvalidResource(e)) => e,
        other => panic!("expected InvalidResource, got {other:?}"),
    };
    assert_eq!(
        res(rl.try_acquire("").await),
        ResourceError::Empty { index: 0 }
    );
    let long = "x".repeat(redlock::DEFAULT_MAX_RESOURCE_LEN + 1);
    assert!(matches!(
        res(rl.acquire(&long).await),
        ResourceError::TooLong { .. }
    ));
    assert_eq!(
        res(rl.try_acquire_many(Vec::<String>::new()).await),
        ResourceError::NoResources
    );
    assert_eq!(
        res(rl.try_acquire_many(["a", "b", "a"]).await),
        ResourceError::Duplicate { index: 2 }
    );
    let many: Vec<String> = (0..=redlock::MAX_RESOURCES_PER_LOCK)
        .map(|i| i.to_string())
        .collect();
    assert!(matches!(
        res(rl.try_acquire_many(many).await),
        ResourceError::TooMany { .. }
    ));
    let e = rl.lock("a").retry(unbounded()).acquire().await.unwrap_err();
    assert!(
        matches!(e, Error::Config(ConfigError::InvalidRetry(_))),
        "{e:?}"
    );
}

#[test]
fn redlock_is_cheap_to_clone_and_thread_safe() {
    fn assert_traits<T: Clone + Send + Sync + 'static>() {}
    assert_traits::<Redlock>();
    assert_traits::<Error>();
    fn assert_send<T: Send>(_: &T) {}
    let rl = build(|b| b).unwrap();
    assert_send(&rl.acquire("x"));
}

/// A minimum validity of `Duration::MAX` (the builder's or a `LockRequest`'s) is a typed
/// configuration error: the TTL check added it to the drift allowance and panicked on the
/// overflow, in `build()` and in `LockRequest::acquire` alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enormous_minimum_validity_is_a_typed_error() {
    let built = std::panic::catch_unwind(|| build(|b| b.min_validity(Duration::MAX)));
    match built {
        Ok(Err(Error::Config(_))) => {}
        Ok(other) => panic!("build: expected a config error, got {other:?}"),
        Err(_) => panic!("build panicked on min_validity(Duration::MAX)"),
    }
    let rl = build(|b| b).expect("client");
    let task = tokio::spawn(async move {
        rl.lock("r")
            .min_validity(Duration::MAX)
            .acquire()
            .await
            .map(drop)
    });
    match task.await {
        Ok(Err(Error::Config(_))) => {}
        Ok(other) => panic!("LockRequest: expected a config error, got {other:?}"),
        Err(e) => panic!("LockRequest::min_validity(Duration::MAX) panicked: {e}"),
    }
}

/// A request that names its client's own TTL and minimum validity is held to the rule the
/// client was built with: it was refused with `InvalidTtl` ("must exceed the node timeout …")
/// for a TTL of 101 ms over a 100 ms node timeout, or a minimum validity of 1.9 s in a 2 s TTL
/// over a 1 s node timeout, which `build()` had accepted, and which the client's own
/// `acquire` used without a complaint.
#[tokio::test(flavor = "current_thread")]
async fn a_request_is_held_to_the_rule_its_client_was_built_with() {
    let cases = [
        (
            Duration::from_millis(101),
            Duration::ZERO,
            Duration::from_millis(100),
        ),
        (
            Duration::from_secs(2),
            Duration::from_millis(1_900),
            Duration::from_secs(1),
        ),
    ];
    for (ttl, min_validity, node_timeout) in cases {
        let rl = build(|b| {
            b.ttl(ttl)
                .min_validity(min_validity)
                .node_timeout(node_timeout)
                .connect_timeout(Duration::from_millis(200))
        })
        .expect("a valid client");
        // Nothing listens on these ports: the attempt fails, but not on the configuration.
        let e = rl
            .lock("terms")
            .ttl(ttl)
            .min_validity(min_validity)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .expect_err("no node listens");
        assert!(
            !matches!(e, Error::Config(_)),
            "{ttl:?}, {min_validity:?}: {e}"
        );
        // Not above the node timeout: refused, for the client and for a request alike.
        let e = config_err(build(|b| b.ttl(node_timeout).node_timeout(node_timeout)));
        assert!(matches!(e, ConfigError::InvalidNodeTimeout { .. }), "{e}");
        let e = rl
            .lock("terms")
            .ttl(node_timeout)
            .min_validity(Duration::ZERO)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .expect_err("refused");
        assert!(
            matches!(&e, Error::Config(ConfigError::InvalidTtl { .. }))
                && e.to_string().contains("node timeout"),
            "{e}"
        );
    }
}
