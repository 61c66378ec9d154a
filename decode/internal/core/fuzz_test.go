package core

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages/wire"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// fuzzWorld drives a core from fuzz bytes, answering its Calls from the
// same bytes.
type fuzzWorld struct {
	core    *Core
	in      []byte
	tainted bool
	timers  []uint64
}

func (w *fuzzWorld) byte() byte {
	if len(w.in) == 0 {
		return 0
	}
	b := w.in[0]
	w.in = w.in[1:]
	return b
}

// take consumes a length byte and then up to that many bytes. The length
// is read before the rest is measured: in one expression the order of
// len(w.in) and w.byte() is unspecified.
func (w *fuzzWorld) take() []byte {
	n := int(w.byte())
	n = min(n, len(w.in))
	b := w.in[:n]
	w.in = w.in[n:]
	return b
}

func (w *fuzzWorld) step(t *testing.T, m Msg) {
	// Every message a trace would record decodes back to itself.
	require.True(t, sameValue(reflect.ValueOf(m), reflect.ValueOf(roundTrip(t, m))), "%T does not survive a trace", m)
	effs := w.core.Step(m)
	for _, e := range effs {
		switch e := e.(type) {
		case ArmTimer:
			w.timers = append(w.timers, e.ID)
		case ReleasePool:
			require.False(t, w.tainted, "the pool was released after a revocation could not be confirmed")
		}
		var res Msg
		fail := w.byte()%5 == 0
		switch e := e.(type) {
		case CallAdmit:
			res = AdmittedMsg{Err: errIf(fail)}
		case CallSize:
			bufs := []Buffer{{Name: "a", Base: 1, ItemLen: e.Layout[0].ItemLen, Pages: 8}}
			if len(e.Layout) > 1 {
				bufs = append(bufs, Buffer{Name: "b", Base: 2, ItemLen: e.Layout[1].ItemLen, Pages: 6})
			}
			res = SizedMsg{Buffers: bufs, Err: errIf(fail)}
		case CallOpenAccess:
			res = AccessMsg{Address: []byte("ap"), Revocable: true, Err: errIf(fail)}
		case CallVerify:
			res = VerifiedMsg{Err: errIf(fail)}
		}
		require.NoError(t, w.core.check(), "after %T", m)
		if res != nil {
			w.step(t, res)
		}
	}
	w.tainted = w.tainted || w.core.ledger.tainted
	require.NoError(t, w.core.check(), "after %T", m)
}

func errIf(fail bool) error {
	if fail {
		return errors.New("no")
	}
	return nil
}

// FuzzCore feeds a core a sequence of messages drawn from fuzz bytes (valid
// and malformed Hellos, notices and goodbyes from three sessions, losses,
// revocations that may fail, timers, the serving stack's calls, protobuf
// messages decoded from the bytes themselves), answering its Calls from
// the bytes too: nothing may panic, and the invariants of check hold after
// every message.
func FuzzCore(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 7, 1, 1, 0, 2, 3, 1, 4, 1, 1, 5, 0, 1, 1, 2, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 9, 0, 4, 0, 5, 0, 1, 8, 0, 0, 11})
	f.Add([]byte{12, 20, 0x1a, 0x04, 0x12, 0x02, 0x08, 0x01, 0, 1, 1, 0, 3})
	f.Fuzz(func(t *testing.T, in []byte) {
		w := &fuzzWorld{in: in}
		size := len(in) > 0 && in[0]&0x80 != 0
		var pool []Buffer
		if !size {
			pool = []Buffer{{Name: "k", Base: 1 << 20, ItemLen: 64, Pages: 8}, {Name: "v", Base: 2 << 20, ItemLen: 64, Pages: 8}}
		}
		w.core = NewCore(Rules{MaxSessions: 2, MaxRoomsPerSession: 3, MaxChunksPerRoom: 3, AcceptUnknownRooms: len(in) > 1 && in[1]&1 == 1,
			Admit: true, Verify: true, Size: size, MaxPoolBytes: 1 << 16, ByeGrace: time.Second, RoomTimeout: time.Second}, pool)
		for steps := 0; len(w.in) > 0 && steps < 64; steps++ {
			op := w.byte() % 16
			sess := fmt.Sprintf("s%d", w.byte()%3)
			node := "n-" + sess
			room := uint64(w.byte() % 4)
			switch op {
			case 0:
				h := &wire.Hello{Version: ProtocolVersion, Prefill: sess, SessionAddress: node, SessionId: "a" + sess, PageSize: uint32(w.byte() % 5),
					Buffers: []*wire.Buffer{{Name: "k", ItemLen: 64, Pages: uint64(w.byte())}, {Name: "v", ItemLen: 64, Pages: 8}}}
				if w.byte()%4 == 0 {
					h.Buffers = h.Buffers[:1]
				}
				w.step(t, HelloMsg{From: Origin{Node: node}, Hello: h, Token: sess})
			case 1, 13:
				start := int64(w.byte() % 24)
				n := &wire.ChunkNotice{Session: sess, Room: room, Start: start, End: start + int64(w.byte()%24), Last: w.byte()%2 == 0,
					Status: wire.Status(w.byte() % 4), NotQuiesced: w.byte()%3 == 0}
				for k := w.byte() % 6; k > 0; k-- {
					n.Positions = append(n.Positions, int64(w.byte()%10))
					n.DstPages = append(n.DstPages, int64(w.byte()%10))
				}
				if op == 13 {
					var raw wire.ChunkNotice
					if proto.Unmarshal(w.take(), &raw) == nil {
						raw.Session = sess
						n = &raw
					}
				}
				w.step(t, NoticeMsg{From: Origin{Node: node}, Notice: n})
			case 2:
				b := &wire.Bye{Session: sess, Chunks: uint64(w.byte() % 4)}
				if w.byte()%3 == 0 {
					b.Aborted = "stopped"
				}
				w.step(t, ByeMsg{From: Origin{Node: node}, Bye: b})
			case 3:
				w.step(t, DepartedMsg{Actor: node + "/a" + sess, Grace: time.Duration(w.byte()%2) * time.Second})
			case 4:
				w.step(t, PeerLostMsg{Session: sess, Cause: errors.New("silent")})
			case 5:
				var err error
				if w.byte()%3 == 0 {
					err = errors.Mark(errors.New("unconfirmed"), ErrNotQuiesced)
				}
				w.step(t, RevokedMsg{Session: sess, Err: err})
			case 6:
				if len(w.timers) > 0 {
					i := int(w.byte()) % len(w.timers)
					w.step(t, TimerMsg{ID: w.timers[i]})
				}
			case 7:
				var pages []int
				for k := w.byte()%4 + 1; k > 0; k-- {
					pages = append(pages, int(w.byte()%10))
				}
				from := ""
				if w.byte()%2 == 0 {
					from = sess
				}
				w.step(t, ExpectMsg{Room: room, Pages: pages, From: from})
			case 8:
				w.step(t, ReleaseMsg{Room: room})
			case 9:
				w.step(t, LookupMsg{Room: room})
			case 10:
				w.step(t, DrainMsg{})
			case 11:
				w.step(t, CloseMsg{})
			case 14:
				w.step(t, CancelRoomMsg{Room: room, Cause: "fuzz"})
			case 15:
				w.step(t, CancelMsg{From: Origin{Node: node}, Cancel: &wire.Cancel{Session: sess, Room: room, NotQuiesced: w.byte()%3 == 0}})
			case 12:
				var raw wire.Hello
				if proto.Unmarshal(w.take(), &raw) == nil {
					w.step(t, HelloMsg{From: Origin{Node: raw.SessionAddress}, Hello: &raw, Token: sess})
				}
			}
		}
	})
}

// TestCoreInvariantsCatchAPlantedBug shows check failing on a core whose
// bookkeeping was broken on purpose (a page held by a room that was
// forgotten): the fuzz oracle can fail.
func TestCoreInvariantsCatchAPlantedBug(t *testing.T) {
	c := NewCore(Rules{MaxSessions: 1, MaxRoomsPerSession: 1, MaxChunksPerRoom: 4, ByeGrace: time.Second},
		[]Buffer{{Name: "k", Base: 1, ItemLen: 64, Pages: 8}})
	require.NoError(t, c.check())
	effs := c.Step(ExpectMsg{Room: 1, Pages: []int{2, 3}})
	require.Equal(t, Reply{}, effs[0])
	require.NoError(t, c.check())
	delete(c.rooms, 1) // the planted bug: forget the room, keep its pages
	err := c.check()
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "neither live nor lingering"), err.Error())
}

// TestCoreCloseReleasesPagesWithThePool is the fuzz finding that a closed
// core released its pool while a quiet room still listed pages of it.
func TestCoreCloseReleasesPagesWithThePool(t *testing.T) {
	c := NewCore(Rules{MaxSessions: 1, MaxRoomsPerSession: 1, MaxChunksPerRoom: 4, ByeGrace: time.Second},
		[]Buffer{{Name: "k", Base: 1, ItemLen: 64, Pages: 8}})
	c.Step(ExpectMsg{Room: 1, Pages: []int{2, 3}})
	effs := c.Step(CloseMsg{})
	require.Contains(t, effs, Effect(ReleasePool{}))
	require.NoError(t, c.check())
	require.Equal(t, Reply{Err: nil}, c.Step(ReleaseMsg{Room: 1})[0])
	require.NoError(t, c.check())
}
