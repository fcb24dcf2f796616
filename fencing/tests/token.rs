//! The text form, serde, bad input, and the in-memory fence.

use std::sync::Arc;

use fencing::{
    Admission, FenceError, FenceToken, HighWater, MAX_CLAIMS, MAX_NODE_NAME_LEN, MAX_STAMP,
    MAX_TOKEN_TEXT_LEN, MemoryFence, ScalarToken, Token,
};
use proptest::prelude::*;

fn t(s: &str) -> FenceToken {
    s.parse().unwrap()
}

#[test]
fn canonical_text_form() {
    let token = FenceToken::new([
        ("127.0.0.1:7002", 1_716_200_000_000_017),
        ("127.0.0.1:7001", 1_716_200_000_000_001),
    ])
    .unwrap();
    let text = token.to_string();
    assert_eq!(
        text,
        "f1,127.0.0.1:7001=1716200000000001,127.0.0.1:7002=1716200000000017"
    );
    assert_eq!(text.parse::<FenceToken>().unwrap(), token);
    // Claim order in the input does not matter; the output is sorted.
    assert_eq!(
        t("f1,127.0.0.1:7002=1716200000000017,127.0.0.1:7001=1716200000000001"),
        token
    );
    assert_eq!(token.stamp("127.0.0.1:7002"), Some(1_716_200_000_000_017));
    assert_eq!(token.stamp("nope"), None);
    assert_eq!(token.len(), 2);
    // Names outside the safe set are %-escaped, so the text is header- and env-safe.
    let odd = FenceToken::new([("node one,=%é", 5u64), ("/run/redis.sock", 6)]).unwrap();
    let text = odd.to_string();
    assert_eq!(text, "f1,/run/redis.sock=6,node%20one%2C%3D%25%C3%A9=5");
    assert!(
        text.bytes()
            .all(|b| b.is_ascii_graphic() && b != b';' && b != b'"')
    );
    assert_eq!(text.parse::<FenceToken>().unwrap(), odd);
    assert_eq!(format!("{odd:?}"), format!("FenceToken({text})"));
}

#[test]
fn serde_uses_the_text_form() {
    let token = t("f1,a=1,b=2");
    let json = serde_json::to_string(&token).unwrap();
    assert_eq!(json, r#""f1,a=1,b=2""#);
    assert_eq!(serde_json::from_str::<FenceToken>(&json).unwrap(), token);
    let err = serde_json::from_str::<FenceToken>(r#""f1,a=01""#).unwrap_err();
    assert!(err.to_string().contains("leading zero"), "{err}");
    assert!(serde_json::from_str::<FenceToken>("17").is_err());
    assert_eq!(serde_json::to_string(&ScalarToken(7)).unwrap(), "7");
    assert_eq!(
        serde_json::from_str::<ScalarToken>("7").unwrap(),
        ScalarToken(7)
    );
}

#[test]
fn bad_input_gets_typed_errors() {
    use FenceError::*;
    type Expected = fn(&FenceError) -> bool;
    let cases: Vec<(String, Expected)> = vec![
        ("".into(), |e| matches!(e, EmptyToken)),
        ("   ".into(), |e| matches!(e, EmptyToken)),
        ("f1".into(), |e| matches!(e, EmptyToken)),
        ("f1,".into(), |e| matches!(e, MalformedToken { .. })),
        ("f2,a=1".into(), |e| {
            matches!(e, MalformedToken { position: 0, .. })
        }),
        ("a=1".into(), |e| matches!(e, MalformedToken { .. })),
        ("f1,a".into(), |e| matches!(e, MalformedToken { .. })),
        ("f1,a=".into(), |e| matches!(e, MalformedToken { .. })),
        ("f1,=5".into(), |e| matches!(e, InvalidNodeName { .. })),
        ("f1,a=1,,b=2".into(), |e| matches!(e, MalformedToken { .. })),
        ("f1,a=-1".into(), |e| matches!(e, MalformedToken { .. })),
        ("f1,a=1x".into(), |e| matches!(e, MalformedToken { .. })),
        ("f1,a=007".into(), |e| matches!(e, MalformedToken { .. })),
        ("f1,a b=1".into(), |e| matches!(e, MalformedToken { .. })),
        ("f1,a%2=1".into(), |e| matches!(e, MalformedToken { .. })),
        ("f1,a%2c=1".into(), |e| matches!(e, MalformedToken { .. })),
        ("f1,%61=1".into(), |e| matches!(e, MalformedToken { .. })), // needless escape of `a`
        ("f1,%FF=1".into(), |e| matches!(e, MalformedToken { .. })), // not UTF-8
        (
            "f1,a=1,a=2".into(),
            |e| matches!(e, DuplicateNode { node } if node == "a"),
        ),
        ("f1,a=9223372036854775808".into(), |e| {
            matches!(e, StampOutOfRange { .. })
        }),
        ("f1,a=99999999999999999999999".into(), |e| {
            matches!(e, StampOutOfRange { .. })
        }),
        (format!("f1,{}=1", "n".repeat(MAX_NODE_NAME_LEN + 1)), |e| {
            matches!(e, InvalidNodeName { .. })
        }),
        (
            format!(
                "f1,{}",
                (0..=MAX_CLAIMS)
                    .map(|i| format!("n{i}=1"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            |e| matches!(e, TooManyClaims { .. }),
        ),
        ("x".repeat(MAX_TOKEN_TEXT_LEN + 1), |e| {
            matches!(e, TokenTooLong { .. })
        }),
        ("f1,a=1".repeat(1 << 20), |e| {
            matches!(e, TokenTooLong { .. })
        }),
    ];
    for (input, expected) in cases {
        let err = input.parse::<FenceToken>().unwrap_err();
        let shown: String = input.chars().take(60).collect();
        assert!(expected(&err), "{shown:?} gave {err:?}");
        assert!(!err.to_string().is_empty());
    }
    assert!(matches!(
        FenceToken::new(Vec::<(&str, u64)>::new()),
        Err(FenceError::EmptyToken)
    ));
    assert!(matches!(
        FenceToken::new([("a", MAX_STAMP + 1)]),
        Err(FenceError::StampOutOfRange { .. })
    ));
    assert!(matches!(
        FenceToken::new([("", 1)]),
        Err(FenceError::InvalidNodeName { .. })
    ));
    assert!(matches!(
        "".parse::<ScalarToken>(),
        Err(FenceError::EmptyToken)
    ));
    assert!(matches!(
        "1".repeat(21).parse::<ScalarToken>(),
        Err(FenceError::TokenTooLong { .. })
    ));
    assert!(matches!(
        "12a".parse::<ScalarToken>(),
        Err(FenceError::MalformedToken { .. })
    ));
    // The largest valid token still fits under the text limit.
    let biggest = FenceToken::new((0..MAX_CLAIMS).map(|i| {
        let name: String = format!("{i:02}{}", "é".repeat((MAX_NODE_NAME_LEN - 2) / 2));
        (name, MAX_STAMP)
    }))
    .unwrap();
    let text = biggest.to_string();
    assert!(
        text.len() <= MAX_TOKEN_TEXT_LEN,
        "{} > {}",
        text.len(),
        MAX_TOKEN_TEXT_LEN
    );
    assert_eq!(text.parse::<FenceToken>().unwrap(), biggest);
}

/// A node name with a NUL byte is refused where the token is made or parsed, as every
/// backend must store the names: PostgreSQL text cannot hold NUL, and such a token used to pass
/// here and in the memory fence, then fail in `PgFence::admit` with an untyped backend error
/// ("invalid byte sequence"), which says the outcome is unknown.
#[test]
fn node_names_with_a_nul_byte_are_refused() {
    let made = FenceToken::new([("a\0b", 1u64), ("c", 1)]);
    assert!(
        matches!(made, Err(FenceError::InvalidNodeName { .. })),
        "{made:?}"
    );
    let parsed = "f1,a%00b=1,c=1".parse::<FenceToken>();
    assert!(
        matches!(parsed, Err(FenceError::InvalidNodeName { .. })),
        "{parsed:?}"
    );
    assert!(parsed.unwrap_err().is_malformed());
}

#[test]
fn rejection_messages_name_both_tokens() {
    let fence = MemoryFence::new();
    fence.admit("r", &t("f1,a=5,b=5")).unwrap();
    let err = fence.admit("r", &t("f1,a=4,c=9")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "stale fence token f1,a=4,c=9: the resource already admitted a newer grant (high water f1,a=5,b=5)"
    );
    match err {
        FenceError::Stale {
            offered,
            high_water,
        } => {
            assert_eq!(offered, Token::Claims(t("f1,a=4,c=9")));
            assert_eq!(high_water.get("a"), Some(5));
        }
        other => panic!("{other:?}"),
    }
    let err = fence.admit("r", &t("f1,x=1")).unwrap_err();
    assert!(err.is_unrelated() && err.is_rejection());
    assert!(
        err.to_string().starts_with("unrelated fence token f1,x=1"),
        "{err}"
    );
}

#[test]
fn memory_fence_rule() {
    let fence = Arc::new(MemoryFence::new());
    let g1 = t("f1,a=10,b=10,c=10");
    let g2 = t("f1,a=20,b=20,d=20");
    let g3 = t("f1,c=30,d=30,e=30");
    assert_eq!(fence.admit("r", &g2).unwrap(), Admission::Advanced);
    assert_eq!(fence.admit("r", &g2).unwrap(), Admission::Repeated);
    assert!(fence.admit("r", &g1).unwrap_err().is_stale());
    // g3 shares only d with the history, and is newer there.
    assert_eq!(fence.admit("r", &g3).unwrap(), Admission::Advanced);
    assert_eq!(
        fence.high_water("r"),
        HighWater::from_entries([("a", 20), ("b", 20), ("c", 30), ("d", 30), ("e", 30)])
    );
    assert!(fence.admit("r", &g2).unwrap_err().is_stale());
    // Resources are independent.
    assert_eq!(fence.admit("other", &g1).unwrap(), Admission::Advanced);
    // Scalars: `last ≤ token`, equal is the same holder retrying.
    assert_eq!(
        fence.admit("s", ScalarToken(5)).unwrap(),
        Admission::Advanced
    );
    assert_eq!(
        fence.admit("s", ScalarToken(5)).unwrap(),
        Admission::Repeated
    );
    assert!(fence.admit("s", ScalarToken(4)).unwrap_err().is_stale());
    assert!(fence.admit("s", &g1).unwrap_err().is_unrelated());
    assert!(
        fence
            .admit("r", ScalarToken(1 << 60))
            .unwrap_err()
            .is_unrelated()
    );
    assert!(matches!(
        fence.admit("s", ScalarToken(u64::MAX)),
        Err(FenceError::StampOutOfRange { .. })
    ));
    assert_eq!(fence.high_water("s").scalar(), Some(5));
    assert_eq!(fence.high_water("s").to_string(), "scalar 5");
    // The protected write runs only when admitted, under the fence's lock.
    let (_, v) = fence.admit_with("r", &g3, |a| format!("{a:?}")).unwrap();
    assert_eq!(v, "Repeated");
    let mut ran = false;
    assert!(fence.admit_with("r", &g1, |_| ran = true).is_err());
    assert!(!ran);
    fence.reset("r");
    assert_eq!(fence.admit("r", &g1).unwrap(), Admission::Advanced);
}

/// A fenced write that uses its own fence (logs the high water, resets a resource, admits
/// another write) must not hang the thread: `admit_with` held the fence's only mutex while the
/// write ran, and a second lock from the same thread deadlocked (review of 2026-12-03: the
/// write below never returned). Each step runs on a thread of its own, with a deadline.
#[test]
fn a_fenced_write_can_use_its_own_fence() {
    fn within_deadline<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()).unwrap());
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("{what}: the fenced write did not return (deadlock)"))
    }
    let fence = Arc::new(MemoryFence::new());
    let g1 = t("f1,a=10,b=10");
    let g2 = t("f1,a=20,b=20");

    // Reading the high water from inside the write sees the advance the write runs under.
    let f = fence.clone();
    let (a, seen) = within_deadline("high_water inside the write", move || {
        f.admit_with("r", &g2, |_| f.high_water("r")).unwrap()
    });
    assert_eq!(a, Admission::Advanced);
    assert_eq!(seen, HighWater::from(&t("f1,a=20,b=20")));

    // A second admission on the same fence from inside the write is refused with a typed
    // error (the fence is taken until the write returns), never admitted, never a hang.
    let f = fence.clone();
    let inner = within_deadline("admit inside the write", move || {
        f.admit_with("other", &t("f1,a=30"), |_| {
            f.admit("r", &t("f1,a=5,b=5")).map_err(|e| e.to_string())
        })
        .unwrap()
        .1
    });
    let err = inner.unwrap_err();
    assert!(err.contains("from inside a fenced write"), "{err}");
    assert_eq!(fence.high_water("r"), HighWater::from(&t("f1,a=20,b=20")));
    assert!(fence.admit("r", &g1).unwrap_err().is_stale());

    // An operator's reset from inside a write (of another resource) takes effect.
    let f = fence.clone();
    within_deadline("reset inside the write", move || {
        f.admit_with("other", &t("f1,a=30"), |_| f.reset("r"))
            .unwrap()
    });
    assert_eq!(fence.admit("r", &g1).unwrap(), Admission::Advanced);

    // Another fence is independent: a write may be fenced by both.
    let (f, other) = (fence.clone(), Arc::new(MemoryFence::new()));
    let nested = within_deadline("another fence inside the write", move || {
        f.admit_with("r", &t("f1,a=40,b=40"), |_| {
            other
                .admit_with("r", &t("f1,a=40,b=40"), |_| "both")
                .unwrap()
                .1
        })
        .unwrap()
        .1
    });
    assert_eq!(nested, "both");

    // Another thread's admission still waits for the write to end.
    let (f, done) = (
        fence.clone(),
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let (f2, done2) = (fence.clone(), done.clone());
    let (_, during) = fence
        .admit_with("r", &t("f1,a=50,b=50"), move |_| {
            let other = std::thread::spawn(move || {
                let a = f2.admit("r", &t("f1,a=60,b=60"));
                done2.store(true, std::sync::atomic::Ordering::SeqCst);
                a
            });
            std::thread::sleep(std::time::Duration::from_millis(300));
            (done.load(std::sync::atomic::Ordering::SeqCst), other)
        })
        .unwrap();
    assert!(!during.0, "another thread was admitted while the write ran");
    assert_eq!(during.1.join().unwrap().unwrap(), Admission::Advanced);
    assert_eq!(f.high_water("r"), HighWater::from(&t("f1,a=60,b=60")));
}

/// A high water keeps every node it ever saw: nodes that lost their data come back under new
/// names, so it can hold more than the 32 claims a token may carry. Its `Display` (and so the
/// `Stale` and `Unrelated` messages) is still the claim text form; past 32 nodes it used to
/// fall back to a debug map (`{"n00": 1000, …}`, review of 2026-12-03).
#[test]
fn a_high_water_of_more_than_32_nodes_displays_in_the_text_form() {
    let fence = MemoryFence::new();
    let mut expected = Vec::new();
    for i in 0..40u64 {
        // Each grant shares one node with the one before it.
        let t = FenceToken::new([
            (format!("n {i:02}"), 1000 + i),
            (format!("n {:02}", i + 1), 1000 + i),
        ])
        .unwrap();
        assert_eq!(fence.admit("r", &t).unwrap(), Admission::Advanced);
        expected.push(format!("n%20{i:02}={}", 1000 + i));
    }
    expected.push("n%2040=1039".to_owned());
    let hw = fence.high_water("r");
    assert_eq!(hw.len(), 41);
    assert_eq!(hw.to_string(), format!("f1,{}", expected.join(",")));
    let err = fence.admit("r", &t("f1,n%2005=1")).unwrap_err();
    assert!(err.is_stale());
    assert!(
        err.to_string()
            .ends_with(&format!("(high water f1,{})", expected.join(","))),
        "{err}"
    );
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9.:-]{1,20}", "\\PC{1,12}", "[ -~]{1,30}",].prop_filter("byte length", |s| {
        !s.is_empty() && s.len() <= MAX_NODE_NAME_LEN
    })
}

proptest! {
    #[test]
    fn text_form_round_trips(claims in proptest::collection::btree_map(arb_name(), 0..=MAX_STAMP, 1..8)) {
        let token = FenceToken::new(claims.clone()).unwrap();
        let text = token.to_string();
        prop_assert!(text.bytes().all(|b| b.is_ascii_graphic()));
        let back: FenceToken = text.parse().unwrap();
        prop_assert_eq!(&back, &token);
        prop_assert_eq!(back.to_string(), text);
        for (n, s) in &claims {
            prop_assert_eq!(token.stamp(n), Some(*s));
        }
    }

    #[test]
    fn garbage_never_panics(s in "\\PC{0,64}|f1,[ -~]{0,64}") {
        let _ = s.parse::<FenceToken>();
        let _ = s.parse::<ScalarToken>();
    }
}
