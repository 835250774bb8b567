//! The client's one error type: every gRPC refusal as a variant callers can match.

use std::sync::Arc;

use tonic::{Code, Status};

/// A result with the client's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a client call failed. Each variant keeps the broker's message, which names the problem
/// (the limit hit, the field that differs, the member that holds the message).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request was malformed: bad topic or pattern, missing field, bad URL or token.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No such subscription, or the message is not in flight (already acked, or back in the
    /// queue waiting for redelivery).
    #[error("not found: {0}")]
    NotFound(String),
    /// A live broadcast subscription already has this id.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// Refused in the current state: a stale ack or nack (another member holds the message
    /// now), or a join whose settings differ from the live subscription's.
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// Refused by a limit: a full queue, a message over the size limit, too many subscriptions
    /// or members. The message names the limit.
    #[error("refused by a limit: {0}")]
    ResourceExhausted(String),
    /// The broker wants a (different) bearer token.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The broker is gone, unreachable or shutting down, or the stream ended.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The connection could not be made or broke.
    #[error("transport: {}", chain(.0.as_ref()))]
    Transport(#[source] Arc<tonic::transport::Error>),
    /// Any other gRPC status.
    #[error("{code:?}: {message}")]
    Other {
        /// The gRPC status code.
        code: Code,
        /// The broker's message.
        message: String,
    },
}

/// An error and its causes, `: `-separated: tonic's transport error alone says only
/// "transport error"; the cause says "connection refused".
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    // Bounded: cause chains are short, but never trust one to end.
    for _ in 0..8 {
        let Some(cause) = source else { break };
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Error {
    /// The error for a gRPC status code and message carried in a frame (a refused settle, a
    /// refused streaming publish).
    pub fn from_code(code: i32, message: impl Into<String>) -> Self {
        Status::new(Code::from_i32(code), message.into()).into()
    }

    pub(crate) fn transport(error: tonic::transport::Error) -> Self {
        Error::Transport(Arc::new(error))
    }

    /// Whether retrying the same call later may succeed: the broker or the connection was
    /// unavailable, as opposed to a refusal that will repeat.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unavailable(_) | Error::Transport(_) => true,
            Error::Other { code, .. } => matches!(
                code,
                Code::Unknown | Code::Cancelled | Code::DeadlineExceeded | Code::Aborted
            ),
            _ => false,
        }
    }
}

impl From<Status> for Error {
    fn from(status: Status) -> Self {
        let message = status.message().to_string();
        match status.code() {
            Code::InvalidArgument => Error::InvalidArgument(message),
            Code::NotFound => Error::NotFound(message),
            Code::AlreadyExists => Error::AlreadyExists(message),
            Code::FailedPrecondition => Error::FailedPrecondition(message),
            // tonic's own decode limit answers OUT_OF_RANGE; to a caller it is the same limit.
            Code::ResourceExhausted | Code::OutOfRange => Error::ResourceExhausted(message),
            Code::Unauthenticated | Code::PermissionDenied => Error::Unauthenticated(message),
            Code::Unavailable => Error::Unavailable(message),
            code => Error::Other { code, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_variants_keeping_the_message() {
        let cases = [
            (Code::NotFound, "not found: m"),
            (Code::FailedPrecondition, "failed precondition: m"),
            (Code::ResourceExhausted, "refused by a limit: m"),
            (Code::OutOfRange, "refused by a limit: m"),
            (Code::Unavailable, "unavailable: m"),
            (Code::Internal, "Internal: m"),
        ];
        for (code, text) in cases {
            assert_eq!(Error::from(Status::new(code, "m")).to_string(), text);
        }
        assert!(matches!(
            Error::from_code(Code::FailedPrecondition as i32, "stale"),
            Error::FailedPrecondition(m) if m == "stale"
        ));
        assert!(Error::Unavailable(String::new()).is_transient());
        assert!(!Error::NotFound(String::new()).is_transient());
    }
}
