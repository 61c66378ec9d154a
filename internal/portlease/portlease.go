package portlease

import (
	"net"
	"net/netip"
	"strconv"

	"github.com/cockroachdb/errors"
)

// Lease is a free TCP port, held until Release.
type Lease struct {
	// Port is the port held.
	Port int
	fd   int  // the held socket, while held
	held bool // a zero Lease holds nothing (and never closes fd 0)
}

// Take holds a free TCP port of host: an IP address (an IPv6 one may name
// its zone, "fe80::1%eth0"), or "" for every interface. With shared, a
// listener that sets SO_REUSEADDR may bind the port while it is held;
// without, nothing else can bind it, and a dial to it is refused until
// Release. An unspecified address (0.0.0.0, ::) holds every interface's
// port, IPv6's too, as Go listens there.
func Take(host string, shared bool) (*Lease, error) {
	var addr netip.Addr
	if host != "" {
		var err error
		if addr, err = netip.ParseAddr(host); err != nil {
			return nil, errors.Newf("portlease: host %q is not an IP address", host)
		}
	}
	l, err := take(addr.Unmap(), shared)
	if err != nil {
		return nil, errors.Wrapf(err, "portlease: hold a free port of %q", host)
	}
	return l, nil
}

// Addr is host and the held port, joined for a dial or a listen.
func (l *Lease) Addr(host string) string { return net.JoinHostPort(host, strconv.Itoa(l.Port)) }
