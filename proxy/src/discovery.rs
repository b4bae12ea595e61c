//! Where the cores are: every address each configured `host:port` resolves to, resolved
//! again every `upstream_resolve_interval` (pingora's `LoadBalancer` calls [`discover`]
//! then). A DNS name that resolves to many addresses (a Kubernetes headless Service) is
//! many cores; a core that appears is balanced to once its readiness check passes, and
//! one whose address is gone is forgotten. An address resolves to itself.
//!
//! A name that does not resolve this time keeps the addresses it had last time: DNS away
//! for a moment must not empty the pool. (A core that is really gone fails its readiness
//! check and gets no traffic.)
//!
//! [`discover`]: ServiceDiscovery::discover

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use pingora::lb::discovery::ServiceDiscovery;
use pingora::lb::Backend;
use pingora::Result;

pub struct Resolver {
    upstreams: Vec<String>,
    /// What each entry resolved to last, kept for a failed resolution.
    last: Mutex<HashMap<String, BTreeSet<Backend>>>,
}

impl Resolver {
    pub fn new(upstreams: &[String]) -> Self {
        Self {
            upstreams: upstreams.to_vec(),
            last: Mutex::default(),
        }
    }

    async fn resolve(entry: &str) -> std::io::Result<BTreeSet<Backend>> {
        let addrs = tokio::net::lookup_host(entry).await?;
        Ok(addrs
            .map(|addr| Backend {
                addr: pingora::protocols::l4::socket::SocketAddr::Inet(addr),
                weight: 1,
                ext: Default::default(),
            })
            .collect())
    }
}

#[async_trait]
impl ServiceDiscovery for Resolver {
    async fn discover(&self) -> Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        let mut all = BTreeSet::new();
        for entry in &self.upstreams {
            let found = match Self::resolve(entry).await {
                Ok(found) if !found.is_empty() => {
                    let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
                    last.insert(entry.clone(), found.clone());
                    found
                }
                outcome => {
                    tracing::warn!(upstream = %entry, ?outcome, "upstream not resolved; keeping its last addresses");
                    let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
                    last.get(entry).cloned().unwrap_or_default()
                }
            };
            all.extend(found);
        }
        Ok((all, HashMap::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_is_every_address_it_resolves_to_and_an_address_itself() {
        let resolver = Resolver::new(&["localhost:8081".to_owned(), "127.0.0.2:8082".to_owned()]);
        let (found, _) = resolver.discover().await.expect("discovered");
        let addrs: Vec<String> = found.iter().map(|b| b.addr.to_string()).collect();
        assert!(addrs.contains(&"127.0.0.1:8081".to_owned()), "{addrs:?}");
        assert!(addrs.contains(&"127.0.0.2:8082".to_owned()), "{addrs:?}");
    }

    #[tokio::test]
    async fn a_name_that_stops_resolving_keeps_its_last_addresses() {
        let resolver = Resolver::new(&["localhost:8081".to_owned()]);
        let first = resolver.discover().await.expect("discovered").0;
        // As if DNS failed this time: the entry's last addresses stand in.
        let resolver = Resolver {
            upstreams: vec!["no-such-host.invalid:8081".to_owned()],
            last: Mutex::new(HashMap::from([(
                "no-such-host.invalid:8081".to_owned(),
                first.clone(),
            )])),
        };
        assert_eq!(resolver.discover().await.expect("discovered").0, first);
    }
}
