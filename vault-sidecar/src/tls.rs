//! The per-pod CA, leaf certificates, and TLS toward the client.
//!
//! [`Ca`] is generated at start (ECDSA P-256, key only in memory) or loaded from files. [`LeafCache`]
//! mints one leaf per CONNECT target on first use (concurrent first uses mint exactly once) and
//! serves later handshakes from memory. Each leaf comes with its own `rustls::ServerConfig`
//! offering `h2` and `http/1.1`; rustls picks from the client's own ALPN offer.
//!
//! Certificate profile (SPEC §2.2), checked by `openssl verify -x509_strict` in tests:
//! - CA: basicConstraints CA:TRUE pathlen 0 (critical), keyUsage keyCertSign+cRLSign (critical),
//!   subject key identifier, notBefore one hour in the past.
//! - leaf: DNS or IP SAN for the target, EKU serverAuth, keyUsage digitalSignature, authority key
//!   identifier, notBefore one hour in the past, valid 30 days, re-minted 7 days before expiry.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use dashmap::DashMap;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use time::{Duration, OffsetDateTime};
use tokio::sync::OnceCell;

use crate::config::TargetHost;

/// Leaf validity.
pub(crate) const LEAF_VALIDITY: Duration = Duration::days(30);
/// A leaf is re-minted once it has less than this left.
pub(crate) const LEAF_RENEW_BEFORE: Duration = Duration::days(7);
/// Backdating of notBefore, for clients with skewed clocks.
pub(crate) const BACKDATE: Duration = Duration::hours(1);
/// Beyond this many cached leaves the cache is cleared (a pod talks to a handful of hosts).
pub(crate) const MAX_CACHED_LEAVES: usize = 10_000;

/// ALPN protocols offered to clients, in preference order.
pub(crate) const ALPN_H2: &[u8] = b"h2";
pub(crate) const ALPN_HTTP11: &[u8] = b"http/1.1";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot generate or sign a certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the CA certificate to {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{0}` cannot be a certificate name")]
    BadName(String),
}

/// The certificate authority that signs leaves.
pub struct Ca {
    /// The CA as an rcgen issuer (re-signed in memory when loaded; same name and key).
    issuer: rcgen::Certificate,
    key: KeyPair,
    /// The CA certificate as served and chained (the original bytes when loaded).
    der: CertificateDer<'static>,
    pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f; // positive (RFC 5280 §4.1.2.2)
    bytes[0] |= 0x01; // no leading zero byte, so exactly 16 bytes
    SerialNumber::from_slice(&bytes)
}

impl Ca {
    /// A fresh per-pod CA (ECDSA P-256).
    pub fn generate() -> Result<Self, TlsError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "LAP");
        dn.push(DnType::CommonName, "LAP vault sidecar CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = now - BACKDATE;
        params.not_after = now + Duration::days(365);
        params.serial_number = Some(random_serial());
        let issuer = params.self_signed(&key)?;
        let der = issuer.der().clone();
        let pem = issuer.pem();
        Ok(Self { issuer, key, der, pem })
    }

    /// Load a CA from PEM files (cluster-CA mode).
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, TlsError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| TlsError::Read {
                path: p.display().to_string(),
                source,
            })
        };
        let pem = read(cert_path)?;
        let key = KeyPair::from_pem(&read(key_path)?)?;
        let params = CertificateParams::from_ca_cert_pem(&pem)?;
        let issuer = params.self_signed(&key)?;
        let der = CertificateDer::pem_slice_iter(pem.as_bytes())
            .next()
            .and_then(Result::ok)
            .ok_or_else(|| TlsError::Read {
                path: cert_path.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no PEM certificate"),
            })?;
        Ok(Self { issuer, key, der, pem })
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The CA certificate, DER.
    pub fn der(&self) -> &CertificateDer<'static> {
        &self.der
    }

    /// Write the CA certificate (never the key) to `path`, mode 0644, atomically.
    pub fn write_cert(&self, path: &Path) -> Result<(), TlsError> {
        let err = |source| TlsError::Write {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let tmp = path.with_extension("pem.tmp");
        std::fs::write(&tmp, self.pem.as_bytes()).map_err(err)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).map_err(err)?;
        }
        std::fs::rename(&tmp, path).map_err(err)
    }

    /// Mint a leaf for `host`: its own P-256 key, SAN for the name or IP.
    pub fn mint_leaf(&self, host: &TargetHost) -> Result<MintedLeaf, TlsError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host.to_string());
        params.distinguished_name = dn;
        params.subject_alt_names = vec![match host {
            TargetHost::Ip(ip) => SanType::IpAddress(*ip),
            TargetHost::Name(name) => {
                SanType::DnsName(name.clone().try_into().map_err(|_| TlsError::BadName(name.clone()))?)
            }
        }];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - BACKDATE;
        params.not_after = now + LEAF_VALIDITY;
        params.serial_number = Some(random_serial());
        let not_after = params.not_after;
        let cert = params.signed_by(&key, &self.issuer, &self.key)?;
        Ok(MintedLeaf {
            chain: vec![cert.der().clone(), self.der.clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            not_after,
        })
    }
}

/// A freshly minted leaf: chain (leaf, CA) and key.
pub struct MintedLeaf {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub not_after: OffsetDateTime,
}

/// A cached leaf, ready for handshakes.
#[derive(Debug)]
pub struct Leaf {
    /// Offers `h2` and `http/1.1`.
    pub server_config: Arc<ServerConfig>,
    /// Offers no ALPN: for clients whose offer has neither (curl `-0` offers `http/1.0`), so the
    /// handshake still succeeds and HTTP/1.x is spoken (RFC 7301 §3.2 lets the server ignore ALPN).
    pub server_config_no_alpn: Arc<ServerConfig>,
    pub not_after: OffsetDateTime,
}

/// Whether a lookup minted or hit the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    Minted,
    Hit,
}

type Slot = Arc<OnceCell<Arc<Leaf>>>;

/// Leaves by CONNECT target, minted once each (single flight).
pub struct LeafCache {
    ca: Arc<Ca>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    slots: DashMap<TargetHost, Slot>,
}

impl LeafCache {
    pub fn new(ca: Arc<Ca>) -> Self {
        Self {
            ca,
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            slots: DashMap::new(),
        }
    }

    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// The server config for `host`, minting its leaf on first use.
    pub async fn get(&self, host: &TargetHost) -> Result<(Arc<Leaf>, CacheOutcome), TlsError> {
        loop {
            let slot = self.slot(host);
            let mut minted = false;
            let leaf = slot
                .get_or_try_init(|| async {
                    minted = true;
                    self.build(host).map(Arc::new)
                })
                .await?;
            if leaf.not_after - LEAF_RENEW_BEFORE > OffsetDateTime::now_utc() {
                let outcome = if minted {
                    CacheOutcome::Minted
                } else {
                    CacheOutcome::Hit
                };
                return Ok((leaf.clone(), outcome));
            }
            // Close to expiry: drop this slot (unless someone already replaced it) and mint again.
            self.slots.remove_if(host, |_, s| Arc::ptr_eq(s, &slot));
        }
    }

    fn slot(&self, host: &TargetHost) -> Slot {
        if let Some(slot) = self.slots.get(host) {
            return slot.clone();
        }
        if self.slots.len() >= MAX_CACHED_LEAVES {
            self.slots.clear();
        }
        self.slots.entry(host.clone()).or_default().clone()
    }

    fn build(&self, host: &TargetHost) -> Result<Leaf, TlsError> {
        let minted = self.ca.mint_leaf(host)?;
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(minted.chain, minted.key)?;
        let server_config_no_alpn = Arc::new(config.clone());
        config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()];
        Ok(Leaf {
            server_config: Arc::new(config),
            server_config_no_alpn,
            not_after: minted.not_after,
        })
    }
}

/// Whether the ClientHello's SNI is consistent with the CONNECT target: absent, an IP (treated as
/// absent), or the same name.
pub(crate) fn sni_matches(sni: Option<&str>, target: &TargetHost) -> bool {
    match sni {
        None => true,
        Some(name) if name.parse::<IpAddr>().is_ok() => true,
        Some(name) => TargetHost::parse(name) == *target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sni_rules() {
        let t = TargetHost::parse("api.anthropic.com");
        assert!(sni_matches(None, &t));
        assert!(sni_matches(Some("API.anthropic.com"), &t));
        assert!(sni_matches(Some("10.0.0.1"), &t));
        assert!(!sni_matches(Some("api.github.com"), &t));
    }

    #[tokio::test]
    async fn concurrent_first_lookups_mint_once() {
        let cache = Arc::new(LeafCache::new(Arc::new(Ca::generate().expect("ca"))));
        let host = TargetHost::parse("api.anthropic.com");
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let cache = cache.clone();
                let host = host.clone();
                tokio::spawn(async move { cache.get(&host).await.expect("leaf") })
            })
            .collect();
        let mut minted = 0;
        let mut first: Option<Arc<Leaf>> = None;
        for t in tasks {
            let (cfg, outcome) = t.await.expect("join");
            minted += usize::from(outcome == CacheOutcome::Minted);
            if let Some(f) = &first {
                assert!(Arc::ptr_eq(f, &cfg), "every caller gets the same leaf");
            }
            first = Some(cfg);
        }
        assert_eq!(minted, 1);
    }

    #[test]
    fn ip_targets_get_an_ip_san() {
        let ca = Ca::generate().expect("ca");
        let leaf = ca.mint_leaf(&TargetHost::parse("127.0.0.1")).expect("leaf");
        assert_eq!(leaf.chain.len(), 2);
        assert_eq!(leaf.chain[1], *ca.der());
    }
}
