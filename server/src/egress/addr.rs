//! Where a connection may go: host names and addresses as code inside a sandbox may spell them,
//! and the address ranges the egress proxy never connects to, whatever the allowlist says.
//!
//! Code inside is hostile, so every spelling the system resolver would accept is read here the
//! same way: `2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`, `[::ffff:127.0.0.1]`,
//! `localhost.` all name loopback, and loopback is refused after resolution however it was
//! named.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest host name (RFC 1035).
const MAX_NAME: usize = 253;

/// A connection's target host, normalised.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Host {
    /// A DNS name: lowercase, no trailing dot.
    Name(String),
    /// An address literal, IPv4-mapped and -compatible IPv6 forms turned into IPv4.
    Ip(IpAddr),
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Splits `host[:port]` or `[v6][:port]` into the host and the port as written.
pub(crate) fn split_port(a: &str) -> (&str, Option<&str>) {
    let at = if a.starts_with('[') {
        a.rfind("]:").map(|i| i + 1)
    } else {
        a.rfind(':')
    };
    match at {
        Some(i) => (&a[..i], Some(&a[i + 1..])),
        None => (a, None),
    }
}

/// Reads the host part of a request target (`example.com`, `[::1]`, `0x7f.1`).
pub(crate) fn parse_host(raw: &str) -> Result<Host, &'static str> {
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or("unclosed [ in the host")?;
        // Zone ids (`fe80::1%eth0`) name the host's own interfaces: never ours to reach.
        let ip: Ipv6Addr = inner.parse().map_err(|_| "malformed IPv6 address")?;
        return Ok(Host::Ip(canonical(IpAddr::V6(ip))));
    }
    let lower = raw.to_ascii_lowercase();
    // One trailing dot is the same name, fully qualified.
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() || name.len() > MAX_NAME {
        return Err("empty or overlong host name");
    }
    if let Some(ip) = parse_ipv4_loose(name) {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err("malformed host name");
        }
    }
    // A last label that reads as a number is an address that did not parse (`1.2.3.256`,
    // `0x1g`), not a name (URL parsers refuse it the same way).
    let last = labels.last().copied().unwrap_or_default();
    if last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x") {
        return Err("malformed IPv4 address");
    }
    Ok(Host::Name(name.to_owned()))
}

/// An IPv4 address in any form `inet_aton` accepts: one to four parts, each decimal, octal
/// (leading `0`) or hex (`0x`); the last part fills the remaining bytes.
pub(crate) fn parse_ipv4_loose(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        let (digits, radix) =
            if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
                (h, 16)
            } else if part.len() > 1 && part.starts_with('0') {
                (&part[1..], 8)
            } else {
                (*part, 10)
            };
        if digits.is_empty() && radix != 8 {
            return None;
        }
        if !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        let v = if digits.is_empty() {
            0
        } else {
            u64::from_str_radix(digits, radix).ok()?
        };
        values.push(v);
    }
    let (head, last) = values.split_at(values.len() - 1);
    let mut addr: u64 = 0;
    for (i, v) in head.iter().enumerate() {
        if *v > 0xff {
            return None;
        }
        addr |= v << (24 - 8 * i);
    }
    let rest_bits = 32 - 8 * head.len() as u32;
    if last[0] >= 1u64 << rest_bits {
        return None;
    }
    addr |= last[0];
    Some(Ipv4Addr::from(u32::try_from(addr).ok()?))
}

/// The address as IPv4 when it is an IPv4 address written as IPv6 (mapped `::ffff:a.b.c.d`
/// or the deprecated compatible `::a.b.c.d`).
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1) {
                return IpAddr::V4(Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7])));
            }
            ip
        }
        v4 => v4,
    }
}

/// IPv4 ranges never reached, with what they are.
const V4_REFUSED: [(&str, &str); 15] = [
    ("0.0.0.0/8", "an unspecified address"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a shared (carrier-grade NAT) address"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local (cloud metadata) address"),
    ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "an IETF protocol address"),
    ("192.0.2.0/24", "a documentation address"),
    ("192.88.99.0/24", "a 6to4 relay address"),
    ("192.168.0.0/16", "a private address"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address (or broadcast)"),
];

/// IPv6 ranges never reached (IPv4 forms are turned into IPv4 first, see [`canonical`]).
const V6_REFUSED: [(&str, &str); 11] = [
    ("::/128", "an unspecified address"),
    ("::1/128", "a loopback address"),
    ("64:ff9b:1::/48", "a local NAT64 address"),
    ("::ffff:0:0:0/96", "an IPv4-translated address"),
    ("100::/64", "a discard address"),
    ("2001::/23", "an IETF protocol (Teredo) address"),
    ("2001:db8::/32", "a documentation address"),
    ("fc00::/7", "a private (unique local) address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address"),
    ("ff00::/8", "a multicast address"),
];

/// Why `ip` is never connected to, or `None` when it is a public address.
pub(crate) fn refused(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => V4_REFUSED
            .iter()
            .find(|(net, _)| contains(net, IpAddr::V4(v4)))
            .map(|(_, why)| *why),
        IpAddr::V6(v6) => {
            // Addresses that carry an IPv4 address inside: judged by it.
            let s = v6.segments();
            let embedded = if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                Some(Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7])))
            } else if s[0] == 0x2002 {
                Some(Ipv4Addr::from((u32::from(s[1]) << 16) | u32::from(s[2])))
            } else {
                None
            };
            if let Some(inner) = embedded {
                return refused(IpAddr::V4(inner));
            }
            V6_REFUSED
                .iter()
                .find(|(net, _)| contains(net, IpAddr::V6(v6)))
                .map(|(_, why)| *why)
        }
    }
}

fn contains(net: &str, ip: IpAddr) -> bool {
    match (net.parse::<IpNet>(), ip) {
        (Ok(IpNet::V4(n)), IpAddr::V4(a)) => Ipv4Net::contains(&n, &a),
        (Ok(IpNet::V6(n)), IpAddr::V6(a)) => Ipv6Net::contains(&n, &a),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_spelling_of_loopback_is_loopback() {
        for spelled in [
            "127.0.0.1",
            "2130706433",
            "0x7f000001",
            "0x7F.1",
            "0177.0.0.1",
            "0177.0.0.01",
            "127.1",
            "127.0.1",
            "017700000001",
            "[::ffff:127.0.0.1]",
            "[::ffff:7f00:1]",
            "[::127.0.0.1]",
            "127.0.0.1.",
        ] {
            let host = parse_host(spelled).unwrap();
            let Host::Ip(addr) = host else {
                panic!("{spelled} read as a name");
            };
            assert_eq!(addr, ip("127.0.0.1"), "{spelled}");
            assert_eq!(refused(addr), Some("a loopback address"), "{spelled}");
        }
        assert_eq!(
            parse_host("[::1]").unwrap(),
            Host::Ip(ip("::1")),
            "IPv6 loopback"
        );
        assert_eq!(refused(ip("::1")), Some("a loopback address"));
    }

    #[test]
    fn names_are_normalised_and_malformed_hosts_refused() {
        assert_eq!(
            parse_host("API.Example.COM.").unwrap(),
            Host::Name("api.example.com".into())
        );
        for bad in [
            "",
            ".",
            "a..b",
            "exa mple.com",
            "1.2.3.256",
            "0x1g",
            "evil.com\r\nx",
            "[::1",
            "[fe80::1%eth0]",
            "a.b.c.d.0x",
            "%31%32%37.0.0.1",
            "example.com..",
        ] {
            assert!(parse_host(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse_host(&"a.".repeat(130)).is_err());
    }

    #[test]
    fn refused_ranges_cover_the_classic_targets() {
        for (addr, why) in [
            ("169.254.169.254", "a link-local (cloud metadata) address"),
            ("10.1.2.3", "a private address"),
            ("172.31.255.255", "a private address"),
            ("192.168.1.1", "a private address"),
            ("100.100.100.100", "a shared (carrier-grade NAT) address"),
            ("0.0.0.0", "an unspecified address"),
            ("224.0.0.1", "a multicast address"),
            ("255.255.255.255", "a reserved address (or broadcast)"),
            ("::", "an unspecified address"),
            ("fe80::1", "a link-local address"),
            ("fd00::1", "a private (unique local) address"),
            ("ff02::1", "a multicast address"),
            (
                "::ffff:169.254.169.254",
                "a link-local (cloud metadata) address",
            ),
            (
                "64:ff9b::a9fe:a9fe",
                "a link-local (cloud metadata) address",
            ),
            ("2002:7f00:1::1", "a loopback address"),
            ("2001:0:4136:e378::1", "an IETF protocol (Teredo) address"),
        ] {
            assert_eq!(refused(ip(addr)), Some(why), "{addr}");
        }
        for public in [
            "93.184.216.34",
            "1.1.1.1",
            "2606:4700::1111",
            "64:ff9b::101:101",
        ] {
            assert_eq!(refused(ip(public)), None, "{public}");
        }
    }

    #[test]
    fn loose_ipv4_edges() {
        assert_eq!(parse_ipv4_loose("0"), Some(Ipv4Addr::UNSPECIFIED));
        assert_eq!(parse_ipv4_loose("4294967295"), Some(Ipv4Addr::BROADCAST));
        assert_eq!(parse_ipv4_loose("4294967296"), None);
        assert_eq!(parse_ipv4_loose("1.2.65536"), None);
        assert_eq!(
            parse_ipv4_loose("1.2.65535"),
            Some(Ipv4Addr::new(1, 2, 255, 255))
        );
        assert_eq!(parse_ipv4_loose("256.1.1.1"), None);
        assert_eq!(parse_ipv4_loose("1.2.3.4.5"), None);
        assert_eq!(parse_ipv4_loose("08.1.1.1"), None);
        assert_eq!(parse_ipv4_loose("example"), None);
    }
}
