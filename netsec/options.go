package netsec

import (
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/cockroachdb/errors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Limits bound what one peer can make a node hold. The zero value of a
// field takes its default.
type Limits struct {
	// MaxRecvMsgSize bounds one received gRPC message (one protoactor
	// message batch), in bytes. Default 4 MiB. A peer's MaxSendMsgSize
	// above it makes that peer's large batches fail, not this node.
	MaxRecvMsgSize int
	// MaxSendMsgSize bounds one sent gRPC message, in bytes. Default 4 MiB.
	MaxSendMsgSize int
	// MaxConcurrentStreams bounds the streams of one connection (protoactor
	// uses one per peer node). Default 4.
	MaxConcurrentStreams uint32
	// MaxHeaderListSize bounds one request's metadata, in bytes; protoactor
	// sends none, and gRPC's own default is 16 MiB. Default 64 KiB.
	MaxHeaderListSize uint32
	// HandshakeTimeout bounds a new connection's TLS handshake, so that a
	// peer that connects and says nothing cannot hold it. Default 5 s.
	HandshakeTimeout time.Duration
}

// Default limits.
const (
	DefaultMaxMsgSize           = 4 << 20
	DefaultMaxConcurrentStreams = 4
	DefaultHandshakeTimeout     = 5 * time.Second
	DefaultMaxHeaderListSize    = 64 << 10
)

func (l Limits) withDefaults() (Limits, error) {
	if l.MaxRecvMsgSize < 0 || l.MaxSendMsgSize < 0 || l.HandshakeTimeout < 0 {
		return l, errors.Newf("limits: MaxRecvMsgSize %d, MaxSendMsgSize %d and HandshakeTimeout %v must not be negative",
			l.MaxRecvMsgSize, l.MaxSendMsgSize, l.HandshakeTimeout)
	}
	if l.MaxRecvMsgSize == 0 {
		l.MaxRecvMsgSize = DefaultMaxMsgSize
	}
	if l.MaxSendMsgSize == 0 {
		l.MaxSendMsgSize = DefaultMaxMsgSize
	}
	if l.MaxConcurrentStreams == 0 {
		l.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if l.MaxHeaderListSize == 0 {
		l.MaxHeaderListSize = DefaultMaxHeaderListSize
	}
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return l, nil
}

// Options configure a node's control plane.
type Options struct {
	// TLS is the node's mutual-TLS material; nil runs in the clear, which
	// RemoteOptions allows on a loopback listen address only.
	TLS *TLS
	// Limits bound messages, streams and handshakes.
	Limits Limits
	// Authorize, if set, sees every envelope of every received batch with
	// the sending peer's identity and may refuse it (see Authorize).
	Authorize Authorize
	// Log receives recovered panics (ERROR) and refused batches (WARN);
	// nil: slog.Default().
	Log *slog.Logger
}

// ServerOptions are the gRPC server options of a node whose actor system is
// system: TLS credentials when o.TLS is set, the limits, and the guards
// (UnaryGuard, StreamGuard checking targets against the system's address).
// A request o.Authorize refuses as ErrNotServed is answered through system
// with a DeadLetterResponse, as protoactor answers a request for an actor
// that does not exist.
func ServerOptions(system *actor.ActorSystem, o Options) ([]grpc.ServerOption, error) {
	l, err := o.Limits.withDefaults()
	if err != nil {
		return nil, err
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(l.MaxRecvMsgSize),
		grpc.MaxSendMsgSize(l.MaxSendMsgSize),
		grpc.MaxConcurrentStreams(l.MaxConcurrentStreams),
		grpc.MaxHeaderListSize(l.MaxHeaderListSize),
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.ChainUnaryInterceptor(UnaryGuard(o.Log)),
		grpc.ChainStreamInterceptor(streamGuard(system.Address, o.Authorize, func(sender, target *actor.PID) {
			system.Root.Send(sender, &actor.DeadLetterResponse{Target: target})
		}, o.Log)),
	}
	if o.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(o.TLS.ServerConfig())))
	}
	return opts, nil
}

// DialOptions are the gRPC dial options a node uses to reach its peers:
// TLS credentials (the peer's certificate must chain to the CA and name the
// dialled host) or, without o.TLS, plaintext; and the message size limits.
func DialOptions(o Options) ([]grpc.DialOption, error) {
	l, err := o.Limits.withDefaults()
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS.ClientConfig())
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(l.MaxRecvMsgSize), grpc.MaxCallSendMsgSize(l.MaxSendMsgSize)),
	}, nil
}

// RemoteOptions are protoactor remote's configuration options for a node of
// system listening on listen: CheckListen's rule (TLS unless loopback),
// then ServerOptions and DialOptions. Pass them to remote.Configure.
func RemoteOptions(system *actor.ActorSystem, listen string, o Options) ([]remote.ConfigOption, error) {
	if err := CheckListen(listen, o.TLS != nil); err != nil {
		return nil, err
	}
	so, err := ServerOptions(system, o)
	if err != nil {
		return nil, err
	}
	do, err := DialOptions(o)
	if err != nil {
		return nil, err
	}
	return []remote.ConfigOption{remote.WithServerOptions(so...), remote.WithDialOptions(do...)}, nil
}
