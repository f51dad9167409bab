//! A host reached over SSH, made into a Machine's host: Ployz installed as the `ployz.service`
//! systemd unit (Docker too, when absent and allowed), or upgraded to this CLI's own build.
//!
//! The CLI is the daemon too, so it carries what it installs: its own executable
//! (`/proc/self/exe`) and the install files of the tarball (`packaging/`), copied to a temporary
//! directory on the host and installed there by `install.sh` with root's rights (as root, or
//! with passwordless `sudo`). Every step prints one progress line on stderr.

use std::io::IsTerminal as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use tokio::io::AsyncWriteExt as _;

use crate::connection::{Connection, SshTarget};

/// The files `install.sh` installs beside the executable, as the tarball carries them.
const INSTALL_SH: &str = include_str!("../../packaging/install.sh");
const UNIT: &str = include_str!("../../packaging/ployz.service");
const DAEMON_TOML: &str = include_str!("../../configs/daemon.toml");

/// This CLI's release, what it installs.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How long the daemon on a host may take to say READY=1 after its unit starts.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// What the user allowed.
#[derive(Debug, Clone, Copy)]
pub struct InstallOptions {
    /// Install nothing: a host without Ployz (or Docker) is an error naming what is missing.
    pub no_install: bool,
    /// Install Docker without asking.
    pub yes: bool,
    /// No progress lines (`--json`).
    pub quiet: bool,
}

/// What was found on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Probe {
    pub root: bool,
    /// The SSH user's name on the host.
    pub user: Option<String>,
    /// The SSH user is in the group `ployz` (the daemon's socket is for root and that group).
    pub ployz_group: bool,
    pub sudo: bool,
    pub systemd: bool,
    pub docker: bool,
    /// `ployz --version`'s release, when installed as `/usr/bin/ployz`.
    pub ployz: Option<String>,
    /// Where `ployz` is on the SSH user's PATH, wherever it was installed.
    pub ployz_path: Option<String>,
    /// The SHA-256 of the installed executable.
    pub ployz_sha256: Option<String>,
    /// `systemctl is-active ployz`.
    pub active: Option<String>,
    /// The executable of the unit's main process, as /proc shows it (`/usr/bin/ployz
    /// (deleted)` when the file was replaced since it started), when it can be read.
    pub running_exe: Option<String>,
    /// `/etc/os-release`'s `ID` and `ID_LIKE`.
    pub os: Vec<String>,
    /// The version of the `ployz` package dpkg has installed, when Ployz came from the package.
    pub package: Option<String>,
}

/// What [`ensure_installed`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// Ployz was installed (and Docker, when `docker` is true).
    Fresh { docker: bool },
    /// A build of this CLI's release was there already and running.
    Current,
}

/// Parses the probe script's `key=value` lines.
pub fn parse_probe(out: &str) -> Probe {
    let mut p = Probe::default();
    for line in out.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim();
        match k {
            "uid" => p.root = v == "0",
            "user" => p.user = Some(v.to_owned()).filter(|s| !s.is_empty()),
            "ployz_group" => p.ployz_group = v == "yes",
            "sudo" => p.sudo = v == "yes",
            "systemd" => p.systemd = v == "yes",
            "docker" => p.docker = v == "yes",
            "ployz" => {
                p.ployz = v
                    .split_whitespace()
                    .last()
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
            }
            "ployz_sha256" => p.ployz_sha256 = Some(v.to_owned()).filter(|s| !s.is_empty()),
            "ployz_path" => p.ployz_path = Some(v.to_owned()).filter(|s| !s.is_empty()),
            "active" => p.active = Some(v.to_owned()).filter(|s| !s.is_empty()),
            "running_exe" => p.running_exe = Some(v.to_owned()).filter(|s| !s.is_empty()),
            "os" => p.os.extend(v.split_whitespace().map(str::to_owned)),
            "package" => p.package = Some(v.to_owned()).filter(|s| !s.is_empty()),
            _ => {}
        }
    }
    p
}

/// What the host has, in lines [`parse_probe`] reads. POSIX sh; reads only.
const PROBE: &str = r#"echo "uid=$(id -u)"
echo "user=$(id -un)"
if id -nG 2>/dev/null | tr ' ' '\n' | grep -qx ployz; then echo ployz_group=yes; fi
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then echo sudo=yes; fi
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then echo systemd=yes; fi
if command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || [ -x /usr/bin/dockerd ]; then echo docker=yes; fi
if command -v ployz >/dev/null 2>&1; then echo "ployz_path=$(command -v ployz)"; fi
if [ -x /usr/bin/ployz ]; then
  echo "ployz=$(/usr/bin/ployz --version 2>/dev/null | head -n 1)"
  echo "ployz_sha256=$(sha256sum /usr/bin/ployz | cut -d ' ' -f 1)"
  echo "active=$(systemctl is-active ployz.service 2>/dev/null)"
  pid=$(systemctl show -p MainPID --value ployz.service 2>/dev/null)
  if [ -n "$pid" ] && [ "$pid" != 0 ]; then
    echo "running_exe=$(readlink "/proc/$pid/exe" 2>/dev/null || sudo -n readlink "/proc/$pid/exe" 2>/dev/null)"
  fi
fi
if [ -r /etc/os-release ]; then . /etc/os-release; echo "os=${ID:-} ${ID_LIKE:-}"; fi
if command -v dpkg-query >/dev/null 2>&1 && dpkg-query -W -f='${Status}' ployz 2>/dev/null | grep -q ' installed$'; then
  echo "package=$(dpkg-query -W -f='${Version}' ployz)"
fi
"#;

/// A release as numbers (`0.1.0` → `[0, 1, 0]`), for ordering; `None` when not of that form.
pub fn release(v: &str) -> Option<Vec<u64>> {
    let core = v.split(['-', '+']).next()?;
    core.split('.').map(|p| p.parse().ok()).collect()
}

/// A host over SSH.
pub struct Host {
    target: SshTarget,
    connection: Connection,
}

impl Host {
    pub fn new(connection: &Connection) -> anyhow::Result<Host> {
        match connection {
            Connection::Ssh(t) => Ok(Host {
                target: t.clone(),
                connection: connection.clone(),
            }),
            Connection::Unix(_) => {
                bail!("installing needs the host as ssh://user@host[:port], not '{connection}'")
            }
        }
    }

    /// The host as the user gave it (`ssh://user@host[:port]`), for messages.
    pub fn url(&self) -> String {
        self.connection.to_string()
    }

    /// What a daemon already running on the host says of itself through `ployz dial-stdio`
    /// (however it was installed and started), or `None` when none answers.
    async fn running_daemon(&self) -> Option<ployz_core::api::VersionInfo> {
        let ask = async {
            let mut client = crate::client::ApiClient::connect(&self.connection)
                .await
                .ok()?;
            client
                .get::<ployz_core::api::VersionInfo>(ployz_core::api::paths::VERSION)
                .await
                .ok()
        };
        tokio::time::timeout(Duration::from_secs(30), ask)
            .await
            .ok()
            .flatten()
    }

    /// Runs `script` with `sh` on the host (as the SSH user), `stdin` fed from `input`.
    async fn sh(&self, script: &str, input: Option<Input<'_>>) -> anyhow::Result<Remote> {
        let mut cmd = crate::client::ssh_to(&self.target)?;
        cmd.arg(format!(
            "sh -c {}",
            shlex::try_quote(script).map_err(|e| anyhow!("script cannot be quoted: {e}"))?
        ));
        cmd.stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start ssh for {}", self.url()))?;
        if let Some(input) = input {
            let mut stdin = child.stdin.take().expect("piped stdin");
            let feeding = async move {
                match input {
                    Input::Bytes(b) => stdin.write_all(b).await?,
                    Input::File(path) => {
                        let mut f = tokio::fs::File::open(path).await?;
                        tokio::io::copy(&mut f, &mut stdin).await?;
                    }
                }
                stdin.shutdown().await
            };
            let (fed, out) = tokio::join!(feeding, child.wait_with_output());
            let out = out?;
            if let Err(e) = fed {
                if out.status.success() {
                    return Err(anyhow!(e).context(format!("cannot send a file to {}", self.url())));
                }
            }
            return Ok(Remote(out));
        }
        Ok(Remote(child.wait_with_output().await?))
    }

    /// Runs `script` and fails (with what it printed) unless it succeeds.
    async fn sh_ok(
        &self,
        what: &str,
        script: &str,
        input: Option<Input<'_>>,
    ) -> anyhow::Result<String> {
        let out = self.sh(script, input).await?;
        if !out.0.status.success() {
            bail!(
                "{what} on {} failed ({}): {}",
                self.url(),
                out.0.status,
                out.text()
            );
        }
        Ok(String::from_utf8_lossy(&out.0.stdout).into_owned())
    }

    /// What is on the host.
    pub async fn probe(&self) -> anyhow::Result<Probe> {
        let out = self.sh(PROBE, None).await?;
        if !out.0.status.success() {
            bail!(
                "cannot run commands on {} over SSH ({}): {}; check that `ssh {}` logs in without a password prompt",
                self.url(),
                out.0.status,
                out.text(),
                self.destination()
            );
        }
        Ok(parse_probe(&String::from_utf8_lossy(&out.0.stdout)))
    }

    fn destination(&self) -> String {
        let mut d = match &self.target.user {
            Some(u) => format!("{u}@{}", self.target.host),
            None => self.target.host.clone(),
        };
        if let Some(p) = self.target.port {
            d = format!("-p {p} {d}");
        }
        d
    }

    /// How root's commands are run: directly as root, or with passwordless sudo.
    fn as_root(&self, probe: &Probe) -> anyhow::Result<&'static str> {
        if probe.root {
            Ok("")
        } else if probe.sudo {
            Ok("sudo -n ")
        } else {
            bail!(
                "{} logs in as a user who is not root and cannot use sudo without a password; installing needs root: connect as root, or give the user passwordless sudo (a line `{} ALL=(ALL) NOPASSWD:ALL` in /etc/sudoers.d/ployz)",
                self.url(),
                self.target.user.as_deref().unwrap_or("USER")
            )
        }
    }
}

enum Input<'a> {
    Bytes(&'a [u8]),
    File(&'a std::path::Path),
}

/// What a remote command printed.
struct Remote(std::process::Output);

impl Remote {
    /// Its stderr (or stdout, when stderr is empty), trimmed to its last lines.
    fn text(&self) -> String {
        let err = String::from_utf8_lossy(&self.0.stderr);
        let out = String::from_utf8_lossy(&self.0.stdout);
        let text = if err.trim().is_empty() { out } else { err };
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let from = lines.len().saturating_sub(8);
        lines[from..].join(" | ")
    }
}

fn progress(options: &InstallOptions, line: &str) {
    if !options.quiet {
        eprintln!("{line}");
    }
}

/// The SHA-256 of this CLI's executable, hex: computed once, on a blocking thread (a debug
/// build is hundreds of megabytes).
async fn own_sha256() -> anyhow::Result<String> {
    static OWN: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    OWN.get_or_try_init(|| async {
        tokio::task::spawn_blocking(|| {
            let mut file = std::fs::File::open("/proc/self/exe")
                .context("cannot read this CLI's executable")?;
            let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = std::io::Read::read(&mut file, &mut buf)
                    .context("cannot read this CLI's executable")?;
                if n == 0 {
                    break;
                }
                ctx.update(&buf[..n]);
            }
            Ok(hex::encode(ctx.finish()))
        })
        .await
        .context("hashing this CLI's executable")?
    })
    .await
    .cloned()
}

/// Makes sure the host runs this CLI's release of Ployz as `ployz.service`: installs it (and
/// Docker, when absent and allowed) when it is missing, starts it when it is installed but not
/// running, and waits for READY=1. A host with an older release is an error naming
/// `ployz machine upgrade`; a newer one, an error naming an upgrade of this CLI.
pub async fn ensure_installed(host: &Host, options: InstallOptions) -> anyhow::Result<Installed> {
    progress(&options, &format!("checking {} over SSH ...", host.url()));
    let probe = host.probe().await?;
    // A daemon that runs and answers is used as it is, however it was installed (a package, a
    // tarball, by hand under another service manager).
    if probe.ployz.is_none() && probe.ployz_path.is_some() {
        if let Some(v) = host.running_daemon().await {
            // It answered through `ployz dial-stdio`: this user reaches its socket already.
            same_release(host, &v.version)?;
            progress(
                &options,
                &format!("a Ployz {} daemon answers on {}", v.version, host.url()),
            );
            return Ok(Installed::Current);
        }
    }
    if let Some(theirs) = &probe.ployz {
        // An older release that is no Machine yet (installed earlier, by hand or by an older
        // CLI) has nothing to hand over carefully: it is upgraded here. `machine upgrade` would
        // find no Machine to upgrade.
        let older = matches!((release(theirs), release(VERSION)), (Some(t), Some(o)) if t < o);
        if older && !options.no_install && probe.package.is_none() {
            reach_the_socket(host, &probe, options).await?;
            let daemon = host.running_daemon().await;
            if daemon.as_ref().is_some_and(|v| v.machine.is_none()) {
                progress(
                    &options,
                    &format!(
                        "Ployz {theirs} on {} is older than this CLI's {VERSION} and not initialised: upgrading it",
                        host.url()
                    ),
                );
                let sudo = host.as_root(&probe)?;
                install(host, &probe, sudo, options).await?;
                return Ok(Installed::Fresh { docker: false });
            }
        }
        same_release(host, theirs)?;
        if probe.active.as_deref() == Some("active") {
            progress(
                &options,
                &format!("Ployz {theirs} is installed and running on {}", host.url()),
            );
            reach_the_socket(host, &probe, options).await?;
            return Ok(Installed::Current);
        }
        if options.no_install {
            bail!(
                "Ployz is installed on {} but ployz.service is {}; start it there (`systemctl start ployz`), or leave out --no-install",
                host.url(),
                probe.active.as_deref().unwrap_or("not active")
            );
        }
        if let Some(version) = &probe.package {
            bail!(
                "{} has Ployz from the ployz package ({version}) and ployz.service is {}; start it there (`sudo systemctl start ployz`) rather than have this CLI replace the package's files",
                host.url(),
                probe.active.as_deref().unwrap_or("not active")
            );
        }
    } else if options.no_install {
        bail!(
            "Ployz is not installed on {} and --no-install was given; install it there (the package or the tarball: docs/install.md), or leave out --no-install",
            host.url()
        );
    }
    let sudo = host.as_root(&probe)?;
    if !probe.systemd {
        bail!(
            "{} does not run systemd (no /run/systemd/system); Ployz runs as the ployz.service unit: on a host without systemd, unpack the tarball and run `ployz daemon run --config /etc/ployz/daemon.toml` under its service manager",
            host.url()
        );
    }
    let docker = if probe.docker {
        false
    } else {
        ensure_docker(host, &probe, sudo, options).await?;
        true
    };
    install(host, &probe, sudo, options).await?;
    Ok(Installed::Fresh { docker })
}

/// Puts the SSH user in the group `ployz` when it is neither root nor a member, so that `ployz
/// dial-stdio` reaches the daemon's socket: a host where Ployz came from the package or the
/// tarball, or from an install cut short before its last step, has the daemon but not the user
/// in its group. With sudo it is done; without, the error says how.
async fn reach_the_socket(
    host: &Host,
    probe: &Probe,
    options: InstallOptions,
) -> anyhow::Result<()> {
    if probe.root || probe.ployz_group {
        return Ok(());
    }
    // Reached already some other way: the socket's group set otherwise (`socket_group`), or
    // another socket (`?socket=`).
    if host.running_daemon().await.is_some() {
        return Ok(());
    }
    let user = probe.user.as_deref().unwrap_or("USER");
    if !probe.sudo {
        bail!(
            "{} logs in as '{user}', which is neither root nor in the group ployz that the daemon's socket is for, and cannot use sudo without a password to join it; on the host run `sudo usermod -a -G ployz {user}`, or connect as root",
            host.url()
        );
    }
    progress(
        &options,
        &format!(
            "adding {user} to the group ployz on {} (the daemon's socket is for root and that group) ...",
            host.url()
        ),
    );
    host.sh_ok(
        "adding the SSH user to the group ployz",
        r#"sudo -n usermod -a -G ployz "$(id -un)""#,
        None,
    )
    .await?;
    Ok(())
}

/// Fails, naming the way forward, unless `theirs` (the host's release) is this CLI's.
fn same_release(host: &Host, theirs: &str) -> anyhow::Result<()> {
    match (release(theirs), release(VERSION)) {
        (Some(t), Some(o)) if t < o => bail!(
            "{} runs Ployz {theirs}, older than this CLI's {VERSION}; upgrade it first: `ployz machine upgrade --connect {}` (or `-m MACHINE` for a Machine of a Cluster)",
            host.url(),
            host.url()
        ),
        (Some(t), Some(o)) if t > o => bail!(
            "{} runs Ployz {theirs}, newer than this CLI's {VERSION}; use a CLI of release {theirs} or newer",
            host.url()
        ),
        _ => Ok(()),
    }
}

/// Installs Docker from the distribution's packages, asking first (unless `--yes`).
async fn ensure_docker(
    host: &Host,
    probe: &Probe,
    sudo: &str,
    options: InstallOptions,
) -> anyhow::Result<()> {
    if options.no_install {
        bail!(
            "Docker is not installed on {} and --no-install was given; install it there (Debian: `apt-get install docker.io`), or leave out --no-install",
            host.url()
        );
    }
    let debian = probe.os.iter().any(|o| o == "debian" || o == "ubuntu");
    let fedora = probe.os.iter().any(|o| o == "fedora");
    let install = if debian {
        "DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io"
    } else if fedora {
        "dnf install -y moby-engine"
    } else {
        bail!(
            "Docker is not installed on {} and its distribution ({}) is not one Ployz installs Docker on; install Docker there, then run this again",
            host.url(),
            if probe.os.is_empty() { "unknown".to_owned() } else { probe.os.join(" ") }
        );
    };
    if !options.yes {
        if !std::io::stdin().is_terminal() {
            bail!(
                "Docker is not installed on {}; give --yes to install it from the distribution's packages, or --no-install to refuse",
                host.url()
            );
        }
        eprint!(
            "Docker is not installed on {}. Install it from the distribution's packages? [y/N] ",
            host.url()
        );
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            bail!(
                "not installing Docker on {}; nothing was changed",
                host.url()
            );
        }
    }
    progress(
        &options,
        &format!("installing Docker on {} ...", host.url()),
    );
    host.sh_ok(
        "installing Docker",
        &format!("{sudo}sh -c '{install} && systemctl enable --now docker.service'"),
        None,
    )
    .await?;
    Ok(())
}

/// Copies this CLI's executable and the install files to the host, runs `install.sh` as root
/// and waits for the unit to be active (READY=1).
async fn install(
    host: &Host,
    probe: &Probe,
    sudo: &str,
    options: InstallOptions,
) -> anyhow::Result<()> {
    let exe = std::path::Path::new("/proc/self/exe");
    let size = std::fs::metadata(exe).map(|m| m.len()).unwrap_or(0);
    progress(
        &options,
        &format!(
            "copying Ployz {VERSION} to {} ({} MB) ...",
            host.url(),
            size.div_ceil(1 << 20)
        ),
    );
    // In the SSH user's home, not /tmp: hardened hosts mount /tmp noexec, and install.sh runs
    // the staged executable to check it.
    let dir = host
        .sh_ok(
            "creating a temporary directory",
            r#"mktemp -d "${HOME:-/tmp}/.ployz-install.XXXXXX""#,
            None,
        )
        .await?;
    let dir = dir.trim().to_owned();
    if !(dir.starts_with('/') && dir.contains("/.ployz-install."))
        || dir.contains(char::is_whitespace)
    {
        bail!("mktemp on {} printed '{dir}', not a directory", host.url());
    }
    let result = async {
        host.sh_ok(
            "copying the executable",
            &format!("cat > {dir}/ployz && chmod 0755 {dir}/ployz"),
            Some(Input::File(exe)),
        )
        .await?;
        for (name, text) in [
            ("install.sh", INSTALL_SH),
            ("ployz.service", UNIT),
            ("daemon.toml", DAEMON_TOML),
        ] {
            host.sh_ok(
                "copying the install files",
                &format!("cat > {dir}/{name}"),
                Some(Input::Bytes(text.as_bytes())),
            )
            .await?;
        }
        let verb = if probe.ployz.is_some() {
            "upgrading"
        } else {
            "installing"
        };
        progress(
            &options,
            &format!("{verb} Ployz {VERSION} on {} (install.sh) ...", host.url()),
        );
        let user = if probe.root {
            String::new()
        } else {
            // The SSH user reaches the daemon's socket as a member of its group.
            format!(
                " && {sudo}usermod -a -G ployz {}",
                shlex::try_quote(host.target.user.as_deref().unwrap_or("root"))
                    .map_err(|e| anyhow!("user name cannot be quoted: {e}"))?
            )
        };
        host.sh_ok(
            "install.sh",
            &format!("cd {dir} && {sudo}sh ./install.sh{user}"),
            None,
        )
        .await?;
        wait_active(host, options).await
    }
    .await;
    let _ = host.sh(&format!("rm -rf {dir}"), None).await;
    result
}

/// Waits until `ployz.service` is active on the host (systemd says so only after READY=1), or
/// fails with the end of its journal.
pub async fn wait_active(host: &Host, options: InstallOptions) -> anyhow::Result<()> {
    progress(
        &options,
        &format!("waiting for the daemon on {} to be ready ...", host.url()),
    );
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let out = host.sh("systemctl is-active ployz.service", None).await?;
        let state = String::from_utf8_lossy(&out.0.stdout).trim().to_owned();
        match state.as_str() {
            "active" => {
                progress(
                    &options,
                    &format!("Ployz {VERSION} is running on {}", host.url()),
                );
                return Ok(());
            }
            "failed" => {
                let journal = host
                    .sh(
                        "journalctl -u ployz.service -n 15 --no-pager -o cat 2>&1",
                        None,
                    )
                    .await
                    .map(|r| r.text())
                    .unwrap_or_default();
                bail!(
                    "ployz.service failed to start on {}: {journal}; see `journalctl -u ployz` there",
                    host.url()
                );
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            bail!(
                "ployz.service on {} is still {state} after {} s; see `systemctl status ployz` there",
                host.url(),
                READY_WITHIN.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Replaces the host's Ployz with this CLI's build (the same release or a newer one) and waits
/// for the unit to be active again. `None` when the host already runs exactly this build.
pub async fn upgrade(host: &Host, options: InstallOptions) -> anyhow::Result<Option<String>> {
    let (probe, own) = tokio::join!(host.probe(), own_sha256());
    let (probe, own) = (probe?, own?);
    let Some(theirs) = probe.ployz.clone() else {
        bail!(
            "Ployz is not installed on {}; install it with `ployz machine add {}`",
            host.url(),
            host.url()
        );
    };
    if let (Some(t), Some(o)) = (release(&theirs), release(VERSION)) {
        if t > o {
            bail!(
                "{} runs Ployz {theirs}, newer than this CLI's {VERSION}; upgrading would go back: use a CLI of release {theirs} or newer",
                host.url()
            );
        }
    }
    // The file alone is not the build that runs: a handover that failed after the file was
    // replaced leaves the old process serving (its executable shows as deleted).
    let runs_the_file = probe
        .running_exe
        .as_deref()
        .is_none_or(|exe| exe == "/usr/bin/ployz");
    if probe.ployz_sha256.as_deref() == Some(own.as_str())
        && probe.active.as_deref() == Some("active")
        && runs_the_file
    {
        return Ok(None);
    }
    // Files dpkg owns are replaced by the package's own upgrade, or dpkg's record of them (and
    // its next upgrade or removal) would be wrong.
    if let Some(version) = &probe.package {
        bail!(
            "{} has Ployz from the ployz package ({version}); upgrade it with the package (`sudo apt install ./ployz_<version>_<arch>.deb` there, which hands over the same way), or remove the package (`sudo apt remove ployz`) before `machine upgrade` installs this CLI's build",
            host.url()
        );
    }
    let sudo = host.as_root(&probe)?;
    install(host, &probe, sudo, options).await?;
    Ok(Some(theirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_reads_what_the_script_prints() {
        let p = parse_probe(
            "uid=1000\nuser=deployer\nsudo=yes\nsystemd=yes\nployz_path=/usr/bin/ployz\nployz=ployz 0.1.0\nployz_sha256=ab12\nactive=inactive\nos=debian \n",
        );
        assert_eq!(p.ployz_path.as_deref(), Some("/usr/bin/ployz"));
        assert!(!p.root && p.sudo && p.systemd && !p.docker && !p.ployz_group);
        assert_eq!(p.user.as_deref(), Some("deployer"));
        assert!(parse_probe("uid=1000\nployz_group=yes\n").ployz_group);
        assert_eq!(p.ployz.as_deref(), Some("0.1.0"));
        assert_eq!(p.ployz_sha256.as_deref(), Some("ab12"));
        assert_eq!(p.active.as_deref(), Some("inactive"));
        assert_eq!(p.running_exe, None);
        assert_eq!(
            parse_probe("running_exe=/usr/bin/ployz (deleted)\n")
                .running_exe
                .as_deref(),
            Some("/usr/bin/ployz (deleted)")
        );
        assert_eq!(p.os, vec!["debian"]);
        assert_eq!(p.package, None);
        let bare = parse_probe("uid=0\nos= \npackage=0.1.1\n");
        assert!(bare.root && bare.ployz.is_none() && bare.os.is_empty());
        assert_eq!(bare.package.as_deref(), Some("0.1.1"));
    }

    #[test]
    fn releases_order_by_number() {
        assert!(release("0.9.0") < release("0.10.0"));
        assert!(release("0.1.0-rc.1") == release("0.1.0"));
        assert!(release("1.0.0").unwrap() > release("0.99.9").unwrap());
        assert_eq!(release("x.y"), None);
    }
}
