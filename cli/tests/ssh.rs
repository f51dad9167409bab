//! `--connect ssh://` against a real `sshd` on loopback, started by the test with its own config
//! and keys: the API travels through `ployz dial-stdio`, and a changed host key is refused.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const SSHD: &str = "/usr/sbin/sshd";

fn keygen(path: &Path) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(path.with_extension("pub"));
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen runs (Debian package openssh-client)");
    assert!(ok.success());
}

/// A private sshd on 127.0.0.1:port, stopped by PID on drop.
struct Sshd {
    child: Child,
}

impl Sshd {
    fn start(lab: &Lab, port: u16) -> Sshd {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: install Debian's openssh-server (scripts/test.sh does)"
        );
        std::fs::create_dir_all("/run/sshd").unwrap();
        let bin_dir = Path::new(PLOYZ).parent().unwrap();
        let config = lab.path("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nAuthorizedKeysFile {auth}\n\
                 PidFile {pid}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n\
                 SetEnv PATH={bin}:/usr/local/bin:/usr/bin:/bin\n",
                host_key = lab.path("host_key").display(),
                auth = lab.path("authorized_keys").display(),
                pid = lab.path("sshd.pid").display(),
                bin = bin_dir.display(),
            ),
        )
        .unwrap();
        let log = std::fs::File::create(lab.path("sshd.log")).unwrap();
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "sshd did not listen: {}",
                std::fs::read_to_string(lab.path("sshd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Sshd { child }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(5));
    }
}

fn user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
#[ignore = "needs sshd (scripts/test.sh runs it)"]
fn the_api_travels_over_ssh_and_a_changed_host_key_is_refused() {
    let lab = Lab::new();
    let daemon = lab.daemon("m1");
    assert!(lab
        .ployz(&daemon, &["machine", "init", "--name", "over-ssh"])
        .status
        .success());

    keygen(&lab.path("host_key"));
    keygen(&lab.path("client_key"));
    std::fs::copy(lab.path("client_key.pub"), lab.path("authorized_keys")).unwrap();
    let ssh_config = lab.path("ssh_config");
    std::fs::write(
        &ssh_config,
        format!(
            "Host *\n  UserKnownHostsFile {}\n  IdentityFile {}\n  IdentitiesOnly yes\n",
            lab.path("known_hosts").display(),
            lab.path("client_key").display()
        ),
    )
    .unwrap();
    let port = free_port();
    let url = format!(
        "ssh://{}@127.0.0.1:{port}?socket={}",
        user(),
        daemon.socket.display()
    );
    let over_ssh = |args: &[&str]| {
        lab.cli()
            .env(
                "PLOYZ_SSH_COMMAND",
                format!("ssh -F {}", ssh_config.display()),
            )
            .arg("--connect")
            .arg(&url)
            .args(args)
            .output()
            .unwrap()
    };

    let sshd = Sshd::start(&lab, port);
    let ls = json(&over_ssh(&["machine", "ls", "--json"]));
    assert_eq!(ls["values"][0]["name"], "over-ssh");
    // accept-new recorded the host key on first use.
    let known = std::fs::read_to_string(lab.path("known_hosts")).unwrap();
    assert!(known.contains("ssh-ed25519"), "{known}");
    // A second call reuses the recorded key.
    assert!(over_ssh(&["machine", "ls"]).status.success());

    // A context whose first host is down: ssh starts either way, so only an answer tells the
    // connections apart; the command goes to the next one.
    let dead = format!("ssh://{}@127.0.0.1:{}", user(), free_port());
    let in_context = |args: &[&str]| {
        lab.cli()
            .env(
                "PLOYZ_SSH_COMMAND",
                format!("ssh -F {}", ssh_config.display()),
            )
            .args(args)
            .output()
            .unwrap()
    };
    let add = in_context(&["ctx", "add", "fleet", &dead, &url]);
    assert!(add.status.success(), "{}", stderr(&add));
    let ls = in_context(&["machine", "ls", "--json"]);
    assert!(
        ls.status.success(),
        "the dead first host was not passed over: {}",
        stderr(&ls)
    );
    assert_eq!(json(&ls)["values"][0]["name"], "over-ssh");
    assert!(
        stderr(&ls).contains("warning: passed over: ")
            && stderr(&ls).contains(&format!("using {url}")),
        "{}",
        stderr(&ls)
    );
    // None answers: the error names each connection and what became of it.
    let add = in_context(&[
        "ctx",
        "add",
        "down",
        &dead,
        &dead.replace("127.0.0.1", "127.0.0.2"),
    ]);
    assert!(add.status.success(), "{}", stderr(&add));
    let out = in_context(&["-c", "down", "machine", "ls"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.starts_with("error: no connection answered: "), "{err}");
    assert!(
        err.contains("127.0.0.1")
            && err.contains("127.0.0.2")
            && err.contains("Connection refused"),
        "{err}"
    );
    drop(sshd);

    // Same address, new host key: the CLI must refuse, not re-accept.
    keygen(&lab.path("host_key"));
    let _sshd = Sshd::start(&lab, port);
    let out = over_ssh(&["machine", "ls", "--json"]);
    assert!(
        !out.status.success(),
        "a changed host key was accepted: {}",
        stdout(&out)
    );
    let err = stderr(&out);
    assert!(
        err.contains("Host key verification failed")
            || err.contains("HOST IDENTIFICATION HAS CHANGED"),
        "{err}"
    );
    assert!(
        err.starts_with("error: cannot reach the daemon at ssh://"),
        "{err}"
    );
    assert!(stdout(&out).is_empty());
}
