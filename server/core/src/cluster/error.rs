//! Why a request to another member failed: no answer (it is likely gone; the caller
//! marks it down and goes to the next owner), or an answer that says no.

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
    /// The member could not be reached, or the connection broke before an answer.
    #[error("node {node} did not answer: {why}")]
    Unreachable { node: String, why: String },
    /// The member did not answer in time (a hung process still accepts connections).
    #[error("node {node} did not answer in time")]
    Timeout { node: String },
    /// The member answered, but not with what was asked.
    #[error("node {node} answered {status}")]
    Answered { node: String, status: u16 },
}

impl ClusterError {
    /// Whether the member may answer a later request (all of these may: a member that
    /// was down comes back).
    pub fn is_retryable(&self) -> bool {
        true
    }
}
