//! What the daemon does with a damaged data dir and a full disk, end to end.
//!
//! A Machine with an imported certificate and a Certificate Policy is stopped; its data dir is
//! then damaged the ways disks and people damage them. The daemon must refuse to start, naming
//! what is missing and the ways out, and `--accept-data-loss` must start it anyway. On a 2 MiB
//! tmpfs filled up, writes fail clearly, health answers 503, reads show only what is on disk,
//! and everything resumes without a restart once space returns.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A self-signed certificate for `host` in `dir`: `cert.pem`, `cert.key`.
fn self_signed(dir: &Path, host: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "cert.key",
            "-out",
            "cert.pem",
            "-days",
            "2",
            "-subj",
            &format!("/CN={host}"),
            "-addext",
            &format!("subjectAltName=DNS:{host}"),
        ],
    );
}

/// Copies a data dir (regular files and directories, modes kept).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &target);
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// How `ployz daemon run` ended on a data dir it must refuse.
struct Refusal {
    code: Option<i32>,
    output: String,
}

/// Runs the daemon on `data_dir` and waits for it to exit. Panics if its edge starts listening
/// (it started on a damaged data dir) or if it neither starts nor exits within 30 s.
fn daemon_refusing(lab: &Lab, data_dir: &Path, extra: &[&str]) -> Refusal {
    let [http, https, metrics] = free_ports();
    let name = data_dir.file_name().unwrap().to_string_lossy().into_owned();
    let log = lab.path(&format!("{name}.refusal.log"));
    let file = std::fs::File::create(&log).unwrap();
    let child = Command::new(PLOYZ)
        .args(["daemon", "run", "--data-dir"])
        .arg(data_dir)
        .arg("--socket")
        .arg(lab.path(&format!("{name}.sock")))
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .args(["--https-listen", &format!("127.0.0.1:{https}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .args(QUIET_DAEMON)
        .arg("--no-mesh")
        .args(extra)
        .env("PLOYZ_LOG", "info")
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let mut child = Reaped(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            return Refusal {
                code: status.code(),
                output: std::fs::read_to_string(&log).unwrap_or_default(),
            };
        }
        if std::net::TcpStream::connect(("127.0.0.1", http)).is_ok() {
            let output = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("the daemon started on a damaged data dir ({name}): {output}");
        }
        assert!(
            Instant::now() < deadline,
            "the daemon neither started nor exited on {name}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A stopped Machine's data dir holding an imported certificate and a Certificate Policy:
/// (the data dir, the policy as shown, the Machine's public key).
fn prepared_data_dir(lab: &Lab) -> (PathBuf, serde_json::Value, String) {
    let mut daemon = lab.daemon("source");
    let init = json(&lab.ployz(&daemon, &["machine", "init", "--name", "m1", "--json"]));
    self_signed(lab.dir.path(), "app.test.localhost");
    let out = lab.ployz(
        &daemon,
        &[
            "cert",
            "import",
            "app.test.localhost",
            "--cert",
            &lab.path("cert.pem").display().to_string(),
            "--key",
            &lab.path("cert.key").display().to_string(),
        ],
    );
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    for fraction in ["0.4", "0.5"] {
        let out = lab.ployz(
            &daemon,
            &["cert", "policy", "set", "--renew-fraction", fraction],
        );
        assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    }
    let policy = json(&lab.ployz(&daemon, &["cert", "policy", "show", "--json"]));
    assert_eq!(policy["renewal_fraction"], 0.5, "{policy}");
    let certs = json(&lab.ployz(&daemon, &["cert", "ls", "--json"]));
    assert!(certs.to_string().contains("app.test.localhost"), "{certs}");
    let machines = json(&lab.ployz(&daemon, &["machine", "ls", "--json"]));
    let public_key = machines.to_string();
    assert!(daemon.stop(), "the daemon did not stop on SIGTERM");
    assert!(init["id"].is_string());
    (daemon.data_dir.clone(), policy, public_key)
}

/// Where written data ends in `path`: just past the last non-zero byte.
fn data_end(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
}

type Damage = fn(&Path);

fn truncate_db(dir: &Path) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("store/db"))
        .unwrap();
    f.set_len(1000).unwrap();
}

fn empty_db(dir: &Path) {
    std::fs::write(dir.join("store/db"), b"").unwrap();
}

fn flip_eight_bytes(dir: &Path) {
    let path = dir.join("store/db");
    let mut bytes = std::fs::read(&path).unwrap();
    let needle = b"renewal_fraction";
    let at = bytes
        .windows(needle.len())
        .rposition(|w| w == needle)
        .expect("the policy is in the store's file");
    for b in &mut bytes[at..at + 8] {
        *b ^= 0xFF;
    }
    std::fs::write(&path, bytes).unwrap();
}

fn delete_store(dir: &Path) {
    std::fs::remove_dir_all(dir.join("store")).unwrap();
}

fn delete_store_and_record(dir: &Path) {
    std::fs::remove_dir_all(dir.join("store")).unwrap();
    std::fs::remove_file(dir.join("store.ack")).unwrap();
}

fn noise_near_the_end(dir: &Path) {
    let path = dir.join("store/db");
    let mut bytes = std::fs::read(&path).unwrap();
    let end = data_end(&bytes);
    let mut x: u32 = 0x9E37_79B9;
    for b in &mut bytes[end.saturating_sub(4096)..end] {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    std::fs::write(&path, bytes).unwrap();
}

fn delete_key(dir: &Path) {
    std::fs::remove_file(dir.join("wireguard.key")).unwrap();
}

#[test]
#[ignore = "needs dockerd: a Machine's init connects to Docker (scripts/test.sh runs it)"]
fn a_damaged_store_or_a_missing_key_is_refused_naming_what_is_missing_until_the_loss_is_accepted() {
    let lab = Lab::new();
    let (source, policy, machines_before) = prepared_data_dir(&lab);
    let shapes: [(&str, Damage, &[&str]); 7] = [
        ("truncated", truncate_db, &[]),
        ("emptied", empty_db, &[]),
        ("flipped", flip_eight_bytes, &[]),
        (
            "deleted",
            delete_store,
            &[
                "this Machine acknowledged writes up to sequence",
                "the store holds up to 0",
            ],
        ),
        (
            "deleted-with-record",
            delete_store_and_record,
            &["holds nothing of this Machine"],
        ),
        ("noise", noise_near_the_end, &[]),
        (
            "keyless",
            delete_key,
            &["WireGuard private key", "is missing", "Management Address"],
        ),
    ];
    for (name, damage, expected) in shapes {
        let dir = lab.path(&format!("{name}-data"));
        copy_dir(&source, &dir);
        damage(&dir);

        let refused = daemon_refusing(&lab, &dir, &[]);
        let output = &refused.output;
        assert_eq!(refused.code, Some(1), "{name}: {output}");
        let error = output
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or_else(|| panic!("{name}: no error line: {output}"));
        eprintln!("{name}: {error}");
        assert!(
            error.contains("holds less than this Machine acknowledged")
                || error.contains("is unreadable")
                || error.contains("holds nothing of this Machine")
                || error.contains("WireGuard private key"),
            "{name}: {error}"
        );
        for needle in
            expected
                .iter()
                .chain(&["restore the data dir", "--accept-data-loss", "peers"])
        {
            assert!(
                error.contains(needle),
                "{name}: missing {needle:?}: {error}"
            );
        }

        // Accepting the loss starts it, serving what is left; and from then on it starts as
        // usual.
        let mut daemon = Daemon::start_with(
            dir.clone(),
            lab.path(&format!("{name}.sock")),
            0,
            &[
                "--no-certificates",
                "--dns-listen",
                "off",
                "--accept-data-loss",
            ],
        );
        assert!(
            daemon.log_text().contains("accepted"),
            "{name}: the loss was not logged: {}",
            daemon.log_text()
        );
        let shown = json(&lab.ployz(&daemon, &["cert", "policy", "show", "--json"]));
        if name == "keyless" {
            assert_eq!(shown, policy, "{name}: the store was intact");
            let machines = json(&lab.ployz(&daemon, &["machine", "ls", "--json"])).to_string();
            assert_ne!(
                machines, machines_before,
                "{name}: the public key did not change"
            );
        }
        let out = lab.ployz(
            &daemon,
            &["cert", "policy", "set", "--renew-fraction", "0.6"],
        );
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        assert!(daemon.stop(), "{name}: the daemon did not stop on SIGTERM");
        let daemon = Daemon::start(dir.clone(), lab.path(&format!("{name}.sock")));
        let shown = json(&lab.ployz(&daemon, &["cert", "policy", "show", "--json"]));
        assert_eq!(shown["renewal_fraction"], 0.6, "{name}: {shown}");
    }
}

/// A tmpfs mounted on `path` (created), unmounted when dropped even if the test fails.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: PathBuf, size: &str) -> Tmpfs {
        std::fs::create_dir_all(&path).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "cannot mount a tmpfs (this test needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(path)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// Fills the filesystem holding `dir` with one file; returns its path.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write as _;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xA5u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    path
}

/// Polls the edge's health endpoint until it answers `status`; returns the body.
fn health_becomes(port: u16, status: u16, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (s, body) = http_get(port, "anything", "/.ployz/health");
        if s == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "health still answers {s}, not {status}: {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs dockerd, and root to mount a tmpfs (scripts/test.sh runs it)"]
fn a_full_disk_fails_writes_clearly_answers_health_503_shows_durable_values_and_recovers_without_restart(
) {
    let lab = Lab::new();
    // Dropped in reverse: the Machine (daemon stopped, containers removed), then the tmpfs.
    let tmpfs = Tmpfs::mount(lab.path("full-data"), "2m");
    let m = DockerMachine::new(&lab, "full");
    let port = m.daemon.http_port;
    health_becomes(port, 200, Duration::from_secs(10));
    let set = |fraction: &str| {
        run(
            &lab,
            &m,
            &["cert", "policy", "set", "--renew-fraction", fraction],
        )
    };
    let show =
        || json(&run(&lab, &m, &["cert", "policy", "show", "--json"]))["renewal_fraction"].clone();
    let out = set("0.5");
    assert!(out.status.success(), "{}", stderr(&out));

    let filler = fill(&tmpfs.0);
    // A write that lands in space the store already had may still be taken (and is then on
    // disk); one soon is refused.
    let mut durable = serde_json::json!(0.5);
    let refusal = (1..=40)
        .find_map(|i| {
            let fraction = format!("0.{:02}", 50 + i);
            let out = set(&fraction);
            if out.status.success() {
                durable = fraction.parse::<f64>().unwrap().into();
                None
            } else {
                Some((fraction, stderr(&out)))
            }
        })
        .expect("a full disk took 40 writes");
    let (refused_value, error) = refusal;
    eprintln!("refused: {error}");
    assert!(
        error.contains("cannot write") || error.contains("No space left on device"),
        "{error}"
    );
    assert_eq!(error.trim_end().lines().count(), 1, "{error}");
    let body = health_becomes(port, 503, Duration::from_secs(5));
    eprintln!("health: {body}");
    assert!(body.contains("store cannot write"), "{body}");
    // Reads show what is on disk, never the refused value.
    assert_eq!(show(), durable, "refused value {refused_value} shown");

    // A Deploy in this window fails instead of reporting success with nothing routed.
    std::fs::write(
        lab.path("compose.yaml"),
        format!(
            r#"
services:
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "echo full-disk-ok > /www/index.html && exec httpd -f -p 8080 -h /www"]
    volumes:
      - {data}:/data
    x-ports:
      - web.full.localhost:8080/http
    x-pre_deploy:
      command: ["sh", "-c", "if [ -e /data/fill-now ]; then dd if=/dev/zero of=/data/hook-filler bs=4096 2>/dev/null; fi; true"]
"#,
            data = tmpfs.0.display()
        ),
    )
    .unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    eprintln!("deploy: {text}");
    assert!(
        !out.status.success(),
        "a Deploy succeeded on a full disk: {text}"
    );
    assert!(!text.contains("Deploy completed"), "{text}");
    assert!(
        text.contains("cannot write") || text.contains("cannot be stored"),
        "{text}"
    );

    std::fs::remove_file(&filler).unwrap();
    let body = health_becomes(port, 200, Duration::from_secs(15));
    assert!(body.contains("serving"), "{body}");
    let pid = m.daemon.pid();
    let out = set("0.8");
    assert!(
        out.status.success(),
        "writes did not resume: {}",
        stderr(&out)
    );
    assert_eq!(show(), serde_json::json!(0.8));

    // The disk fills while a Deploy runs (its pre-deploy hook fills it, after the Deploy took
    // the lease): the observations of what it starts cannot be stored, and it does not report
    // success.
    std::fs::write(tmpfs.0.join("fill-now"), b"").unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    let text = format!("{}{}", stdout(&out), stderr(&out));
    eprintln!("deploy filling the disk: {text}");
    assert!(
        !out.status.success(),
        "a Deploy succeeded while the disk filled: {text}"
    );
    assert!(!text.contains("Deploy completed"), "{text}");
    assert!(
        text.contains("cannot write") || text.contains("cannot be stored"),
        "{text}"
    );
    health_becomes(port, 503, Duration::from_secs(5));
    std::fs::remove_file(tmpfs.0.join("fill-now")).unwrap();
    std::fs::remove_file(tmpfs.0.join("hook-filler")).unwrap();
    health_becomes(port, 200, Duration::from_secs(15));

    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http_get(port, "web.full.localhost", "/");
        if status == 200 {
            assert_eq!(body.trim(), "full-disk-ok");
            break;
        }
        assert!(Instant::now() < deadline, "{status} {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(m.daemon.pid(), pid, "the daemon was restarted");

    // Lifting a drain mark the full disk will not let go of is refused, never reported done.
    let ps = json(&run(&lab, &m, &["ps", "--json"]))["values"].clone();
    let id = ps.as_array().unwrap()[0]["id"].as_str().unwrap().to_owned();
    let drain = format!("/v1/containers/{id}/drain");
    let marks = || api_request(&m.daemon.socket, "GET", "/v1/drains", "", b"");
    let (status, _, body) = api_request(
        &m.daemon.socket,
        "POST",
        &drain,
        "",
        br#"{"timeout_seconds":0}"#,
    );
    assert_eq!(status, 200, "{body}");
    let filler = fill(&tmpfs.0);
    // Writes until the store has met the full disk (one may still land on space sled holds).
    let deadline = Instant::now() + Duration::from_secs(15);
    while http_get(port, "anything", "/.ployz/health").0 != 503 {
        assert!(
            Instant::now() < deadline,
            "the store never met the full disk"
        );
        let _ = set("0.3");
    }
    let (status, _, body) = api_request(&m.daemon.socket, "DELETE", &drain, "", b"");
    assert_eq!(
        status, 503,
        "a lift the disk refused was answered {status}: {body}"
    );
    assert!(body.contains("cannot write"), "{body}");
    assert!(marks().2.contains(&id), "{:?}", marks());
    std::fs::remove_file(&filler).unwrap();
    health_becomes(port, 200, Duration::from_secs(15));
    let (status, _, body) = api_request(&m.daemon.socket, "DELETE", &drain, "", b"");
    assert_eq!(status, 200, "{body}");
    assert_eq!(marks().2.trim(), "[]", "{:?}", marks());
    drop(m);
    drop(tmpfs);
}

#[test]
#[ignore = "needs dockerd: a Machine's init connects to Docker (scripts/test.sh runs it)"]
fn a_lost_machine_json_is_said_at_start_and_init_sets_the_old_store_and_key_aside() {
    let lab = Lab::new();
    let (source, _, _) = prepared_data_dir(&lab);
    let dir = lab.path("no-identity-data");
    copy_dir(&source, &dir);
    let old_key = std::fs::read(dir.join("wireguard.key")).unwrap();
    std::fs::remove_file(dir.join("machine.json")).unwrap();

    // The daemon starts uninitialised, and says what it found.
    let daemon = Daemon::start(dir.clone(), lab.path("no-identity.sock"));
    let log = daemon.log_text();
    assert!(
        log.contains("machine.json is missing") && log.contains("restore machine.json"),
        "{log}"
    );
    // `machine init`, as its refusals hint, starts anew and deletes nothing: the old store,
    // its acknowledgement record and key are beside the new ones.
    let init = lab.ployz(&daemon, &["machine", "init", "--name", "anew", "--json"]);
    assert!(init.status.success(), "{}", stderr(&init));
    let aside = |prefix: &str| -> Vec<PathBuf> {
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .collect()
    };
    let stores = aside("store.lost-");
    assert_eq!(
        stores.len(),
        1,
        "{:?}",
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect::<Vec<_>>()
    );
    assert!(stores[0].join("db").exists() || std::fs::read_dir(&stores[0]).unwrap().count() > 0);
    assert_eq!(aside("store.ack.lost-").len(), 1);
    let keys = aside("wireguard.key.lost-");
    assert_eq!(keys.len(), 1);
    assert_eq!(std::fs::read(&keys[0]).unwrap(), old_key);
    assert!(dir.join("store").exists() && dir.join("machine.json").exists());
}

#[test]
#[ignore = "needs dockerd: a Machine's init connects to Docker (scripts/test.sh runs it)"]
fn a_clock_that_went_back_is_said_by_the_store_digest() {
    let lab = Lab::new();
    // An hour ahead (mesh.clock_offset_ms), a write, then the clock set right again.
    let ahead = lab.path("ahead.toml");
    std::fs::write(&ahead, "[mesh]\nclock_offset_ms = 3600000\n").unwrap();
    let ahead_args = [QUIET_DAEMON, &["--config", ahead.to_str().unwrap()]].concat();
    let mut daemon = Daemon::start_with(lab.path("data"), lab.path("ployz.sock"), 0, &ahead_args);
    let init = lab.ployz(&daemon, &["machine", "init", "--name", "jumped"]);
    assert!(init.status.success(), "{}", stderr(&init));
    let put = lab.ployz(&daemon, &["store", "put", "during=1"]);
    assert!(put.status.success(), "{}", stderr(&put));
    let digest = json(&lab.ployz(&daemon, &["store", "digest", "--json"]));
    assert!(digest["clock_went_back_ms"].is_null(), "{digest}");

    daemon.restart_with(QUIET_DAEMON);
    let digest = json(&lab.ployz(&daemon, &["store", "digest", "--json"]));
    let behind = digest["clock_went_back_ms"].as_u64().unwrap_or(0);
    assert!(
        (3_500_000..=3_600_000).contains(&behind),
        "the clock went back an hour: {digest}"
    );
    let table = lab.ployz(&daemon, &["store", "digest"]);
    assert!(
        stderr(&table).contains("warning: this Machine's clock went back 3")
            && stderr(&table).contains("the others refuse its writes"),
        "{}",
        stderr(&table)
    );
}
