package httpsink

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"code.dny.dev/ssrf"
)

// ErrBlockedAddress is returned (wrapped) when block_private_networks
// refuses a destination after DNS resolution.
var ErrBlockedAddress = errors.New("outbox: http: destination address is not public and block_private_networks is set")

// guardian is the SSRF guard of block_private_networks. Its lists are
// generated from IANA's IPv4 and IPv6 special-purpose address registries
// by code.dny.dev/ssrf, which keeps them in step with the registries: it
// refuses every IPv4 range of the registry and multicast, every IPv6
// address outside 2000::/3 (the only block IANA allocates as global
// unicast: loopback, unique-local, link-local, multicast, NAT64, discard,
// SRv6 SIDs and whatever else the registry sets aside there), and the
// registry's ranges inside 2000::/3.
//
// The registries mark a few of those ranges globally reachable (the
// anycast addresses of PCP, TURN and DNS-SD SRP, AMT relays, AS112 DNS
// servers, the NAT64 well-known prefix, ORCHIDv2 and drone identifiers);
// they are refused all the same: none is a place a webhook receiver
// lives, NAT64 reaches any IPv4 address, and 2001::/23, which holds most
// of them, also holds Teredo, whose addresses embed IPv4 addresses. guard_test.go lists every entry of
// both registries, so an upgrade that dropped one fails.
//
// Any port is allowed: receivers listen where they like. Only tcp4 and
// tcp6 are (the library's default), which is all an HTTP client dials.
var guardian = ssrf.New(ssrf.WithAnyPort())

// blockedAddr reports whether block_private_networks refuses ip. An
// IPv4-mapped IPv6 address is judged by the IPv4 address it carries, the
// one a connection to it reaches.
func blockedAddr(ip netip.Addr) bool {
	return !ip.IsValid() || guardian.SafeAddr(ip.Unmap()) != nil
}

// guardControl is a net.Dialer.Control hook: it runs after DNS resolution
// with the literal address about to be connected, so a name that resolves
// (or rebinds) to an internal address is refused.
func guardControl(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %q is not an IP address and port", ErrBlockedAddress, address)
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if err := guardian.Safe(network, ap.String(), nil); err != nil {
		return fmt.Errorf("%w: %w", ErrBlockedAddress, err)
	}
	return nil
}
