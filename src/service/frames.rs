//! A member's frames as protobuf: [`frame`] for one, [`FrameStream`] for a member's stream
//! (written as [`WireFrame`]s, which encode the same).

use std::{
    collections::HashMap,
    pin::Pin,
    task::{Context, Poll},
};

use tonic::Status;

use super::{convert::timestamp, status, wire::WireFrame};
use crate::{
    broker::{MemberStream, Outbound},
    pb,
};

/// Turns a domain frame into its protobuf form; an `End` becomes the stream's final status.
/// The streams write frames as [`WireFrame`]s, which encode the same.
pub fn frame(outbound: Outbound) -> Result<pb::SubscriptionFrame, Status> {
    use pb::subscription_frame::Frame;
    let frame = match outbound {
        Outbound::Confirm {
            subscription_id,
            member_id,
            epoch,
        } => Frame::Confirmation(pb::Confirmation {
            subscription_id: subscription_id.to_string(),
            member_id,
            epoch,
        }),
        Outbound::Standby {
            subscription_id,
            member_id,
            position,
            stepped_down_epoch,
        } => Frame::Standby(pb::StandbyNotice {
            subscription_id: subscription_id.to_string(),
            member_id,
            position,
            stepped_down_epoch,
        }),
        Outbound::Message {
            message,
            attempt,
            epoch,
            shared: _,
        } => Frame::Message(pb::DeliveredMessage {
            system_id: message.system_id(),
            topic: message.topic().to_string(),
            payload: message.payload_bytes(),
            headers: message
                .headers()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<HashMap<_, _>>(),
            delivery_attempt: attempt,
            published_at: Some(timestamp(message.published_at_ms())),
            epoch,
        }),
        Outbound::End(error) => return Err(status(&error)),
    };
    Ok(pb::SubscriptionFrame { frame: Some(frame) })
}

/// A member's stream as protobuf frames.
#[derive(Debug)]
pub struct FrameStream(pub(super) MemberStream);

impl futures_core::Stream for FrameStream {
    type Item = Result<WireFrame, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.0)
            .poll_next(cx)
            .map(|o| o.map(WireFrame::of))
    }
}
