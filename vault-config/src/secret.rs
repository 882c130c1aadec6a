//! One secret as validated: its name, stub, real value, the hosts it may be sent to and where in a
//! request its stub may be swapped.

use std::fmt;
use std::str::FromStr;

use crate::hosts::BindingSet;

/// Where in a request a stub may be swapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    Header,
    Query,
    Body,
}

impl Location {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Header => "header",
            Self::Query => "query",
            Self::Body => "body",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Self::Header => 1,
            Self::Query => 2,
            Self::Body => 4,
        }
    }
}

impl FromStr for Location {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "header" => Ok(Self::Header),
            "query" => Ok(Self::Query),
            "body" => Ok(Self::Body),
            other => Err(format!("`{other}` is not one of \"header\", \"query\", \"body\"")),
        }
    }
}

/// A small set of [`Location`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LocationSet(u8);

impl LocationSet {
    pub fn insert(&mut self, loc: Location) {
        self.0 |= loc.bit();
    }

    pub fn contains(self, loc: Location) -> bool {
        self.0 & loc.bit() != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Location> {
        [Location::Header, Location::Query, Location::Body]
            .into_iter()
            .filter(move |l| self.contains(*l))
    }
}

/// One secret, validated. `Debug` never shows the value or the stub.
#[derive(Clone)]
pub struct Secret {
    pub name: String,
    pub stub: String,
    pub value: String,
    /// Where it may be sent: host patterns, each with its port (443 unless written).
    pub hosts: BindingSet,
    pub locations: LocationSet,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("locations", &self.locations)
            .finish_non_exhaustive()
    }
}
