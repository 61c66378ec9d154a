//go:build unix

package portlease

import (
	"net"
	"syscall"

	"github.com/cockroachdb/errors"
)

func take(ip net.IP, shared bool) (*Lease, error) {
	sa, family := sockaddr(ip)
	fd, err := socket(family)
	if err != nil && ip == nil && family == syscall.AF_INET6 {
		// No IPv6 here: every interface is IPv4's.
		sa, family = &syscall.SockaddrInet4{}, syscall.AF_INET
		fd, err = socket(family)
	}
	if err != nil {
		return nil, errors.Wrap(err, "socket")
	}
	l := &Lease{fd: fd}
	fail := func(what string, err error) (*Lease, error) {
		l.Release()
		return nil, errors.Wrap(err, what)
	}
	if shared {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
			return fail("SO_REUSEADDR", err)
		}
	}
	if family == syscall.AF_INET6 && (ip == nil || ip.IsUnspecified()) {
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

// sockaddr is ip's port-0 address and family; nil is every interface,
// IPv6's dual-stack one, as Go listens on it.
func sockaddr(ip net.IP) (syscall.Sockaddr, int) {
	if ip4 := ip.To4(); ip4 != nil {
		sa := &syscall.SockaddrInet4{}
		copy(sa.Addr[:], ip4)
		return sa, syscall.AF_INET
	}
	sa := &syscall.SockaddrInet6{}
	if ip != nil {
		copy(sa.Addr[:], ip.To16())
	}
	return sa, syscall.AF_INET6
}

// Release frees the port. It may be called more than once.
func (l *Lease) Release() {
	if l.fd >= 0 {
		_ = syscall.Close(l.fd)
		l.fd = -1
	}
}
