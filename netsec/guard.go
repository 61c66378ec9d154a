package netsec

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/cockroachdb/errors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// receiveMethod is the one RPC of protoactor remote that a node needs: the
// bidirectional stream that carries message batches. The service's unary
// methods (ListProcesses, GetProcessDiagnostics) panic "implement me".
const receiveMethod = "/remote.Remoting/Receive"

// protoSerializer is protoactor remote's serializer id for protobuf, the
// only one the control plane uses. The JSON serializer (id 1) turns any
// unknown type name into a message delivered to the target, so it is
// refused.
const protoSerializer = 0

// Envelope is one message of a batch as the peer sent it, after the batch
// passed ValidateBatch: the target is local, the indexes were in range and
// the type is a registered protobuf message.
type Envelope struct {
	Target   *actor.PID
	Sender   *actor.PID // nil when the peer sent none
	TypeName string
	Data     []byte
}

// Authorize decides whether a peer may deliver an envelope. It runs on the
// gRPC stream's goroutine before protoactor sees the batch; an error
// refuses the whole batch and closes the stream, so protoactor delivers
// nothing of it.
type Authorize func(peer Identity, e Envelope) error

// remotingService prefixes the methods of protoactor remote's gRPC service.
const remotingService = "/remote.Remoting/"

// UnaryGuard answers every unary call of protoactor remote's service with
// codes.Unimplemented without calling its handler: protoactor implements
// none of them (ListProcesses and GetProcessDiagnostics panic "implement
// me"), and an interceptor is the one place that sees them before they
// run, since protoactor registers its own unexported service value. A
// handler of any other service runs with its panics recovered as
// codes.Internal and logged on log (nil: slog.Default()).
func UnaryGuard(log *slog.Logger) grpc.UnaryServerInterceptor {
	log = orDefault(log)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		if strings.HasPrefix(info.FullMethod, remotingService) {
			return nil, status.Errorf(codes.Unimplemented, "%s is not served", info.FullMethod)
		}
		defer recoverAs(&err, info.FullMethod, log)
		return handler(ctx, req)
	}
}

func orDefault(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.Default()
	}
	return log
}

// StreamGuard serves only the Receive stream of protoactor remote's
// service (any other stream of it answers codes.Unimplemented), recovers
// any panic of its handler as codes.Internal, and checks every received
// message batch with ValidateBatch against local (the node's own address;
// called per batch because a port-0 node learns it only after it started)
// and then with authorize (nil accepts every batch that validates): a batch
// that fails ends the stream with codes.InvalidArgument or
// codes.PermissionDenied before protoactor reads it, and is logged at WARN
// on log (nil: slog.Default()) with the peer's name and address. A stream
// that ends on a message that cannot be read (not protobuf, a message
// that does not decode as its type, one over the size limit) is logged
// at WARN the same way. It also bounds the watches of local actors that
// a stream delivers and takes back those it still holds when it ends (see
// watchSet, MaxWatchesPerStream). ServerOptions adds the answer to a
// request for an actor the node does not serve (see ErrNotServed).
func StreamGuard(local func() string, authorize Authorize, log *slog.Logger) grpc.StreamServerInterceptor {
	return streamGuard(local, authorize, nil, log)
}

// answerer answers a refused request: it tells sender that target did
// not take it.
type answerer func(sender, target *actor.PID)

func streamGuard(local func() string, authorize Authorize, answer answerer, log *slog.Logger) grpc.StreamServerInterceptor {
	log = orDefault(log)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer recoverAs(&err, info.FullMethod, log)
		if info.FullMethod != receiveMethod {
			if strings.HasPrefix(info.FullMethod, remotingService) {
				return status.Errorf(codes.Unimplemented, "%s is not served", info.FullMethod)
			}
			return handler(srv, ss)
		}
		g := &guardedStream{ServerStream: ss, local: local, authorize: authorize, answer: answer, log: log}
		g.peer, _ = PeerIdentity(ss.Context()) // plaintext loopback: the zero identity
		if p, ok := peer.FromContext(ss.Context()); ok {
			g.addr = fmt.Sprint(p.Addr)
		}
		// Deferred after recoverAs, so run before it: a stream that ended
		// any way, a panic included, takes back the watches it set.
		defer g.release(srv, handler)
		err = handler(srv, g)
		g.unreadable(err)
		return err
	}
}

// recoverAs turns a panic into a gRPC error so that a handler's bug costs
// one stream, not the process.
func recoverAs(err *error, method string, log *slog.Logger) {
	if p := recover(); p != nil {
		*err = status.Errorf(codes.Internal, "%s: recovered panic", method)
		// The panic value and stack are for the operator's log, not the peer.
		log.Error("netsec: recovered a panic of a gRPC handler", "method", method, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	}
}

type guardedStream struct {
	grpc.ServerStream
	local     func() string
	authorize Authorize
	answer    answerer // nil: a request for an actor not served is refused whole
	log       *slog.Logger
	peer      Identity
	addr      string
	// refused: the stream ends on a batch refuse logged. Set and read on
	// the handler's goroutine, the one that calls RecvMsg.
	refused bool
	// watches are the watches of local actors that this stream delivered
	// and did not take back; only the handler's goroutine touches them.
	watches watchSet
}

// refuse logs a refused batch for the operator and ends the stream.
func (g *guardedStream) refuse(code codes.Code, err error) error {
	g.refused = true
	g.log.Warn("netsec: refused a message batch", "peer", g.peer.Name(), "addr", g.addr, "error", err.Error())
	return status.Error(code, err.Error())
}

// unreadable logs, at WARN with the peer's name and address, a stream that
// ended on a message the node could not read: gRPC's failure to decode
// the frame as a protoactor message (Internal) or to take one over the
// size limit (ResourceExhausted), or protoactor's failure to decode a
// message of the batch as its type (its plain error: Unknown). protoactor
// reports these only to its own logger, which a node keeps quiet; a peer
// that went away or a node that is closing (Canceled, Unavailable, EOF)
// is not worth a line.
func (g *guardedStream) unreadable(err error) {
	if err == nil || g.refused {
		return
	}
	switch status.Code(err) {
	case codes.Internal, codes.ResourceExhausted, codes.Unknown:
		g.log.Warn("netsec: a peer's message could not be read; its stream ended", "peer", g.peer.Name(), "addr", g.addr, "error", err.Error())
	}
}

// stray answers a request for an actor the node does not serve, as
// protoactor answers one for an actor that does not exist: the sender's
// future fails at once (actor.ErrDeadLetter) rather than at its timeout,
// which cutting the stream would leave it to (protoactor fails no future
// when a stream ends). Logged at WARN: a peer that names actors this
// node does not serve is misconfigured or probing.
func (g *guardedStream) stray(e *remote.MessageEnvelope, env Envelope, why error) {
	sender := proto.Clone(env.Sender).(*actor.PID)
	if e.SenderRequestId > 0 {
		sender.RequestId = e.SenderRequestId
	}
	target := proto.Clone(env.Target).(*actor.PID)
	if e.TargetRequestId > 0 {
		target.RequestId = e.TargetRequestId
	}
	g.log.Warn("netsec: answered a request for an actor this node does not serve", "peer", g.peer.Name(), "addr", g.addr,
		"target", target.Id, "type", env.TypeName, "error", why.Error())
	g.answer(sender, target)
}

func (g *guardedStream) RecvMsg(m any) error {
	if err := g.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	rm, ok := m.(*remote.RemoteMessage)
	if !ok {
		return status.Errorf(codes.Internal, "unexpected message %T on the Receive stream", m)
	}
	b := rm.GetMessageBatch()
	if b == nil {
		return nil
	}
	if err := ValidateBatch(b, g.local()); err != nil {
		return g.refuse(codes.InvalidArgument, err)
	}
	kept := b.Envelopes
	type stray struct {
		e   *remote.MessageEnvelope
		env Envelope
		why error
	}
	var strays []stray
	if g.authorize != nil {
		kept = make([]*remote.MessageEnvelope, 0, len(b.Envelopes))
		for _, e := range b.Envelopes {
			env := envelopeOf(b, e)
			err := g.authorize(g.peer, env)
			switch {
			case err == nil:
				kept = append(kept, e)
			case g.answer != nil && env.Sender != nil && errors.Is(err, ErrNotServed):
				strays = append(strays, stray{e, env, err})
			default:
				return g.refuse(codes.PermissionDenied, errors.Wrapf(err, "peer %q", g.peer.Name()))
			}
		}
	}
	if code, err := g.watches.admit(b, kept); err != nil {
		return g.refuse(code, errors.Wrapf(err, "peer %q", g.peer.Name()))
	}
	// Answered only once the whole batch passed: a batch refused
	// delivers nothing and answers nothing.
	for _, s := range strays {
		g.stray(s.e, s.env, s.why)
	}
	b.Envelopes = kept
	stampPeer(b, g.peer.Name())
	return nil
}

// Bounds on the watches one stream holds (see watchSet). A peer node sets
// one watch per session of its actors with this node's actors (a
// prefill's session actor watches the decode server; the server watches
// it back): far below either bound.
const (
	// MaxWatchesPerStream bounds the watches of local actors that one
	// stream holds at once.
	MaxWatchesPerStream = 1024
	// MaxWatchBytesPerStream bounds the bytes of their PIDs' addresses and
	// ids, which the watched actors keep.
	MaxWatchBytesPerStream = 256 << 10
)

// watchKey is one watch that a stream delivered: the watched local actor
// and the watcher's id (its address is the stream's one watcher address).
type watchKey struct{ targetAddr, target, watcher string }

// watchSet bounds what a peer makes this node's actors hold by watching
// them. protoactor adds every Watch's watcher to the target's watchers,
// without limit, for as long as the target lives, and sends each a
// Terminated when it stops, dialling its address. Legitimately a peer
// node's actors watch this node's over the stream of that node's
// endpoint: one address, a watch per session, each taken back by an
// Unwatch, and useless once the stream ends (protoactor on the watcher's
// side reports every actor it watched on this node terminated when its
// connection ends, and never sends that Watch again). So a stream holds
// at most MaxWatchesPerStream watches of MaxWatchBytesPerStream bytes,
// all by watchers at one address, and the watches it still holds when it
// ends are taken back (release). The zero value is an empty set.
type watchSet struct {
	addr  string // the watchers' address: the first Watch's; "" before one
	held  map[watchKey]bool
	bytes int
}

// admit applies the Watches and Unwatches among envs (a batch's envelopes
// to deliver, in order) to the set, all or nothing: a Watch over a bound
// or by a watcher at another address than the stream's refuses the batch
// (the code to end the stream with, and why), and the set stays as it
// was. A repeated Watch is one watch (protoactor keeps a set); an Unwatch
// of a watch the set does not hold is delivered and changes nothing.
func (w *watchSet) admit(b *remote.MessageBatch, envs []*remote.MessageEnvelope) (codes.Code, error) {
	var next map[watchKey]bool // this batch's changes: true held, false taken back
	addr, n, bytes := w.addr, len(w.held), w.bytes
	for _, e := range envs {
		name := b.TypeNames[e.TypeId]
		if name != "actor.Watch" && name != "actor.Unwatch" {
			continue
		}
		who, err := watcherOf(name, e.MessageData)
		if err != nil {
			return codes.InvalidArgument, err // ValidateBatch decoded it already
		}
		t := b.Targets[e.Target]
		k := watchKey{targetAddr: t.Address, target: t.Id, watcher: who.Id}
		held, changed := next[k]
		if !changed {
			held = w.held[k]
		}
		cost := len(k.targetAddr) + len(k.target) + len(k.watcher) + len(addr)
		if name == "actor.Unwatch" {
			if held && who.Address == addr {
				if next == nil {
					next = map[watchKey]bool{}
				}
				next[k] = false
				n, bytes = n-1, bytes-cost
			}
			continue
		}
		if addr == "" {
			addr = who.Address
			cost += len(addr)
		}
		switch {
		case who.Address != addr:
			return codes.PermissionDenied, errors.Newf("Watch of %q by a watcher at %q: this stream's watchers are at %q", t.Id, who.Address, addr)
		case held:
			continue
		case n >= MaxWatchesPerStream:
			return codes.ResourceExhausted, errors.Newf("Watch of %q: the stream holds %d watches already (at most %d)", t.Id, n, MaxWatchesPerStream)
		case bytes+cost > MaxWatchBytesPerStream:
			return codes.ResourceExhausted, errors.Newf("Watch of %q: the stream's watches would hold %d bytes (at most %d)", t.Id, bytes+cost, MaxWatchBytesPerStream)
		}
		if next == nil {
			next = map[watchKey]bool{}
		}
		next[k] = true
		n, bytes = n+1, bytes+cost
	}
	if next == nil {
		return codes.OK, nil
	}
	w.addr, w.bytes = addr, bytes
	if w.held == nil {
		w.held = map[watchKey]bool{}
	}
	for k, held := range next {
		if held {
			w.held[k] = true
		} else {
			delete(w.held, k)
		}
	}
	return codes.OK, nil
}

// unwatches is a batch that takes back every watch of the set, nil when it
// holds none.
func (w *watchSet) unwatches() *remote.MessageBatch {
	if len(w.held) == 0 {
		return nil
	}
	b := &remote.MessageBatch{TypeNames: []string{"actor.Unwatch"}}
	targets := map[[2]string]int32{}
	for k := range w.held {
		t := [2]string{k.targetAddr, k.target}
		i, ok := targets[t]
		if !ok {
			i = int32(len(b.Targets))
			targets[t] = i
			b.Targets = append(b.Targets, actor.NewPID(k.targetAddr, k.target))
		}
		data, err := proto.Marshal(&actor.Unwatch{Watcher: actor.NewPID(w.addr, k.watcher)})
		if err != nil {
			continue // a PID always marshals
		}
		b.Envelopes = append(b.Envelopes, &remote.MessageEnvelope{Target: i, TypeId: 0, MessageData: data, SerializerId: protoSerializer})
	}
	return b
}

// release takes back the watches that the stream still holds once its
// handler returned: it runs the handler (protoactor's endpoint reader)
// once more, on a stream that carries their Unwatches and then ends, so
// that they reach the watched actors the way the Watches did, after them.
// The handler, not this guard, holds the actor system that delivers them.
func (g *guardedStream) release(srv any, handler grpc.StreamHandler) {
	b := g.watches.unwatches()
	g.watches = watchSet{}
	if b == nil {
		return
	}
	if err := handler(srv, &releaseStream{ServerStream: g.ServerStream, batch: b}); err != nil {
		g.log.Warn("netsec: could not take back the watches of an ended stream", "peer", g.peer.Name(), "addr", g.addr,
			"watches", len(b.Envelopes), "error", err.Error())
	}
}

// releaseStream hands protoactor's endpoint reader one batch, then the end
// of the stream; what the reader would send back goes nowhere.
type releaseStream struct {
	grpc.ServerStream
	batch *remote.MessageBatch
}

func (s *releaseStream) RecvMsg(m any) error {
	rm, ok := m.(*remote.RemoteMessage)
	if !ok || s.batch == nil {
		return io.EOF
	}
	rm.MessageType = &remote.RemoteMessage_MessageBatch{MessageBatch: s.batch}
	s.batch = nil
	return nil
}

func (s *releaseStream) SendMsg(any) error { return nil }

// watcherOf decodes the watcher of a Watch or an Unwatch.
func watcherOf(typeName string, data []byte) (*actor.PID, error) {
	var who *actor.PID
	switch typeName {
	case "actor.Watch":
		var m actor.Watch
		if err := proto.Unmarshal(data, &m); err != nil {
			return nil, errors.Wrap(err, typeName)
		}
		who = m.Watcher
	case "actor.Unwatch":
		var m actor.Unwatch
		if err := proto.Unmarshal(data, &m); err != nil {
			return nil, errors.Wrap(err, typeName)
		}
		who = m.Watcher
	}
	if who == nil {
		return nil, errors.Newf("%s without a watcher", typeName)
	}
	return who, nil
}

// stampPeer sets PeerHeader on every envelope to the verified peer name,
// or removes it for an unauthenticated peer, so that no peer can claim
// another's name through it.
func stampPeer(b *remote.MessageBatch, name string) {
	for _, e := range b.Envelopes {
		switch {
		case name != "":
			if e.MessageHeader == nil {
				e.MessageHeader = &remote.MessageHeader{}
			}
			if e.MessageHeader.HeaderData == nil {
				e.MessageHeader.HeaderData = map[string]string{}
			}
			e.MessageHeader.HeaderData[PeerHeader] = name
		case e.MessageHeader != nil:
			delete(e.MessageHeader.HeaderData, PeerHeader)
		}
	}
}

func envelopeOf(b *remote.MessageBatch, e *remote.MessageEnvelope) Envelope {
	out := Envelope{Target: b.Targets[e.Target], TypeName: b.TypeNames[e.TypeId], Data: e.MessageData}
	if e.Sender > 0 {
		out.Sender = b.Senders[e.Sender-1]
	}
	return out
}

// ValidateBatch checks what protoactor remote's endpoint reader
// (onMessageBatch, deserializeSender/Target, Deserialize) indexes or
// dereferences without checking, so that a batch that passes cannot make it
// panic: target, sender and type indexes in range and naming non-nil
// entries, the protobuf serializer, a type name that protobuf knows, and
// the PIDs inside the system messages it acts on non-nil. It also refuses a
// target whose address is not local (when local is not empty): protoactor
// would forward such a message to another node, or, for another spelling of
// this node's own address, to itself forever.
func ValidateBatch(b *remote.MessageBatch, local string) error {
	for i, e := range b.Envelopes {
		if e == nil {
			return errors.Newf("envelope %d: empty", i)
		}
		if e.Target < 0 || int(e.Target) >= len(b.Targets) || b.Targets[e.Target] == nil {
			return errors.Newf("envelope %d: target index %d out of range [0, %d)", i, e.Target, len(b.Targets))
		}
		t := b.Targets[e.Target]
		if t.Id == "" {
			return errors.Newf("envelope %d: target has no id", i)
		}
		if local != "" && t.Address != local {
			return errors.Newf("envelope %d: target address %q is not this node (%q): messages are never forwarded", i, t.Address, local)
		}
		if e.Sender < 0 || int(e.Sender) > len(b.Senders) || (e.Sender > 0 && b.Senders[e.Sender-1] == nil) {
			return errors.Newf("envelope %d: sender index %d out of range [0, %d]", i, e.Sender, len(b.Senders))
		}
		if e.TypeId < 0 || int(e.TypeId) >= len(b.TypeNames) {
			return errors.Newf("envelope %d: type index %d out of range [0, %d)", i, e.TypeId, len(b.TypeNames))
		}
		if e.SerializerId != protoSerializer {
			return errors.Newf("envelope %d: serializer %d refused (protobuf only)", i, e.SerializerId)
		}
		name := b.TypeNames[e.TypeId]
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
		if err != nil {
			return errors.Newf("envelope %d: unknown message type %q", i, name)
		}
		if err := checkSystem(mt, e.MessageData); err != nil {
			return errors.Wrapf(err, "envelope %d", i)
		}
	}
	return nil
}

// checkSystem decodes the system messages whose PIDs protoactor
// dereferences on receipt (Terminated's Who in the endpoint reader,
// Watch's and Unwatch's Watcher in the target actor) and refuses nil ones.
// Other types are decoded once, by protoactor, after this check.
func checkSystem(mt protoreflect.MessageType, data []byte) error {
	var pid func(proto.Message) *actor.PID
	switch mt.Descriptor().FullName() {
	case "actor.Terminated":
		pid = func(m proto.Message) *actor.PID { return m.(*actor.Terminated).Who }
	case "actor.Watch":
		pid = func(m proto.Message) *actor.PID { return m.(*actor.Watch).Watcher }
	case "actor.Unwatch":
		pid = func(m proto.Message) *actor.PID { return m.(*actor.Unwatch).Watcher }
	default:
		return nil
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(data, m); err != nil {
		return errors.Wrapf(err, "%s", mt.Descriptor().FullName())
	}
	if p := pid(m); p == nil || p.Address == "" || p.Id == "" {
		return errors.Newf("%s without a complete PID", mt.Descriptor().FullName())
	}
	return nil
}
