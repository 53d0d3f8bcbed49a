//! Routing a dataset's reads to the member that owns each shard, and the per-member
//! clients that carry them.
//!
//! A [`Router`] holds the cluster's ring as the given node reported it, so a reader asks
//! each shard's owner itself (no proxy hop on the node), then the next members in the
//! ring's order when the owner cannot be reached, and the given node last. `Clients`
//! keeps one connection per member for one reading thread; `on_best` walks a key's
//! candidates with them. The catalog (listing shards) and the planned reader (reading
//! runs) both go through here.

use std::collections::HashMap;
use std::time::Duration;

use granary_proto::ring::{key_hash, Ring, RingNode};

use crate::{Client, ClusterView, Credentials, Error, MemberState, Result};

/// Where reads go: each shard to its owner, or everything to one node.
#[derive(Debug, Clone)]
pub struct Router {
    /// Members' URLs, sorted by id (the ring's order), and whether each is up.
    members: Vec<(String, bool)>,
    ring: Option<Ring>,
    /// The node the dataset was given, last resort and sole target without a ring.
    endpoint: String,
}

impl Router {
    /// Every read to `endpoint`.
    pub fn single(endpoint: &str) -> Router {
        Router {
            members: Vec::new(),
            ring: None,
            endpoint: endpoint.to_owned(),
        }
    }

    /// Reads routed by the cluster's ring as `view` shows it (a view without members'
    /// URLs routes everything to `endpoint`).
    pub fn from_view(endpoint: &str, view: &ClusterView) -> Router {
        let mut members: Vec<_> = view.members.iter().collect();
        members.sort_by(|a, b| a.id.cmp(&b.id));
        members.dedup_by(|a, b| a.id == b.id);
        if members.len() < 2 || members.iter().any(|m| m.url.is_empty()) {
            return Router::single(endpoint);
        }
        let ring = Ring::new(members.iter().map(|m| RingNode {
            id: m.id.clone(),
            weight: m.weight,
        }));
        Router {
            members: members
                .iter()
                .map(|m| (m.url.clone(), m.state == MemberState::Up))
                .collect(),
            ring: Some(ring),
            endpoint: endpoint.to_owned(),
        }
    }

    /// Reads routed by the cluster `client`'s node belongs to, as it reports it now. A
    /// node on this machine (`unix:`) and a node that gives no view are read through
    /// alone.
    pub fn discover(client: &mut Client) -> Result<Router> {
        let endpoint = client.endpoint().to_owned();
        if endpoint.starts_with("unix:") {
            return Ok(Router::single(&endpoint));
        }
        match client.cluster() {
            Ok(view) => Ok(Router::from_view(&endpoint, &view)),
            // Credentials refused here are refused for the data too: say so now.
            Err(e) if matches!(e.status(), Some(401 | 403)) => Err(e),
            Err(_) => Ok(Router::single(&endpoint)),
        }
    }

    /// The node the dataset was given.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Where to read `key` from, best first: its owner, then the other members up in the
    /// ring's order, then the given node.
    pub fn candidates(&self, bucket: &str, key: &str) -> Vec<String> {
        let Some(ring) = &self.ring else {
            return vec![self.endpoint.clone()];
        };
        let mut out: Vec<String> = ring
            .ranked(key_hash(bucket, key))
            .into_iter()
            .filter(|&i| self.members[i].1)
            .map(|i| self.members[i].0.clone())
            .collect();
        if !out.contains(&self.endpoint) {
            out.push(self.endpoint.clone());
        }
        out
    }
}

/// Clients by endpoint, one connection each, kept by one reading thread.
pub(crate) struct Clients {
    router: Router,
    credentials: Option<Credentials>,
    timeout: Duration,
    open: HashMap<String, Client>,
}

impl Clients {
    pub(crate) fn new(
        router: Router,
        credentials: Option<Credentials>,
        timeout: Duration,
    ) -> Clients {
        Clients {
            router,
            credentials,
            timeout,
            open: HashMap::new(),
        }
    }

    fn get(&mut self, endpoint: &str) -> Result<&mut Client> {
        if !self.open.contains_key(endpoint) {
            let c = Client::new(endpoint)?
                .with_credentials_opt(self.credentials.clone())
                .with_timeout(self.timeout);
            self.open.insert(endpoint.to_owned(), c);
        }
        Ok(self.open.get_mut(endpoint).expect("just inserted"))
    }
}

/// Calls `f` with a client of `key`'s best member, then of the next ones while the
/// failure is one another member may not have.
pub(crate) fn on_best<T>(
    clients: &mut Clients,
    bucket: &str,
    key: &str,
    mut f: impl FnMut(&mut Client) -> Result<T>,
) -> Result<T> {
    let mut last_err = None;
    for endpoint in clients.router.candidates(bucket, key) {
        match clients.get(&endpoint).and_then(&mut f) {
            // Another member may succeed where this one failed or was busy.
            Err(e) if e.is_retryable() => last_err = Some(e),
            other => return other,
        }
    }
    Err(last_err.unwrap_or_else(|| Error::Invalid("no member to read from".into())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeServer, Reply};
    use crate::Member;

    fn view(states: &[(&str, MemberState)]) -> ClusterView {
        ClusterView {
            node_id: "a".into(),
            members: states
                .iter()
                .map(|(id, state)| Member {
                    id: (*id).into(),
                    url: format!("http://{id}:7070"),
                    state: *state,
                    weight: 100.0,
                    handover: None,
                })
                .collect(),
            owner: None,
        }
    }

    #[test]
    fn reads_go_to_the_owner_then_the_ring_order_then_the_given_node() {
        use MemberState::{Down, Up};
        let all_up = Router::from_view("http://a:7070", &view(&[("a", Up), ("b", Up), ("c", Up)]));
        let ring = Ring::uniform(["a", "b", "c"]);
        for i in 0..50 {
            let key = format!("d/shard-{i}.tar");
            let want: Vec<String> = ring
                .ranked(key_hash("bk", &key))
                .into_iter()
                .map(|n| format!("http://{}:7070", ring.nodes()[n].id))
                .collect();
            assert_eq!(all_up.candidates("bk", &key), want);
        }
        // A member seen down is not asked; the given node comes last whatever happens.
        let b_down =
            Router::from_view("http://a:7070", &view(&[("a", Up), ("b", Down), ("c", Up)]));
        for i in 0..50 {
            let got = b_down.candidates("bk", &format!("k{i}"));
            assert!(!got.contains(&"http://b:7070".to_owned()));
            assert_eq!(got.len(), 2);
        }
        // Without members' URLs (an unsigned view): everything through the given node.
        let mut v = view(&[("a", Up), ("b", Up)]);
        v.members[1].url.clear();
        let single = Router::from_view("http://a:7070", &v);
        assert_eq!(
            single.candidates("bk", "k"),
            vec!["http://a:7070".to_owned()]
        );
    }

    #[test]
    fn a_node_without_a_view_is_read_through_alone_and_a_refusal_is_an_error() {
        let none = "<Error><Code>NoSuchKey</Code><Message>no</Message></Error>";
        let denied = "<Error><Code>AccessDenied</Code><Message>no</Message></Error>";
        let server = FakeServer::start(vec![
            Reply::status(404, none.as_bytes().to_vec()),
            Reply::status(403, denied.as_bytes().to_vec()),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let alone = Router::discover(&mut c).unwrap();
        assert_eq!(alone.candidates("bk", "any.tar"), vec![server.endpoint()]);
        let err = Router::discover(&mut c).unwrap_err();
        assert_eq!(err.status(), Some(403));
        assert_eq!(err.code(), Some("AccessDenied"));
        let reqs = server.finish();
        assert_eq!(reqs.len(), 2);
        assert!(reqs.iter().all(|r| r.target == "/_granary/cluster"));
    }
}
