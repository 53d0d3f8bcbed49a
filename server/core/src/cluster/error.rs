//! Why a call to another member failed: no answer (it is likely gone; the caller marks
//! it down and goes to the next owner), or an answer that says no, with the S3 code the
//! member gave, so that a client hears what the member said.

use granary_proto::S3Code;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
    /// The member could not be reached, or the connection broke before an answer.
    #[error("node {node} did not answer: {why}")]
    Unreachable { node: String, why: String },
    /// The member did not answer in time (a hung process still accepts connections).
    #[error("node {node} did not answer in time")]
    Timeout { node: String },
    /// The member refused the call: its status, and the S3 code and message of its
    /// error document (`code` is `None` when the answer had none).
    #[error("node {node} refused {what} ({status}): {message}")]
    Refused {
        node: String,
        what: &'static str,
        status: u16,
        code: Option<S3Code>,
        message: String,
    },
    /// The member answered with something that is not the call's reply.
    #[error("node {node} answered {what} with what it cannot be: {why}")]
    Garbled {
        node: String,
        what: &'static str,
        why: String,
    },
}

impl ClusterError {
    /// Whether the same call may succeed later: a member that was down comes back, a
    /// busy one has room again; one that refused the request as it stands does not.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClusterError::Refused { status, .. } => *status >= 500,
            _ => true,
        }
    }
}
