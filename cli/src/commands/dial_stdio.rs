//! `ployz dial-stdio`: a byte pipe between stdio and the local daemon's socket. `--connect
//! ssh://` runs it on the far side, so the API travels inside the SSH session.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use crate::connection::DEFAULT_SOCKET;

#[derive(Debug, Args)]
pub struct DialStdioArgs {
    /// The daemon's socket.
    #[arg(long, value_name = "PATH", env = "PLOYZ_SOCKET", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
}

pub fn run(args: DialStdioArgs) -> anyhow::Result<()> {
    let socket = UnixStream::connect(&args.socket).with_context(|| {
        format!(
            "cannot reach the daemon at unix://{}; is `ployz daemon run` running there?",
            args.socket.display()
        )
    })?;
    let mut to_daemon = socket.try_clone()?;
    // stdin -> daemon. When stdin ends, half-close so the daemon sees the end of requests.
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let _ = pump(&mut stdin, &mut to_daemon);
        let _ = to_daemon.shutdown(Shutdown::Write);
    });
    // daemon -> stdout, until the daemon closes.
    let mut from_daemon = socket;
    let mut stdout = std::io::stdout().lock();
    pump(&mut from_daemon, &mut stdout)?;
    Ok(())
}

/// Copies until EOF, flushing after every chunk so responses are not held in a buffer.
fn pump(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<()> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        to.flush()?;
    }
}
