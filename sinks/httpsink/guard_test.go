package httpsink

import (
	"net/netip"
	"testing"

	"code.dny.dev/ssrf"
	"github.com/stretchr/testify/require"
)

// specialPurpose is every entry of IANA's IPv4 and IPv6 special-purpose
// address registries (iana-ipv4-special-registry and
// iana-ipv6-special-registry, their 2025 entries: 3fff::/20, 5f00::/16
// and 100:0:0:1::/64 the latest), by the registry's name, with the blocks
// the guard refuses besides. global marks the entries the
// registry calls globally reachable: refused all the same (guard.go says
// why).
var specialPurpose = []struct {
	prefix, name string
	global       bool
}{
	// IPv4 special-purpose registry.
	{"0.0.0.0/8", `"This network"`, false},
	{"0.0.0.0/32", `"This host on this network"`, false},
	{"10.0.0.0/8", "Private-Use", false},
	{"100.64.0.0/10", "Shared Address Space", false},
	{"127.0.0.0/8", "Loopback", false},
	{"169.254.0.0/16", "Link Local", false},
	{"172.16.0.0/12", "Private-Use", false},
	{"192.0.0.0/24", "IETF Protocol Assignments", false},
	{"192.0.0.0/29", "IPv4 Service Continuity Prefix", false},
	{"192.0.0.8/32", "IPv4 dummy address", false},
	{"192.0.0.9/32", "Port Control Protocol Anycast", true},
	{"192.0.0.10/32", "Traversal Using Relays around NAT Anycast", true},
	{"192.0.0.170/32", "NAT64/DNS64 Discovery", false},
	{"192.0.0.171/32", "NAT64/DNS64 Discovery", false},
	{"192.0.2.0/24", "Documentation (TEST-NET-1)", false},
	{"192.31.196.0/24", "AS112-v4", true},
	{"192.52.193.0/24", "AMT", true},
	{"192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", false},
	{"192.168.0.0/16", "Private-Use", false},
	{"192.175.48.0/24", "Direct Delegation AS112 Service", true},
	{"198.18.0.0/15", "Benchmarking", false},
	{"198.51.100.0/24", "Documentation (TEST-NET-2)", false},
	{"203.0.113.0/24", "Documentation (TEST-NET-3)", false},
	{"240.0.0.0/4", "Reserved", false},
	{"255.255.255.255/32", "Limited Broadcast", false},
	// IPv4 multicast (its own registry).
	{"224.0.0.0/4", "Multicast", false},

	// IPv6 special-purpose registry.
	{"::1/128", "Loopback Address", false},
	{"::/128", "Unspecified Address", false},
	// IPv4-mapped addresses are judged by the IPv4 address they carry
	// (TestGuardMappedAddresses); ::ffff:0.0.0.0/104 is "this network".
	{"::ffff:0.0.0.0/104", "IPv4-mapped Address (of 0.0.0.0/8)", false},
	{"64:ff9b::/96", "IPv4-IPv6 Translat.", true},
	{"64:ff9b:1::/48", "IPv4-IPv6 Translat.", false},
	{"100::/64", "Discard-Only Address Block", false},
	{"100:0:0:1::/64", "Dummy IPv6 Prefix", false},
	{"2001::/23", "IETF Protocol Assignments", false},
	{"2001::/32", "TEREDO", false},
	{"2001:1::1/128", "Port Control Protocol Anycast", true},
	{"2001:1::2/128", "Traversal Using Relays around NAT Anycast", true},
	{"2001:1::3/128", "DNS-SD Service Registration Protocol Anycast Address", true},
	{"2001:2::/48", "Benchmarking", false},
	{"2001:3::/32", "AMT", true},
	{"2001:4:112::/48", "AS112-v6", true},
	{"2001:10::/28", "Deprecated (previously ORCHID)", false},
	{"2001:20::/28", "ORCHIDv2", true},
	{"2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", true},
	{"2001:db8::/32", "Documentation", false},
	{"2002::/16", "6to4", false},
	{"2620:4f:8000::/48", "Direct Delegation AS112 Service", true},
	{"3fff::/20", "Documentation", false},
	{"5f00::/16", "Segment Routing (SRv6) SIDs", false},
	{"fc00::/7", "Unique-Local", false},
	{"fe80::/10", "Link-Local Unicast", false},
	// Outside the registry: multicast, the deprecated site-local block,
	// and the rest of the space outside 2000::/3 (IETF-reserved, never
	// global unicast), such as the deprecated IPv4-compatible ::/96.
	{"ff00::/8", "Multicast", false},
	{"fec0::/10", "Site-Local (deprecated)", false},
	{"::/96", "IPv4-compatible (deprecated)", false},
	{"4000::/3", "Reserved by IETF", false},
}

// The guard refuses the first and the last address of every range above,
// both as a literal in the config (blockedAddr) and at dial time, on any
// port.
func TestGuardRefusesEverySpecialPurposeRange(t *testing.T) {
	t.Parallel()
	for _, r := range specialPurpose {
		p := netip.MustParsePrefix(r.prefix)
		for _, ip := range []netip.Addr{p.Masked().Addr(), lastAddr(p)} {
			require.True(t, blockedAddr(ip), "%s (%s, %s, globally reachable: %v) is not refused", ip, r.prefix, r.name, r.global)
			for _, port := range []uint16{443, 8080} {
				addr := netip.AddrPortFrom(ip, port).String()
				require.ErrorIs(t, guardControl(network(ip), addr, nil), ErrBlockedAddress, "%s (%s, %s)", addr, r.prefix, r.name)
			}
		}
	}
}

// Public addresses pass on any port, the ones next to refused ranges
// included; so do IPv4-mapped forms of public IPv4 addresses.
func TestGuardPassesPublicAddresses(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"8.8.8.8", "1.1.1.1", "9.9.9.9", "2606:4700:4700::1111", "2001:4860:4860::8888", "2a00:1450:4001::1",
		"9.255.255.255", "11.0.0.1", "100.63.255.255", "100.128.0.1", "126.255.255.255", "128.0.0.1",
		"169.253.255.255", "169.255.0.1", "172.15.255.255", "172.32.0.1", "192.0.1.1", "192.0.3.1",
		"192.88.98.1", "192.88.100.1", "192.167.255.255", "192.169.0.1", "198.17.255.255", "198.20.0.1",
		"198.51.99.1", "203.0.112.1", "223.255.255.254",
		"2001:200::1",        // the first address after 2001::/23 (a real allocation)
		"2001:db7:ffff::1",   // beside the documentation block
		"2003::1",            // after 6to4
		"2620:4f:7fff::1",    // beside AS112's /48
		"3ffe:ffff::1",       // before 3fff::/20
		"3fff:1000::1",       // after 3fff::/20
		"::ffff:8.8.8.8",     // IPv4-mapped: the IPv4 address is dialled
		"::ffff:203.0.114.1", // beside TEST-NET-3
	} {
		ip := netip.MustParseAddr(s)
		require.False(t, blockedAddr(ip), "%s is refused", s)
		for _, port := range []uint16{80, 443, 8443, 9000} {
			addr := netip.AddrPortFrom(ip, port).String()
			require.NoError(t, guardControl(network(ip), addr, nil), addr)
		}
	}
}

// An IPv4-mapped IPv6 address reaches the IPv4 address it carries, so it
// is refused exactly when that address is.
func TestGuardMappedAddresses(t *testing.T) {
	t.Parallel()
	for _, r := range specialPurpose {
		p := netip.MustParsePrefix(r.prefix)
		if !p.Addr().Is4() {
			continue
		}
		mapped := netip.AddrFrom16(p.Addr().As16())
		require.True(t, blockedAddr(mapped), "%s (%s)", mapped, r.name)
		require.ErrorIs(t, guardControl("tcp6", netip.AddrPortFrom(mapped, 443).String(), nil), ErrBlockedAddress, "%s", mapped)
	}
}

// What the dial hook refuses besides addresses: anything but an IP
// address and port, networks an HTTP client never dials, zoned addresses;
// and the library's own error stays reachable under ErrBlockedAddress.
func TestGuardControlRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ network, address string }{
		{"tcp4", "example.com:443"},
		{"tcp4", "8.8.8.8"},
		{"tcp6", "[fe80::1%eth0]:443"},
		{"udp4", "8.8.8.8:443"},
		{"unix", "/run/receiver.sock"},
	} {
		require.ErrorIs(t, guardControl(tc.network, tc.address, nil), ErrBlockedAddress, "%s %s", tc.network, tc.address)
	}
	err := guardControl("tcp4", "169.254.169.254:80", nil)
	require.ErrorIs(t, err, ErrBlockedAddress)
	require.ErrorIs(t, err, ssrf.ErrProhibitedIP)
	require.ErrorContains(t, err, "169.254.169.254")
	require.True(t, blockedAddr(netip.Addr{}), "the zero Addr")
}

// The helpers the tests above stand on: the last address of a prefix, and
// the network Go dials an address with.
func TestGuardTestHelpers(t *testing.T) {
	t.Parallel()
	require.Equal(t, netip.MustParseAddr("10.255.255.255"), lastAddr(netip.MustParsePrefix("10.0.0.0/8")))
	require.Equal(t, netip.MustParseAddr("2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff"), lastAddr(netip.MustParsePrefix("2001::/23")))
	require.Equal(t, netip.MustParseAddr("2001:1::1"), lastAddr(netip.MustParsePrefix("2001:1::1/128")))
	require.Equal(t, "tcp4", network(netip.MustParseAddr("8.8.8.8")))
	require.Equal(t, "tcp6", network(netip.MustParseAddr("::ffff:8.8.8.8")))
}

// lastAddr returns the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As16()
	host := 128 - p.Bits()
	if p.Addr().Is4() {
		host = 32 - p.Bits()
	}
	for i := 15; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	if p.Addr().Is4() {
		return netip.AddrFrom16(b).Unmap()
	}
	return netip.AddrFrom16(b)
}

// network is the network Go's dialer hands the Control hook for ip.
func network(ip netip.Addr) string {
	if ip.Is4() {
		return "tcp4"
	}
	return "tcp6"
}
