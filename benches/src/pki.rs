//! A throwaway CA and one server leaf for `localhost`, `127.0.0.1` and `::1`, generated per run.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// PEM and DER forms of the upstream's CA and leaf.
pub struct UpstreamPki {
    pub ca_pem: String,
    pub leaf_pem: String,
    pub leaf_key_pem: String,
    ca_der: CertificateDer<'static>,
    leaf_der: CertificateDer<'static>,
    leaf_key_der: Vec<u8>,
}

impl UpstreamPki {
    pub fn generate() -> Result<Self, rcgen::Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "LAP bench upstream CA");
        let ca = ca_params.self_signed(&ca_key)?;

        let leaf_key = KeyPair::generate()?;
        let mut leaf_params = CertificateParams::new(vec!["localhost".to_owned()])?;
        leaf_params.subject_alt_names.extend([
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        ]);
        leaf_params.distinguished_name.push(DnType::CommonName, "localhost");
        leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        leaf_params.use_authority_key_identifier_extension = true;
        let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key)?;

        Ok(Self {
            ca_pem: ca.pem(),
            leaf_pem: leaf.pem(),
            leaf_key_pem: leaf_key.serialize_pem(),
            ca_der: ca.der().clone(),
            leaf_der: leaf.der().clone(),
            leaf_key_der: leaf_key.serialize_der(),
        })
    }

    /// A rustls server config presenting the leaf, offering `alpn` in order.
    pub fn server_config(&self, alpn: &[&[u8]]) -> Result<rustls::ServerConfig, rustls::Error> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key_der.clone()));
        let mut config = rustls::ServerConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![self.leaf_der.clone(), self.ca_der.clone()], key)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }
}

/// A rustls client config trusting only the given PEM roots, offering `alpn`.
pub fn client_config(roots_pem: &str, alpn: &[&[u8]]) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(roots_pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("root PEM: {e}"))?;
        roots.add(cert).map_err(|e| format!("root: {e}"))?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}
