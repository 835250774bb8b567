//! Every [`Error`] becomes a gRPC status here, and only here: its [`ErrorKind`] picks the
//! code, its words (capped) the message. The service's other statuses (a request stream that
//! broke, a batch refused part way) are built here too.

use tonic::{Code, Status};

use crate::core::{Error, ErrorKind};

/// The longest status message a client gets, in bytes: messages quote client input (ids,
/// topics), and an unbounded one would make a `grpc-message` header larger than any client
/// accepts, hiding the real error behind a transport one.
pub const MAX_STATUS_MESSAGE_BYTES: usize = 1024;

/// Cuts `message` to [`MAX_STATUS_MESSAGE_BYTES`] at a character boundary, marking the cut.
pub fn cap_message(mut message: String) -> String {
    if message.len() > MAX_STATUS_MESSAGE_BYTES {
        const MARK: &str = "…";
        let mut end = MAX_STATUS_MESSAGE_BYTES - MARK.len();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(MARK);
    }
    message
}

/// Maps a broker error to the gRPC status a client gets.
pub fn status(error: &Error) -> Status {
    Status::new(code(error), cap_message(error.to_string()))
}

/// The gRPC code of a broker error, without formatting its message.
pub fn code(error: &Error) -> Code {
    code_of(error.kind())
}

/// The gRPC code of a kind of refusal.
fn code_of(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::Unknown => Code::Unknown,
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::Unimplemented => Code::Unimplemented,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::Unavailable => Code::Unavailable,
    }
}

/// A batch message's refusal before anything was published: `index` (from 0) names it.
pub(super) fn in_batch(index: usize, error: &Error) -> Status {
    Status::new(
        code(error),
        format!(
            "message {} of the batch: {}",
            index + 1,
            cap_message(error.to_string())
        ),
    )
}

/// A batch refused part way: `done` of `total` messages were published, the next was refused
/// with `error`. The count travels in the `tinybroker-published-count` metadata too.
pub(super) fn batch_refused(done: usize, total: usize, error: &Error) -> Status {
    let mut status = Status::new(
        code(error),
        format!(
            "published {done} of {total} messages; message {} was refused: {}",
            done + 1,
            cap_message(error.to_string())
        ),
    );
    if let Ok(value) = done.to_string().parse() {
        status
            .metadata_mut()
            .insert("tinybroker-published-count", value);
    }
    status
}

/// A `Consume` stream whose client closed its side: it can settle nothing more, so the member
/// left (an `OK` status, with why).
pub(super) fn closed_by_client() -> Status {
    Status::new(
        Code::Ok,
        "the client closed its side of the stream, so it can settle nothing more: the member left and its unacked messages went back to the queue",
    )
}

/// A request stream's error as the stream's final status. Tonic's decoder refuses a request
/// over `max_request_bytes` with `OUT_OF_RANGE`; docs/semantics.md#limits-table (and gRPC convention for size limits)
/// says `RESOURCE_EXHAUSTED`. A unary call's status is rewritten in its response headers
/// (`server::oversize`); a stream's travels in its trailers, so it is mapped here.
pub(super) fn oversize_as_resource_exhausted(status: Status) -> Status {
    if status.code() == Code::OutOfRange {
        Status::resource_exhausted(format!(
            "request is larger than the max_request_bytes limit (messages are limited to max_message_bytes): {}",
            status.message()
        ))
    } else {
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_status_messages_are_cut_at_a_char_boundary() {
        let long = "é".repeat(2000);
        let cut = cap_message(long);
        assert!(cut.len() <= MAX_STATUS_MESSAGE_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(cap_message("short".into()), "short");
        let status = status(&Error::SubscriptionNotFound("x".repeat(1_000_000)));
        assert!(status.message().len() <= MAX_STATUS_MESSAGE_BYTES);
    }
}
