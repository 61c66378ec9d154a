//go:build !unix

package portlease

import "net"

// take, where no socket can be held bound without listening from Go's
// standard library, takes a free port and frees it: the port may be given
// to another socket before its listener binds it.
func take(ip net.IP, _ bool) (*Lease, error) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	return &Lease{Port: l.Addr().(*net.TCPAddr).Port, fd: -1}, nil
}

// Release frees the port (already free here).
func (l *Lease) Release() {}
