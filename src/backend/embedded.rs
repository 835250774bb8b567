//! The embedded broker's `PublishStream`: what the client has sent so far (at most
//! [`READ_AHEAD`] requests, about [`READ_AHEAD_BYTES`]) is published together with
//! [`Broker::publish_each`] (a run to one topic is routed and locked once), then answered,
//! before more is read: the order holds and HTTP/2 flow control still paces a publisher that
//! does not read its answers.

use std::{collections::VecDeque, task::Poll};

use crate::{
    broker::{Broker, Published},
    core::{Draft, Error},
};

/// Most `PublishStream` requests read ahead of their answers and published together (one
/// routing and one round of locks for a run to one topic: [`Broker::publish_each`]).
pub const READ_AHEAD: usize = crate::broker::RUN_LIMIT;

/// Read-ahead stops once the requests read hold this many payload and envelope bytes (a single
/// larger message is still read, alone).
pub const READ_AHEAD_BYTES: usize = 64 * 1024;

/// The publishes of one embedded `PublishStream` (see the module doc).
pub struct Run {
    broker: Broker,
    /// Requests taken and validated, not yet published.
    run: Vec<Draft>,
    /// The broker's results for `run`, in order (kept to reuse its buffer).
    results: Vec<Result<Published, Error>>,
    /// Answers to give, in request order.
    answers: VecDeque<Result<Published, Error>>,
    /// Requests and bytes taken since the last answers were asked for.
    taken: usize,
    taken_bytes: usize,
    /// The broker refused with [`Error::ShuttingDown`]: that is the last answer.
    shut: bool,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("waiting", &(self.run.len() + self.answers.len()))
            .finish_non_exhaustive()
    }
}

impl Run {
    /// Nothing taken yet.
    pub fn new(broker: Broker) -> Self {
        Self {
            broker,
            run: Vec::new(),
            results: Vec::new(),
            answers: VecDeque::new(),
            taken: 0,
            taken_bytes: 0,
            shut: false,
        }
    }

    /// `Ready` until this round took [`READ_AHEAD`] requests or [`READ_AHEAD_BYTES`], while
    /// no answer waits; `Pending` means "take the answers" (they are ready).
    pub(super) fn poll_ready(&self) -> Poll<()> {
        if self.shut
            || !self.answers.is_empty()
            || self.taken >= READ_AHEAD
            || self.taken_bytes >= READ_AHEAD_BYTES
        {
            return Poll::Pending;
        }
        Poll::Ready(())
    }

    /// Takes the next request; a refusal is answered after what was taken before it, so
    /// those are published first.
    pub(super) fn push(&mut self, request: Result<Draft, Error>) {
        self.taken += 1;
        match request {
            Ok(draft) => {
                self.taken_bytes += draft.size();
                self.run.push(draft);
            }
            Err(error) => {
                self.publish_run();
                if !self.shut {
                    self.answers.push_back(Err(error));
                }
            }
        }
    }

    /// Publishes what was taken, then gives the next answer; a new round of taking starts.
    pub(super) fn next_answer(&mut self) -> Option<Result<Published, Error>> {
        self.publish_run();
        self.taken = 0;
        self.taken_bytes = 0;
        self.answers.pop_front()
    }

    /// Publishes `run` and turns the results into answers; shutdown ends them at the first
    /// `ShuttingDown` (what came after it was refused with it too, unanswered).
    fn publish_run(&mut self) {
        if self.run.is_empty() {
            return;
        }
        self.broker
            .publish_each(self.run.drain(..), &mut self.results);
        for result in self.results.drain(..) {
            if self.shut {
                continue;
            }
            self.shut = matches!(result, Err(Error::ShuttingDown));
            self.answers.push_back(result);
        }
    }
}
