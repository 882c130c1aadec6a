//! The control plane's side of the vault hand-off (`lap_harness::vault_handoff` is the other):
//! receive the listening socket the harness bound inside its sandbox, and later say `go`.

use std::io::{IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

/// Why no socket came.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("the sandbox closed its control socket before handing over the vault's socket")]
    Closed,
    #[error("the sandbox did not hand over the vault's socket within {0:?}")]
    Timeout(Duration),
    #[error("the control socket failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Wait (blocking, up to `timeout`) for the `L` message carrying one listening socket.
pub fn receive_listener(control: &UnixStream, timeout: Duration) -> Result<OwnedFd, HandoffError> {
    control.set_read_timeout(Some(timeout))?;
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let got = recvmsg(
        control,
        &mut [IoSliceMut::new(&mut byte)],
        &mut cmsg,
        RecvFlags::CMSG_CLOEXEC,
    );
    let msg = match got {
        Ok(m) => m,
        Err(rustix::io::Errno::AGAIN) => return Err(HandoffError::Timeout(timeout)),
        Err(e) => return Err(HandoffError::Io(e.into())),
    };
    if msg.bytes == 0 {
        return Err(HandoffError::Closed);
    }
    let mut fds = cmsg.drain().filter_map(|m| match m {
        RecvAncillaryMessage::ScmRights(fds) => Some(fds),
        _ => None,
    });
    fds.next().and_then(|mut f| f.next()).ok_or(HandoffError::Closed)
}

/// Tell the harness the vault is serving: it may go on.
pub fn go(mut control: &UnixStream) -> std::io::Result<()> {
    control.write_all(b"G")
}
