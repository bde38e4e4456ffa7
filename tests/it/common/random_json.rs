//! Random JSON text, for the tests that hold what the relay makes of a payload to what a
//! runner makes of it (celery's argsrepr and kwargsrepr, RQ's description and data): arrays
//! and objects nested up to 6 deep with keys repeated now and then, white space, strings of
//! escaped and plain pieces, numbers of every form. Which numbers and pieces is each test's.

use rand::Rng;

/// A generator of random JSON text.
pub struct RandomJson {
    /// The number literals, as text (besides random integers).
    pub numbers: &'static [&'static str],
    /// What strings are made of, as JSON text (escapes included).
    pub pieces: &'static [&'static str],
    pub space: Space,
}

/// Where a container's items get white space (`" \n"`), one time in four; the two ways draw it
/// from the random numbers differently (so that each test's seed keeps its cases).
#[derive(Clone, Copy)]
pub enum Space {
    /// Before and after each item (a `next_u32` each).
    AroundItems,
    /// Before each item (a `random_range`).
    BeforeItems,
}

impl RandomJson {
    /// A random JSON array (`open` `[`) or object (`{`) of about `size` characters.
    pub fn container(&self, rng: &mut impl Rng, open: u8, depth: usize, size: usize) -> String {
        let n = match rng.random_range(0..10) {
            0 => 0,
            1 => size / 3 + 1,
            _ => rng.random_range(1..6),
        };
        let ws = |rng: &mut dyn rand::RngCore| if rng.next_u32() % 4 == 0 { " \n" } else { "" };
        let mut s = String::new();
        s.push(open as char);
        let mut keys: Vec<String> = Vec::new();
        for i in 0..n {
            if i > 0 {
                s.push_str(if rng.random_bool(0.5) { ", " } else { "," });
            }
            match self.space {
                Space::AroundItems => s.push_str(ws(rng)),
                Space::BeforeItems => {
                    if rng.random_range(0..4) == 0 {
                        s.push_str(" \n");
                    }
                }
            }
            if open == b'{' {
                // Now and then a key given before.
                let key = match keys.len() {
                    k if k > 0 && rng.random_range(0..6) == 0 => {
                        keys[rng.random_range(0..k)].clone()
                    }
                    _ => self.string(rng, size / (n + 1)),
                };
                keys.push(key.clone());
                s.push_str(&key);
                s.push_str(if rng.random_bool(0.5) { ": " } else { ":" });
            }
            s.push_str(&self.value(rng, depth + 1, size / (n + 1)));
            if let Space::AroundItems = self.space {
                s.push_str(ws(rng));
            }
        }
        s.push(if open == b'[' { ']' } else { '}' });
        s
    }

    fn value(&self, rng: &mut impl Rng, depth: usize, size: usize) -> String {
        match rng.random_range(0..10) {
            0 if depth < 6 => self.container(rng, b'[', depth, size),
            1 if depth < 6 => self.container(rng, b'{', depth, size),
            2 => self.numbers[rng.random_range(0..self.numbers.len())].to_owned(),
            3 => rng.random_range(-1_000_000i64..1_000_000).to_string(),
            4 => ["true", "false", "null"][rng.random_range(0..3)].to_owned(),
            _ => self.string(rng, size),
        }
    }

    /// A JSON string of up to about `size` pieces.
    fn string(&self, rng: &mut impl Rng, size: usize) -> String {
        let len = rng.random_range(0..=size.max(1));
        let mut s = String::from("\"");
        for _ in 0..len {
            s.push_str(self.pieces[rng.random_range(0..self.pieces.len())]);
        }
        s.push('"');
        s
    }
}
