//! `--with-registry-auth`: the Docker credentials of the CLI's user, read where `docker login`
//! keeps them (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`, or the credential
//! helper it names), for the registries of a Deploy's images. They travel with the calls that
//! may pull and are used for those pulls alone: never stored, logged or shown.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context as _};
use base64::Engine as _;
use ployz_core::api::RegistryAuth;

/// The key Docker Hub's credentials are kept under.
const DOCKER_HUB: &str = "https://index.docker.io/v1/";

/// The registry an image comes from, as `docker login` names it: the first part of its
/// reference when that is a host (it has a `.` or a `:`, or is `localhost`), else Docker Hub.
pub fn registry_of(image: &str) -> String {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first.to_owned(),
        _ => DOCKER_HUB.to_owned(),
    }
}

/// A `config.json` key, or a server URL, as the host (and port) it names.
fn host_of(key: &str) -> &str {
    let key = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    key.split('/').next().unwrap_or(key)
}

fn config_path() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("config.json"));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or_else(|| anyhow!("--with-registry-auth: HOME is not set, so ~/.docker/config.json cannot be found; set DOCKER_CONFIG"))?;
    Ok(PathBuf::from(home).join(".docker/config.json"))
}

/// What `config.json` holds that matters here.
#[derive(Debug, Default, serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// The credentials for each registry of `images`. A registry the configuration has nothing for
/// is named in `missing` (its images are pulled without credentials).
pub fn credentials(images: &[&str]) -> anyhow::Result<(Vec<RegistryAuth>, Vec<String>)> {
    let path = config_path()?;
    let text = std::fs::read_to_string(&path).map_err(|e| {
        anyhow!(
            "--with-registry-auth: cannot read {}: {e}; run `docker login REGISTRY` first (or set DOCKER_CONFIG)",
            path.display()
        )
    })?;
    let config: DockerConfig = serde_json::from_str(&text).map_err(|e| {
        anyhow!(
            "--with-registry-auth: {} is not a Docker configuration ({e})",
            path.display()
        )
    })?;
    let mut registries: Vec<String> = images.iter().map(|i| registry_of(i)).collect();
    registries.sort();
    registries.dedup();
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for registry in registries {
        let host = host_of(&registry).to_owned();
        let helper = config
            .cred_helpers
            .iter()
            .find(|(k, _)| host_of(k) == host)
            .map(|(_, h)| h.clone());
        let entry = config.auths.iter().find(|(k, _)| host_of(k) == host);
        let auth = match (helper, entry) {
            (Some(helper), _) => from_helper(&helper, &registry)?,
            (None, Some((key, entry))) if entry.auth.is_some() || entry.identitytoken.is_some() => {
                Some(from_entry(&registry, key, entry, &path)?)
            }
            (None, _) => match &config.creds_store {
                Some(store) => from_helper(store, &registry)?,
                None => None,
            },
        };
        match auth {
            Some(a) => found.push(a),
            None => missing.push(registry),
        }
    }
    Ok((found, missing))
}

fn from_entry(
    registry: &str,
    key: &str,
    entry: &AuthEntry,
    path: &std::path::Path,
) -> anyhow::Result<RegistryAuth> {
    let (mut username, mut password) = (String::new(), String::new());
    if let Some(auth) = &entry.auth {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_owned(), p.to_owned())));
        // The value itself is never shown: the file and the entry are named.
        let Some((u, p)) = decoded else {
            bail!(
                "--with-registry-auth: the auth of \"{key}\" in {} is not base64 of USER:PASSWORD; run `docker login {}` again",
                path.display(),
                host_of(key)
            );
        };
        (username, password) = (u, p);
    }
    Ok(RegistryAuth {
        server: registry.to_owned(),
        username,
        password,
        identity_token: entry.identitytoken.clone().filter(|t| !t.is_empty()),
    })
}

/// Asks `docker-credential-<helper>` for the credentials of `registry`; `None` when it has none
/// (it says "credentials not found"), as Docker then pulls without.
fn from_helper(helper: &str, registry: &str) -> anyhow::Result<Option<RegistryAuth>> {
    let program = format!("docker-credential-{helper}");
    let mut child = std::process::Command::new(&program)
        .arg("get")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| {
            format!(
                "--with-registry-auth: cannot run {program} (the Docker configuration names it)"
            )
        })?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(registry.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        if String::from_utf8_lossy(&out.stdout).contains("credentials not found") {
            return Ok(None);
        }
        bail!(
            "--with-registry-auth: {program} failed for {registry} ({}); check it with `{program} list`",
            out.status
        );
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(rename = "Username")]
        username: String,
        #[serde(rename = "Secret")]
        secret: String,
    }
    let a: Answer = serde_json::from_slice(&out.stdout).map_err(|_| {
        anyhow!("--with-registry-auth: {program} answered something else than credentials")
    })?;
    Ok(Some(if a.username == "<token>" {
        RegistryAuth {
            server: registry.to_owned(),
            username: String::new(),
            password: String::new(),
            identity_token: Some(a.secret),
        }
    } else {
        RegistryAuth {
            server: registry.to_owned(),
            username: a.username,
            password: a.secret,
            identity_token: None,
        }
    }))
}

/// The credentials in `auths` for `image`'s registry.
pub fn for_image<'a>(auths: &'a [RegistryAuth], image: &str) -> Option<&'a RegistryAuth> {
    let host = registry_of(image);
    auths.iter().find(|a| host_of(&a.server) == host_of(&host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_of_an_image_is_its_host_or_docker_hub() {
        assert_eq!(registry_of("nginx:1"), DOCKER_HUB);
        assert_eq!(registry_of("team/app:1"), DOCKER_HUB);
        assert_eq!(registry_of("ghcr.io/team/app:1"), "ghcr.io");
        assert_eq!(registry_of("127.0.0.1:5000/app"), "127.0.0.1:5000");
        assert_eq!(registry_of("localhost/app"), "localhost");
    }

    #[test]
    fn credentials_come_from_config_json_by_host_and_are_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        std::fs::write(
            dir.path().join("config.json"),
            format!(r#"{{"auths": {{"https://reg.example:5000/v1/": {{"auth": "{auth}"}}, "bad.example": {{"auth": "not-base64!"}}}}}}"#),
        )
        .unwrap();
        // SAFETY: this test alone sets DOCKER_CONFIG, and reads it before returning.
        unsafe { std::env::set_var("DOCKER_CONFIG", dir.path()) };
        let (found, missing) = credentials(&[
            "reg.example:5000/app:1",
            "nginx:1",
            "reg.example:5000/other",
        ])
        .unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].username, "alice");
        assert_eq!(found[0].password, "s3cret");
        assert!(!format!("{:?}", found[0]).contains("s3cret"));
        assert_eq!(missing, [DOCKER_HUB]);
        assert!(for_image(&found, "reg.example:5000/app:2").is_some());
        let e = credentials(&["bad.example/app"]).unwrap_err().to_string();
        assert!(
            e.contains("\"bad.example\"") && !e.contains("not-base64"),
            "{e}"
        );
        unsafe { std::env::remove_var("DOCKER_CONFIG") };
    }
}
