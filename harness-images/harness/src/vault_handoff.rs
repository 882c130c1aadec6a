//! The local backend's vault hand-off (control-plane `backend::local`): the sandbox's network
//! namespace has loopback only, so the vault's proxy port must be a socket *in* that namespace,
//! served by the sidecar running outside it.
//!
//! With `LAP_VAULT_HANDOFF=stdin`, standard input is a Unix stream socket to the control plane.
//! Before anything else runs, the harness binds `LAP_VAULT_LISTEN` (`127.0.0.1:14322`: the
//! `HTTPS_PROXY` its environment names) in its own namespace, sends the listening socket over
//! standard input (`SCM_RIGHTS`, one byte `L`), closes its own copy, and waits for one byte `G`:
//! the sidecar serves that socket and wrote the CA. Standard input is then `/dev/null`. No agent
//! code runs before `G`; if the control plane goes away first, the harness exits.

use std::io::{IoSlice, Read};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// Why the hand-off failed (the harness exits with it as its fatal reason).
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("LAP_VAULT_LISTEN `{0}` is not an address:port")]
    BadAddress(String),
    #[error("cannot listen on {addr} for the vault: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("standard input is not the control plane's socket: {0}")]
    NoSocket(#[source] std::io::Error),
    #[error("cannot hand the vault's socket to the control plane: {0}")]
    Send(#[source] std::io::Error),
    #[error("the control plane did not start the vault (its socket closed before `go`)")]
    NoGo,
}

/// Do the hand-off described in the module docs. `listen` is `LAP_VAULT_LISTEN`.
pub fn run(listen: &str) -> Result<(), HandoffError> {
    let addr: SocketAddr = listen
        .parse()
        .map_err(|_| HandoffError::BadAddress(listen.to_owned()))?;
    let control = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(UnixStream::from)
        .map_err(HandoffError::NoSocket)?;
    let listener = TcpListener::bind(addr).map_err(|source| HandoffError::Bind { addr, source })?;
    {
        let fds = [listener.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut cmsg = SendAncillaryBuffer::new(&mut space);
        cmsg.push(SendAncillaryMessage::ScmRights(&fds));
        sendmsg(&control, &[IoSlice::new(b"L")], &mut cmsg, SendFlags::empty())
            .map_err(|e| HandoffError::Send(e.into()))?;
    }
    drop(listener);
    let mut go = [0u8; 1];
    match (&control).read(&mut go) {
        Ok(1) if go[0] == b'G' => {}
        _ => return Err(HandoffError::NoGo),
    }
    drop(control);
    // Standard input becomes /dev/null: nothing started later inherits the control socket.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = rustix::stdio::dup2_stdin(&null);
    }
    Ok(())
}
