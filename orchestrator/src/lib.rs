//! The orchestrator: from Requested Service Specs to Service Containers on a Machine's Docker.
//!
//! The Compose files are loaded into Requested Service Specs by `ployz-compose`; from there:
//!
//! - [`plan`] computes a Deploy Plan from a Deploy Intent and a Deploy Snapshot (pure);
//! - [`preview`] turns a Deploy Plan into the Deploy Preview shown before confirming;
//! - [`execute`] runs a Deploy Plan's operations one at a time through a `DeployTarget`;
//! - [`docker`] and [`observer`] are the Docker operations and the Docker observer.
//!
//! **Architecture Invariant:** planning does no IO; everything Docker is behind the daemon's API.

pub mod docker;
pub mod execute;
pub mod images;
pub mod observer;
pub mod plan;
pub mod preview;
