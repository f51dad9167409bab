//! Certificates by ACME.
