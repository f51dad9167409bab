//! The TUN interface of the userspace device, opened with the kernel's virtio offloads where the
//! kernel has them.
//!
//! With `IFF_VNET_HDR` every read and write carries a 10-byte virtio header. With
//! `TUNSETOFFLOAD(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)` the kernel may hand the device one TCP
//! segment of up to 64 KiB instead of ~45 MTU-sized packets, and accepts such segments written
//! back: one system call and one pass through the kernel's stack per 64 KiB instead of per packet.
//! Where the kernel (or a sandbox such as gVisor) refuses the offloads, the device still works
//! with plain packets, and says so in its counters.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// What the TUN interface was opened with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunOffloads {
    /// Reads and writes carry a virtio header.
    pub vnet_hdr: bool,
    /// The kernel hands the device TCP segments larger than the MTU (and takes them back).
    pub tso: bool,
}

/// An open TUN interface. Dropping it closes the descriptor, and the interface goes with it.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    offloads: TunOffloads,
}

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl Tun {
    /// Creates the TUN interface `name` in the calling thread's network namespace. Non-blocking:
    /// the device's threads wait in `poll(2)`.
    pub fn create(name: &str) -> io::Result<Tun> {
        match Tun::open(name, true) {
            Ok(tun) => Ok(tun),
            // A kernel without virtio headers on TUN (or a sandbox emulating TUN) refuses the
            // flag; the plain interface still works.
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(interface = name, error = %err, "the TUN interface refused virtio headers; the userspace mesh runs without offloads");
                Tun::open(name, false)
            }
            Err(err) => Err(err),
        }
    }

    fn open(name: &str, vnet_hdr: bool) -> io::Result<Tun> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface name {name:?} must be 1 to 15 bytes"),
            ));
        }
        let path = CString::new("/dev/net/tun").expect("no NUL in a literal");
        // SAFETY: a valid C string; the result is checked.
        let raw = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut request = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: 0,
            _pad: [0; 22],
        };
        for (slot, byte) in request.name.iter_mut().zip(name.bytes()) {
            *slot = byte as libc::c_char;
        }
        let mut flags = libc::IFF_TUN | libc::IFF_NO_PI;
        if vnet_hdr {
            flags |= libc::IFF_VNET_HDR;
        }
        request.flags = flags as libc::c_short;
        // SAFETY: TUNSETIFF takes a pointer to a `struct ifreq`, which `IfReq` lays out.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut request) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut offloads = TunOffloads {
            vnet_hdr,
            tso: false,
        };
        if vnet_hdr {
            let wanted = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
            // SAFETY: TUNSETOFFLOAD takes the flags as its integer argument.
            if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETOFFLOAD, wanted as libc::c_ulong) }
                == 0
            {
                offloads.tso = true;
            } else {
                tracing::info!(interface = name, error = %io::Error::last_os_error(), "the TUN interface refused TCP segmentation offload; the userspace mesh moves one packet per system call");
            }
        }
        Ok(Tun { fd, offloads })
    }

    /// What the interface was opened with.
    pub fn offloads(&self) -> TunOffloads {
        self.offloads
    }

    /// Reads one frame (the virtio header, when there is one, then the packet). `WouldBlock`
    /// when nothing is waiting.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Writes one frame. A full queue (`WouldBlock`) drops it, as a full NIC queue would.
    pub fn write(&self, frame: &[u8]) -> io::Result<usize> {
        // SAFETY: `frame` is valid for reads of its length.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
