//! The Deploy executor's target: the Machines' management API, through the entry daemon, which
//! forwards each call to the operation's Machine over the mesh; every call carries that
//! Machine's lease token.

use ployz_core::api::{
    docker_paths as paths, HookResult, RunContainerRequest, RunHookRequest, StopContainerRequest,
};
use ployz_core::{
    ContainerRef, ContainerRuntimeObservation, MachineId, PreDeployHook, ServiceId, ServiceSpec,
    VolumeSpec,
};
use ployz_orchestrator::execute::DeployTarget;

use crate::client::ApiClient;
use crate::leases::Leases;

/// Executes operations on the Machines whose leases the command holds.
pub struct ApiTarget<'a> {
    pub client: &'a mut ApiClient,
    /// The leases; an operation for a Machine without one is refused.
    pub leases: &'a Leases,
    /// Registry credentials to pull with (`--with-registry-auth`), by registry.
    pub registry_auth: &'a [ployz_core::api::RegistryAuth],
    /// The Plan ID a bound Deploy (`--plan-id`) labels its containers with.
    pub plan_id: Option<String>,
}

impl ApiTarget<'_> {
    fn check(&mut self, machine: &MachineId) -> Result<(), String> {
        self.leases.aim(self.client, machine)
    }
}

fn sentence(e: anyhow::Error) -> String {
    format!("{e:#}")
}

impl DeployTarget for ApiTarget<'_> {
    async fn create_volume(
        &mut self,
        machine: &MachineId,
        volume: &VolumeSpec,
    ) -> Result<(), String> {
        self.check(machine)?;
        let _: serde_json::Value = self
            .client
            .post(paths::VOLUMES, volume)
            .await
            .map_err(sentence)?;
        Ok(())
    }

    async fn run_container(
        &mut self,
        machine: &MachineId,
        service_id: &ServiceId,
        spec: &ServiceSpec,
    ) -> Result<ContainerRuntimeObservation, String> {
        self.check(machine)?;
        self.client
            .post(
                paths::CONTAINERS,
                &RunContainerRequest {
                    service_id: service_id.clone(),
                    spec: spec.clone(),
                    plan_id: self.plan_id.clone(),
                    registry_auth: crate::registry_auth::for_image(
                        self.registry_auth,
                        &spec.container.image,
                    )
                    .cloned(),
                },
            )
            .await
            .map_err(sentence)
    }

    async fn observe_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<Option<ContainerRuntimeObservation>, String> {
        self.check(machine)?;
        match self
            .client
            .get(&paths::fill(paths::CONTAINER, container.id.as_str()))
            .await
        {
            Ok(c) => Ok(Some(c)),
            Err(e) => match e.downcast_ref::<ployz_core::api::ApiError>() {
                Some(api) if api.code == ployz_core::api::ErrorCode::NotFound => Ok(None),
                _ => Err(sentence(e)),
            },
        }
    }

    async fn start_container(
        &mut self,
        machine: &MachineId,
        c: &ContainerRef,
    ) -> Result<(), String> {
        self.check(machine)?;
        let _: serde_json::Value = self
            .client
            .post(&paths::fill(paths::CONTAINER_START, c.id.as_str()), &())
            .await
            .map_err(sentence)?;
        Ok(())
    }

    async fn stop_container(
        &mut self,
        machine: &MachineId,
        c: &ContainerRef,
    ) -> Result<(), String> {
        self.check(machine)?;
        let _: serde_json::Value = self
            .client
            .post(
                &paths::fill(paths::CONTAINER_STOP, c.id.as_str()),
                &StopContainerRequest::default(),
            )
            .await
            .map_err(sentence)?;
        Ok(())
    }

    async fn remove_container(
        &mut self,
        machine: &MachineId,
        c: &ContainerRef,
    ) -> Result<(), String> {
        self.check(machine)?;
        self.client
            .delete(&paths::fill(paths::CONTAINER, c.id.as_str()))
            .await
            .map_err(sentence)
    }

    async fn tail_logs(
        &mut self,
        machine: &MachineId,
        c: &ContainerRef,
        lines: usize,
    ) -> Result<Vec<String>, String> {
        self.check(machine)?;
        let mut text = Vec::new();
        self.client
            .get_stream(
                &format!(
                    "{}?tail={lines}",
                    paths::fill(paths::CONTAINER_LOGS, c.id.as_str())
                ),
                |chunk| text.extend_from_slice(chunk),
            )
            .await
            .map_err(sentence)?;
        Ok(String::from_utf8_lossy(&text)
            .lines()
            .map(str::to_owned)
            .collect())
    }

    async fn drain_container(
        &mut self,
        machine: &MachineId,
        c: &ContainerRef,
    ) -> Result<(), String> {
        self.check(machine)?;
        let result: ployz_core::api::DrainResult = self
            .client
            .post(
                &paths::fill(paths::CONTAINER_DRAIN, c.id.as_str()),
                &ployz_core::api::DrainRequest::default(),
            )
            .await
            .map_err(sentence)?;
        if result.in_flight_left > 0 {
            eprintln!(
                "        warning: {} still had {} requests in flight after the drain timeout",
                c.name, result.in_flight_left
            );
        }
        if !result.unconfirmed.is_empty() {
            eprintln!(
                "        warning: the edges of {} did not confirm they let {} go before the drain timeout",
                result.unconfirmed.join(", "),
                c.name
            );
        }
        Ok(())
    }

    async fn undrain_container(
        &mut self,
        machine: &MachineId,
        c: &ContainerRef,
    ) -> Result<(), String> {
        self.check(machine)?;
        self.client
            .delete(&paths::fill(paths::CONTAINER_DRAIN, c.id.as_str()))
            .await
            .map_err(sentence)
    }

    async fn run_hook(
        &mut self,
        machine: &MachineId,
        service_id: &ServiceId,
        spec: &ServiceSpec,
        hook: &PreDeployHook,
    ) -> Result<HookResult, String> {
        self.check(machine)?;
        self.client
            .post(
                paths::HOOKS,
                &RunHookRequest {
                    service_id: service_id.clone(),
                    spec: spec.clone(),
                    hook: hook.clone(),
                    registry_auth: crate::registry_auth::for_image(
                        self.registry_auth,
                        &spec.container.image,
                    )
                    .cloned(),
                },
            )
            .await
            .map_err(sentence)
    }
}
