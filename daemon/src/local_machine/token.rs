//! Joining in two steps, for when one CLI cannot reach both hosts: a Machine of the Cluster makes
//! a Join Token (`ployz machine token`); the new Machine takes it (`ployz machine join TOKEN`),
//! keeps it in its data dir and prints its join request; a Machine of the Cluster admits that
//! request (`ployz machine join REQUEST`). The new Machine, which has the inviting Machine as its
//! only WireGuard peer meanwhile, fetches its grant from it over the mesh
//! ([`LocalMachine::grant_for_peer`] answers there) and joins.
//!
//! Neither text is a secret and neither grants anything: the authority is in running the two
//! commands, each against its own Machine's socket.

use std::net::SocketAddr;

use ployz_core::api::{AdmitRequest, JoinToken, PendingJoin, PendingJoinRequest, API_VERSION};
use ployz_core::{LocalMachinePhase, MachineName};

use super::{io, LocalMachine, MachineError};
use crate::fsutil::write_atomic;

fn refused(message: impl Into<String>, fix: impl Into<String>) -> MachineError {
    MachineError::Refused {
        message: message.into(),
        fix: fix.into(),
    }
}

/// What the data dir keeps of a taken Join Token.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct HeldToken {
    token: JoinToken,
    request: AdmitRequest,
}

impl LocalMachine {
    /// This Machine's Join Token: its Cluster, its Machine ID, key, subnet and endpoints (the
    /// ones given by hand first). Only a participating Machine hands them out, as only one
    /// admits.
    pub fn join_token(
        &self,
        own_endpoints: Vec<SocketAddr>,
        wireguard_port: u16,
    ) -> Result<JoinToken, MachineError> {
        let identity = self.identity().ok_or(MachineError::NotInitialised)?;
        if identity.phase != LocalMachinePhase::Participating {
            return Err(refused(
                format!(
                    "this Machine is {}; only a participating Machine invites",
                    identity.phase
                ),
                "make the token on a participating Machine (`ployz machine ls` shows each one's phase)",
            ));
        }
        let cluster = identity
            .cluster
            .clone()
            .ok_or(MachineError::NotInitialised)?;
        let store = self.store().ok_or(MachineError::NotInitialised)?;
        let mut endpoints = super::cluster::roster(&store)?
            .into_iter()
            .find(|m| m.id == identity.id)
            .map(|m| m.endpoints)
            .unwrap_or_default();
        for e in own_endpoints {
            if !endpoints.contains(&e) {
                endpoints.push(e);
            }
        }
        if endpoints.is_empty() {
            return Err(refused(
                format!(
                    "this Machine advertises no WireGuard endpoint (no usable address on its interfaces, port {wireguard_port})"
                ),
                "give it one with `ployz machine update --endpoint ADDR:PORT`, then make the token again",
            ));
        }
        Ok(JoinToken {
            cluster,
            machine: identity.id.clone(),
            name: identity.name.to_string(),
            public_key: identity.public_key.clone(),
            subnet: identity.subnet,
            endpoints,
            api: API_VERSION,
            version: env!("CARGO_PKG_VERSION").to_owned(),
        })
    }

    /// Takes a Join Token on this uninitialised Machine: checks it, keeps it (replacing one
    /// taken before) and answers the join request to admit. Nothing is kept when it is refused.
    pub fn take_join_token(
        &self,
        request: PendingJoinRequest,
        own_endpoints: Vec<SocketAddr>,
    ) -> Result<PendingJoin, MachineError> {
        let token = JoinToken::from_text(&request.token).map_err(|e| {
            refused(
                e.to_string(),
                "ask for a new one with `ployz machine token`",
            )
        })?;
        if let Some(identity) = self.identity() {
            let which = match &identity.cluster {
                Some(c) if *c == token.cluster => "this token's Cluster".to_owned(),
                Some(c) => format!("another Cluster ({c})"),
                None => "a Cluster".to_owned(),
            };
            return Err(refused(
                format!(
                    "this Machine is already initialised, as '{}' ({}), and in {which}",
                    identity.name, identity.id
                ),
                "remove it from its Cluster first (`ployz machine rm` run on another of its Machines), then join again",
            ));
        }
        if token.api != API_VERSION {
            return Err(refused(
                format!(
                    "the inviting Machine's daemon (release {}) speaks API version {}, this one (release {}) speaks {API_VERSION}",
                    token.version,
                    token.api,
                    env!("CARGO_PKG_VERSION")
                ),
                "install the same Ployz release on both Machines, then make a new token",
            ));
        }
        if token.endpoints.is_empty() {
            return Err(refused(
                "the Join Token names no endpoint of the inviting Machine",
                "give that Machine an endpoint (`ployz machine update --endpoint`) and make a new token",
            ));
        }
        if let Some(name) = &request.name {
            name.parse::<MachineName>()?;
        }
        let admit = AdmitRequest {
            request: self.join_request(own_endpoints)?,
            name: request.name.clone(),
            public_ip: request.public_ip,
            token_cluster: Some(token.cluster.clone()),
        };
        let held = HeldToken {
            token: token.clone(),
            request: admit.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&held).expect("the held token serialises");
        write_atomic(&self.dir.join_token_file(), &bytes, 0o600)
            .map_err(io("writing the Join Token"))?;
        tracing::info!(cluster = %token.cluster, inviting = %token.machine, "Join Token taken; waiting to be admitted");
        Ok(PendingJoin {
            token,
            request_text: admit.to_text(),
            request: admit,
            last_attempt: None,
        })
    }

    /// The Join Token this uninitialised Machine holds, with its join request.
    pub fn pending_join(&self) -> Option<PendingJoin> {
        if self.identity().is_some() {
            return None;
        }
        let bytes = std::fs::read(self.dir.join_token_file()).ok()?;
        let held: HeldToken = serde_json::from_slice(&bytes).ok()?;
        Some(PendingJoin {
            token: held.token,
            request_text: held.request.to_text(),
            request: held.request,
            last_attempt: None,
        })
    }
}
