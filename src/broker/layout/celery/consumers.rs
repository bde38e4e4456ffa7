//! The consumers of the celery layout's queues (docs/redis-side.md): NOT YET WRITTEN.

use super::super::consumers::{Consumers, Reading, Seen};
use super::super::peek::Decoded;
use super::Celery;
use crate::broker::connection::RedisConnection;

impl Consumers for Celery {
    fn seen<'a>(&'a self, _con: &'a mut RedisConnection, _namespace: &'a str) -> Reading<'a, Seen> {
        Box::pin(async { Ok(Seen::Unrecorded("not yet written")) })
    }

    fn enqueued_at(&self, _job: &Decoded) -> Option<f64> {
        None
    }
}
