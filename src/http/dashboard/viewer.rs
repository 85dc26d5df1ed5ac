//! Who looks at a dashboard page: the namespace every view shows and what the visitor may
//! do (read from a sign-in, or what a cluster node verified, by `auth`).

use crate::auth::Role;

/// The visitor of a dashboard page: the namespace shown, the role, and the token the
/// page's forms must carry. Without keys configured, a loopback visitor in `default` with
/// every operation; with keys, whoever signed in (otherwise the sign-in page answers).
#[derive(Debug, Clone)]
pub(in crate::http) struct Viewer {
    /// The namespace every view shows.
    pub(in crate::http) namespace: String,
    /// What the visitor may do beyond the namespace's data.
    pub(in crate::http) role: Role,
    /// The CSRF token of this visitor's forms.
    pub(in crate::http) csrf: String,
    /// Whether the visitor signed in with a key (and can sign out).
    pub(in crate::http) signed_in: bool,
    /// The hex SHA-256 of the key the visitor signed in with (empty without keys); read
    /// by cluster mode, which seals it into a forwarded page's caller.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(in crate::http) key: String,
}

impl Viewer {
    /// Whether the server-wide figures and operations are shown.
    pub(in crate::http) fn admin(&self) -> bool {
        self.role == Role::Admin
    }
}
