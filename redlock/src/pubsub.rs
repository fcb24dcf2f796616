//! The subscription connections the hand-off waiters use, behind one small seam: real Redis
//! pub/sub in production, and the simulated nodes' pub/sub under the `simulation` feature.

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};

use crate::error::SubError;

/// Opens subscription connections to one node (one per node and client, built once: the size
/// difference of the variants does not matter).
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum SubClient {
    Redis(redis::Client),
    #[cfg(feature = "simulation")]
    Sim(crate::sim::SubClient),
}

/// The command half of a subscription connection (cheap to clone).
#[derive(Clone)]
pub(crate) enum SubSink {
    Redis(PubSubSink),
    #[cfg(feature = "simulation")]
    Sim(crate::sim::SubSink),
}

/// The message half of a subscription connection: ends when the connection breaks.
pub(crate) enum SubStream {
    Redis(PubSubStream),
    #[cfg(feature = "simulation")]
    Sim(crate::sim::SubStream),
}

/// A published message.
pub(crate) enum Message {
    Redis(redis::Msg),
    /// Channel and payload.
    #[cfg(feature = "simulation")]
    Sim(String, String),
}

impl Message {
    /// The channel it was published on.
    pub(crate) fn channel(&self) -> &str {
        match self {
            Self::Redis(m) => m.get_channel_name(),
            #[cfg(feature = "simulation")]
            Self::Sim(c, _) => c,
        }
    }

    /// What was published.
    pub(crate) fn payload(&self) -> &[u8] {
        match self {
            Self::Redis(m) => m.get_payload_bytes(),
            #[cfg(feature = "simulation")]
            Self::Sim(_, p) => p.as_bytes(),
        }
    }
}

impl SubClient {
    /// Opens a subscription connection (unbounded: the caller bounds it).
    pub(crate) async fn open(&self) -> Result<(SubSink, SubStream), SubError> {
        match self {
            Self::Redis(client) => {
                let pubsub = client
                    .get_async_pubsub()
                    .await
                    .map_err(|_| SubError::Broken)?;
                let (sink, stream) = pubsub.split();
                Ok((SubSink::Redis(sink), SubStream::Redis(stream)))
            }
            #[cfg(feature = "simulation")]
            Self::Sim(client) => {
                let (sink, stream) = client.open().await?;
                Ok((SubSink::Sim(sink), SubStream::Sim(stream)))
            }
        }
    }
}

/// A refusal for lack of permission leaves the connection usable; anything else breaks it.
fn sub_error(e: redis::RedisError) -> SubError {
    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
        SubError::Refused
    } else {
        SubError::Broken
    }
}

impl SubSink {
    pub(crate) async fn subscribe(&mut self, channels: &[String]) -> Result<(), SubError> {
        match self {
            Self::Redis(s) => s.subscribe(channels).await.map_err(sub_error),
            #[cfg(feature = "simulation")]
            Self::Sim(s) => s.subscribe(channels).await,
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channels: &[String]) -> Result<(), SubError> {
        match self {
            Self::Redis(s) => s.unsubscribe(channels).await.map_err(sub_error),
            #[cfg(feature = "simulation")]
            Self::Sim(s) => s.unsubscribe(channels).await,
        }
    }

    pub(crate) async fn ping(&mut self) -> Result<(), SubError> {
        match self {
            Self::Redis(s) => s.ping::<redis::Value>().await.map(drop).map_err(sub_error),
            #[cfg(feature = "simulation")]
            Self::Sim(s) => s.ping().await,
        }
    }
}

impl SubStream {
    /// The next message; `None` once the connection broke.
    pub(crate) async fn next(&mut self) -> Option<Message> {
        match self {
            Self::Redis(s) => s.next().await.map(Message::Redis),
            #[cfg(feature = "simulation")]
            Self::Sim(s) => s.next().await.map(|(c, p)| Message::Sim(c, p)),
        }
    }
}
