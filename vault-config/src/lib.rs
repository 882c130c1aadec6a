//! The vault sidecar's configuration, apart from the proxy: what the operator (or the control
//! plane) writes, and everything that turns it into validated settings.
//!
//! - [`SidecarConfig`], [`SecretSpec`], [`SecretsFile`]: the wire shapes of the TOML file and of
//!   the `{"secrets":[...]}` JSON document (`secrets_file`, standard input, the admin API).
//! - [`Settings::from_config`]: validates *everything* and returns ready-to-run [`Settings`] or
//!   every problem found, each naming its key ([`ConfigErrors`]).
//! - [`HostPattern`], [`HostSet`], [`TargetHost`]: the host patterns secrets are bound to and the
//!   egress lists name, and the host a request goes to.
//! - [`EgressPolicy`], [`AddressPolicy`]: the egress decision on the host name and on the
//!   resolved address.
//!
//! The control plane builds sidecar configurations with these types and depends on this crate,
//! not on the proxy.
#![warn(unreachable_pub)]

mod config;
mod egress;
mod hosts;
mod secret;

pub use config::{
    parse_config, parse_secrets_stdin, read_config, read_secrets_file, split_host_port, validate_secret_specs,
    BodyTripwire, CaSource, ConfigError, ConfigErrors, EgressConfig, InterceptMode, SecretSpec, SecretsFile, Settings,
    SidecarConfig, DEFAULT_ADMIN_LISTEN, DEFAULT_LISTEN, DEFAULT_UPSTREAM_RESPONSE_TIMEOUT_SECS,
    DEFAULT_WORKER_THREADS, MAX_UPSTREAM_RESPONSE_TIMEOUT_SECS, MAX_WORKER_THREADS, MIN_STUB_LEN, MIN_VALUE_LEN,
};
pub use egress::{
    canonical, is_host_local, own_interface_addresses, AddressDenial, AddressPolicy, EgressDecision, EgressPolicy,
};
pub use hosts::{
    is_valid_dns_name, parse_ip, Binding, BindingError, BindingSet, HostPattern, HostPatternError, HostSet, TargetHost,
    DEFAULT_BINDING_PORT,
};
pub use secret::{
    HeaderUse, Location, Secret, Surface, Surfaces, CREDENTIAL_HEADERS, CREDENTIAL_PARAMS, CREDENTIAL_SCHEMES,
};
