//! The bus contract (`tinybroker::cluster::bus`'s module doc), as generic checks any
//! implementation must pass: here against the in-memory model ([`crate::bus::BusModel`]); the
//! NATS adapter runs the same functions against a real nats-server (`bus_nats.rs`, through
//! [`every_bus_contract_check`]). Each takes three clients of one server, on fresh subjects.

use std::time::Duration;

use bytes::Bytes;
use tinybroker::cluster::bus::{Bus, BusError, BusMessage, Inbox};

use crate::bus::{BusModel, matches};

/// Calls `$run!(check)` for every check of the contract, so each implementation's runner runs
/// all of them (`bus_nats.rs` for NATS): a new check goes here too.
#[macro_export]
macro_rules! every_bus_contract_check {
    ($run:ident) => {
        $run!(a_publish_reaches_every_matching_subscription_in_order);
        $run!(a_request_gets_the_first_answer_or_says_why_not);
        $run!(answers_gather_on_an_inbox);
        $run!(a_dropped_subscription_takes_its_interest_with_it);
    };
}

/// Bound on a message the contract says arrives.
const ARRIVES: Duration = Duration::from_secs(5);

async fn next(inbox: &mut Inbox) -> BusMessage {
    tokio::time::timeout(
        ARRIVES,
        std::future::poll_fn(|cx| inbox.as_mut().poll_next(cx)),
    )
    .await
    .expect("nothing arrived within 5 s")
    .expect("the subscription ended")
}

/// Whether anything arrives within `quiet` (after what the check waited for already came: a
/// message the contract says must not arrive would have come by then on one server).
async fn nothing_more(inbox: &mut Inbox, quiet: Duration) -> bool {
    tokio::time::timeout(
        quiet,
        std::future::poll_fn(|cx| inbox.as_mut().poll_next(cx)),
    )
    .await
    .is_err()
}

fn body(n: u32) -> Bytes {
    Bytes::from(n.to_string())
}

/// Subjects with `*` and `>` match as NATS's do; a publish reaches every matching subscription,
/// once each and in the order published, and no other.
pub async fn a_publish_reaches_every_matching_subscription_in_order(
    a: &impl Bus,
    b: &impl Bus,
    _c: &impl Bus,
) {
    let mut exact = a.subscribe("fan.y.z").await.unwrap();
    let mut star = a.subscribe("fan.*.z").await.unwrap();
    let mut tail = a.subscribe("fan.>").await.unwrap();
    let mut other = a.subscribe("other.y.z").await.unwrap();
    a.flush().await.unwrap();
    for n in 0..20 {
        b.publish("fan.y.z", body(n)).await.unwrap();
    }
    b.publish("fan.y", body(100)).await.unwrap();
    b.flush().await.unwrap();
    for inbox in [&mut exact, &mut star, &mut tail] {
        for n in 0..20 {
            let message = next(inbox).await;
            assert_eq!(message.subject, "fan.y.z");
            assert_eq!(message.payload, body(n), "in the order published");
            assert_eq!(message.reply, None);
        }
    }
    assert_eq!(
        next(&mut tail).await.payload,
        body(100),
        "`>` takes one token or more"
    );
    let quiet = Duration::from_millis(200);
    assert!(
        nothing_more(&mut exact, quiet).await,
        "at most once, and `fan.y` is not `fan.y.z`"
    );
    assert!(
        nothing_more(&mut star, quiet).await,
        "`*` is exactly one token"
    );
    assert!(nothing_more(&mut other, quiet).await, "another subject");
}

/// A request gets the first answer; with no subscription it is "no responders" at once, with
/// one that does not answer it times out.
pub async fn a_request_gets_the_first_answer_or_says_why_not(
    a: &impl Bus,
    b: &impl Bus,
    _c: &impl Bus,
) {
    let mut service = a.subscribe("service.echo").await.unwrap();
    let _mute = a.subscribe("service.mute").await.unwrap();
    a.flush().await.unwrap();
    let asked = b.request("service.echo", body(7), ARRIVES);
    let answered = async {
        let question = next(&mut service).await;
        let reply = question.reply.expect("a request carries its reply subject");
        a.publish(
            &reply,
            Bytes::from(format!(
                "re {}",
                std::str::from_utf8(&question.payload).unwrap()
            )),
        )
        .await
        .unwrap();
    };
    let (answer, ()) = tokio::join!(asked, answered);
    assert_eq!(answer.unwrap().payload, Bytes::from("re 7"));
    assert_eq!(
        b.request("service.nobody", body(1), ARRIVES).await,
        Err(BusError::NoResponders)
    );
    let started = tokio::time::Instant::now();
    assert_eq!(
        b.request("service.mute", body(2), Duration::from_millis(300))
            .await,
        Err(BusError::TimedOut)
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "timed out early: {:?}",
        started.elapsed()
    );
}

/// One publish with a reply subject, answered by every subscriber: the answers gather on the
/// asker's inbox (how a gateway asks every gateway at once).
pub async fn answers_gather_on_an_inbox(a: &impl Bus, b: &impl Bus, c: &impl Bus) {
    let mut at_a = a.subscribe("ask.all").await.unwrap();
    let mut at_c = c.subscribe("ask.all").await.unwrap();
    a.flush().await.unwrap();
    c.flush().await.unwrap();
    let inbox = b.new_inbox();
    assert_ne!(inbox, b.new_inbox(), "each inbox is new");
    let mut answers = b.subscribe(&inbox).await.unwrap();
    b.publish_with_reply("ask.all", &inbox, body(0))
        .await
        .unwrap();
    let question = next(&mut at_a).await;
    assert_eq!(question.reply.as_deref(), Some(inbox.as_str()));
    a.publish(&inbox, Bytes::from("a")).await.unwrap();
    let question = next(&mut at_c).await;
    assert_eq!(question.reply.as_deref(), Some(inbox.as_str()));
    c.publish(&inbox, Bytes::from("c")).await.unwrap();
    let mut got = vec![
        next(&mut answers).await.payload,
        next(&mut answers).await.payload,
    ];
    got.sort();
    assert_eq!(got, [Bytes::from("a"), Bytes::from("c")]);
}

/// Dropping a subscription removes its interest: a request then finds no responders.
pub async fn a_dropped_subscription_takes_its_interest_with_it(
    a: &impl Bus,
    b: &impl Bus,
    _c: &impl Bus,
) {
    let inbox = a.subscribe("leaving").await.unwrap();
    a.flush().await.unwrap();
    drop(inbox);
    a.flush().await.unwrap();
    // The unsubscription reaches the server after the flush at the latest; on a real server the
    // request may yet race it once, so the first "no responders" within the bound counts.
    let deadline = tokio::time::Instant::now() + ARRIVES;
    loop {
        match b
            .request("leaving", body(0), Duration::from_millis(200))
            .await
        {
            Err(BusError::NoResponders) => break,
            other => assert!(
                tokio::time::Instant::now() < deadline,
                "a dropped subscription still has interest: {other:?}"
            ),
        }
    }
}

type Client = crate::bus::BusClient;

fn run(check: impl AsyncFnOnce(&BusModel, &Client, &Client, &Client)) {
    let rt = crate::clock::paused_runtime();
    rt.block_on(async {
        let model = BusModel::new();
        let (a, b, c) = (model.client(1), model.client(2), model.client(3));
        check(&model, &a, &b, &c).await;
    });
}

#[test]
fn cluster_bus_model_a_publish_reaches_every_matching_subscription_in_order() {
    run(async |_, a, b, c| a_publish_reaches_every_matching_subscription_in_order(a, b, c).await);
}

#[test]
fn cluster_bus_model_a_request_gets_the_first_answer_or_says_why_not() {
    run(async |_, a, b, c| a_request_gets_the_first_answer_or_says_why_not(a, b, c).await);
}

#[test]
fn cluster_bus_model_answers_gather_on_an_inbox() {
    run(async |_, a, b, c| answers_gather_on_an_inbox(a, b, c).await);
}

#[test]
fn cluster_bus_model_a_dropped_subscription_takes_its_interest_with_it() {
    run(async |_, a, b, c| a_dropped_subscription_takes_its_interest_with_it(a, b, c).await);
}

// The model's subject matching is NATS's, token by token.
#[test]
fn cluster_bus_model_matches_subjects_as_nats_does() {
    assert!(matches("a.b", "a.b") && !matches("a.b", "a.b.c") && !matches("a.b.c", "a.b"));
    assert!(matches("a.*", "a.b") && !matches("a.*", "a.b.c") && !matches("a.*", "a"));
    assert!(matches("a.>", "a.b") && matches("a.>", "a.b.c") && !matches("a.>", "a"));
    assert!(matches("*.b.>", "x.b.y.z") && !matches("*.b.>", "x.c.y"));
    assert!(matches(
        "$JS.EVENT.ADVISORY.CONSUMER.*.s.*",
        "$JS.EVENT.ADVISORY.CONSUMER.CREATED.s.c"
    ));
}

// The model's fault hook: a cut-off client fails every operation and hears nothing; healed,
// it hears what is published after (nothing was stored meanwhile).
#[test]
fn cluster_bus_model_a_partitioned_client_fails_and_hears_nothing_until_healed() {
    run(async |model, a, b, _c| {
        let mut inbox = a.subscribe("cut").await.unwrap();
        model.partition(1);
        assert!(matches!(
            a.publish("cut", body(0)).await,
            Err(BusError::Unavailable(_))
        ));
        b.publish("cut", body(1)).await.unwrap();
        assert_eq!(
            b.request("cut", body(2), Duration::from_millis(100)).await,
            Err(BusError::NoResponders),
            "a cut-off subscriber is no responder"
        );
        model.heal(1);
        b.publish("cut", body(3)).await.unwrap();
        assert_eq!(
            next(&mut inbox).await.payload,
            body(3),
            "what came while cut off is lost"
        );
        assert_eq!(model.lost(), 2);
    });
}
