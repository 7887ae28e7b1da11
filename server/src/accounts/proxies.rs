//! Who is calling, for rate limits: the socket peer, or, only when the peer is one of
//! `--trusted-proxies`, the right-most `X-Forwarded-For` entry that is not itself a trusted
//! proxy. A client cannot escape its limit by sending its own `X-Forwarded-For`.

use axum::http::HeaderMap;
use ipnet::IpNet;
use std::net::IpAddr;
use std::sync::Arc;

/// Longest `X-Forwarded-For` list considered.
const MAX_FORWARDED: usize = 32;

#[derive(Debug, Clone, Default)]
pub(crate) struct TrustedProxies(Arc<Vec<IpNet>>);

#[derive(Debug, thiserror::Error)]
#[error("invalid --trusted-proxies entry `{0}` (expected CIDR such as 10.0.0.0/8)")]
pub(crate) struct BadCidr(String);

impl TrustedProxies {
    pub(crate) fn parse(list: &[String]) -> Result<Self, BadCidr> {
        let nets = list
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| BadCidr(s.to_owned()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TrustedProxies(Arc::new(nets)))
    }

    fn trusts(&self, ip: &IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(ip))
    }

    /// The address a request's limits are keyed on: the peer, or behind trusted proxies the
    /// right-most forwarded address that no trusted proxy vouches for. Entries are read from
    /// the right (the end the proxies append to); an unparseable entry stops the walk at the
    /// proxy that appended it. IPv6 clients are keyed by their /64, which one host controls.
    pub(crate) fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusts(&peer) {
            return prefix_key(peer);
        }
        let values: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let mut hop = peer;
        for entry in values
            .iter()
            .rev()
            .flat_map(|v| v.rsplit(','))
            .take(MAX_FORWARDED)
        {
            match entry.trim().parse::<IpAddr>() {
                Ok(ip) if self.trusts(&ip) => hop = ip,
                Ok(ip) => return prefix_key(ip),
                Err(_) => break,
            }
        }
        prefix_key(hop)
    }
}

/// IPv4 addresses as they are; IPv6 addresses reduced to their /64.
fn prefix_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xff(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", v.parse().unwrap());
        h
    }

    #[test]
    fn forwarded_for_counts_only_behind_a_trusted_proxy() {
        let none = TrustedProxies::default();
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        assert_eq!(
            none.client_ip(peer, &xff("1.2.3.4")),
            peer,
            "spoofed header ignored"
        );

        let t = TrustedProxies::parse(&["10.0.0.0/8".into(), "127.0.0.1".into()]).unwrap();
        let proxy: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(t.client_ip(proxy, &xff("1.2.3.4")).to_string(), "1.2.3.4");
        // The client prepends a lie; the proxy appends the truth: the right-most untrusted wins.
        assert_eq!(
            t.client_ip(proxy, &xff("9.9.9.9, 1.2.3.4")).to_string(),
            "1.2.3.4"
        );
        assert_eq!(
            t.client_ip(proxy, &xff("1.2.3.4, 10.0.0.7")).to_string(),
            "1.2.3.4"
        );
        assert_eq!(t.client_ip(proxy, &HeaderMap::new()), proxy);
        assert_eq!(t.client_ip(proxy, &xff("garbage")), proxy);
        // Junk to the left of a real entry cannot pick the key; junk to its right stops at the
        // proxy that appended it.
        assert_eq!(
            t.client_ip(proxy, &xff("1.2.3.4, x, 5.6.7.8")).to_string(),
            "5.6.7.8"
        );
        assert_eq!(t.client_ip(proxy, &xff("1.2.3.4, x")), proxy);
        let many = (0..40)
            .map(|i| format!("9.9.9.{i}"))
            .collect::<Vec<_>>()
            .join(", ")
            + ", 5.6.7.8";
        assert_eq!(t.client_ip(proxy, &xff(&many)).to_string(), "5.6.7.8");
        // One /64 is one client.
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(
            none.client_ip(a, &HeaderMap::new()),
            none.client_ip(b, &HeaderMap::new())
        );
        assert!(TrustedProxies::parse(&["nope".into()]).is_err());
    }
}
