//! Batched datagram IO for the UDP workers: on Linux one `recvmmsg` takes every query waiting
//! on the socket (blocking until at least one is there) and one `sendmmsg` sends every reply,
//! so a burst costs two system calls and one wake-up instead of two calls per query. Elsewhere
//! the same interface moves one datagram per call.
//!
//! All buffers are allocated once per worker and reused.

use std::io;
use std::net::{SocketAddr, UdpSocket};

/// Datagrams taken per receive call.
pub(crate) const BATCH: usize = 64;
/// Receive buffer per datagram. A query never needs more; a bigger datagram is reported cut
/// and dropped.
pub(crate) const SLOT: usize = 4096;

/// Received datagrams.
pub(crate) struct RecvBatch {
    bufs: Vec<u8>,
    lens: [usize; BATCH],
    srcs: [Option<SocketAddr>; BATCH],
    cut: [bool; BATCH],
    count: usize,
    #[cfg(target_os = "linux")]
    sys: linux::RecvState,
}

/// Replies waiting to be sent.
pub(crate) struct SendBatch {
    bufs: Vec<Vec<u8>>,
    dsts: Vec<SocketAddr>,
    count: usize,
    #[cfg(target_os = "linux")]
    sys: linux::SendState,
}

impl RecvBatch {
    pub(crate) fn new() -> RecvBatch {
        RecvBatch {
            bufs: vec![0; BATCH * SLOT],
            lens: [0; BATCH],
            srcs: [None; BATCH],
            cut: [false; BATCH],
            count: 0,
            #[cfg(target_os = "linux")]
            sys: linux::RecvState::new(),
        }
    }

    /// Datagram `i`: its bytes, its source, and whether it was cut to fit the slot.
    pub(crate) fn get(&self, i: usize) -> Option<(&[u8], SocketAddr, bool)> {
        let src = self.srcs.get(..self.count)?.get(i).copied().flatten()?;
        let start = i * SLOT;
        Some((&self.bufs[start..start + self.lens[i]], src, self.cut[i]))
    }

    /// Blocks until at least one datagram arrives (or the socket's read timeout passes) and
    /// takes every datagram waiting, up to [`BATCH`].
    pub(crate) fn recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        self.count = 0;
        #[cfg(target_os = "linux")]
        {
            self.count = self.sys.recv(
                socket,
                &mut self.bufs,
                &mut self.lens,
                &mut self.srcs,
                &mut self.cut,
            )?;
        }
        #[cfg(not(target_os = "linux"))]
        {
            let (len, src) = socket.recv_from(&mut self.bufs[..SLOT])?;
            self.lens[0] = len.min(SLOT);
            self.srcs[0] = Some(src);
            self.cut[0] = len > SLOT;
            self.count = 1;
        }
        Ok(self.count)
    }
}

impl SendBatch {
    pub(crate) fn new() -> SendBatch {
        SendBatch {
            bufs: (0..BATCH)
                .map(|_| Vec::with_capacity(crate::wire::MAX_UDP_PAYLOAD))
                .collect(),
            dsts: Vec::with_capacity(BATCH),
            count: 0,
            #[cfg(target_os = "linux")]
            sys: linux::SendState::new(),
        }
    }

    /// The buffer for the next reply; [`SendBatch::push`] keeps it, anything else discards it.
    pub(crate) fn next_buf(&mut self) -> &mut Vec<u8> {
        &mut self.bufs[self.count]
    }

    /// Keeps the reply just written to [`SendBatch::next_buf`] for `dst`.
    pub(crate) fn push(&mut self, dst: SocketAddr) {
        self.dsts.truncate(self.count);
        self.dsts.push(dst);
        self.count += 1;
    }

    /// Sends every kept reply (best effort: a reply the kernel refuses is dropped, the client
    /// retries) and empties the batch.
    pub(crate) fn flush(&mut self, socket: &UdpSocket) {
        let count = std::mem::take(&mut self.count);
        if count == 0 {
            return;
        }
        #[cfg(target_os = "linux")]
        self.sys
            .send(socket, &self.bufs[..count], &self.dsts[..count]);
        #[cfg(not(target_os = "linux"))]
        for (buf, dst) in self.bufs[..count].iter().zip(&self.dsts) {
            if let Err(e) = socket.send_to(buf, dst) {
                tracing::debug!(error = %e, %dst, "DNS UDP send failed");
            }
        }
        self.dsts.clear();
    }
}

#[cfg(target_os = "linux")]
mod linux {
    //! The `recvmmsg`/`sendmmsg` calls. The header arrays point into buffers owned by the
    //! caller; the pointers are rebuilt before every call, so nothing dangles across moves.

    use std::io;
    use std::mem::{size_of, zeroed};
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
    use std::os::fd::AsRawFd;

    use socket2::SockAddr;

    use super::{BATCH, SLOT};

    pub(super) struct RecvState {
        addrs: Vec<libc::sockaddr_storage>,
        iovs: Vec<libc::iovec>,
        hdrs: Vec<libc::mmsghdr>,
    }

    // SAFETY: the raw pointers inside are scratch, rebuilt before each call and never read
    // across threads.
    unsafe impl Send for RecvState {}

    impl RecvState {
        pub(super) fn new() -> RecvState {
            // SAFETY: all-zero is a valid value of these plain C structs.
            RecvState {
                addrs: vec![unsafe { zeroed() }; BATCH],
                iovs: vec![unsafe { zeroed() }; BATCH],
                hdrs: vec![unsafe { zeroed() }; BATCH],
            }
        }

        /// Receives into `bufs` (BATCH slots of SLOT bytes) and records per datagram its
        /// length, source and whether it was cut; returns how many arrived.
        pub(super) fn recv(
            &mut self,
            socket: &UdpSocket,
            bufs: &mut [u8],
            lens: &mut [usize; BATCH],
            srcs: &mut [Option<SocketAddr>; BATCH],
            cut: &mut [bool; BATCH],
        ) -> io::Result<usize> {
            assert!(bufs.len() >= BATCH * SLOT);
            let slots = self.addrs.iter_mut().zip(self.iovs.iter_mut());
            let slots = slots.zip(bufs.chunks_exact_mut(SLOT));
            for (hdr, ((addr, iov), buf)) in self.hdrs.iter_mut().zip(slots) {
                *iov = libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: SLOT,
                };
                // SAFETY: all-zero is a valid msghdr; the fields set point into live buffers.
                let mut msg: libc::msghdr = unsafe { zeroed() };
                msg.msg_name = (addr as *mut libc::sockaddr_storage).cast();
                msg.msg_namelen = size_of::<libc::sockaddr_storage>() as _;
                msg.msg_iov = iov;
                msg.msg_iovlen = 1;
                *hdr = libc::mmsghdr {
                    msg_hdr: msg,
                    msg_len: 0,
                };
            }
            // SAFETY: `hdrs` holds BATCH headers whose pointers target `addrs`, `iovs` and
            // `bufs`, all alive and exclusively borrowed for the call.
            let n = unsafe {
                libc::recvmmsg(
                    socket.as_raw_fd(),
                    self.hdrs.as_mut_ptr(),
                    BATCH as _,
                    libc::MSG_WAITFORONE as _,
                    std::ptr::null_mut(),
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            for i in 0..n {
                let h = &self.hdrs[i];
                lens[i] = (h.msg_len as usize).min(SLOT);
                cut[i] = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
                srcs[i] = from_storage(&self.addrs[i]);
            }
            Ok(n)
        }
    }

    /// The socket address the kernel wrote.
    fn from_storage(a: &libc::sockaddr_storage) -> Option<SocketAddr> {
        match i32::from(a.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let sin =
                    unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6.
                let sin6 =
                    unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }

    pub(super) struct SendState {
        addrs: Vec<SockAddr>,
        iovs: Vec<libc::iovec>,
        hdrs: Vec<libc::mmsghdr>,
    }

    // SAFETY: as for RecvState.
    unsafe impl Send for SendState {}

    impl SendState {
        pub(super) fn new() -> SendState {
            SendState {
                addrs: Vec::with_capacity(BATCH),
                // SAFETY: all-zero is a valid value of these plain C structs.
                iovs: vec![unsafe { zeroed() }; BATCH],
                hdrs: vec![unsafe { zeroed() }; BATCH],
            }
        }

        pub(super) fn send(&mut self, socket: &UdpSocket, bufs: &[Vec<u8>], dsts: &[SocketAddr]) {
            let count = bufs.len().min(dsts.len()).min(BATCH);
            self.addrs.clear();
            self.addrs
                .extend(dsts[..count].iter().map(|d| SockAddr::from(*d)));
            let slots = self.iovs.iter_mut().zip(self.hdrs.iter_mut());
            for ((buf, addr), (iov, hdr)) in bufs[..count].iter().zip(&self.addrs).zip(slots) {
                *iov = libc::iovec {
                    iov_base: buf.as_ptr() as *mut libc::c_void,
                    iov_len: buf.len(),
                };
                // SAFETY: all-zero is a valid msghdr; the fields set point into live buffers.
                let mut msg: libc::msghdr = unsafe { zeroed() };
                msg.msg_name = addr.as_ptr() as *mut libc::c_void;
                msg.msg_namelen = addr.len();
                msg.msg_iov = iov;
                msg.msg_iovlen = 1;
                *hdr = libc::mmsghdr {
                    msg_hdr: msg,
                    msg_len: 0,
                };
            }
            let mut sent = 0;
            while sent < count {
                // SAFETY: headers `sent..count` point into `addrs`, `iovs` and `bufs`, alive
                // for the call; the kernel only reads the buffers.
                let n = unsafe {
                    libc::sendmmsg(
                        socket.as_raw_fd(),
                        self.hdrs[sent..].as_mut_ptr(),
                        (count - sent) as _,
                        0,
                    )
                };
                if n <= 0 {
                    let e = io::Error::last_os_error();
                    tracing::debug!(error = %e, dst = %dsts[sent], "DNS UDP send failed");
                    // Skip the datagram the kernel refused and go on with the rest.
                    sent += 1;
                } else {
                    sent += n as usize;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn receives_a_burst_and_replies_to_each_sender() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let addr = server.local_addr().unwrap();
        let clients: Vec<UdpSocket> = (0..3)
            .map(|_| {
                let c = UdpSocket::bind("127.0.0.1:0").unwrap();
                c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                c
            })
            .collect();
        for (i, c) in clients.iter().enumerate() {
            c.send_to(&[i as u8; 10], addr).unwrap();
        }
        let big = UdpSocket::bind("127.0.0.1:0").unwrap();
        big.send_to(&vec![7u8; SLOT + 100], addr).unwrap();

        let mut recv = RecvBatch::new();
        let mut send = SendBatch::new();
        let mut seen = 0;
        while seen < 4 {
            let n = recv.recv(&server).unwrap();
            for i in 0..n {
                let (bytes, src, cut) = recv.get(i).unwrap();
                seen += 1;
                if src == big.local_addr().unwrap() {
                    assert!(cut, "an oversized datagram is reported cut");
                    continue;
                }
                assert!(!cut);
                assert_eq!(bytes.len(), 10);
                let buf = send.next_buf();
                buf.clear();
                buf.extend_from_slice(&[bytes[0] + 100]);
                send.push(src);
            }
            send.flush(&server);
        }
        for (i, c) in clients.iter().enumerate() {
            let mut b = [0u8; 8];
            let (n, from) = c.recv_from(&mut b).unwrap();
            assert_eq!((n, b[0], from), (1, i as u8 + 100, addr));
        }
        assert!(recv.get(BATCH).is_none());
    }
}
