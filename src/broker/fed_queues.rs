//! The queues the relay fed, each with when it last was: noted by
//! [`super::redis_sink::RedisSink`] after each acknowledged push (one lock per push), read by
//! the daemon's watch of the Redis side (`super::redis_side`), which looks at the most
//! recently fed [`MAX_QUEUES`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most this many queues are watched (the most recently fed), so that the metrics labelled
/// by queue stay bounded (docs/metrics.md#the-redis-side).
pub const MAX_QUEUES: usize = 100;

/// Queues remembered at most: beyond, the least recently fed is forgotten.
const REMEMBERED: usize = 10 * MAX_QUEUES;

/// The queues the relay's sinks fed, each with when it last was.
#[derive(Debug, Default)]
pub struct FedQueues {
    /// Per queue: when it was last fed, and the number of the call that noted it (calls
    /// within one clock tick still come in order).
    last: Mutex<(u64, HashMap<String, Noted>)>,
}

/// When a queue was last fed, and the number of the call that noted it.
type Noted = (Instant, u64);

impl FedQueues {
    /// Notes that `queues` (in any order, repeats allowed) were fed now. One lock per call.
    pub fn note<'a>(&self, queues: impl IntoIterator<Item = &'a str>) {
        let mut distinct: Vec<&str> = Vec::new();
        for q in queues {
            if distinct.last() != Some(&q) && !distinct.contains(&q) {
                distinct.push(q);
            }
        }
        if distinct.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut guard = self.last.lock().expect("not poisoned");
        let (calls, last) = &mut *guard;
        *calls += 1;
        for q in distinct {
            match last.get_mut(q) {
                Some(at) => *at = (now, *calls),
                None => {
                    last.insert(q.to_owned(), (now, *calls));
                }
            }
        }
        if last.len() > REMEMBERED {
            let mut by_age: Vec<(u64, String)> =
                last.iter().map(|(q, at)| (at.1, q.clone())).collect();
            by_age.sort();
            for (_, q) in &by_age[..last.len() - REMEMBERED] {
                last.remove(q);
            }
        }
    }

    /// The queues fed within `window`, the most recently fed first, at most [`MAX_QUEUES`];
    /// forgets the others.
    pub fn recent(&self, window: Duration) -> Vec<String> {
        let mut guard = self.last.lock().expect("not poisoned");
        let last = &mut guard.1;
        last.retain(|_, at| at.0.elapsed() <= window);
        let mut all: Vec<(u64, &String)> = last.iter().map(|(q, at)| (at.1, q)).collect();
        all.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        all.into_iter()
            .take(MAX_QUEUES)
            .map(|(_, q)| q.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_recently_fed_queues_come_first_each_once() {
        let fed = FedQueues::default();
        fed.note(["a", "a", "b", "a"]);
        fed.note(["c"]);
        let recent = fed.recent(Duration::from_secs(60));
        assert_eq!(recent, ["c", "a", "b"]);
        assert!(fed.recent(Duration::ZERO).is_empty(), "outside the window");
        assert!(fed.recent(Duration::from_secs(60)).is_empty(), "forgotten");
    }

    #[test]
    fn at_most_max_queues_are_watched_and_a_bounded_number_remembered() {
        let fed = FedQueues::default();
        let names: Vec<String> = (0..REMEMBERED + 50).map(|i| format!("q{i}")).collect();
        for n in &names {
            fed.note([n.as_str()]);
        }
        assert_eq!(fed.last.lock().unwrap().1.len(), REMEMBERED);
        assert_eq!(fed.recent(Duration::from_secs(60)).len(), MAX_QUEUES);
    }
}
