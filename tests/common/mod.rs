//! What the test modules share, so that none imports from another: [`serve`] is the one
//! way a test starts a server, [`http`] speaks to it over sockets, [`site`] and [`browser`]
//! reach its dashboard, [`python`] runs the Python clients, and [`config`] writes what
//! config files hold.

pub(crate) mod browser;
pub(crate) mod config;
pub(crate) mod http;
pub(crate) mod python;
pub(crate) mod serve;
pub(crate) mod site;
