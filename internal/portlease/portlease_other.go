//go:build !linux

package portlease

import (
	"net"
	"net/netip"
)

// take, where a socket held bound without listening is not known to leave
// the port to an SO_REUSEADDR listener (the BSDs want SO_REUSEPORT of both,
// which Go's listener does not set), takes a free port and frees it: the
// port may be given to another socket before its listener binds it.
func take(addr netip.Addr, _ bool) (*Lease, error) {
	var ta *net.TCPAddr
	if addr.IsValid() {
		ta = net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, 0))
	}
	l, err := net.ListenTCP("tcp", ta)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	return &Lease{Port: l.Addr().(*net.TCPAddr).Port}, nil
}

// Release frees the port (already free here).
func (l *Lease) Release() {}
