package netsec

import (
	"context"
	"crypto/x509"
	"net"
	"slices"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// ErrUnauthenticated marks a connection whose peer presented no verified
// certificate (a plaintext loopback connection, or no peer at all).
var ErrUnauthenticated = errors.New("peer is not authenticated")

// Identity is who a peer proved to be: the leaf of its verified certificate
// chain. The zero Identity is an unauthenticated peer.
type Identity struct {
	CommonName string
	URIs       []string
	DNSNames   []string
	IPs        []net.IP
}

// Authenticated reports whether the identity comes from a verified
// certificate.
func (id Identity) Authenticated() bool {
	return id.CommonName != "" || len(id.URIs) > 0 || len(id.DNSNames) > 0 || len(id.IPs) > 0
}

// Name is the identity's one name for logs and session binding: the subject
// CN, else the first SAN URI, else the first SAN DNS name.
func (id Identity) Name() string {
	switch {
	case id.CommonName != "":
		return id.CommonName
	case len(id.URIs) > 0:
		return id.URIs[0]
	case len(id.DNSNames) > 0:
		return id.DNSNames[0]
	}
	return ""
}

// Is reports whether name is the identity's CN or one of its SAN URIs or
// DNS names. An unauthenticated identity is nobody.
func (id Identity) Is(name string) bool {
	return name != "" && (id.CommonName == name || slices.Contains(id.URIs, name) || slices.Contains(id.DNSNames, name))
}

// CoversHost reports whether the certificate names host (an IP address or a
// DNS name): the check that a peer claiming a protoactor address
// "host:port" holds a certificate for that host.
func (id Identity) CoversHost(host string) bool {
	if ip := net.ParseIP(host); ip != nil {
		return slices.ContainsFunc(id.IPs, ip.Equal)
	}
	return host != "" && slices.Contains(id.DNSNames, host)
}

// IdentityOf is the identity of a certificate.
func IdentityOf(c *x509.Certificate) Identity {
	id := Identity{CommonName: c.Subject.CommonName, DNSNames: slices.Clone(c.DNSNames), IPs: slices.Clone(c.IPAddresses)}
	for _, u := range c.URIs {
		id.URIs = append(id.URIs, u.String())
	}
	return id
}

// PeerIdentity is the verified identity of the peer of a gRPC call or
// stream (a server handler's or interceptor's context), or
// ErrUnauthenticated.
func PeerIdentity(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, errors.Wrap(ErrUnauthenticated, "no peer in the context")
	}
	return IdentityFromPeer(p)
}

// IdentityFromPeer is the verified identity of a gRPC peer: the leaf of the
// chain that the TLS handshake verified against the CA, never a merely
// presented certificate.
func IdentityFromPeer(p *peer.Peer) (Identity, error) {
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Identity{}, errors.Wrapf(ErrUnauthenticated, "peer %v: no TLS", p.Addr)
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return Identity{}, errors.Wrapf(ErrUnauthenticated, "peer %v: no verified certificate", p.Addr)
	}
	return IdentityOf(chains[0][0]), nil
}

// CheckSender refuses an envelope in which an authenticated peer speaks for
// a host its certificate does not name: the sender PID's host, and the host
// in a Terminated (the actor it reports dead: the watcher ends its session
// on it) or a Watch or Unwatch (the watcher: protoactor dials it to deliver
// a Terminated later). Those addresses are where protoactor would dial; the
// port is not checked. Use it inside an Authorize once TLS is on; the zero
// identity covers no host.
func CheckSender(peer Identity, e Envelope) error {
	if e.Sender != nil {
		if err := covers(peer, "sender", e.Sender.Address); err != nil {
			return err
		}
	}
	var pid func([]byte) (*actor.PID, error)
	switch e.TypeName {
	case "actor.Terminated":
		pid = func(b []byte) (*actor.PID, error) {
			var m actor.Terminated
			return m.Who, proto.Unmarshal(b, &m)
		}
	case "actor.Watch":
		pid = func(b []byte) (*actor.PID, error) {
			var m actor.Watch
			return m.Watcher, proto.Unmarshal(b, &m)
		}
	case "actor.Unwatch":
		pid = func(b []byte) (*actor.PID, error) {
			var m actor.Unwatch
			return m.Watcher, proto.Unmarshal(b, &m)
		}
	default:
		return nil
	}
	p, err := pid(e.Data)
	if err != nil {
		return errors.Wrap(err, e.TypeName)
	}
	return covers(peer, e.TypeName, p.GetAddress())
}

func covers(peer Identity, what, address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return errors.Wrapf(err, "%s address %q", what, address)
	}
	if !peer.CoversHost(host) {
		return errors.Newf("%s address %q: peer %q holds no certificate for host %q", what, address, peer.Name(), host)
	}
	return nil
}
