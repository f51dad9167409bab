//! Internal DNS.
