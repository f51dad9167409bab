//! The Compose corpus: Compose projects in the shapes real projects ship (self-hosting guides,
//! sample collections), each in its own folder under `compose/tests/corpus/`. Every project must
//! load without errors and plan against one empty Machine; what it loads and plans is rendered
//! compactly and compared with the project's `expected.txt`.
//!
//! A project folder holds `compose.yaml` (or `compose.yml`, `docker-compose.yaml`,
//! `docker-compose.yml`), or a `files` text file naming its `-f` files in order (one per line);
//! an optional `profiles` text file names the `--profile`s to enable (one per line). Beside them
//! sit whatever the project ships: `.env`, config and secret files, relative folders.
//!
//! `PLOYZ_BLESS=1 cargo test -p ployz --test corpus` writes each `expected.txt` from what the
//! code does now instead of comparing; review the diff before committing it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ployz_compose::{load, ComposeInput, LoadedProject};
use ployz_core::api::{MachineInfo, MachineView};
use ployz_core::{
    ClusterNetwork, DeployIntent, DeployPlan, LocalMachinePhase, MachineId, MachineSnapshot,
    ManagementAddress, MembershipObservation, ServiceSpec,
};
use ployz_orchestrator::plan::{plan, PlanOptions};
use ployz_orchestrator::preview;
use serde_json::Value;

/// The corpus root: one folder per project.
fn corpus_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../compose/tests/corpus");
    dir.canonicalize().unwrap_or(dir)
}

/// Every project folder, by name.
fn projects() -> Vec<(String, PathBuf)> {
    let root = corpus_dir();
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("reading the corpus at {}: {e}", root.display()))
        .map(|entry| entry.expect("a corpus folder entry").path())
        .filter(|p| p.is_dir())
        .map(|p| {
            let name = p
                .file_name()
                .expect("a project folder has a name")
                .to_string_lossy()
                .into_owned();
            (name, p)
        })
        .collect();
    out.sort();
    out
}

/// The lines of an optional list file in `dir` (`files`, `profiles`), blank lines and `#`
/// comments skipped.
fn list_file(dir: &Path, name: &str) -> Vec<String> {
    match std::fs::read_to_string(dir.join(name)) {
        Ok(text) => text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect(),
        Err(_) => vec![],
    }
}

/// The `-f` files of a project, as `ployz deploy` would pick them in its folder.
fn compose_files(dir: &Path) -> Vec<PathBuf> {
    let listed = list_file(dir, "files");
    if !listed.is_empty() {
        return listed.iter().map(|f| dir.join(f)).collect();
    }
    for name in [
        "compose.yaml",
        "compose.yml",
        "docker-compose.yaml",
        "docker-compose.yml",
    ] {
        let p = dir.join(name);
        if p.exists() {
            return vec![p];
        }
    }
    panic!(
        "{}: no compose.yaml, compose.yml, docker-compose.yaml, docker-compose.yml or files list",
        dir.display()
    );
}

/// The home directory the loader expands `~` to.
fn home() -> String {
    std::env::var("HOME").unwrap_or_else(|_| "/root".to_owned())
}

/// Loads a project with only `HOME` in the environment, so the result depends on its folder alone.
fn load_project(dir: &Path) -> Result<LoadedProject, String> {
    let env: BTreeMap<String, String> = [("HOME".to_owned(), home())].into();
    load(&ComposeInput {
        files: compose_files(dir),
        profiles: list_file(dir, "profiles"),
        env,
    })
    .map_err(|e| e.to_string())
}

/// The fixed Deploy Snapshot: one empty, participating Machine named `m1`. Built through serde
/// so that observations a newer snapshot carries take their defaults.
fn empty_machine() -> MachineSnapshot {
    let net = ClusterNetwork::default();
    let view = MachineView {
        info: MachineInfo {
            id: MachineId::generate(),
            name: "m1".parse().expect("m1 is a Machine Name"),
            phase: LocalMachinePhase::Participating,
            subnet: net
                .first_free_subnet(&[])
                .expect("the default network has a free subnet"),
            public_key: String::new(),
            management_address: ManagementAddress::from_public_key(&[0; 32]),
            endpoints: Vec::new(),
            version: String::new(),
            wireguard_backend: None,
            edge_features: ployz_core::EdgeFeature::published(),
        },
        membership: MembershipObservation::Up,
        selected_endpoint: None,
        subnet_collisions: Vec::new(),
    };
    let snapshot = serde_json::json!({
        "machine": serde_json::to_value(&view).expect("a Machine view serialises"),
        "containers": [],
        "volumes": [],
        "images": [],
    });
    serde_json::from_value(snapshot).expect("an empty Machine snapshot deserialises")
}

fn plan_project(
    project: &LoadedProject,
    machines: &[MachineSnapshot],
) -> Result<DeployPlan, String> {
    let intent = DeployIntent::all(project.services.clone(), project.volumes.clone());
    plan(&intent, machines, &PlanOptions::default()).map_err(|e| e.to_string())
}

/// The DNS label of a Service Name: lowercase, `_` and `.` turned into `-`.
fn dns_label(name: &str) -> String {
    name.to_lowercase().replace(['_', '.'], "-")
}

/// A path with the project folder shown as `<project>`, its parent (the corpus) as `<corpus>`
/// and the home directory as `<home>`.
fn relative_path(path: &str, dir: &Path) -> String {
    let mut out = path.to_owned();
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    for (from, to) in [
        (canonical.clone(), "<project>"),
        (dir.to_path_buf(), "<project>"),
    ] {
        out = out.replace(&*from.to_string_lossy(), to);
    }
    for parent in [canonical.parent(), dir.parent()].into_iter().flatten() {
        out = out.replace(&*parent.to_string_lossy(), "<corpus>");
    }
    let home = home();
    if !home.is_empty() && home != "/" {
        out = out.replace(&home, "<home>");
    }
    out
}

/// One mount as `type source -> target [ro]`, read from its serialised form (so any mount type
/// renders, whichever this build knows).
fn render_mount(mount: &Value, dir: &Path) -> String {
    let kind = mount["type"].as_str().unwrap_or("?");
    let mut line = kind.to_owned();
    if let Some(source) = mount["source"].as_str() {
        let _ = write!(line, " {}", relative_path(source, dir));
    }
    let _ = write!(line, " -> {}", mount["target"].as_str().unwrap_or("?"));
    if mount["read_only"].as_bool().unwrap_or(false) {
        line.push_str(" ro");
    }
    line
}

fn render_service(out: &mut String, spec: &ServiceSpec, project: &LoadedProject, dir: &Path) {
    let name = spec.name.as_str();
    let _ = writeln!(out, "service {name}");
    let _ = writeln!(out, "  dns: {}", dns_label(name));
    let _ = writeln!(out, "  image: {}", spec.container.image);
    let _ = writeln!(
        out,
        "  mode: {} x{}",
        spec.mode.as_str(),
        match spec.mode {
            ployz_core::ServiceMode::Replicated => spec.replicas,
            ployz_core::ServiceMode::Global => 1,
        }
    );
    let mut ports: Vec<String> = spec.ports.iter().map(ToString::to_string).collect();
    ports.sort();
    for port in ports {
        let _ = writeln!(out, "  port: {port}");
    }
    let container = serde_json::to_value(&spec.container).expect("a container spec serialises");
    for mount in container["mounts"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "  mount: {}", render_mount(mount, dir));
    }
    for (kind, field) in [("config", "configs"), ("secret", "secrets")] {
        let mut targets: Vec<&str> = container[field]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| f["target"].as_str().unwrap_or("?"))
            .collect();
        targets.sort();
        for target in targets {
            let _ = writeln!(out, "  {kind}: {target}");
        }
    }
    let mut keys: Vec<&str> = project
        .warnings
        .iter()
        .filter(|w| w.service.as_deref() == Some(name))
        .map(|w| w.key.as_str())
        .collect();
    keys.sort();
    let _ = writeln!(out, "  warnings: {}{}", keys.len(), listed(&keys));
}

/// ` (a, b)`, or nothing for an empty list.
fn listed(keys: &[&str]) -> String {
    if keys.is_empty() {
        String::new()
    } else {
        format!(" ({})", keys.join(", "))
    }
}

/// The compact, stable rendering `expected.txt` holds: per Service (in load order) what was
/// loaded, with ports, configs, secrets and warning keys sorted; the named volumes; the
/// project's own warnings; then the plan's operations in the preview's words.
fn render(
    dir: &Path,
    project: &LoadedProject,
    plan: &DeployPlan,
    machines: &[MachineSnapshot],
) -> String {
    let mut out = String::new();
    for spec in &project.services {
        render_service(&mut out, spec, project, dir);
    }
    for volume in &project.volumes {
        let external = if volume.external { " (external)" } else { "" };
        let _ = writeln!(out, "volume {}{external}", volume.name);
    }
    let mut top: Vec<&str> = project
        .warnings
        .iter()
        .filter(|w| w.service.is_none())
        .map(|w| w.key.as_str())
        .collect();
    top.sort();
    let _ = writeln!(out, "project warnings: {}{}", top.len(), listed(&top));
    out.push_str("plan:\n");
    for op in &plan.volume_operations {
        let _ = writeln!(out, "  {}", preview::describe(op, machines));
    }
    for service in &plan.services {
        for op in &service.operations {
            let _ = writeln!(
                out,
                "  {}: {}",
                service.name,
                preview::describe(op, machines)
            );
        }
    }
    out
}

/// Loads, plans and renders one project; `Err` names what failed.
fn rendered(dir: &Path) -> Result<String, String> {
    let project = load_project(dir).map_err(|e| format!("load:\n{e}"))?;
    let machines = [empty_machine()];
    let plan = plan_project(&project, &machines).map_err(|e| format!("plan: {e}"))?;
    Ok(render(dir, &project, &plan, &machines))
}

/// The corpus is large enough to mean something.
const MIN_PROJECTS: usize = 40;

#[test]
fn every_project_loads_and_plans() {
    let all = projects();
    let mut failures = Vec::new();
    for (name, dir) in &all {
        let result = load_project(dir).and_then(|p| {
            plan_project(&p, &[empty_machine()])
                .map(|_| ())
                .map_err(|e| format!("plan: {e}"))
        });
        if let Err(e) = result {
            failures.push(format!("{name}:\n{e}"));
        }
    }
    println!("{} corpus projects, {} failing", all.len(), failures.len());
    assert!(
        all.len() >= MIN_PROJECTS,
        "the corpus has {} projects, at least {MIN_PROJECTS} expected",
        all.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} corpus projects do not load and plan:\n\n{}",
        failures.len(),
        all.len(),
        failures.join("\n\n")
    );
}

#[test]
fn every_project_loads_and_plans_as_expected() {
    let bless = std::env::var("PLOYZ_BLESS").is_ok_and(|v| v == "1");
    let mut mismatches = Vec::new();
    for (name, dir) in projects() {
        let got = match rendered(&dir) {
            Ok(text) => text,
            Err(e) => format!("error: {e}\n"),
        };
        let path = dir.join("expected.txt");
        if bless {
            std::fs::write(&path, &got)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            continue;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        if got != expected {
            mismatches.push(format!(
                "{name}: {} differs\n--- expected\n{expected}--- got\n{got}",
                path.display()
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} corpus projects render differently from their expected.txt (after reviewing, \
         PLOYZ_BLESS=1 cargo test -p ployz --test corpus writes what the code does now):\n\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}
