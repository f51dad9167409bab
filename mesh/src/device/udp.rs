//! The userspace device's UDP sockets, with the kernel's segmentation offloads where it has them.
//!
//! Sending, a run of equal-sized encrypted packets to one peer goes out in one `sendmsg(2)` with
//! `UDP_SEGMENT` (UDP GSO): the kernel cuts it into datagrams as late as it can. Receiving,
//! `UDP_GRO` lets the kernel hand over up to 64 KiB of datagrams from one sender in one
//! `recvmsg(2)`, with the size they were cut at. Each falls back to one datagram per call where
//! the kernel refuses it.

use std::io;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// The most datagrams one GSO send may carry (the kernel's `UDP_MAX_SEGMENTS` is 64 on older
/// kernels).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// The most payload bytes one GSO send may carry (a UDP datagram's limit, before the cut).
pub const MAX_GSO_BYTES: usize = 65_000;
/// A receive buffer large enough for a GRO batch.
pub const MAX_GRO_BYTES: usize = 65_535;

/// One bound UDP socket (IPv4 or IPv6 only).
#[derive(Debug)]
pub struct Udp {
    socket: Socket,
    gso: AtomicBool,
    gro: bool,
}

/// One `recvmsg`: `len` bytes from `from`, to be cut every `segment` bytes (the last piece may be
/// shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    pub segment: usize,
    pub from: SocketAddr,
}

impl Udp {
    /// Binds `port` (0: any) on every address of one family, non-blocking, with GSO and GRO
    /// where the kernel has them and `SO_MARK` when `fwmark` is set.
    pub fn bind(v6: bool, port: u16, fwmark: Option<u32>) -> io::Result<Udp> {
        let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
        let socket = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
        if v6 {
            socket.set_only_v6(true)?;
        }
        socket.set_nonblocking(true)?;
        // Room for bursts while a thread is busy with crypto.
        let _ = socket.set_recv_buffer_size(4 << 20);
        let _ = socket.set_send_buffer_size(4 << 20);
        if let Some(mark) = fwmark {
            socket.set_mark(mark)?;
        }
        let addr: SocketAddr = if v6 {
            SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0).into()
        } else {
            SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port).into()
        };
        socket.bind(&addr.into())?;
        let gro = setsockopt_int(socket.as_raw_fd(), libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        // GSO needs no option to send; whether the kernel takes it shows on the first send.
        Ok(Udp {
            socket,
            gso: AtomicBool::new(true),
            gro,
        })
    }

    /// Marks every datagram sent from now on with `mark` (`SO_MARK`; 0 clears it).
    pub fn set_mark(&self, mark: u32) -> io::Result<()> {
        self.socket.set_mark(mark)
    }

    /// The port bound.
    pub fn port(&self) -> io::Result<u16> {
        self.socket
            .local_addr()?
            .as_socket()
            .map(|addr| addr.port())
            .ok_or_else(|| io::Error::other("a UDP socket without an IP address"))
    }

    /// Whether receives are coalesced by the kernel.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Whether sends are still segmented by the kernel (false after the kernel refused one).
    pub fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Sends one datagram.
    pub fn send_to(&self, packet: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.socket.send_to(packet, &to.into())
    }

    /// Sends `packets`, cut every `segment` bytes (the last piece may be shorter), to `to`: in
    /// one call with GSO, else one datagram at a time.
    pub fn send_segments(&self, packets: &[u8], segment: usize, to: SocketAddr) -> io::Result<()> {
        if packets.len() <= segment {
            return self.send_to(packets, to).map(|_| ());
        }
        if self.gso() {
            match self.send_gso(packets, segment, to) {
                Ok(()) => return Ok(()),
                // EIO: a device on the path cannot checksum a segmented datagram; EINVAL/
                // ENOPROTOOPT: a kernel without UDP GSO. Neither will change for this socket.
                Err(err)
                    if matches!(
                        err.raw_os_error(),
                        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
                    ) =>
                {
                    tracing::info!(error = %err, "the kernel refused UDP segmentation offload; the userspace mesh sends one datagram per system call");
                    self.gso.store(false, Ordering::Relaxed);
                }
                Err(err) => return Err(err),
            }
        }
        let mut result = Ok(());
        for packet in packets.chunks(segment) {
            if let Err(err) = self.send_to(packet, to) {
                result = Err(err);
            }
        }
        result
    }

    fn send_gso(&self, packets: &[u8], segment: usize, to: SocketAddr) -> io::Result<()> {
        let addr = SockAddr::from(to);
        let mut iov = libc::iovec {
            iov_base: packets.as_ptr() as *mut libc::c_void,
            iov_len: packets.len(),
        };
        // SAFETY: CMSG_SPACE is a pure size computation.
        const SPACE: usize = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
        let mut control = [0u64; SPACE.div_ceil(8)];
        // SAFETY: an all-zero msghdr is valid; every pointer set below outlives the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = addr.as_ptr() as *mut libc::c_void;
        msg.msg_namelen = addr.len();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = SPACE as _;
        // SAFETY: the control buffer holds one header and a u16, as CMSG_SPACE computed.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_UDP;
            (*cmsg).cmsg_type = libc::UDP_SEGMENT;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), segment as u16);
        }
        // SAFETY: `msg` is fully initialised above.
        let n = unsafe { libc::sendmsg(self.socket.as_raw_fd(), &msg, 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Receives one datagram, or one GRO batch of datagrams from one sender. `WouldBlock` when
    /// nothing is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Received> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: CMSG_SPACE is a pure size computation.
        const SPACE: usize = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
        let mut control = [0u64; SPACE.div_ceil(8) + 2];
        let mut name = MaybeUninit::<libc::sockaddr_storage>::zeroed();
        // SAFETY: an all-zero msghdr is valid; every pointer set below outlives the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = name.as_mut_ptr().cast();
        msg.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&control) as _;
        // SAFETY: `msg` points at live buffers of the sizes given.
        let n = unsafe { libc::recvmsg(self.socket.as_raw_fd(), &mut msg, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let len = n as usize;
        let mut segment = len;
        // SAFETY: the kernel filled the control buffer up to msg_controllen.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == libc::UDP_GRO {
                    let size =
                        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                    if size > 0 {
                        segment = size as usize;
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        // SAFETY: zeroed storage is a valid value, and the kernel wrote an address into it.
        let from = socket_addr(unsafe { &name.assume_init() })
            .ok_or_else(|| io::Error::other("a datagram from a non-IP address"))?;
        Ok(Received { len, segment, from })
    }
}

impl AsRawFd for Udp {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// The IP address in a `sockaddr_storage` the kernel filled.
fn socket_addr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which fits in it.
            let addr =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
                u16::from_be(addr.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6, which fits in it.
            let addr = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(addr.sin6_addr.s6_addr),
                u16::from_be(addr.sin6_port),
                addr.sin6_flowinfo,
                addr.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value is a live c_int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segmented_send_arrives_as_its_datagrams() {
        let receiver = Udp::bind(false, 0, None).unwrap();
        let sender = Udp::bind(false, 0, None).unwrap();
        let to: SocketAddr = (Ipv4Addr::LOCALHOST, receiver.port().unwrap()).into();
        // Three datagrams of 1,000 bytes and a last one of 500, each filled with its index.
        let mut packets = Vec::new();
        for (i, len) in [1000usize, 1000, 1000, 500].into_iter().enumerate() {
            packets.extend(std::iter::repeat_n(i as u8, len));
        }
        sender.send_segments(&packets, 1000, to).unwrap();

        let mut buf = vec![0u8; MAX_GRO_BYTES];
        let mut seen = Vec::new();
        while seen.len() < 4 {
            let got = match receiver.recv(&mut buf) {
                Ok(got) => got,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    wait_readable(receiver.as_raw_fd());
                    continue;
                }
                Err(err) => panic!("{err}"),
            };
            assert_eq!(got.from.port(), sender.port().unwrap());
            for piece in buf[..got.len].chunks(got.segment) {
                seen.push((piece[0], piece.len()));
                assert!(piece.iter().all(|b| *b == piece[0]));
            }
        }
        assert_eq!(seen, vec![(0, 1000), (1, 1000), (2, 1000), (3, 500)]);
    }

    fn wait_readable(fd: RawFd) {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, 5_000) };
        assert_eq!(rc, 1, "the datagrams did not arrive within 5 s");
    }
}
