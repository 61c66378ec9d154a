package portlease

import (
	"net"
	"strconv"

	"github.com/cockroachdb/errors"
)

// Lease is a free TCP port, held until Release.
type Lease struct {
	// Port is the port held.
	Port int
	fd   int // the held socket; -1 when none is held
}

// Take holds a free TCP port of host: an IP address, or "" for every
// interface. With shared, a listener that sets SO_REUSEADDR may bind the
// port while it is held; without, nothing else can bind it, and a dial to
// it is refused until Release.
func Take(host string, shared bool) (*Lease, error) {
	var ip net.IP
	if host != "" {
		if ip = net.ParseIP(host); ip == nil {
			return nil, errors.Newf("portlease: host %q is not an IP address", host)
		}
	}
	l, err := take(ip, shared)
	if err != nil {
		return nil, errors.Wrapf(err, "portlease: hold a free port of %q", host)
	}
	return l, nil
}

// Addr is host and the held port, joined for a dial or a listen.
func (l *Lease) Addr(host string) string { return net.JoinHostPort(host, strconv.Itoa(l.Port)) }
