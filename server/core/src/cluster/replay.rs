//! The nonces of members' signed requests that change something, kept for as long as
//! their signatures are good ([`granary_proto::peer::WINDOW`] either side of their time):
//! a second request with a nonce already seen is a replay. Entries whose signatures have
//! expired are pruned as the table grows, so it holds about a window's worth of those
//! requests.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::sync::Locked;
use granary_proto::peer::WINDOW;

#[derive(Default)]
pub struct Nonces {
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// `node nonce` → the signing time, in seconds.
    by_nonce: HashMap<String, u64>,
    /// The table's length after the last prune.
    kept: usize,
}

impl Nonces {
    /// Records `node`'s nonce signed at `secs`, now `now` (seconds); false when it was
    /// seen already.
    pub fn first_use(&self, node: &str, nonce: &str, secs: u64, now: u64) -> bool {
        let mut seen = self.seen.locked();
        if seen.by_nonce.len() >= 2 * seen.kept.max(1024) {
            let horizon = now.saturating_sub(WINDOW.as_secs());
            seen.by_nonce.retain(|_, at| *at >= horizon);
            seen.kept = seen.by_nonce.len();
        }
        seen.by_nonce
            .insert(format!("{node} {nonce}"), secs)
            .is_none()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.lock().unwrap().by_nonce.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_counts_once_and_expired_ones_are_let_go() {
        let n = Nonces::default();
        assert!(n.first_use("a", "x", 1000, 1000));
        assert!(!n.first_use("a", "x", 1000, 1001), "a replay");
        assert!(n.first_use("b", "x", 1000, 1001), "another member's nonce");
        for i in 0..5000 {
            assert!(n.first_use("a", &format!("n{i}"), 1000, 1000 + i / 10));
        }
        assert!(
            n.len() < 3000,
            "nonces whose signatures expired are pruned: {}",
            n.len()
        );
        assert!(
            !n.first_use("a", "n4999", 1499, 1500),
            "recent ones are kept"
        );
    }
}
