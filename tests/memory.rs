//! What a queued message costs on the heap, counted by a global allocator that keeps the live
//! total the way glibc's malloc lays out its chunks (the request plus an 8-byte header, rounded
//! up to 16, at least 32 bytes), so the figure is the one `tinybroker bench fill` sees in the
//! broker's resident set.
//!
//! Its own test binary: the counting allocator serves every allocation of the process.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use tinybroker::{
    broker::Broker,
    clock::TokioClock,
    core::{
        Draft, Envelope, Headers, Limits, MemberOptions, Mode, OpenRequest, Pattern,
        SubscriptionSpec, Topic,
    },
};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The chunk glibc's malloc hands out for a request of `size` bytes (64-bit).
fn chunk(size: usize) -> usize {
    ((size + 8 + 15) & !15).max(32)
}

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: the caller's layout is passed on as it came.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        // SAFETY: as above; `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        LIVE.fetch_add(chunk(new_size), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A power of two, so the queue's ring buffer is exactly full (as it is, within a few percent,
/// at the bench's million).
const MESSAGES: usize = 1 << 17;
const PAYLOAD: [u8; 128] = [7; 128];

fn queue_request() -> OpenRequest {
    OpenRequest {
        subscription_id: "fill".into(),
        spec: SubscriptionSpec {
            mode: Mode::Queue,
            consumer_group: "g".into(),
            patterns: vec![Pattern::parse("bench.>").unwrap()],
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: Default::default(),
            overflow: Default::default(),
        },
        member: MemberOptions::default(),
        metadata: std::sync::Arc::from(""),
    }
}

// Issue 16: at most 192 bytes of heap per queued 128-byte message (it was 256: a 16-byte queue
// slot, a 96-byte shared record and the payload's own 144-byte chunk), and the memory budget
// charges at least what each one really holds.
#[test]
fn a_queued_128_byte_message_costs_at_most_192_bytes() {
    let limits = Limits {
        max_queue_messages: MESSAGES as u64,
        max_queue_bytes: u64::MAX / 2,
        max_memory_bytes: u64::MAX / 2,
        ..Limits::default()
    };
    let broker = Broker::new(limits.clone(), Arc::new(TokioClock::new()));
    // Join and leave: the member-less subscription keeps its queue, as in `bench fill`.
    drop(broker.open(&queue_request(), None).unwrap());
    // One envelope for the whole run, as a stream publishing to one topic shares it.
    let envelope = Envelope::new(Topic::parse("bench.fill").unwrap(), Headers::new());
    let accounted_before = broker.list().1.memory_accounted_bytes;
    let before = LIVE.load(Ordering::Relaxed);
    for _ in 0..MESSAGES {
        let draft = Draft::in_envelope(envelope.clone(), &PAYLOAD, &limits).unwrap();
        broker.publish(draft).unwrap();
    }
    let per_message = (LIVE.load(Ordering::Relaxed) - before) as f64 / MESSAGES as f64;
    let accounted =
        (broker.list().1.memory_accounted_bytes - accounted_before) as f64 / MESSAGES as f64;
    assert_eq!(
        broker.describe("fill").unwrap().queued_messages,
        MESSAGES as u64
    );
    println!("{per_message:.1} bytes per queued message, {accounted:.1} accounted");
    assert!(
        per_message <= 192.0,
        "{per_message:.1} bytes per queued 128-byte message"
    );
    assert!(
        accounted >= per_message,
        "the budget charges {accounted:.1} bytes per message but each holds {per_message:.1}"
    );
}
