//! The orchestrator: from a Compose file to Service Containers on a Machine's Docker.
//!
//! - [`compose`] loads Compose files into Requested Service Specs (pure, no Docker);
//! - [`plan`] computes a Deploy Plan from a Deploy Intent and a Deploy Snapshot (pure);
//!
//! **Architecture Invariant:** loading and planning do no IO beyond reading the Compose files and
//! the files they name; everything Docker is behind the daemon's API.

pub mod docker;
pub mod execute;
pub mod observer;
pub mod plan;
pub mod preview;

pub mod compose;
