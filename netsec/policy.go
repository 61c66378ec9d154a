package netsec

import (
	"net"
	"strings"

	"github.com/cockroachdb/errors"
)

// CheckListen enforces that only a loopback listen address may run the
// control plane in the clear: any other address (including all interfaces,
// an empty host, or a name that is not "localhost") requires TLS. The error
// names the address.
func CheckListen(listen string, withTLS bool) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return errors.Wrapf(err, "listen address %q", listen)
	}
	if withTLS || IsLoopback(host) {
		return nil
	}
	return errors.Newf("listen address %q is not loopback: the control plane needs TLS there (give the CA, certificate and key)", listen)
}

// IsLoopback reports whether host is a loopback IP or "localhost". Other
// names are not resolved: what a name resolves to can change after the
// check.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	return ip != nil && ip.IsLoopback()
}
