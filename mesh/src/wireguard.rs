//! The WireGuard interface that carries the mesh: its backend, its Management Address, its peers
//! (one per other Machine) and the routes to their Machine Subnets.
//!
//! [`MeshInterface::up`] creates and configures the interface; [`MeshInterface::set_peers`]
//! reconciles peers and routes to exactly the set the daemon derives from Machine records;
//! [`MeshInterface::stats`] reads what WireGuard reports per peer (for endpoint selection and
//! `ployz wg show`). Dropping the handle, or [`MeshInterface::down`], removes the interface.
//!
//! Everything here acts on the network namespace of the calling thread: the TUN device, the
//! UDP sockets of the userspace backend (made by threads it spawns, which inherit the namespace),
//! and the `ip` commands it runs. The daemon runs in one namespace from the start; a test that
//! puts two interfaces in two namespaces of one process calls each handle from a thread that has
//! `setns`ed into its namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use defguard_wireguard_rs::host::Host;
use defguard_wireguard_rs::key::Key;
use defguard_wireguard_rs::net::IpAddrMask;
use defguard_wireguard_rs::peer::Peer;
use defguard_wireguard_rs::{InterfaceConfiguration, Kernel, WGApi, WireguardInterfaceApi};
use ployz_core::{MachineSubnet, ManagementAddress};

use crate::userspace::UserspaceDevice;

/// WireGuard's persistent keepalive for every peer, in seconds (as Uncloud and KubeSpan).
pub const PERSISTENT_KEEPALIVE_SECONDS: u16 = 25;

/// The MTU used when the egress interface's MTU cannot be read.
pub const DEFAULT_MTU: u32 = 1420;
/// The smallest MTU the interface is given (IPv6's minimum).
pub const MIN_MTU: u32 = 1280;
/// The largest MTU the interface is given.
pub const MAX_MTU: u32 = 1420;
/// What WireGuard's encapsulation takes from the egress MTU (IPv6 outer header + UDP + WireGuard).
pub const WIREGUARD_OVERHEAD: u32 = 80;

/// Where the kernel shows a loaded (or built-in) WireGuard module.
const KERNEL_MODULE_PATH: &str = "/sys/module/wireguard";
/// The routing protocol tag of the routes this module installs, so it removes only its own.
const ROUTE_PROTOCOL: &str = "static";
/// How long [`MeshInterface::down`] waits for the userspace device to disappear.
const DOWN_DEADLINE: Duration = Duration::from_secs(5);

/// What went wrong with the mesh interface. Each message names the setting or value and the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireGuardError {
    /// `backend = "kernel"` was asked for on a host without the module.
    #[error(
        "[mesh] backend = \"kernel\" but this host has no WireGuard kernel module \
         ({KERNEL_MODULE_PATH} is absent); load it with `modprobe wireguard`, or set \
         backend = \"auto\" or \"userspace\" to use the in-process userspace implementation"
    )]
    KernelModuleMissing,
    /// A backend setting that is not one of the three words.
    #[error("[mesh] backend = \"{value}\" is not a backend; write auto, kernel or userspace")]
    BadBackendSetting {
        /// The text given.
        value: String,
    },
    /// The interface name cannot be a Linux interface name.
    #[error(
        "[mesh] interface = \"{name}\" is not a usable interface name: {reason}; choose 1 to 15 \
         letters, digits, '-' or '_' (default ployz0)"
    )]
    BadInterfaceName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The private key is not 32 bytes (raw or base64 as `wg genkey` prints).
    #[error(
        "the WireGuard private key is not usable: {reason}; it must be 32 bytes, raw or in \
         base64 as `wg genkey` prints (remove the key file from the data dir to make a new one)"
    )]
    BadPrivateKey {
        /// What is wrong with it.
        reason: String,
    },
    /// A peer's public key is not 32 bytes in base64.
    #[error(
        "peer public key '{value}' is not a WireGuard public key (32 bytes in base64, as \
         `wg pubkey` prints); fix the Machine record that carries it"
    )]
    BadPublicKey {
        /// The text given.
        value: String,
    },
    /// The same public key twice in one peer set.
    #[error(
        "peer public key '{value}' appears twice in the peer set; two Machine records carry the \
         same key, remove the stale one"
    )]
    DuplicatePeer {
        /// The key.
        value: String,
    },
    /// An explicit MTU below IPv6's minimum.
    #[error("MTU {mtu} is below {MIN_MTU}, the least IPv6 needs; leave it unset to detect it")]
    MtuTooSmall {
        /// The MTU given.
        mtu: u32,
    },
    /// The userspace backend found the interface name taken in this namespace.
    #[error(
        "interface {name} already exists in this network namespace, held by another process \
         (another ployz daemon?); stop it, or set [mesh] interface to another name"
    )]
    InterfaceInUse {
        /// The interface name.
        name: String,
    },
    /// WireGuard itself refused (defguard_wireguard_rs / boringtun / netlink).
    #[error("WireGuard interface {interface}: {action} failed: {detail}")]
    Interface {
        /// The interface name.
        interface: String,
        /// What was being done.
        action: &'static str,
        /// What WireGuard said.
        detail: String,
    },
    /// An `ip` command failed.
    #[error("`{command}` failed: {detail}; is iproute2 installed and is the daemon root?")]
    Command {
        /// The command line.
        command: String,
        /// Its error output, or why it did not run.
        detail: String,
    },
    /// The userspace device did not disappear after being stopped.
    #[error("interface {name} still exists {seconds} s after it was stopped")]
    StillPresent {
        /// The interface name.
        name: String,
        /// How long it was waited for.
        seconds: u64,
    },
}

type Result<T> = std::result::Result<T, WireGuardError>;

// === Backend ===

/// Which WireGuard implementation carries the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// The Linux kernel module, driven over netlink.
    Kernel,
    /// boringtun inside the daemon's process, on a TUN device.
    Userspace,
}

impl Backend {
    /// The word shown in `ployz machine ls`, `ployz wg show` and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Backend::Kernel => "kernel",
            Backend::Userspace => "userspace",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `[mesh] backend` setting: what the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackendSetting {
    /// The kernel module where it exists, otherwise userspace.
    #[default]
    Auto,
    /// The kernel module; an error without it.
    Kernel,
    /// The userspace implementation, even where the module exists.
    Userspace,
}

impl FromStr for BackendSetting {
    type Err = WireGuardError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(BackendSetting::Auto),
            "kernel" => Ok(BackendSetting::Kernel),
            "userspace" => Ok(BackendSetting::Userspace),
            other => Err(WireGuardError::BadBackendSetting {
                value: other.to_owned(),
            }),
        }
    }
}

/// What the host offers, as [`choose_backend`] needs it. Read once at start with
/// [`KernelProbe::detect`]; built by hand in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelProbe {
    /// Whether the WireGuard kernel module is loaded or built in.
    pub module_present: bool,
}

impl KernelProbe {
    /// Looks at this host: the module is present when `/sys/module/wireguard` exists (it does for
    /// a loaded module and for one built into the kernel). The daemon may `modprobe wireguard`
    /// before probing; this function does not load anything.
    pub fn detect() -> KernelProbe {
        KernelProbe {
            module_present: Path::new(KERNEL_MODULE_PATH).exists(),
        }
    }
}

/// The backend to use for a setting on a host: `auto` takes the kernel module where it exists,
/// otherwise userspace; `kernel` without the module is an error naming the setting and the fix.
pub fn choose_backend(setting: BackendSetting, probe: KernelProbe) -> Result<Backend> {
    match (setting, probe.module_present) {
        (BackendSetting::Auto, true) | (BackendSetting::Kernel, true) => Ok(Backend::Kernel),
        (BackendSetting::Auto, false) | (BackendSetting::Userspace, _) => Ok(Backend::Userspace),
        (BackendSetting::Kernel, false) => Err(WireGuardError::KernelModuleMissing),
    }
}

// === Keys ===

/// This Machine's WireGuard private key. Its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct PrivateKey([u8; 32]);

impl PrivateKey {
    /// A key from its 32 raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> PrivateKey {
        PrivateKey(bytes)
    }

    /// A key from the contents of a key file: 32 raw bytes, or base64 as `wg genkey` prints
    /// (surrounding whitespace ignored).
    pub fn from_file_contents(contents: &[u8]) -> Result<PrivateKey> {
        if let Ok(bytes) = <[u8; 32]>::try_from(contents) {
            return Ok(PrivateKey(bytes));
        }
        let text = std::str::from_utf8(contents).map_err(|_| WireGuardError::BadPrivateKey {
            reason: format!(
                "{} bytes that are neither 32 raw bytes nor text",
                contents.len()
            ),
        })?;
        text.trim().parse()
    }

    /// A new random key.
    pub fn generate() -> PrivateKey {
        PrivateKey(Key::generate().as_array())
    }

    /// The matching public key's 32 bytes.
    pub fn public_key(&self) -> [u8; 32] {
        Key::new(self.0).public_key().as_array()
    }

    /// The matching public key in base64, as `wg pubkey` prints it and peers are named by.
    pub fn public_key_base64(&self) -> String {
        BASE64.encode(self.public_key())
    }

    /// The Management Address this key gives its Machine.
    pub fn management_address(&self) -> ManagementAddress {
        ManagementAddress::from_public_key(&self.public_key())
    }

    fn to_base64(&self) -> String {
        BASE64.encode(self.0)
    }
}

impl FromStr for PrivateKey {
    type Err = WireGuardError;
    fn from_str(s: &str) -> Result<PrivateKey> {
        let bytes = BASE64
            .decode(s.trim())
            .map_err(|err| WireGuardError::BadPrivateKey {
                reason: format!("not base64 ({err})"),
            })?;
        let len = bytes.len();
        let bytes = <[u8; 32]>::try_from(bytes).map_err(|_| WireGuardError::BadPrivateKey {
            reason: format!("{len} bytes instead of 32"),
        })?;
        Ok(PrivateKey(bytes))
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey(<redacted>)")
    }
}

/// Decodes a peer's base64 public key.
pub fn parse_public_key(value: &str) -> Result<[u8; 32]> {
    BASE64
        .decode(value.trim())
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .ok_or_else(|| WireGuardError::BadPublicKey {
            value: value.to_owned(),
        })
}

fn key_base64(key: &Key) -> String {
    BASE64.encode(key.as_array())
}

// === MTU ===

/// The MTU for the mesh interface given the egress interface's MTU: 80 less (WireGuard's
/// overhead over IPv6), kept within 1280..=1420; 1420 when the egress MTU is unknown.
pub fn mesh_mtu(egress_mtu: Option<u32>) -> u32 {
    match egress_mtu {
        Some(mtu) => mtu
            .saturating_sub(WIREGUARD_OVERHEAD)
            .clamp(MIN_MTU, MAX_MTU),
        None => DEFAULT_MTU,
    }
}

/// The MTU of the interface that carries traffic to a public address (the route to 1.1.1.1, a
/// lookup in the routing table that sends nothing), or of the default route's device; `None`
/// when neither can be read (no route, no `ip`).
pub fn egress_mtu() -> Option<u32> {
    let device = ip_json(&["-4", "route", "get", "1.1.1.1"])
        .ok()
        .and_then(|routes| first_str(&routes, "dev"))
        .or_else(|| {
            ip_json(&["-4", "route", "show", "default"])
                .ok()
                .and_then(|routes| first_str(&routes, "dev"))
        })?;
    let links = ip_json(&["link", "show", "dev", &device]).ok()?;
    links
        .as_array()?
        .first()?
        .get("mtu")?
        .as_u64()
        .and_then(|mtu| u32::try_from(mtu).ok())
}

fn first_str(value: &serde_json::Value, field: &str) -> Option<String> {
    value
        .as_array()?
        .first()?
        .get(field)?
        .as_str()
        .map(str::to_owned)
}

// === Interface ===

/// How to bring the mesh interface up.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// The interface name (`[mesh] interface`, default `ployz0`).
    pub interface: String,
    /// The backend, from [`choose_backend`].
    pub backend: Backend,
    /// This Machine's private key (from the data dir).
    pub private_key: PrivateKey,
    /// WireGuard's UDP port (`[mesh] wireguard_port`, default 51820).
    pub listen_port: u16,
    /// This Machine's Management Address, a /128 on the interface (derived from the key).
    pub management_address: ManagementAddress,
    /// This Machine's Gateway (`.1` of its Machine Subnet): the source of IPv4 routes to peers.
    pub gateway: Ipv4Addr,
    /// The interface MTU; `None` detects it with [`egress_mtu`] and [`mesh_mtu`].
    pub mtu: Option<u32>,
}

/// One peer of the mesh: another Machine as its Machine record describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// The peer's WireGuard public key, base64.
    pub public_key: String,
    /// The peer's Management Address (its /128 is routed and allowed).
    pub management_address: Ipv6Addr,
    /// The peer's Machine Subnet (routed and allowed).
    pub subnet: MachineSubnet,
    /// The peer's Selected Endpoint as this Machine observes it; `None` waits for the peer to
    /// reach this Machine first (WireGuard learns the endpoint from its handshake).
    pub endpoint: Option<SocketAddr>,
}

/// What one [`MeshInterface::set_peers`] call changed. All zero when the interface already
/// matched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerChanges {
    /// Peers added.
    pub added: usize,
    /// Peers whose allowed IPs, endpoint or keepalive were changed.
    pub updated: usize,
    /// Peers removed.
    pub removed: usize,
    /// Routes added or replaced.
    pub routes_set: usize,
    /// Routes removed.
    pub routes_removed: usize,
}

impl PeerChanges {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        *self == PeerChanges::default()
    }
}

/// What WireGuard reports about one peer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PeerStats {
    /// The peer's public key, base64.
    pub public_key: String,
    /// The endpoint WireGuard currently sends to: the configured one, or the one it learned
    /// from the peer's last authenticated packet.
    pub endpoint: Option<SocketAddr>,
    /// When the last handshake completed; `None` before the first.
    pub last_handshake: Option<SystemTime>,
    /// Bytes received from the peer.
    pub rx_bytes: u64,
    /// Bytes sent to the peer.
    pub tx_bytes: u64,
}

/// The backend's handle. The kernel interface is driven through defguard_wireguard_rs (netlink);
/// the userspace device ([`crate::device`]) with the same configuration text, in process.
enum Api {
    Kernel(WGApi<Kernel>),
    Userspace(UserspaceDevice),
}

/// What [`Api`] failed at, before it is given the interface name and the action.
type ApiResult<T> = std::result::Result<T, String>;

impl Api {
    fn configure_interface(&self, config: &InterfaceConfiguration) -> ApiResult<()> {
        match self {
            Api::Kernel(api) => api.configure_interface(config).map_err(|e| e.to_string()),
            Api::Userspace(device) => {
                let name = device.name();
                if let Some(mtu) = config.mtu {
                    run_ip(&["link", "set", "dev", name, "mtu", &mtu.to_string()])
                        .map_err(|e| e.to_string())?;
                }
                for address in &config.addresses {
                    let family = if address.address.is_ipv6() {
                        "-6"
                    } else {
                        "-4"
                    };
                    run_ip(&[family, "addr", "replace", &address.to_string(), "dev", name])
                        .map_err(|e| e.to_string())?;
                }
                let key = Key::from_str(&config.prvkey).map_err(|e| e.to_string())?;
                let host = Host::new(config.port, key);
                userspace_set(device, &host.as_uapi())
            }
        }
    }

    fn configure_peer(&self, peer: &Peer) -> ApiResult<()> {
        match self {
            Api::Kernel(api) => api.configure_peer(peer).map_err(|e| e.to_string()),
            Api::Userspace(device) => userspace_set(device, &peer.as_uapi_update()),
        }
    }

    fn remove_peer(&self, key: &Key) -> ApiResult<()> {
        match self {
            Api::Kernel(api) => api.remove_peer(key).map_err(|e| e.to_string()),
            Api::Userspace(device) => {
                userspace_set(device, &Peer::new(key.clone()).as_uapi_remove())
            }
        }
    }

    fn read(&self) -> ApiResult<Host> {
        match self {
            Api::Kernel(api) => api.read_interface_data().map_err(|e| e.to_string()),
            Api::Userspace(device) => {
                let reply = device.get().map_err(|e| e.to_string())?;
                if reply.errno != 0 {
                    return Err(format!("the device answered errno {}", reply.errno));
                }
                Host::parse_uapi(reply.body.as_bytes()).map_err(|e| e.to_string())
            }
        }
    }
}

fn userspace_set(device: &UserspaceDevice, body: &str) -> ApiResult<()> {
    let reply = device.set(body).map_err(|e| e.to_string())?;
    match reply.errno {
        0 => Ok(()),
        errno => Err(format!(
            "the device refused the configuration: {}",
            std::io::Error::from_raw_os_error(errno)
        )),
    }
}

/// The mesh's WireGuard interface, owned by this handle: dropping it (or [`MeshInterface::down`])
/// removes the interface, and with it every route through it.
pub struct MeshInterface {
    name: String,
    backend: Backend,
    mtu: u32,
    gateway: Ipv4Addr,
    api: Option<Api>,
}

impl fmt::Debug for MeshInterface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeshInterface")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .field("mtu", &self.mtu)
            .field("gateway", &self.gateway)
            .finish_non_exhaustive()
    }
}

impl MeshInterface {
    /// Creates the interface in the calling thread's network namespace, gives it the private
    /// key, listen port, MTU and the Management Address (/128), with no peers, and brings it up.
    ///
    /// With the kernel backend a WireGuard interface of the same name left by an earlier run is
    /// deleted first (the daemon owns that name); an interface of another kind is refused. With
    /// the userspace backend an existing interface of that name belongs to a live process, and
    /// this refuses ([`WireGuardError::InterfaceInUse`]).
    pub fn up(config: MeshConfig) -> Result<MeshInterface> {
        validate_interface_name(&config.interface)?;
        let mtu = match config.mtu {
            Some(mtu) if mtu < MIN_MTU => return Err(WireGuardError::MtuTooSmall { mtu }),
            Some(mtu) => mtu,
            None => mesh_mtu(egress_mtu()),
        };
        let name = config.interface.clone();
        let failed = |action: &'static str| {
            let name = name.clone();
            move |detail: String| WireGuardError::Interface {
                interface: name,
                action,
                detail,
            }
        };
        let exists = link_exists(&name);
        let api = match config.backend {
            Backend::Kernel => {
                if exists {
                    if link_kind(&name).as_deref() != Some("wireguard") {
                        return Err(WireGuardError::InterfaceInUse { name });
                    }
                    tracing::info!(interface = %name, "deleting the WireGuard interface left by an earlier run");
                    run_ip(&["link", "del", "dev", &name])?;
                }
                let mut api = WGApi::<Kernel>::new(name.clone())
                    .map_err(|e| failed("setup")(e.to_string()))?;
                api.create_interface()
                    .map_err(|e| failed("create")(e.to_string()))?;
                Api::Kernel(api)
            }
            Backend::Userspace => {
                if exists {
                    return Err(WireGuardError::InterfaceInUse { name });
                }
                Api::Userspace(
                    UserspaceDevice::create(&name).map_err(|e| failed("create")(e.to_string()))?,
                )
            }
        };
        // From here on the handle owns the interface: an error below drops it, which removes it.
        let interface = MeshInterface {
            name: name.clone(),
            backend: config.backend,
            mtu,
            gateway: config.gateway,
            api: Some(api),
        };
        let configuration = InterfaceConfiguration {
            name: name.clone(),
            prvkey: config.private_key.to_base64(),
            addresses: vec![IpAddrMask::host(IpAddr::V6(
                config.management_address.addr(),
            ))],
            port: config.listen_port,
            peers: Vec::new(),
            mtu: Some(mtu),
            fwmark: None,
        };
        interface
            .api()?
            .configure_interface(&configuration)
            .map_err(failed("configure"))?;
        run_ip(&["link", "set", "dev", &name, "up"])?;
        tracing::info!(
            interface = %name,
            backend = %config.backend,
            mtu,
            port = config.listen_port,
            management_address = %config.management_address,
            "WireGuard interface up"
        );
        Ok(interface)
    }

    /// The WireGuard API. It is only taken away while the handle is being consumed, so the
    /// error cannot be seen from outside; it exists so no path here can panic.
    fn api(&self) -> Result<&Api> {
        self.api.as_ref().ok_or_else(|| WireGuardError::Interface {
            interface: self.name.clone(),
            action: "use",
            detail: "the interface was already removed".into(),
        })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The backend carrying the interface.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The interface's MTU.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    fn interface_error(&self, action: &'static str) -> impl Fn(String) -> WireGuardError + '_ {
        move |detail| WireGuardError::Interface {
            interface: self.name.clone(),
            action,
            detail,
        }
    }

    fn read(&self) -> Result<Host> {
        self.api()?
            .read()
            .map_err(self.interface_error("read peers"))
    }

    /// Reconciles the interface's peers and routes to exactly `peers`: adds the missing, updates
    /// those whose allowed IPs, keepalive or endpoint differ, removes the others, and likewise
    /// for routes. Calling it again with the same set changes nothing (the result is empty).
    ///
    /// Each peer gets AllowedIPs = its Management Address /128 + its Machine Subnet, and a
    /// persistent keepalive of 25 s. A peer's endpoint is set when given and different from the
    /// one WireGuard uses now; a `None` endpoint leaves whatever WireGuard learned.
    ///
    /// Routes: the peer's Machine Subnet via the interface with this Machine's Gateway as source,
    /// and the peer's Management Address /128 via the interface. The Gateway address is held by
    /// the Docker bridge network `ployz`, which the orchestrator creates; until it exists the
    /// subnet routes carry no source (the kernel cannot use an address it does not hold) and the
    /// next call after the bridge appears adds it.
    ///
    /// Both backends change a peer's endpoint and allowed IPs in place: its session goes on.
    /// `&mut self` keeps two reconciliations from interleaving.
    pub fn set_peers(&mut self, peers: &[PeerConfig]) -> Result<PeerChanges> {
        let mut desired: BTreeMap<[u8; 32], (&PeerConfig, Peer)> = BTreeMap::new();
        for config in peers {
            let key = parse_public_key(&config.public_key)?;
            let mut peer = Peer::new(Key::new(key));
            peer.endpoint = config.endpoint;
            peer.persistent_keepalive_interval = Some(PERSISTENT_KEEPALIVE_SECONDS);
            peer.allowed_ips = allowed_ips(config);
            if desired.insert(key, (config, peer)).is_some() {
                return Err(WireGuardError::DuplicatePeer {
                    value: config.public_key.clone(),
                });
            }
        }

        let host = self.read()?;
        let mut changes = PeerChanges::default();
        for (key, (_, peer)) in &desired {
            match host.peers.get(&Key::new(*key)) {
                None => {
                    self.api()?
                        .configure_peer(peer)
                        .map_err(self.interface_error("add peer"))?;
                    changes.added += 1;
                }
                Some(current) if peer_differs(current, peer) => {
                    self.api()?
                        .configure_peer(peer)
                        .map_err(self.interface_error("update peer"))?;
                    changes.updated += 1;
                }
                Some(_) => {}
            }
        }
        for key in host.peers.keys() {
            if !desired.contains_key(&key.as_array()) {
                self.api()?
                    .remove_peer(key)
                    .map_err(self.interface_error("remove peer"))?;
                changes.removed += 1;
            }
        }

        let wanted = wanted_routes(peers, self.route_source());
        let (set, removed) = self.reconcile_routes(&wanted)?;
        changes.routes_set = set;
        changes.routes_removed = removed;
        if !changes.is_empty() {
            tracing::info!(interface = %self.name, ?changes, "mesh peers reconciled");
        }
        Ok(changes)
    }

    /// The source the routes to peers' Machine Subnets carry now: this Machine's Gateway when
    /// an interface holds it (the Docker `ployz` network), else none.
    pub fn route_source(&self) -> Option<Ipv4Addr> {
        local_ipv4_addresses()
            .contains(&self.gateway)
            .then_some(self.gateway)
    }

    /// The peers WireGuard holds now, as [`ObservedPeer`]s ordered by public key.
    pub fn observe_peers(&self) -> Result<Vec<ObservedPeer>> {
        let host = self.read()?;
        let mut peers: Vec<ObservedPeer> = host
            .peers
            .values()
            .map(|peer| ObservedPeer {
                public_key: key_base64(&peer.public_key),
                allowed_ips: ip_set(&peer.allowed_ips)
                    .into_iter()
                    .map(|(ip, cidr)| format!("{ip}/{cidr}"))
                    .collect(),
                persistent_keepalive: peer.persistent_keepalive_interval,
                endpoint: peer.endpoint,
            })
            .collect();
        peers.sort_by(|a, b| a.public_key.cmp(&b.public_key));
        Ok(peers)
    }

    /// Sets the interface up (`ip link set up`).
    pub fn set_link_up(&self) -> Result<()> {
        run_ip(&["link", "set", "dev", &self.name, "up"]).map(drop)
    }

    /// Puts the Management Address (/128) back on the interface.
    pub fn restore_address(&self, management_address: Ipv6Addr) -> Result<()> {
        let address = format!("{management_address}/128");
        run_ip(&["-6", "addr", "replace", &address, "dev", &self.name]).map(drop)
    }

    /// Removes what is left of the interface and creates it again from `config` (no peers: the
    /// next [`MeshInterface::set_peers`] adds them). For an interface deleted from outside.
    pub fn recreate(&mut self, config: MeshConfig) -> Result<()> {
        self.remove();
        *self = MeshInterface::up(config)?;
        Ok(())
    }

    /// Makes the routes through the interface tagged [`ROUTE_PROTOCOL`] exactly `wanted`
    /// (destination -> preferred source). Returns (set, removed).
    fn reconcile_routes(
        &self,
        wanted: &BTreeMap<String, Option<IpAddr>>,
    ) -> Result<(usize, usize)> {
        let current = self.routes()?;
        let mut set = 0;
        for (dst, src) in wanted {
            if current.get(dst) == Some(src) {
                continue;
            }
            let family = if dst.contains(':') { "-6" } else { "-4" };
            let mut args = vec![
                family,
                "route",
                "replace",
                dst,
                "dev",
                &self.name,
                "proto",
                ROUTE_PROTOCOL,
            ];
            let src_text = src.map(|s| s.to_string());
            if let Some(src) = &src_text {
                args.extend(["src", src.as_str()]);
            }
            run_ip(&args)?;
            set += 1;
        }
        let mut removed = 0;
        for dst in current.keys() {
            if !wanted.contains_key(dst) {
                let family = if dst.contains(':') { "-6" } else { "-4" };
                run_ip(&[
                    family,
                    "route",
                    "del",
                    dst,
                    "dev",
                    &self.name,
                    "proto",
                    ROUTE_PROTOCOL,
                ])?;
                removed += 1;
            }
        }
        Ok((set, removed))
    }

    /// The routes through this interface that this module installed: destination (always with
    /// its prefix length) -> preferred source.
    pub fn routes(&self) -> Result<BTreeMap<String, Option<IpAddr>>> {
        let mut routes = BTreeMap::new();
        for family in ["-4", "-6"] {
            let listed = ip_json(&[
                family,
                "route",
                "show",
                "dev",
                &self.name,
                "proto",
                ROUTE_PROTOCOL,
            ])?;
            for route in listed.as_array().map(Vec::as_slice).unwrap_or_default() {
                let Some(dst) = route.get("dst").and_then(|d| d.as_str()) else {
                    continue;
                };
                let dst = normalize_prefix(dst);
                let src = route
                    .get("prefsrc")
                    .and_then(|s| s.as_str())
                    .and_then(|s| s.parse().ok());
                routes.insert(dst, src);
            }
        }
        Ok(routes)
    }

    /// The userspace device's counters and offloads; `None` with the kernel module.
    pub fn datapath_stats(&self) -> Option<crate::device::Stats> {
        match self.api.as_ref()? {
            Api::Kernel(_) => None,
            Api::Userspace(device) => Some(device.stats()),
        }
    }

    /// What WireGuard reports per peer, ordered by public key.
    pub fn stats(&self) -> Result<Vec<PeerStats>> {
        let host = self.read()?;
        let mut stats: Vec<PeerStats> = host
            .peers
            .values()
            .map(|peer| PeerStats {
                public_key: key_base64(&peer.public_key),
                endpoint: peer.endpoint,
                last_handshake: peer.last_handshake,
                rx_bytes: peer.rx_bytes,
                tx_bytes: peer.tx_bytes,
            })
            .collect();
        stats.sort_by(|a, b| a.public_key.cmp(&b.public_key));
        Ok(stats)
    }

    /// Removes the interface and waits (at most 5 s) until it is gone from this namespace.
    pub fn down(mut self) -> Result<()> {
        self.remove();
        let deadline = Instant::now() + DOWN_DEADLINE;
        while link_exists(&self.name) {
            if Instant::now() >= deadline {
                return Err(WireGuardError::StillPresent {
                    name: self.name.clone(),
                    seconds: DOWN_DEADLINE.as_secs(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::info!(interface = %self.name, "WireGuard interface down");
        Ok(())
    }

    /// Removes the interface without waiting. The kernel interface is deleted; the userspace
    /// device is told to stop (its threads exit and the TUN device goes with them) and its
    /// control socket is removed. defguard's own `remove_interface` is not used: it also clears
    /// DNS settings this module never made, and fails on hosts without a DNS manager.
    fn remove(&mut self) {
        match self.api.take() {
            Some(Api::Kernel(_)) => {
                if let Err(err) = run_ip(&["link", "del", "dev", &self.name]) {
                    tracing::warn!(interface = %self.name, error = %err, "could not delete the WireGuard interface");
                }
            }
            Some(Api::Userspace(device)) => {
                // Dropping the device stops its threads and removes its control socket.
                drop(device);
            }
            None => {}
        }
    }
}

impl Drop for MeshInterface {
    fn drop(&mut self) {
        self.remove();
    }
}

/// One peer as WireGuard holds it ([`MeshInterface::observe_peers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedPeer {
    /// Its public key, base64.
    pub public_key: String,
    /// Its allowed IPs, `ADDR/PREFIX`.
    pub allowed_ips: BTreeSet<String>,
    /// Its persistent keepalive, seconds.
    pub persistent_keepalive: Option<u16>,
    /// The endpoint WireGuard sends to.
    pub endpoint: Option<SocketAddr>,
}

/// The allowed IPs [`MeshInterface::set_peers`] gives a peer, `ADDR/PREFIX`.
pub fn wanted_allowed_ips(config: &PeerConfig) -> BTreeSet<String> {
    ip_set(&allowed_ips(config))
        .into_iter()
        .map(|(ip, cidr)| format!("{ip}/{cidr}"))
        .collect()
}

/// The routes [`MeshInterface::set_peers`] keeps for `peers`: destination (with its prefix
/// length) -> preferred source. Each peer's Machine Subnet (from `source` when given) and its
/// Management Address /128.
pub fn wanted_routes(
    peers: &[PeerConfig],
    source: Option<Ipv4Addr>,
) -> BTreeMap<String, Option<IpAddr>> {
    peers
        .iter()
        .flat_map(|config| {
            [
                (config.subnet.to_string(), source.map(IpAddr::V4)),
                (format!("{}/128", config.management_address), None),
            ]
        })
        .collect()
}

/// What one link of the calling thread's namespace looks like ([`observe_link`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkObservation {
    /// Whether a link of that name exists.
    pub exists: bool,
    /// Whether it is administratively up.
    pub up: bool,
    /// The addresses it holds.
    pub addresses: BTreeSet<IpAddr>,
}

/// The link `name` as it is now: whether it exists, is up, and which addresses it holds.
pub fn observe_link(name: &str) -> Result<LinkObservation> {
    if !link_exists(name) {
        return Ok(LinkObservation::default());
    }
    let shown = ip_json(&["addr", "show", "dev", name])?;
    let Some(link) = shown.as_array().and_then(|a| a.first()) else {
        return Ok(LinkObservation::default());
    };
    let up = link
        .get("flags")
        .and_then(|f| f.as_array())
        .is_some_and(|flags| flags.iter().any(|f| f.as_str() == Some("UP")));
    let addresses = link
        .get("addr_info")
        .and_then(|a| a.as_array())
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|a| a.get("local")?.as_str()?.parse().ok())
        .collect();
    Ok(LinkObservation {
        exists: true,
        up,
        addresses,
    })
}

fn allowed_ips(config: &PeerConfig) -> Vec<IpAddrMask> {
    vec![
        IpAddrMask::host(IpAddr::V6(config.management_address)),
        IpAddrMask::new(IpAddr::V4(config.subnet.network()), 24),
    ]
}

fn ip_set(ips: &[IpAddrMask]) -> BTreeSet<(IpAddr, u8)> {
    ips.iter().map(|ip| (ip.address, ip.cidr)).collect()
}

/// Whether the peer WireGuard holds differs from the wanted one. An endpoint only counts when one
/// is wanted: `None` leaves the endpoint WireGuard learned.
fn peer_differs(current: &Peer, wanted: &Peer) -> bool {
    ip_set(&current.allowed_ips) != ip_set(&wanted.allowed_ips)
        || current.persistent_keepalive_interval != wanted.persistent_keepalive_interval
        || (wanted.endpoint.is_some() && current.endpoint != wanted.endpoint)
}

/// `ip` prints host routes without their prefix length; the routes here always carry one.
fn normalize_prefix(dst: &str) -> String {
    if dst.contains('/') {
        dst.to_owned()
    } else if dst.contains(':') {
        format!("{dst}/128")
    } else {
        format!("{dst}/32")
    }
}

fn validate_interface_name(name: &str) -> Result<()> {
    let bad = |reason| {
        Err(WireGuardError::BadInterfaceName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > 15 {
        return bad("it is longer than 15 bytes");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return bad("it has a character other than a letter, digit, '-' or '_'");
    }
    Ok(())
}

/// Whether an interface of that name exists in the calling thread's network namespace.
pub fn link_exists(name: &str) -> bool {
    nix::net::if_::if_nametoindex(name).is_ok()
}

/// The kind of a link (`wireguard`, `tun`, `veth`...), as `ip -d link` shows it; `None` when
/// it cannot be read or the link has no kind (a plain device).
fn link_kind(name: &str) -> Option<String> {
    let links = ip_json(&["-d", "link", "show", "dev", name]).ok()?;
    links
        .as_array()?
        .first()?
        .get("linkinfo")?
        .get("info_kind")?
        .as_str()
        .map(str::to_owned)
}

/// The IPv4 addresses held by interfaces of the calling thread's network namespace.
pub fn local_ipv4_addresses() -> BTreeSet<Ipv4Addr> {
    match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => addrs
            .filter_map(|a| a.address?.as_sockaddr_in().map(|s| s.ip()))
            .collect(),
        Err(err) => {
            tracing::warn!(error = %err, "could not list this Machine's addresses");
            BTreeSet::new()
        }
    }
}

fn run_ip(args: &[&str]) -> Result<String> {
    let command = || format!("ip {}", args.join(" "));
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|err| WireGuardError::Command {
            command: command(),
            detail: err.to_string(),
        })?;
    if !output.status.success() {
        return Err(WireGuardError::Command {
            command: command(),
            detail: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn ip_json(args: &[&str]) -> Result<serde_json::Value> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let text = run_ip(&full)?;
    if text.trim().is_empty() {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    serde_json::from_str(&text).map_err(|err| WireGuardError::Command {
        command: format!("ip {}", full.join(" ")),
        detail: format!("unreadable JSON output: {err}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_the_kernel_module_where_it_exists() {
        let with = KernelProbe {
            module_present: true,
        };
        let without = KernelProbe {
            module_present: false,
        };
        assert_eq!(
            choose_backend(BackendSetting::Auto, with).unwrap(),
            Backend::Kernel
        );
        assert_eq!(
            choose_backend(BackendSetting::Auto, without).unwrap(),
            Backend::Userspace
        );
        assert_eq!(
            choose_backend(BackendSetting::Userspace, with).unwrap(),
            Backend::Userspace
        );
        assert_eq!(
            choose_backend(BackendSetting::Kernel, with).unwrap(),
            Backend::Kernel
        );
    }

    #[test]
    fn kernel_without_the_module_names_the_setting_and_the_fix() {
        let err = choose_backend(
            BackendSetting::Kernel,
            KernelProbe {
                module_present: false,
            },
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("[mesh] backend = \"kernel\""), "{text}");
        assert!(text.contains("modprobe wireguard"), "{text}");
        assert!(text.contains("userspace"), "{text}");
    }

    #[test]
    fn backend_settings_parse() {
        assert_eq!(
            "auto".parse::<BackendSetting>().unwrap(),
            BackendSetting::Auto
        );
        assert_eq!(
            "kernel".parse::<BackendSetting>().unwrap(),
            BackendSetting::Kernel
        );
        assert_eq!(
            "userspace".parse::<BackendSetting>().unwrap(),
            BackendSetting::Userspace
        );
        let err = "boringtun"
            .parse::<BackendSetting>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("boringtun") && err.contains("auto, kernel or userspace"),
            "{err}"
        );
    }

    #[test]
    fn mtu_is_egress_minus_80_within_bounds() {
        assert_eq!(mesh_mtu(Some(1500)), 1420);
        assert_eq!(mesh_mtu(Some(1450)), 1370);
        assert_eq!(mesh_mtu(Some(9000)), 1420);
        assert_eq!(mesh_mtu(Some(1280)), 1280);
        assert_eq!(mesh_mtu(Some(40)), 1280);
        assert_eq!(mesh_mtu(None), 1420);
    }

    #[test]
    fn private_keys_read_raw_or_base64_and_never_print() {
        let key = PrivateKey::generate();
        let raw = PrivateKey::from_file_contents(&key.0).unwrap();
        assert_eq!(raw, key);
        let text = format!("{}\n", key.to_base64());
        let parsed = PrivateKey::from_file_contents(text.as_bytes()).unwrap();
        assert_eq!(parsed, key);
        assert_eq!(format!("{key:?}"), "PrivateKey(<redacted>)");
        let err = PrivateKey::from_file_contents(b"c2hvcnQ=")
            .unwrap_err()
            .to_string();
        assert!(err.contains("5 bytes instead of 32"), "{err}");
        assert_eq!(
            parse_public_key(&key.public_key_base64()).unwrap(),
            key.public_key()
        );
        assert_eq!(
            key.management_address(),
            ManagementAddress::from_public_key(&key.public_key())
        );
        assert!(matches!(
            parse_public_key("nope"),
            Err(WireGuardError::BadPublicKey { .. })
        ));
    }

    #[test]
    fn interface_names_are_checked() {
        assert!(validate_interface_name("ployz0").is_ok());
        assert!(validate_interface_name("").is_err());
        assert!(validate_interface_name("a-very-long-interface").is_err());
        let err = validate_interface_name("ployz 0").unwrap_err().to_string();
        assert!(err.contains("[mesh] interface = \"ployz 0\""), "{err}");
    }

    #[test]
    fn a_peer_differs_only_in_what_is_wanted() {
        let config = PeerConfig {
            public_key: PrivateKey::generate().public_key_base64(),
            management_address: "fdcc::1".parse().unwrap(),
            subnet: "10.210.3.0/24".parse().unwrap(),
            endpoint: None,
        };
        let mut wanted = Peer::new(Key::new([7; 32]));
        wanted.allowed_ips = allowed_ips(&config);
        wanted.persistent_keepalive_interval = Some(25);
        let mut current = wanted.clone();
        current.allowed_ips.reverse();
        current.endpoint = Some("198.18.0.2:51820".parse().unwrap());
        assert!(
            !peer_differs(&current, &wanted),
            "order and a learned endpoint do not count"
        );
        wanted.endpoint = Some("198.18.0.3:51820".parse().unwrap());
        assert!(peer_differs(&current, &wanted));
        wanted.endpoint = current.endpoint;
        current.persistent_keepalive_interval = None;
        assert!(peer_differs(&current, &wanted));
    }

    #[test]
    fn host_routes_get_their_prefix() {
        assert_eq!(normalize_prefix("fdcc::1"), "fdcc::1/128");
        assert_eq!(normalize_prefix("10.0.0.1"), "10.0.0.1/32");
        assert_eq!(normalize_prefix("10.210.1.0/24"), "10.210.1.0/24");
    }
}
