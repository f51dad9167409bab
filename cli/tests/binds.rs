//! Mounts from a project folder, end to end: a read-only file travels as a config, a directory
//! is bound from the project directory, and an anonymous volume lives and dies with its
//! container. The real daemon, a real dockerd and the busybox test image.

mod common;

use common::*;
use serde_json::Value;

const PROJECT: &str = r#"
services:
  app:
    image: IMAGE
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    volumes:
      - ./conf/app.conf:/etc/app.conf:ro
      - ./conf/hello.sh:/usr/local/bin/hello.sh:ro
      - ./data:/data
      - /cache
"#;

/// Removes an anonymous volume by name when the test ends, also on panic (the Machine's own
/// cleanup removes its containers with their volumes; this covers a container already gone).
struct VolumeGuard(Option<String>);

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        if let Some(name) = &self.0 {
            docker(&["volume", "rm", "-f", name]);
        }
    }
}

/// The running container names of `service`, from `ployz ps --json`.
fn containers_of(lab: &Lab, m: &DockerMachine, service: &str) -> Vec<String> {
    let ps = json(&run(lab, m, &["ps", "--json"]))["values"].clone();
    ps.as_array()
        .expect("ps --json is a list")
        .iter()
        .filter(|c| c["service_name"] == service && c["state"] == "running")
        .map(|c| c["name"].as_str().expect("a container name").to_owned())
        .collect()
}

/// The container's mounts as Docker reports them.
fn docker_mounts(container: &str) -> Vec<Value> {
    let out = docker(&["inspect", "--format", "{{json .Mounts}}", container]);
    assert!(
        out.status.success(),
        "docker inspect {container}: {}",
        stderr(&out)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .expect("the mounts are JSON")
        .as_array()
        .expect("the mounts are a list")
        .clone()
}

fn wait_for(mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs dockerd"]
fn project_binds_travel_and_anonymous_volumes_go_with_their_container() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "binds1");
    std::fs::create_dir_all(lab.path("conf")).unwrap();
    std::fs::create_dir_all(lab.path("data")).unwrap();
    std::fs::write(lab.path("conf/app.conf"), "greeting = hello\n").unwrap();
    std::fs::write(
        lab.path("conf/hello.sh"),
        "#!/bin/sh\necho hello-from-script\n",
    )
    .unwrap();
    std::fs::set_permissions(
        lab.path("conf/hello.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(
        lab.path("compose.yaml"),
        PROJECT.replace("IMAGE", TEST_IMAGE),
    )
    .unwrap();

    // The preview warns once that the data directory must exist on the Machine; the read-only
    // file is not a bind, so it is not named.
    let data = lab.path("data").display().to_string();
    let preview = run(&lab, &m, &["deploy", "--dry-run"]);
    assert!(preview.status.success(), "{}", stderr(&preview));
    let said = format!("{}{}", stdout(&preview), stderr(&preview));
    let warning = format!("bind mount {data} must exist on every Machine the Service runs on");
    assert_eq!(said.matches(&warning).count(), 1, "{said}");
    assert!(!said.contains("app.conf must exist"), "{said}");

    let out = run(&lab, &m, &["deploy", "-y", "--json"]);
    let report = json(&out);
    assert!(report["outcome"]["failed"].is_null(), "{report:#}");
    let names = containers_of(&lab, &m, "app");
    assert_eq!(names.len(), 1, "{names:?}");
    let container = names[0].clone();

    // The read-only file's content was copied in.
    let conf = run(&lab, &m, &["exec", "app", "cat", "/etc/app.conf"]);
    assert!(conf.status.success(), "{}", stderr(&conf));
    assert_eq!(stdout(&conf), "greeting = hello\n");
    // A script keeps its execute bit, and nothing of the files' content is in any label.
    let script = run(&lab, &m, &["exec", "app", "/usr/local/bin/hello.sh"]);
    assert!(script.status.success(), "{}", stderr(&script));
    assert_eq!(stdout(&script), "hello-from-script\n");
    let labels = docker(&["inspect", "--format", "{{json .Config.Labels}}", &container]);
    let labels = String::from_utf8_lossy(&labels.stdout);
    assert!(
        !labels.contains("greeting") && !labels.contains("hello-from-script"),
        "a bound file's content is in the labels: {labels}"
    );

    // The data directory is the project's: a file written here is seen in the container.
    std::fs::write(lab.path("data/from-host.txt"), "written on the host\n").unwrap();
    let seen = run(&lab, &m, &["exec", "app", "cat", "/data/from-host.txt"]);
    assert!(seen.status.success(), "{}", stderr(&seen));
    assert_eq!(stdout(&seen), "written on the host\n");

    // /cache is a volume Docker made for this container.
    let mounts = docker_mounts(&container);
    let cache = mounts
        .iter()
        .find(|mt| mt["Destination"] == "/cache")
        .unwrap_or_else(|| panic!("no /cache mount: {mounts:#?}"));
    assert_eq!(cache["Type"], "volume", "{cache:#}");
    let volume = cache["Name"]
        .as_str()
        .expect("the anonymous volume has a name")
        .to_owned();
    let _guard = VolumeGuard(Some(volume.clone()));
    assert!(docker(&["volume", "inspect", &volume]).status.success());
    let data_mount = mounts
        .iter()
        .find(|mt| mt["Destination"] == "/data")
        .unwrap_or_else(|| panic!("no /data mount: {mounts:#?}"));
    assert_eq!(data_mount["Type"], "bind", "{data_mount:#}");
    assert_eq!(data_mount["Source"], data.as_str(), "{data_mount:#}");
    assert!(
        !mounts.iter().any(|mt| mt["Destination"] == "/etc/app.conf"),
        "the read-only file is copied, not bound: {mounts:#?}"
    );

    // Removing the Service removes its container and the container's anonymous volume.
    let out = run(&lab, &m, &["rm", "app", "-y"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for(
        || !m.docker_containers().iter().any(|(n, _)| n == &container),
        "the container gone from Docker",
    );
    assert!(
        !docker(&["volume", "inspect", &volume]).status.success(),
        "the anonymous volume {volume} outlived its container"
    );
}
