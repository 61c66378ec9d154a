//go:build ucx

package ucx

/*
#include <ucp/api/ucp.h>
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"

	"github.com/cockroachdb/errors"
)

// An access point's address (doc.go, "Connection setup") is not a UCX
// worker address but where its listener is: listenMagic, the address
// family's length of IP bytes (4 or 16), the IP, then the port, big-endian.
// Its first byte is 'K' (0x4b), whose low four bits (11) are no UCX worker
// address's format version, so Connect tells the two apart by that byte.
var listenMagic = []byte("KVSL")

const listenAddrV4, listenAddrV6 = 4 + 1 + 4 + 2, 4 + 1 + 16 + 2

// encodeListenAddr is the address of a listener bound at ip:port.
func encodeListenAddr(ip netip.Addr, port uint16) []byte {
	b := append([]byte(nil), listenMagic...)
	ipb := ip.AsSlice()
	b = append(b, byte(len(ipb)))
	b = append(b, ipb...)
	return binary.BigEndian.AppendUint16(b, port)
}

// isListenAddr reports whether a peer's address claims to be a listener's.
func isListenAddr(addr []byte) bool { return bytes.HasPrefix(addr, listenMagic) }

// accessMagic prefixes the worker address an access point of WriteMessages
// gives out where it has no listener: Connect strips it, and knows from
// it, as from a listener's address, that the receiver fences epochs
// (doc.go, "Epochs"). Like listenMagic, its first byte is no UCX worker
// address's format version.
var accessMagic = []byte("KVSW")

// fencesEpochs says whether addr is an access point's, whose receiver
// fences epochs: a listener's address (access points of WriteMessages
// only), or a worker address with accessMagic.
func fencesEpochs(addr []byte) bool {
	return isListenAddr(addr) || bytes.HasPrefix(addr, accessMagic)
}

// decodeListenAddr parses and checks a listener's address from a peer: its
// exact length, a unicast IP and a port that is not 0.
func decodeListenAddr(addr []byte) (netip.Addr, uint16, error) {
	if len(addr) != listenAddrV4 && len(addr) != listenAddrV6 {
		return netip.Addr{}, 0, errors.Newf("ucx: connect: a listener address of %d bytes (want %d or %d)", len(addr), listenAddrV4, listenAddrV6)
	}
	n := int(addr[len(listenMagic)])
	if len(listenMagic)+1+n+2 != len(addr) {
		return netip.Addr{}, 0, errors.Newf("ucx: connect: a listener address of %d bytes says its IP has %d (want 4 in %d bytes or 16 in %d)", len(addr), n, listenAddrV4, listenAddrV6)
	}
	ip, _ := netip.AddrFromSlice(addr[len(listenMagic)+1 : len(listenMagic)+1+n])
	port := binary.BigEndian.Uint16(addr[len(addr)-2:])
	switch {
	case ip.IsUnspecified() || ip.IsMulticast() || ip.IsInterfaceLocalMulticast():
		return netip.Addr{}, 0, errors.Newf("ucx: connect: a listener address with IP %s (want a unicast address)", ip)
	case port == 0:
		return netip.Addr{}, 0, errors.Newf("ucx: connect: a listener address %s with port 0", ip)
	}
	return ip, port, nil
}

// accessHost is the IP access points listen on, from Options.AccessHost:
// an IP, or a name resolved once (its first IPv4 address, else its first).
func accessHost(host string) (netip.Addr, error) {
	if host == "" {
		return netip.AddrFrom4([4]byte{127, 0, 0, 1}), nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" || ip.IsUnspecified() || ip.IsMulticast() {
			return netip.Addr{}, errors.Newf("ucx: Options.AccessHost %q: want an address peers can reach (not unspecified, multicast or zoned)", host)
		}
		return ip.Unmap(), nil
	}
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return netip.Addr{}, errors.Newf("ucx: Options.AccessHost %q: not an IP address, and it does not resolve (%v)", host, err)
	}
	pick := ips[0]
	for _, ip := range ips {
		if ip.To4() != nil {
			pick = ip
			break
		}
	}
	ip, _ := netip.AddrFromSlice(pick)
	return accessHost(ip.Unmap().String())
}

// connectsBySockaddr reports whether access points can take their peers'
// connections through a listener with a UCX_TLS value: UCX sets a
// client-server connection up over a network transport on the device the
// connection came in by (tcp, or an InfiniBand one), before the lanes the
// transports list allows replace it; with none of them (UCX_TLS=sm,self)
// the peer's endpoint fails ("Destination is unreachable"), and access
// points give out their worker address instead.
func connectsBySockaddr(tls string) bool {
	if tls == "" {
		return true // all
	}
	if rest, ok := strings.CutPrefix(tls, "^"); ok {
		for _, name := range strings.Split(rest, ",") {
			if tlName(name) == "tcp" {
				return false
			}
		}
		return true
	}
	for _, name := range strings.Split(tls, ",") {
		switch n := tlName(name); {
		case n == "all", n == "tcp", n == "ib",
			strings.HasPrefix(n, "rc"), strings.HasPrefix(n, "dc"), strings.HasPrefix(n, "ud"):
			return true
		}
	}
	return false
}

// tlName is a UCX_TLS entry without its `\` (no alias) prefix and
// ":aux" suffix.
func tlName(name string) string {
	name = strings.TrimPrefix(strings.TrimSpace(name), `\`)
	if i := strings.IndexByte(name, ':'); i >= 0 {
		name = name[:i]
	}
	return name
}

// ucxVersion is the (major, minor) version of the UCX library loaded.
func ucxVersion() [2]int {
	var major, minor, release C.uint
	C.ucp_get_version(&major, &minor, &release)
	return [2]int{int(major), int(minor)}
}

// assertsOnEarlyKeys reports whether UCX version v aborts a put through a
// client-server endpoint whose remote key was unpacked before the
// endpoint's setup replaced its configuration (proto_common.inl:219): seen
// on 1.18.1, not on 1.13.1; versions between were not tested.
func assertsOnEarlyKeys(v [2]int) bool {
	return v[0] > 1 || v[0] == 1 && v[1] >= 18
}
