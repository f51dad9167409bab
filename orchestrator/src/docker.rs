//! One Machine's Docker, through bollard: Service Containers, Hook Containers, volumes, the
//! `ployz` network, and Container Runtime Observations read back from Docker.
//!
//! Only containers labelled with this Machine's ID are ever listed or touched, so several
//! Machines (or test daemons) can share one Docker engine without seeing each other's work.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use bollard::models::{
    ContainerCreateBody, EndpointSettings, HealthConfig, HostConfig, HostConfigLogConfig, Ipam,
    IpamConfig, MountTmpfsOptions, MountType, MountVolumeOptions, NetworkCreateRequest,
    NetworkingConfig, PortBinding, ResourcesUlimits, RestartPolicy, RestartPolicyNameEnum,
    VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, InspectNetworkOptions,
    ListContainersOptionsBuilder, ListImagesOptions, ListVolumesOptions, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder, StopContainerOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::{Stream, StreamExt, TryStreamExt};
use ployz_core::{
    ContainerHealth, ContainerId, ContainerKind, ContainerRef, ContainerRuntimeObservation,
    ContainerState, DockerVolume, Healthcheck, HostProtocol, MachineId, MachineSubnet, Mount,
    PortSpec, PreDeployHook, PullPolicy, ServiceId, ServiceSpec, VolumeSpec,
};
use rand::Rng;

/// The Docker network every Service Container joins.
pub const NETWORK: &str = "ployz";

/// Container labels, all under `ployz.`.
pub mod labels {
    pub const MANAGED: &str = "ployz.managed";
    pub const MACHINE_ID: &str = "ployz.machine.id";
    pub const SERVICE_ID: &str = "ployz.service.id";
    pub const SERVICE_NAME: &str = "ployz.service.name";
    pub const SERVICE_MODE: &str = "ployz.service.mode";
    pub const SERVICE_PORTS: &str = "ployz.service.ports";
    pub const SERVICE_SPEC: &str = "ployz.service.spec";
    pub const HOOK: &str = "ployz.service.hook";
}

/// Why a Docker operation failed, by how the caller reacts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DockerError {
    #[error("cannot reach Docker: {0}; is dockerd running (set --docker-host or DOCKER_HOST)?")]
    Unreachable(String),
    #[error("no container '{0}' on this Machine")]
    NoSuchContainer(String),
    #[error("image '{image}' is not on this Machine and could not be pulled: {reason}")]
    ImageUnavailable { image: String, reason: String },
    #[error("the Docker network '{NETWORK}' exists with subnet {found}, but this Machine's subnet is {wanted}; remove that network (`docker network rm {NETWORK}`) or reset this Machine")]
    NetworkConflict { found: String, wanted: String },
    #[error("docker: {0}")]
    Docker(#[from] bollard::errors::Error),
}

impl DockerError {
    /// Whether Docker could not be reached at all (as opposed to refusing one request).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, DockerError::Unreachable(_))
    }
}

fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

pub use ployz_core::api::{ExecResult, HookResult};

/// This Machine's Docker.
#[derive(Clone)]
pub struct MachineDocker {
    /// The client before API version negotiation.
    base: Docker,
    /// The client speaking the engine's API version, negotiated on first use.
    negotiated: std::sync::Arc<tokio::sync::OnceCell<Docker>>,
    machine_id: MachineId,
    subnet: MachineSubnet,
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..4)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

fn ms_to_ns(ms: Option<u64>) -> Option<i64> {
    ms.map(|v| (v as i64).saturating_mul(1_000_000))
}

impl MachineDocker {
    /// Connects to Docker at `host` (`unix:///path`), or where `DOCKER_HOST` or the default
    /// socket says. Connecting is lazy: the first call reports an unreachable engine.
    pub fn connect(
        host: Option<&str>,
        machine_id: MachineId,
        subnet: MachineSubnet,
    ) -> Result<MachineDocker, DockerError> {
        let docker = match host {
            Some(h) => Docker::connect_with_host(h),
            None => Docker::connect_with_local_defaults(),
        }
        .map_err(|e| DockerError::Unreachable(e.to_string()))?;
        Ok(MachineDocker {
            base: docker,
            negotiated: Default::default(),
            machine_id,
            subnet,
        })
    }

    /// The client, speaking the API version the engine supports.
    async fn api(&self) -> Result<&Docker, DockerError> {
        self.negotiated
            .get_or_try_init(|| async {
                self.base
                    .clone()
                    .negotiate_version()
                    .await
                    .map_err(|e| DockerError::Unreachable(e.to_string()))
            })
            .await
    }

    /// Checks the engine answers.
    pub async fn ping(&self) -> Result<(), DockerError> {
        self.api()
            .await?
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| DockerError::Unreachable(e.to_string()))
    }

    /// Creates the `ployz` bridge network on the Machine Subnet with the Machine Gateway, leaves
    /// a matching one alone, and reports a conflicting one.
    pub async fn ensure_network(&self) -> Result<(), DockerError> {
        let wanted = self.subnet.to_string();
        match self
            .api()
            .await?
            .inspect_network(NETWORK, None::<InspectNetworkOptions>)
            .await
        {
            Ok(net) => {
                let found: Vec<String> = net
                    .ipam
                    .and_then(|i| i.config)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|c| c.subnet)
                    .collect();
                if found.iter().any(|s| s == &wanted) {
                    Ok(())
                } else {
                    Err(DockerError::NetworkConflict {
                        found: found.join(","),
                        wanted,
                    })
                }
            }
            Err(e) if is_not_found(&e) => {
                let request = NetworkCreateRequest {
                    name: NETWORK.to_owned(),
                    driver: Some("bridge".into()),
                    ipam: Some(Ipam {
                        driver: Some("default".into()),
                        config: Some(vec![IpamConfig {
                            subnet: Some(wanted),
                            gateway: Some(self.subnet.gateway().to_string()),
                            ..Default::default()
                        }]),
                        options: None,
                    }),
                    labels: Some(HashMap::from([(labels::MANAGED.to_owned(), String::new())])),
                    ..Default::default()
                };
                match self.api().await?.create_network(request).await {
                    Ok(_) => {
                        tracing::info!(subnet = %self.subnet, "created the Docker network '{NETWORK}'");
                        Ok(())
                    }
                    // Another caller created it meanwhile: check it again.
                    Err(bollard::errors::Error::DockerResponseServerError {
                        status_code: 409,
                        ..
                    }) => Box::pin(self.ensure_network()).await,
                    Err(e) => Err(e.into()),
                }
            }
            Err(e) => Err(self.classify(e)),
        }
    }

    fn classify(&self, e: bollard::errors::Error) -> DockerError {
        match e {
            bollard::errors::Error::DockerResponseServerError { .. } => DockerError::Docker(e),
            other => DockerError::Unreachable(other.to_string()),
        }
    }

    /// Every managed container of this Machine, observed now.
    pub async fn observe(&self) -> Result<Vec<ContainerRuntimeObservation>, DockerError> {
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{}={}", labels::MACHINE_ID, self.machine_id)],
        )]);
        let list = self
            .api()
            .await?
            .list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|e| self.classify(e))?;
        let mut out = Vec::with_capacity(list.len());
        for summary in list {
            let Some(id) = summary.id else { continue };
            if let Some(o) = self.observe_container(&id).await? {
                out.push(o);
            }
        }
        out.sort_by(|a, b| (&a.service_name, a.created_at).cmp(&(&b.service_name, b.created_at)));
        Ok(out)
    }

    /// One container, observed now; `None` when it is gone or is not this Machine's.
    pub async fn observe_container(
        &self,
        id: &str,
    ) -> Result<Option<ContainerRuntimeObservation>, DockerError> {
        let c = match self.api().await?.inspect_container(id, None).await {
            Ok(c) => c,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(self.classify(e)),
        };
        let config = c.config.unwrap_or_default();
        let labels = config.labels.unwrap_or_default();
        if labels.get(labels::MACHINE_ID).map(String::as_str) != Some(self.machine_id.as_str()) {
            return Ok(None);
        }
        let (Some(service_id), Some(service_name)) = (
            labels
                .get(labels::SERVICE_ID)
                .and_then(|s| s.parse::<ServiceId>().ok()),
            labels
                .get(labels::SERVICE_NAME)
                .and_then(|s| s.parse().ok()),
        ) else {
            return Ok(None);
        };
        let Some(container_id) = c.id.and_then(|i| i.parse::<ContainerId>().ok()) else {
            return Ok(None);
        };
        let state = c.state.unwrap_or_default();
        let status = state.status.map(|s| s.to_string()).unwrap_or_default();
        let health =
            state
                .health
                .and_then(|h| h.status)
                .and_then(|s| match s.to_string().as_str() {
                    "starting" => Some(ContainerHealth::Starting),
                    "healthy" => Some(ContainerHealth::Healthy),
                    "unhealthy" => Some(ContainerHealth::Unhealthy),
                    _ => None,
                });
        let address = c
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(NETWORK))
            .and_then(|e| e.ip_address)
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        let created_at = c
            .created
            .as_deref()
            .and_then(parse_rfc3339_seconds)
            .unwrap_or(0);
        Ok(Some(ContainerRuntimeObservation {
            id: container_id,
            name: c
                .name
                .unwrap_or_default()
                .trim_start_matches('/')
                .to_owned(),
            machine_id: self.machine_id.clone(),
            service_id,
            service_name,
            kind: if labels.contains_key(labels::HOOK) {
                ContainerKind::Hook
            } else {
                ContainerKind::Service
            },
            state: ContainerState::from_docker(&status),
            health,
            restart_count: c.restart_count.unwrap_or(0).max(0) as u32,
            address,
            image: config.image.unwrap_or_default(),
            created_at,
            spec: labels
                .get(labels::SERVICE_SPEC)
                .and_then(|s| serde_json::from_str(s).ok()),
        }))
    }

    /// The Docker Volumes on this Machine.
    pub async fn volumes(&self) -> Result<Vec<DockerVolume>, DockerError> {
        let list = self
            .api()
            .await?
            .list_volumes(None::<ListVolumesOptions>)
            .await
            .map_err(|e| self.classify(e))?;
        let mut out: Vec<DockerVolume> = list
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| DockerVolume {
                machine_id: self.machine_id.clone(),
                name: v.name,
                driver: v.driver,
                labels: v.labels.into_iter().collect(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The image references (`repo:tag`) present on this Machine.
    pub async fn images(&self) -> Result<Vec<String>, DockerError> {
        let list = self
            .api()
            .await?
            .list_images(None::<ListImagesOptions>)
            .await
            .map_err(|e| self.classify(e))?;
        let mut out: Vec<String> = list.into_iter().flat_map(|i| i.repo_tags).collect();
        out.sort();
        Ok(out)
    }

    /// Creates a Docker Volume; an existing one of that name is left as it is.
    pub async fn create_volume(&self, spec: &VolumeSpec) -> Result<DockerVolume, DockerError> {
        let mut volume_labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
        volume_labels.insert(labels::MANAGED.to_owned(), String::new());
        volume_labels.insert(labels::MACHINE_ID.to_owned(), self.machine_id.to_string());
        let v = self
            .api()
            .await?
            .create_volume(VolumeCreateRequest {
                name: Some(spec.name.clone()),
                driver: spec.driver.clone(),
                driver_opts: Some(spec.driver_opts.clone().into_iter().collect()),
                labels: Some(volume_labels),
                ..Default::default()
            })
            .await
            .map_err(|e| self.classify(e))?;
        Ok(DockerVolume {
            machine_id: self.machine_id.clone(),
            name: v.name,
            driver: v.driver,
            labels: v.labels.into_iter().collect(),
        })
    }

    /// Removes a Docker Volume.
    pub async fn remove_volume(&self, name: &str, force: bool) -> Result<(), DockerError> {
        self.api()
            .await?
            .remove_volume(
                name,
                Some(RemoveVolumeOptionsBuilder::default().force(force).build()),
            )
            .await
            .map_err(|e| self.classify(e))
    }

    /// Makes sure the image is here, by the spec's pull policy.
    async fn ensure_image(&self, image: &str, policy: PullPolicy) -> Result<(), DockerError> {
        let present = match self.api().await?.inspect_image(image).await {
            Ok(_) => true,
            Err(e) if is_not_found(&e) => false,
            Err(e) => return Err(self.classify(e)),
        };
        match policy {
            PullPolicy::Missing if present => Ok(()),
            PullPolicy::Never if present => Ok(()),
            PullPolicy::Never => Err(DockerError::ImageUnavailable {
                image: image.to_owned(),
                reason: "pull_policy is never".into(),
            }),
            PullPolicy::Missing | PullPolicy::Always => {
                let (from, tag) = split_tag(image);
                let mut pull = self.api().await?.create_image(
                    Some(
                        CreateImageOptionsBuilder::default()
                            .from_image(from)
                            .tag(tag)
                            .build(),
                    ),
                    None,
                    None,
                );
                while let Some(item) = pull.next().await {
                    if let Err(e) = item {
                        // A local image that cannot be refreshed still serves `always`.
                        if present {
                            tracing::warn!(image, error = %e, "pull failed; using the local image");
                            return Ok(());
                        }
                        return Err(DockerError::ImageUnavailable {
                            image: image.to_owned(),
                            reason: e.to_string(),
                        });
                    }
                }
                Ok(())
            }
        }
    }

    /// Creates and starts a Service Container carrying `spec` as its Resolved Service Spec.
    pub async fn run_service_container(
        &self,
        service_id: &ServiceId,
        spec: &ServiceSpec,
    ) -> Result<ContainerRuntimeObservation, DockerError> {
        self.ensure_network().await?;
        self.ensure_image(&spec.container.image, spec.container.pull_policy)
            .await?;
        let name = format!("{}-{}", spec.name, random_suffix());
        let body = self.service_container_body(service_id, spec, &name);
        let created_id = self.create_and_start(&name, body, spec).await?;
        self.observe_container(&created_id)
            .await?
            .ok_or(DockerError::NoSuchContainer(created_id))
    }

    /// Creates a container named `name`, copies the spec's configs in, starts it; its ID.
    async fn create_and_start(
        &self,
        name: &str,
        body: ContainerCreateBody,
        spec: &ServiceSpec,
    ) -> Result<String, DockerError> {
        let created = self
            .api()
            .await?
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(name).build()),
                body,
            )
            .await
            .map_err(|e| self.classify(e))?;
        if !spec.container.configs.is_empty() {
            self.copy_configs(&created.id, spec).await?;
        }
        self.api()
            .await?
            .start_container(&created.id, None)
            .await
            .map_err(|e| self.classify(e))?;
        Ok(created.id)
    }

    fn common_labels(&self, service_id: &ServiceId, spec: &ServiceSpec) -> HashMap<String, String> {
        HashMap::from([
            (labels::MANAGED.to_owned(), String::new()),
            (labels::MACHINE_ID.to_owned(), self.machine_id.to_string()),
            (labels::SERVICE_ID.to_owned(), service_id.to_string()),
            (labels::SERVICE_NAME.to_owned(), spec.name.to_string()),
            (
                labels::SERVICE_MODE.to_owned(),
                spec.mode.as_str().to_owned(),
            ),
        ])
    }

    fn service_container_body(
        &self,
        service_id: &ServiceId,
        spec: &ServiceSpec,
        name: &str,
    ) -> ContainerCreateBody {
        let c = &spec.container;
        let mut labels = self.common_labels(service_id, spec);
        labels.insert(
            labels::SERVICE_PORTS.to_owned(),
            spec.ports
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
        labels.insert(
            labels::SERVICE_SPEC.to_owned(),
            serde_json::to_string(spec).expect("a spec serialises"),
        );
        let mut env: Vec<String> = c.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        env.push(format!("PLOYZ_MACHINE_ID={}", self.machine_id));
        let mut port_bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
        let mut exposed = Vec::new();
        for p in &spec.ports {
            if let PortSpec::Host {
                host_ip,
                host_port,
                container_port,
                protocol,
            } = p
            {
                let key = format!(
                    "{container_port}/{}",
                    match protocol {
                        HostProtocol::Tcp => "tcp",
                        HostProtocol::Udp => "udp",
                    }
                );
                exposed.push(key.clone());
                port_bindings
                    .entry(key)
                    .or_insert_with(|| Some(Vec::new()))
                    .get_or_insert_with(Vec::new)
                    .push(PortBinding {
                        host_ip: host_ip.clone(),
                        host_port: Some(host_port.to_string()),
                    });
            }
        }
        let healthcheck = c.healthcheck.as_ref().map(|h| match h {
            Healthcheck::Disabled => HealthConfig {
                test: Some(vec!["NONE".into()]),
                ..Default::default()
            },
            Healthcheck::Configured(hc) => HealthConfig {
                test: Some(hc.test().to_vec()),
                interval: ms_to_ns(hc.interval_ms),
                timeout: ms_to_ns(hc.timeout_ms),
                retries: hc.retries.map(i64::from),
                start_period: ms_to_ns(hc.start_period_ms),
                start_interval: ms_to_ns(hc.start_interval_ms),
            },
        });
        let host_config = HostConfig {
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::UNLESS_STOPPED),
                maximum_retry_count: None,
            }),
            network_mode: Some(NETWORK.to_owned()),
            dns: Some(vec![self.subnet.gateway().to_string()]),
            dns_search: Some(vec!["internal".into()]),
            dns_options: Some(vec!["ndots:1".into()]),
            init: c.init,
            privileged: Some(c.privileged),
            cap_add: (!c.cap_add.is_empty()).then(|| c.cap_add.clone()),
            cap_drop: (!c.cap_drop.is_empty()).then(|| c.cap_drop.clone()),
            sysctls: (!c.sysctls.is_empty()).then(|| c.sysctls.clone().into_iter().collect()),
            ulimits: (!c.ulimits.is_empty()).then(|| {
                c.ulimits
                    .iter()
                    .map(|(name, u)| ResourcesUlimits {
                        name: Some(name.clone()),
                        soft: Some(u.soft),
                        hard: Some(u.hard),
                    })
                    .collect()
            }),
            shm_size: c.shm_size_bytes.map(|v| v as i64),
            nano_cpus: c.resources.nano_cpus.map(|v| v as i64),
            memory: c.resources.memory_limit_bytes.map(|v| v as i64),
            memory_reservation: c.resources.memory_reservation_bytes.map(|v| v as i64),
            mounts: Some(c.mounts.iter().map(docker_mount).collect()),
            port_bindings: (!port_bindings.is_empty()).then_some(port_bindings),
            log_config: Some(match &c.logging {
                Some(l) => HostConfigLogConfig {
                    typ: Some(l.driver.clone()),
                    config: Some(l.options.clone().into_iter().collect()),
                },
                None => HostConfigLogConfig {
                    typ: Some("local".into()),
                    config: None,
                },
            }),
            ..Default::default()
        };
        ContainerCreateBody {
            hostname: Some(name.to_owned()),
            user: c.user.clone(),
            env: Some(env),
            cmd: c.command.clone(),
            entrypoint: c.entrypoint.clone(),
            image: Some(c.image.clone()),
            labels: Some(labels),
            healthcheck,
            stop_timeout: c.stop_grace_period_ms.map(|ms| (ms / 1000) as i64),
            exposed_ports: (!exposed.is_empty()).then_some(exposed),
            host_config: Some(host_config),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    NETWORK.to_owned(),
                    EndpointSettings::default(),
                )])),
            }),
            ..Default::default()
        }
    }

    async fn copy_configs(&self, container: &str, spec: &ServiceSpec) -> Result<(), DockerError> {
        let mut archive = tar::Builder::new(Vec::new());
        for cfg in &spec.container.configs {
            let mut header = tar::Header::new_gnu();
            header.set_size(cfg.content.len() as u64);
            header.set_mode(cfg.mode.unwrap_or(0o444));
            header.set_uid(cfg.uid.unwrap_or(0) as u64);
            header.set_gid(cfg.gid.unwrap_or(0) as u64);
            header.set_mtime(0);
            let path = cfg.target.trim_start_matches('/');
            archive
                .append_data(&mut header, path, cfg.content.as_bytes())
                .map_err(|e| {
                    DockerError::Unreachable(format!("building the configs archive: {e}"))
                })?;
        }
        let bytes = archive
            .into_inner()
            .map_err(|e| DockerError::Unreachable(format!("building the configs archive: {e}")))?;
        self.api()
            .await?
            .upload_to_container(
                container,
                Some(UploadToContainerOptionsBuilder::default().path("/").build()),
                bollard::body_full(bytes.into()),
            )
            .await
            .map_err(|e| self.classify(e))
    }

    /// Starts a stopped container.
    pub async fn start(&self, id: &str) -> Result<(), DockerError> {
        match self.api().await?.start_container(id, None).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Err(DockerError::NoSuchContainer(id.to_owned())),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// Stops a container, giving it `timeout` before SIGKILL. Already stopped is fine.
    pub async fn stop(&self, id: &str, timeout: Option<Duration>) -> Result<(), DockerError> {
        let mut options = StopContainerOptionsBuilder::default();
        if let Some(t) = timeout {
            options = options.t(t.as_secs() as i32);
        }
        match self
            .api()
            .await?
            .stop_container(id, Some(options.build()))
            .await
        {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            Err(e) if is_not_found(&e) => Err(DockerError::NoSuchContainer(id.to_owned())),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// Removes a container (stopping it if needed) and its anonymous volumes. Gone is fine.
    pub async fn remove(&self, id: &str) -> Result<(), DockerError> {
        match self
            .api()
            .await?
            .remove_container(
                id,
                Some(
                    RemoveContainerOptionsBuilder::default()
                        .force(true)
                        .v(true)
                        .build(),
                ),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// The last `tail` log lines (stdout and stderr interleaved as Docker stored them).
    pub async fn tail_logs(&self, id: &str, tail: usize) -> Result<Vec<String>, DockerError> {
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(&tail.to_string())
            .build();
        let chunks: Vec<_> = self
            .api()
            .await?
            .logs(id, Some(options))
            .try_collect()
            .await
            .map_err(|e| {
                if is_not_found(&e) {
                    DockerError::NoSuchContainer(id.to_owned())
                } else {
                    self.classify(e)
                }
            })?;
        let text: String = chunks.iter().map(|c| c.to_string()).collect();
        Ok(text.lines().map(str::to_owned).collect())
    }

    /// A container's log as a stream of chunks.
    pub async fn log_stream(
        &self,
        id: &str,
        follow: bool,
        tail: Option<usize>,
        since: Option<i64>,
        until: Option<i64>,
    ) -> Result<impl Stream<Item = Result<bytes::Bytes, DockerError>> + Send + 'static, DockerError>
    {
        let mut options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .follow(follow)
            .tail(&tail.map_or("all".to_owned(), |t| t.to_string()));
        if let Some(s) = since {
            options = options.since(s as i32);
        }
        if let Some(u) = until {
            options = options.until(u as i32);
        }
        Ok(self
            .api()
            .await?
            .logs(id, Some(options.build()))
            .map(|item| item.map(|c| c.into_bytes()).map_err(DockerError::from)))
    }

    /// Runs `cmd` in a container to completion, capturing its output.
    pub async fn exec(&self, id: &str, cmd: Vec<String>) -> Result<ExecResult, DockerError> {
        let exec = self
            .api()
            .await?
            .create_exec(
                id,
                bollard::models::ExecConfig {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(cmd),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| {
                if is_not_found(&e) {
                    DockerError::NoSuchContainer(id.to_owned())
                } else {
                    self.classify(e)
                }
            })?;
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        if let bollard::exec::StartExecResults::Attached { mut output, .. } = self
            .api()
            .await?
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| self.classify(e))?
        {
            while let Some(chunk) = output.next().await {
                match chunk? {
                    bollard::container::LogOutput::StdErr { message } => {
                        stderr.extend_from_slice(&message)
                    }
                    other => stdout.extend_from_slice(&other.into_bytes()),
                }
            }
        }
        let inspect = self
            .api()
            .await?
            .inspect_exec(&exec.id)
            .await
            .map_err(|e| self.classify(e))?;
        Ok(ExecResult {
            exit_code: inspect.exit_code.unwrap_or(-1),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }

    /// Runs a pre-deploy hook in a Hook Container `<service>-pre-deploy-<4>` and waits for it to
    /// exit, at most its timeout (then it is stopped). Old hook containers of the Service are
    /// removed first. The hook container is kept for inspection.
    pub async fn run_hook(
        &self,
        service_id: &ServiceId,
        spec: &ServiceSpec,
        hook: &PreDeployHook,
    ) -> Result<HookResult, DockerError> {
        for old in self.observe().await? {
            if old.kind == ContainerKind::Hook && &old.service_id == service_id {
                self.remove(old.id.as_str()).await?;
            }
        }
        self.ensure_network().await?;
        self.ensure_image(&spec.container.image, spec.container.pull_policy)
            .await?;
        let name = format!("{}-pre-deploy-{}", spec.name, random_suffix());
        let mut labels = self.common_labels(service_id, spec);
        labels.insert(labels::HOOK.to_owned(), "pre-deploy".to_owned());
        let mut env: Vec<String> = spec
            .container
            .env
            .iter()
            .chain(hook.env.iter())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.push(format!("PLOYZ_MACHINE_ID={}", self.machine_id));
        env.push("PLOYZ_HOOK_PRE_DEPLOY=true".into());
        let body = ContainerCreateBody {
            hostname: Some(name.clone()),
            image: Some(spec.container.image.clone()),
            cmd: Some(hook.command.clone()),
            entrypoint: spec.container.entrypoint.clone(),
            user: hook.user.clone().or_else(|| spec.container.user.clone()),
            env: Some(env),
            labels: Some(labels),
            healthcheck: Some(HealthConfig {
                test: Some(vec!["NONE".into()]),
                ..Default::default()
            }),
            host_config: Some(HostConfig {
                restart_policy: Some(RestartPolicy {
                    name: Some(RestartPolicyNameEnum::NO),
                    maximum_retry_count: None,
                }),
                network_mode: Some(NETWORK.to_owned()),
                dns: Some(vec![self.subnet.gateway().to_string()]),
                dns_search: Some(vec!["internal".into()]),
                privileged: Some(hook.privileged),
                mounts: Some(spec.container.mounts.iter().map(docker_mount).collect()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created_id = self.create_and_start(&name, body, spec).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(hook.timeout_ms);
        let exit_code = loop {
            let c = self
                .api()
                .await?
                .inspect_container(&created_id, None)
                .await
                .map_err(|e| self.classify(e))?;
            let state = c.state.unwrap_or_default();
            if state.running != Some(true)
                && state.status.map(|s| s.to_string()).as_deref() != Some("created")
            {
                break state.exit_code;
            }
            if tokio::time::Instant::now() >= deadline {
                self.stop(&created_id, Some(Duration::from_secs(5))).await?;
                break None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let logs = self.tail_logs(&created_id, 20).await.unwrap_or_default();
        Ok(HookResult {
            container: ContainerRef {
                id: created_id
                    .parse()
                    .map_err(|_| DockerError::NoSuchContainer(created_id.clone()))?,
                name,
            },
            exit_code,
            logs,
        })
    }

    /// Docker's event stream for this Machine's containers.
    pub async fn container_events(
        &self,
    ) -> Result<
        impl Stream<Item = Result<bollard::models::EventMessage, DockerError>> + Send + 'static,
        DockerError,
    > {
        let filters = HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            (
                "label".to_owned(),
                vec![format!("{}={}", labels::MACHINE_ID, self.machine_id)],
            ),
        ]);
        Ok(self
            .api()
            .await?
            .events(Some(
                bollard::query_parameters::EventsOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .map(|e| e.map_err(DockerError::from)))
    }
}

fn docker_mount(m: &Mount) -> bollard::models::Mount {
    match m {
        Mount::Volume {
            source,
            target,
            read_only,
            no_copy,
        } => bollard::models::Mount {
            typ: Some(MountType::VOLUME),
            source: Some(source.clone()),
            target: Some(target.clone()),
            read_only: Some(*read_only),
            volume_options: no_copy.then(|| MountVolumeOptions {
                no_copy: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        },
        Mount::Bind {
            source,
            target,
            read_only,
        } => bollard::models::Mount {
            typ: Some(MountType::BIND),
            source: Some(source.clone()),
            target: Some(target.clone()),
            read_only: Some(*read_only),
            ..Default::default()
        },
        Mount::Tmpfs {
            target,
            size_bytes,
            mode,
        } => bollard::models::Mount {
            typ: Some(MountType::TMPFS),
            target: Some(target.clone()),
            tmpfs_options: Some(MountTmpfsOptions {
                size_bytes: size_bytes.map(|v| v as i64),
                mode: mode.map(i64::from),
                options: None,
            }),
            ..Default::default()
        },
    }
}

/// `repo[:tag]` -> (repo, tag), `latest` when absent; digests stay whole.
fn split_tag(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rfind(':') {
        Some(i) => {
            let cut = image.len() - last.len() + i;
            (&image[..cut], &image[cut + 1..])
        }
        None => (image, "latest"),
    }
}

/// Seconds since the epoch of an RFC 3339 timestamp such as `2026-11-30T14:00:00.123Z`.
fn parse_rfc3339_seconds(s: &str) -> Option<i64> {
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let hms: Vec<i64> = time
        .get(..8)?
        .split(':')
        .map(|p| p.parse::<i64>().ok())
        .collect::<Option<_>>()?;
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_split_like_docker() {
        assert_eq!(split_tag("busybox"), ("busybox", "latest"));
        assert_eq!(split_tag("busybox:1.36"), ("busybox", "1.36"));
        assert_eq!(
            split_tag("localhost:5000/app"),
            ("localhost:5000/app", "latest")
        );
        assert_eq!(
            split_tag("localhost:5000/app:2"),
            ("localhost:5000/app", "2")
        );
    }

    #[test]
    fn timestamps_parse() {
        assert_eq!(parse_rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_seconds("2026-11-30T14:00:05.123456789Z"),
            Some(1_796_047_205)
        );
    }
}
