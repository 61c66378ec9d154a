package netsec

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// watchLocal is the node of the guard-level tests below, and watchPeer the
// address of the peer node whose actors watch it.
const (
	watchLocal = "127.0.0.1:9100"
	watchPeer  = "127.0.0.1:9200"
)

// watchBatch is a batch of Watches (or Unwatches) of target by the peer
// node's actors of the given ids.
func watchBatch(typeName, target, addr string, ids ...string) *remote.RemoteMessage {
	b := &remote.MessageBatch{TypeNames: []string{typeName}, Targets: []*actor.PID{actor.NewPID(watchLocal, target)}}
	for _, id := range ids {
		var m proto.Message = &actor.Watch{Watcher: actor.NewPID(addr, id)}
		if typeName == "actor.Unwatch" {
			m = &actor.Unwatch{Watcher: actor.NewPID(addr, id)}
		}
		data, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		b.Envelopes = append(b.Envelopes, &remote.MessageEnvelope{MessageData: data})
	}
	return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}
}

// ids are n watcher ids.
func ids(prefix string, from, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, from+i)
	}
	return out
}

// fakeStream is a Receive stream whose peer sends msgs, then ends it.
type fakeStream struct {
	msgs []*remote.RemoteMessage
}

func (s *fakeStream) SetHeader(metadata.MD) error  { return nil }
func (s *fakeStream) SendHeader(metadata.MD) error { return nil }
func (s *fakeStream) SetTrailer(metadata.MD)       {}
func (s *fakeStream) Context() context.Context     { return context.Background() }
func (s *fakeStream) SendMsg(any) error            { return nil }

func (s *fakeStream) RecvMsg(m any) error {
	if len(s.msgs) == 0 {
		return io.EOF
	}
	proto.Merge(m.(*remote.RemoteMessage), s.msgs[0])
	s.msgs = s.msgs[1:]
	return nil
}

// watchedActors stands for protoactor's endpoint reader and the actors it
// delivers to: each actor keeps the set of its watchers, as protoactor's
// does (by address and id).
type watchedActors struct {
	runs     int                        // how often the handler ran
	watchers map[string]map[string]bool // target id -> watcher address/id
	most     int                        // the most watchers held at once
}

func (w *watchedActors) held() int {
	n := 0
	for _, set := range w.watchers {
		n += len(set)
	}
	return n
}

func (w *watchedActors) handler(_ any, s grpc.ServerStream) error {
	w.runs++
	if w.watchers == nil {
		w.watchers = map[string]map[string]bool{}
	}
	for {
		m := new(remote.RemoteMessage)
		if err := s.RecvMsg(m); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		b := m.GetMessageBatch()
		for _, e := range b.GetEnvelopes() {
			target := b.Targets[e.Target].Id
			msg, err := remote.Deserialize(e.MessageData, b.TypeNames[e.TypeId], e.SerializerId)
			if err != nil {
				return err
			}
			switch m := msg.(type) {
			case *actor.Watch:
				if w.watchers[target] == nil {
					w.watchers[target] = map[string]bool{}
				}
				w.watchers[target][m.Watcher.Address+"/"+m.Watcher.Id] = true
			case *actor.Unwatch:
				delete(w.watchers[target], m.Watcher.Address+"/"+m.Watcher.Id)
			}
		}
		w.most = max(w.most, w.held())
	}
}

// decodeInTheClear is what a decode node in the clear authorizes: its
// servers' actors open, every other actor closed.
func decodeInTheClear() Authorize {
	p := NewSessionPolicy(HeartbeatActor)
	p.OpenPrefix("kvstream-decode")
	return func(_ Identity, e Envelope) error { return p.AuthorizeLocal(e) }
}

// runStream runs the guard over one stream that carries msgs.
func runStream(w *watchedActors, msgs ...*remote.RemoteMessage) error {
	return StreamGuard(func() string { return watchLocal }, decodeInTheClear(), quiet)(nil, &fakeStream{msgs: msgs},
		&grpc.StreamServerInfo{FullMethod: receiveMethod}, w.handler)
}

// A prefill's session actor watches the decode server and takes the watch
// back at the session's end: delivered, and nothing is left to take back.
func TestGuardKeepsALegitimateWatch(t *testing.T) {
	var w watchedActors
	require.NoError(t, runStream(&w,
		watchBatch("actor.Watch", "kvstream-decode", watchPeer, "kvstream-prefill-1"),
		watchBatch("actor.Watch", "kvstream-decode", watchPeer, "kvstream-prefill-1"), // one watch, not two
		watchBatch("actor.Unwatch", "kvstream-decode", watchPeer, "kvstream-prefill-1"),
	))
	require.Equal(t, 1, w.most, "the watch was delivered")
	require.Zero(t, w.held())
	require.Equal(t, 1, w.runs, "nothing to take back: the handler ran once")

	// Many sessions one after another over one stream: each Unwatch frees
	// its watch's place.
	var msgs []*remote.RemoteMessage
	for i := range 3 * MaxWatchesPerStream {
		id := fmt.Sprintf("kvstream-prefill-%d", i)
		msgs = append(msgs, watchBatch("actor.Watch", "kvstream-decode", watchPeer, id),
			watchBatch("actor.Unwatch", "kvstream-decode", watchPeer, id))
	}
	w = watchedActors{}
	require.NoError(t, runStream(&w, msgs...))
	require.Equal(t, 1, w.most)
	require.Equal(t, 1, w.runs)
}

// A stream's watches are taken back when it ends: the prefill's side
// reports the decode server terminated when its connection ends and never
// watches again over a new one.
func TestGuardTakesBackTheWatchesOfAnEndedStream(t *testing.T) {
	var w watchedActors
	require.NoError(t, runStream(&w,
		watchBatch("actor.Watch", "kvstream-decode", watchPeer, "kvstream-prefill-1"),
		watchBatch("actor.Watch", "kvstream-decode-b", watchPeer, "kvstream-prefill-2", "kvstream-prefill-3"),
		watchBatch("actor.Unwatch", "kvstream-decode-b", watchPeer, "kvstream-prefill-3"),
	))
	require.Equal(t, 3, w.most)
	require.Zero(t, w.held(), "taken back: %v", w.watchers)
	require.Equal(t, 2, w.runs, "the handler ran again for the Unwatches")
}

// Watches flooded over one stream (the open server actor takes any
// peer's, before any session): refused past MaxWatchesPerStream, the
// stream cut, and every watch it set taken back.
func TestGuardBoundsTheWatchesOfAStream(t *testing.T) {
	var w watchedActors
	var msgs []*remote.RemoteMessage
	for i := 0; i < MaxWatchesPerStream+256; i += 256 {
		msgs = append(msgs, watchBatch("actor.Watch", "kvstream-decode", watchPeer, ids("w", i, 256)...))
	}
	err := runStream(&w, msgs...)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.ErrorContains(t, err, fmt.Sprintf("at most %d", MaxWatchesPerStream))
	require.Equal(t, MaxWatchesPerStream, w.most, "the refused batch delivered nothing")
	require.Zero(t, w.held(), "the cut stream's watches were taken back")

	// The bound counts bytes too: long ids fill it sooner.
	w = watchedActors{}
	long := strings.Repeat("x", 4<<10)
	msgs = msgs[:0]
	for i := range 128 {
		msgs = append(msgs, watchBatch("actor.Watch", "kvstream-decode", watchPeer, fmt.Sprintf("%s-%d", long, i)))
	}
	err = runStream(&w, msgs...)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "bytes")
	require.Less(t, w.most*(4<<10), MaxWatchBytesPerStream+1)
	require.Zero(t, w.held())

	// Any target: the heartbeat actor is allowed too.
	w = watchedActors{}
	err = runStream(&w, watchBatch("actor.Watch", HeartbeatActor, watchPeer, ids("w", 0, MaxWatchesPerStream+1)...))
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Zero(t, w.most)
}

// A batch is applied whole or refused whole: an Unwatch in a refused
// batch was not delivered, so its watch is still there to take back.
func TestGuardWatchBatchIsAllOrNothing(t *testing.T) {
	var w watchedActors
	refused := watchBatch("actor.Unwatch", "kvstream-decode", watchPeer, "w-0")
	refused.GetMessageBatch().TypeNames = append(refused.GetMessageBatch().TypeNames, "actor.Watch")
	for _, id := range []string{"new-1", "new-2"} {
		data, err := proto.Marshal(&actor.Watch{Watcher: actor.NewPID(watchPeer, id)})
		require.NoError(t, err)
		refused.GetMessageBatch().Envelopes = append(refused.GetMessageBatch().Envelopes, &remote.MessageEnvelope{TypeId: 1, MessageData: data})
	}
	err := runStream(&w, watchBatch("actor.Watch", "kvstream-decode", watchPeer, ids("w", 0, MaxWatchesPerStream)...), refused)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Equal(t, MaxWatchesPerStream, w.most)
	require.Zero(t, w.held(), "w-0 was taken back too: %v", w.watchers)
}

// A stream carries one peer node's actors' watches: one address, which
// protoactor dials to report a stop. A Watch by a watcher elsewhere is
// refused.
func TestGuardWatchersOfAStreamShareOneAddress(t *testing.T) {
	var w watchedActors
	err := runStream(&w,
		watchBatch("actor.Watch", "kvstream-decode", watchPeer, "a"),
		watchBatch("actor.Unwatch", "kvstream-decode", "127.0.0.1:9300", "a"), // not ours: delivered, changes nothing
		watchBatch("actor.Watch", "kvstream-decode", "127.0.0.1:9300", "b"))
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.ErrorContains(t, err, `"127.0.0.1:9300"`)
	require.Equal(t, 1, w.most)
	require.Zero(t, w.held())
}

// watchCounter is a local process that keeps its watchers as an actor
// does (by address and id), counting them.
type watchCounter struct {
	mu       sync.Mutex
	watchers *actor.PIDSet
	most     int
}

func (c *watchCounter) SendUserMessage(*actor.PID, any) {}
func (c *watchCounter) Stop(*actor.PID)                 {}

func (c *watchCounter) SendSystemMessage(_ *actor.PID, m any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch m := m.(type) {
	case *actor.Watch:
		c.watchers.Add(m.Watcher)
	case *actor.Unwatch:
		c.watchers.Remove(m.Watcher)
	}
	c.most = max(c.most, c.watchers.Len())
}

func (c *watchCounter) count() (now, most int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watchers.Len(), c.most
}

// An authenticated node of the CA that is no session's peer floods an open
// actor with Watches, over fresh streams, round after round (the attack
// grew a decode's heap by 100 MB, 75 MB of it kept after the stream
// closed): each stream is cut at MaxWatchesPerStream, and its watches are
// taken back, so the actor never holds more than one stream's worth. The
// session's peer's watch stays while its stream lives.
func TestWatchFloodIsBoundedAndTakenBack(t *testing.T) {
	const id = "kvstream-watched"
	c := &watchCounter{watchers: actor.NewPIDSet()}
	pid, ok := fx.n.system.ProcessRegistry.Add(c, id)
	require.True(t, ok)
	defer fx.n.system.ProcessRegistry.Remove(pid)
	policy.Open(id)
	defer policy.Forbid(id)
	target := actor.NewPID(fx.addr, id)
	batch := func(typeName string, ids ...string) *remote.RemoteMessage {
		m := watchBatch(typeName, id, "127.0.0.1:1", ids...)
		m.GetMessageBatch().Targets = []*actor.PID{target}
		return m
	}
	held := func(want int) {
		t.Helper()
		require.Eventually(t, func() bool { n, _ := c.count(); return n == want }, 10*time.Second, 5*time.Millisecond,
			"want %d watchers", want)
	}

	for round := range 3 {
		_, s := dialStream(t, fx.c.intruder.ClientConfig(), fx.addr)
		for i := 0; i < MaxWatchesPerStream; i += 256 {
			require.NoError(t, s.Send(batch("actor.Watch", ids(fmt.Sprintf("w%d", round), i, 256)...)))
		}
		held(MaxWatchesPerStream)
		require.NoError(t, s.Send(batch("actor.Watch", fmt.Sprintf("w%d-over", round))))
		ended := make(chan error, 1)
		go func() { _, err := s.Recv(); ended <- err }() // ends at the test's cleanup at the latest
		select {
		case err := <-ended:
			require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the Watch over the bound was not refused: the stream is still open", round)
		}
		held(0)
	}
	_, most := c.count()
	require.Equal(t, MaxWatchesPerStream, most, "never more than one stream's watches")
	require.Contains(t, guardLog.String(), "the stream holds 1024 watches already")

	// The session's peer: its watch is delivered and held while its stream
	// lives, and taken back when the stream ends.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := remote.NewRemotingClient(dial(t, fx.c.prefill.ClientConfig(), fx.addr)).Receive(ctx)
	require.NoError(t, err)
	require.NoError(t, s.Send(batch("actor.Watch", "kvstream-prefill-1")))
	held(1)
	require.NoError(t, s.Send(batch("actor.Unwatch", "kvstream-prefill-1")))
	held(0)
	require.NoError(t, s.Send(batch("actor.Watch", "kvstream-prefill-2")))
	held(1)
	require.NoError(t, s.CloseSend())
	held(0)
}
