//! A network link with a one-way delay, between two processes on this machine: a TCP relay
//! that holds every chunk it reads for the link's delay before writing it on, in both
//! directions. It stands for the distance between a PostgreSQL primary and a standby in
//! another data centre, which loopback does not have: there a standby has every commit
//! almost as soon as the primary, and an asynchronous standby's loss at failover cannot be
//! seen. (The kernel's `netem` would delay packets instead, but this machine's kernel has
//! no `sch_netem`.)
//!
//! [`Link::cut`] drops the link and every byte on it at once, as a partition that takes the
//! primary's site away does: what the primary had sent but the standby had not received
//! never arrives.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::free_port;

/// Chunks on the link in one direction, at most; past that the relay stops reading, so the
/// sender's socket buffers fill as a slow link's would.
const CHUNKS_ON_THE_LINK: usize = 4096;

pub struct Link {
    /// Where the near end listens: what the far side connects to instead of `target`.
    pub port: u16,
    pub delay: Duration,
    relay: Option<JoinHandle<()>>,
}

impl Link {
    /// A link to `127.0.0.1:target` that delays each direction by `delay`.
    pub async fn start(target: u16, delay: Duration) -> anyhow::Result<Self> {
        let port = free_port();
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let relay = tokio::spawn(async move {
            // The connections' pumps live in this set: aborting the relay drops it, and
            // with it every pump and the chunks they hold.
            let mut pumps = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((near, _)) = accepted else { continue };
                        let Ok(far) = TcpStream::connect(("127.0.0.1", target)).await else {
                            continue;
                        };
                        let _ = (near.set_nodelay(true), far.set_nodelay(true));
                        let (near_read, near_write) = near.into_split();
                        let (far_read, far_write) = far.into_split();
                        pumps.spawn(pump(near_read, far_write, delay));
                        pumps.spawn(pump(far_read, near_write, delay));
                    }
                    Some(_) = pumps.join_next(), if !pumps.is_empty() => {}
                }
            }
        });
        Ok(Self {
            port,
            delay,
            relay: Some(relay),
        })
    }

    /// Cuts the link: no new connection, and every open one closed with what was on it.
    pub fn cut(&mut self) {
        if let Some(relay) = self.relay.take() {
            relay.abort();
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.cut();
    }
}

/// Carries one direction: each chunk read is written `delay` after it was read.
async fn pump<R, W>(mut from: R, mut to: W, delay: Duration)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_ON_THE_LINK);
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let chunk = buf[..n].to_vec();
                    if tx.send((Instant::now() + delay, chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_cross_the_link_after_its_delay_and_not_after_a_cut() {
        let target = TcpListener::bind("127.0.0.1:0").await.expect("listener");
        let target_port = target.local_addr().expect("address").port();
        // Long beside the two lines between a write and the cut, however loaded the machine.
        let delay = Duration::from_secs(1);
        let mut link = Link::start(target_port, delay).await.expect("link");
        let mut client = TcpStream::connect(("127.0.0.1", link.port))
            .await
            .expect("connect");
        let (mut server, _) = target.accept().await.expect("accept");

        let sent = Instant::now();
        client.write_all(b"ping").await.expect("write");
        let mut got = [0u8; 4];
        server.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"ping");
        assert!(sent.elapsed() >= delay, "arrived before the link's delay");

        // On the link when it is cut: never arrives, and the server sees the end.
        server.write_all(b"pong").await.expect("write");
        link.cut();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest))
            .await
            .expect("the cut closes the connection");
        assert!(
            read.is_err() || rest.is_empty(),
            "{rest:?} crossed a cut link"
        );
    }
}
