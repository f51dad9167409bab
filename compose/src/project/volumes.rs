//! The top-level `volumes:`: each declaration converted to a Docker Volume spec, and the ones
//! the included services mount.

use std::collections::{BTreeMap, BTreeSet};

use ployz_core::VolumeSpec;

use crate::service::keys::unknown_under;
use crate::service::{boolean, kv_entries, text};
use crate::yaml::Node;
use crate::Diagnostics;

use super::{Project, VolumeDecl};

impl Project<'_> {
    /// Every top-level volume, converted (errors for all, warnings kept for the used ones).
    pub(super) fn volumes(&self, d: &mut Diagnostics) -> BTreeMap<String, VolumeDecl> {
        let mut out = BTreeMap::new();
        let entries = match self.root.get("volumes") {
            None | Some(Node::Null) => return out,
            Some(Node::Map(e)) => e,
            Some(other) => {
                d.error(
                    self.top_file("volumes"),
                    None,
                    Some("volumes"),
                    Some(other.short()),
                    format!("expected a mapping of volumes, found {}", other.kind()),
                    None,
                );
                return out;
            }
        };
        for (key, node) in entries {
            let file = self.section_file("volumes", key).to_owned();
            out.insert(key.clone(), volume_decl(key, node, &file, d));
        }
        out
    }
}

/// The warnings of the top-level volumes some service mounts (`used`).
pub(super) fn used_volume_warnings(
    used: &BTreeSet<String>,
    volumes: &BTreeMap<String, VolumeDecl>,
    d: &mut Diagnostics,
) {
    for key in used {
        if let Some(decl) = volumes.get(key) {
            for (k, m) in &decl.warnings {
                d.warn(&decl.file, None, k, m.clone());
            }
        }
    }
}

/// The Docker Volumes of the top-level volumes some service mounts (`used`), by Docker Volume
/// name; two declarations of one Docker Volume must agree.
pub(super) fn used_volumes(
    used: &BTreeSet<String>,
    volumes: &BTreeMap<String, VolumeDecl>,
    d: &mut Diagnostics,
) -> Vec<VolumeSpec> {
    let mut out_volumes: BTreeMap<String, VolumeSpec> = BTreeMap::new();
    for key in used {
        let Some(decl) = volumes.get(key) else {
            continue;
        };
        match out_volumes.get(&decl.spec.name) {
            Some(existing) if *existing != decl.spec => d.error(
                &decl.file,
                None,
                Some(&format!("volumes.{key}")),
                Some(decl.spec.name.clone()),
                "two top-level volumes name the same Docker Volume with different settings",
                Some("give them different name: values, or the same settings".into()),
            ),
            _ => {
                out_volumes.insert(decl.spec.name.clone(), decl.spec.clone());
            }
        }
    }
    out_volumes.into_values().collect()
}

/// One top-level volume. Declared even when broken, so services mounting it get no second
/// "not declared" error.
fn volume_decl(key: &str, node: &Node, file: &str, d: &mut Diagnostics) -> VolumeDecl {
    let k = format!("volumes.{key}");
    let mut spec = VolumeSpec {
        name: key.to_owned(),
        driver: None,
        driver_opts: BTreeMap::new(),
        labels: BTreeMap::new(),
        external: false,
    };
    let mut warnings = Vec::new();
    match node {
        Node::Null => {}
        Node::Map(entries) => {
            for (field, v) in entries {
                volume_field(&k, field, v, file, &mut spec, &mut warnings, d);
            }
        }
        other => {
            d.error(
                file,
                None,
                Some(&k),
                Some(other.short()),
                format!(
                    "expected a mapping (driver:, name:, ...) or nothing, found {}",
                    other.kind()
                ),
                None,
            );
        }
    }
    check_volume(&k, &spec, file, &mut warnings, d);
    VolumeDecl {
        spec,
        warnings,
        file: file.to_owned(),
    }
}

/// One field of a top-level volume (`volumes.<key>` is `k`); unknown fields are warnings kept
/// for when a service uses the volume.
fn volume_field(
    k: &str,
    field: &str,
    v: &Node,
    file: &str,
    spec: &mut VolumeSpec,
    warnings: &mut Vec<(String, String)>,
    d: &mut Diagnostics,
) {
    let fk = format!("{k}.{field}");
    match field {
        "name" => match text(v) {
            Ok(n) => spec.name = n,
            Err(m) => d.error(file, None, Some(&fk), Some(v.short()), m, None),
        },
        "driver" => match text(v) {
            Ok(n) => spec.driver = Some(n),
            Err(m) => d.error(file, None, Some(&fk), Some(v.short()), m, None),
        },
        "driver_opts" | "labels" => match kv_entries(v) {
            Ok(entries) => {
                let map = entries
                    .into_iter()
                    .map(|(a, b)| (a, b.unwrap_or_default()))
                    .collect();
                if field == "labels" {
                    spec.labels = map;
                } else {
                    spec.driver_opts = map;
                }
            }
            Err(m) => d.error(file, None, Some(&fk), Some(v.short()), m, None),
        },
        "external" => match v {
            Node::Map(_) => {
                spec.external = true;
                if let Some(n) = v.get("name").and_then(Node::scalar_text) {
                    spec.name = n;
                }
            }
            other => match boolean(other) {
                Ok(b) => spec.external = b,
                Err(m) => d.error(file, None, Some(&fk), Some(other.short()), m, None),
            },
        },
        _ if field.starts_with("x-") => {}
        other => warnings.push((fk, unknown_under("volumes.*", other))),
    }
}

/// What a volume's fields say together: an external volume sets no driver, the name is
/// Docker's shape, and a bind in disguise is a warning.
fn check_volume(
    k: &str,
    spec: &VolumeSpec,
    file: &str,
    warnings: &mut Vec<(String, String)>,
    d: &mut Diagnostics,
) {
    if spec.external
        && (spec.driver.is_some() || !spec.driver_opts.is_empty() || !spec.labels.is_empty())
    {
        d.error(
            file,
            None,
            Some(k),
            None,
            "an external volume cannot set driver, driver_opts or labels: it already exists",
            Some("remove them, or drop external: true to let the Deploy create it".into()),
        );
    }
    if !valid_volume_name(&spec.name) {
        d.error(
            file,
            None,
            Some(k),
            Some(spec.name.clone()),
            "not a valid Docker Volume name",
            Some("use at least 2 characters of letters, digits, '_', '.' and '-', starting with a letter or digit".into()),
        );
    }
    let o = spec.driver_opts.get("o").cloned().unwrap_or_default();
    if o.contains("bind") {
        if let Some(device) = spec.driver_opts.get("device") {
            warnings.push((
                format!("{k}.driver_opts"),
                format!(
                    "this volume binds the Machine's path '{device}' (driver_opts o: {o}), a Bind Mount in disguise"
                ),
            ));
        }
    }
}

/// Docker's rule for a volume name.
fn valid_volume_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() >= 2
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}
