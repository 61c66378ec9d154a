//go:build linux

package portlease

import (
	"net"
	"net/netip"
	"strconv"
	"syscall"

	"github.com/cockroachdb/errors"
)

func take(addr netip.Addr, shared bool) (*Lease, error) {
	every := !addr.IsValid() || addr.IsUnspecified()
	sa, family, err := sockaddr(addr, every)
	if err != nil {
		return nil, err
	}
	fd, err := socket(family)
	if err != nil && every && family == syscall.AF_INET6 {
		// No IPv6 here: every interface is IPv4's.
		sa, family = &syscall.SockaddrInet4{}, syscall.AF_INET
		fd, err = socket(family)
	}
	if err != nil {
		return nil, errors.Wrap(err, "socket")
	}
	l := &Lease{fd: fd, held: true}
	fail := func(what string, err error) (*Lease, error) {
		l.Release()
		return nil, errors.Wrap(err, what)
	}
	if shared {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
			return fail("SO_REUSEADDR", err)
		}
	}
	if family == syscall.AF_INET6 && every {
		// Every interface, IPv4's too, as Go's listener on ":port" takes
		// them: the port is held for both families.
		if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 0); err != nil {
			return fail("IPV6_V6ONLY", err)
		}
	}
	if err := syscall.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	got, err := syscall.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	switch a := got.(type) {
	case *syscall.SockaddrInet4:
		l.Port = a.Port
	case *syscall.SockaddrInet6:
		l.Port = a.Port
	default:
		return fail("getsockname", errors.Newf("bound to a %T", got))
	}
	return l, nil
}

// socket opens a TCP socket that no child process inherits: close-on-exec
// is set before any fork can see it.
func socket(family int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	return fd, err
}

// sockaddr is addr's port-0 address and family. Every interface is IPv6's
// dual-stack address, as Go listens on it (0.0.0.0 included: IPv4's alone
// would leave the port's IPv6 side to anyone).
func sockaddr(addr netip.Addr, every bool) (syscall.Sockaddr, int, error) {
	switch {
	case every:
		return &syscall.SockaddrInet6{}, syscall.AF_INET6, nil
	case addr.Is4():
		return &syscall.SockaddrInet4{Addr: addr.As4()}, syscall.AF_INET, nil
	}
	sa := &syscall.SockaddrInet6{Addr: addr.As16()}
	if zone := addr.Zone(); zone != "" {
		ifi, err := net.InterfaceByName(zone)
		if err != nil {
			n, nerr := strconv.Atoi(zone)
			if nerr != nil {
				return nil, 0, errors.Wrapf(err, "zone %q", zone)
			}
			ifi = &net.Interface{Index: n}
		}
		sa.ZoneId = uint32(ifi.Index)
	}
	return sa, syscall.AF_INET6, nil
}

// Release frees the port. It may be called more than once.
func (l *Lease) Release() {
	if l.held {
		_ = syscall.Close(l.fd)
		l.held = false
	}
}
