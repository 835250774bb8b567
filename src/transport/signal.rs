//! A one-shot signal shared by everything that must stop at one moment: the server fires one
//! when shutdown starts (streams the broker does not own end on it) and one when the drain ends
//! (every connection fails from then on).

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Fires once; can be checked without waiting, or awaited.
#[derive(Debug, Default)]
pub struct Signal {
    fired: AtomicBool,
    notify: Notify,
}

impl Signal {
    /// Fires the signal; every waiter, present or future, sees it.
    pub fn fire(&self) {
        self.fired.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Whether the signal fired.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// Completes once the signal fired (at once if it already has).
    pub async fn wait(self: std::sync::Arc<Self>) {
        // Registered before the flag is read: a `fire` between the two still wakes it.
        let notified = self.notify.notified();
        if self.fired() {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn waiters_before_and_after_the_fire_both_complete() {
        let signal = Arc::new(Signal::default());
        let within = |f| tokio::time::timeout(std::time::Duration::from_secs(5), f);
        let early = tokio::spawn(signal.clone().wait());
        tokio::task::yield_now().await;
        assert!(!signal.fired());
        signal.fire();
        within(early).await.expect("woken by fire").unwrap();
        assert!(signal.fired());
        within(tokio::spawn(signal.clone().wait()))
            .await
            .expect("complete after fire")
            .unwrap();
    }
}
