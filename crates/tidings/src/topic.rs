//! Topics by name, typed or raw, and the messages subscribers get.

use std::marker::PhantomData;

use bytes::{Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tidings_proto::{NodeId, TopicId};

use crate::error::{Error, PublishError};

/// Longest topic name, in bytes.
pub const TOPIC_NAME_BYTES_MAX: usize = tidings_gms::message::TOPIC_NAME_BYTES_MAX;

/// Encodes a value into the publisher's arena and splits it off.
type Encode<T> = fn(&T, &mut BytesMut) -> Result<Bytes, String>;

/// Bytes a publisher's encoding arena asks for when it runs out: a block shared by the
/// messages encoded into it, given back to the arena once they are all stable (dropped), so
/// typed publishing allocates about once per block, not once per message.
const ENCODE_BLOCK_BYTES: usize = 64 * 1024;
type Decode<T> = fn(Bytes) -> Result<T, String>;

/// A topic: a name every process agrees on, and the type of its messages. Creating one touches
/// no network; [`Node::publisher`](crate::Node::publisher) and
/// [`Node::subscribe`](crate::Node::subscribe) bind it through the membership service.
///
/// `Topic::<T>::new` carries `T: Serialize + DeserializeOwned` values, encoded with postcard
/// (compact, not self-describing: every process must use the same `T` for a name);
/// [`Topic::raw`] carries bytes as they are, without a copy.
pub struct Topic<T> {
    name: String,
    encode: Encode<T>,
    decode: Decode<T>,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for Topic<T> {
    fn clone(&self) -> Self {
        Topic {
            name: self.name.clone(),
            encode: self.encode,
            decode: self.decode,
            _type: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for Topic<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topic").field("name", &self.name).finish()
    }
}

fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > TOPIC_NAME_BYTES_MAX {
        return Err(Error::TopicName(name.to_owned()));
    }
    Ok(())
}

fn postcard_encode<T: Serialize>(value: &T, arena: &mut BytesMut) -> Result<Bytes, String> {
    debug_assert!(arena.is_empty());
    if arena.capacity() < ENCODE_BLOCK_BYTES / 16 {
        // Reclaims the block in place if every message encoded into it is gone, else takes a
        // new one (a larger value still grows it as it is written).
        arena.reserve(ENCODE_BLOCK_BYTES);
    }
    let mut written = postcard::to_extend(value, std::mem::take(arena));
    let encoded = match &mut written {
        Ok(block) => Ok(block.split().freeze()),
        Err(e) => Err(e.to_string()),
    };
    // The block goes back to the arena either way (a failed encoding leaves no bytes in it).
    *arena = written.unwrap_or_default();
    arena.clear();
    encoded
}

fn postcard_decode<T: DeserializeOwned>(bytes: Bytes) -> Result<T, String> {
    postcard::from_bytes(&bytes).map_err(|e| e.to_string())
}

impl<T: Serialize + DeserializeOwned> Topic<T> {
    /// A typed topic. Fails if the name is empty or longer than [`TOPIC_NAME_BYTES_MAX`].
    pub fn new(name: impl Into<String>) -> Result<Topic<T>, Error> {
        let name = name.into();
        check_name(&name)?;
        Ok(Topic {
            name,
            encode: postcard_encode::<T>,
            decode: postcard_decode::<T>,
            _type: PhantomData,
        })
    }
}

impl Topic<Bytes> {
    /// A topic of raw bytes: payloads are published and delivered as they are (a delivery
    /// shares the received datagram, nothing is copied).
    pub fn raw(name: impl Into<String>) -> Result<Topic<Bytes>, Error> {
        let name = name.into();
        check_name(&name)?;
        Ok(Topic {
            name,
            encode: |b: &Bytes, _| Ok(b.clone()),
            decode: Ok,
            _type: PhantomData,
        })
    }
}

impl<T> Topic<T> {
    /// The topic's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn encode(&self, value: &T, arena: &mut BytesMut) -> Result<Bytes, PublishError> {
        (self.encode)(value, arena).map_err(PublishError::Encode)
    }

    pub(crate) fn decoder(&self) -> Decode<T> {
        self.decode
    }
}

/// One delivered message.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Message<T> {
    /// The value.
    pub value: T,
    /// The node that published it.
    pub origin: NodeId,
    /// The topic's id (bound to its name by the membership service).
    pub topic: TopicId,
    /// When it was published, in microseconds since the Unix epoch by the publisher's clock
    /// (its wall clock read once when its process started, advanced monotonically): `now`
    /// minus it is the delivery latency, exact within a host and off by the hosts' clock
    /// difference between hosts.
    pub sent_at_us: u64,
}
