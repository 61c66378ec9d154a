package decode

import (
	"io"
	"time"

	"github.com/kvstream/kvstream/decode/internal/core"
	"github.com/kvstream/kvstream/messages"
	"go.uber.org/zap"
)

// ChunkStatus is how a chunk ended on the prefill: messages.Succeeded,
// Failed or Dropped (the prefill engine's system.Status is the same type).
type ChunkStatus = messages.Status

// Buffer is one KV tensor of the decode pool, in memory that never moves
// (pinned host memory or device memory the transport can register): Name
// (for logs and errors), Base (the address of page 0), ItemLen (the bytes
// of one page of this buffer), Pages (its capacity in pages); Memory, the
// kind of memory it lives in (host by default: the server registers device
// memory as such, rdma.RegisterMemory); Region, if set, its registration
// already, memory the transport allocated (rdma.Allocator), which the
// server offers as is and never deregisters: its owner frees it once the
// server released the pool (Config.Free, Close). The pool has one Buffer
// per prefill buffer, in the prefill's order (the order of the engine's
// Config.Buffers on the prefill side), each with the same ItemLen; Pages
// may differ from the prefill's.
type Buffer = core.Buffer

// PrefillBuffer is one prefill buffer as a Hello describes it (Name,
// Layer, ItemLen, and Pages, the prefill buffer's capacity, which a pool
// sized by Config.Size may use): what the decode pool's buffer of the same
// index must match.
type PrefillBuffer = core.PrefillBuffer

// Config configures a Server.
type Config struct {
	// Buffers is the decode pool (see Buffer). Every page of it is
	// registered with the transport at New and offered to every prefill
	// session.
	Buffers []Buffer
	// Size, when Buffers is empty, sizes the pool from a prefill's layout
	// instead (tests and the sim's decode command, which learn the
	// geometry from the prefill), and registers what it returns. It runs
	// on the server's actor, so it must bound what it allocates: the
	// layout comes from the network (MaxPoolBytes is checked first). A
	// pool it sized lives while sessions or rooms hold it: once none does
	// and no page may still be written, it is deregistered and handed to
	// Free, and the next Hello sizes a new one. Sessions open at once must
	// all match the pool.
	Size func(layout []PrefillBuffer) ([]Buffer, error)
	// Free, if set, takes back a pool Size made, after it was deregistered
	// and no peer can write it any more. A pool some prefill may still
	// write (its access could not be revoked) is never handed to Free.
	Free func([]Buffer)
	// PageSize, if set, is the pool's page size in tokens: a Hello with
	// another is refused. Zero: the first session's, kept while sessions
	// or rooms hold the pool.
	PageSize int
	// Prefills, when set, are the certificate names of the prefills that
	// may open a session (a node with TLS); any other peer's Hello is
	// refused. Empty: any node holding a certificate of the CA. A
	// prefill's identity is its certificate name (in the clear, the name
	// its Hello claims): one identity holds one live session at a time (a
	// second Hello gets ErrUnavailable until the first ended), and, in a
	// group, one per CP rank.
	Prefills []string
	// MaxPoolBytes bounds the pool a Size function may be asked for: a
	// Hello whose layout (pages times item length, summed, overflow
	// checked) exceeds it is refused before Size runs. Default
	// DefaultMaxPoolBytes.
	MaxPoolBytes uint64
	// ID is the peer id prefill engines know this pool by (default
	// "decode").
	ID string
	// Name, when set, lets several Servers share a node, one per decode
	// pool (the decode ranks of one process, each its own pool): a prefill
	// names the Server it opens a session with in DialConfig.Server.
	// Letters, digits, '.', '_' and '-', at most 64 bytes. Empty: the
	// node's only Server, which a DialConfig without Server reaches.
	Name string
	// Admit, if set, checks a prefill's Hello before anything is sized or
	// offered: what the serving stack and the prefill must agree on beyond
	// the layout (a model, a sharding), which the prefill passes in
	// DialConfig.Metadata. An error refuses the session (Dial's error is
	// marked ErrBadInput and carries its text). It runs on the server's
	// actor, before Size for the same Hello: it must not call the Server,
	// should be short, and must bound what it parses (it reads what the
	// network sent).
	Admit func(prefill string, metadata map[string]string) error
	// AcceptUnknownRooms makes a notice for a room nobody Expected create
	// the room instead of being refused: the room is bound to the identity
	// of the session that reported it first, its pages are those its
	// notices name (pages no other room holds), and it is forgotten once
	// it ended and its pages are quiet (OnRoomEnd is how a process learns
	// of it). The sim's decode command uses it; a serving stack Expects
	// each room with the pages it allocated for it, and the prefill it
	// expects it from (ExpectFrom).
	AcceptUnknownRooms bool
	// Verify, if set, checks a successful chunk's bytes once they landed
	// (a checksum, the sim's pattern), for the session that reported it:
	// an error fails the room (marked ErrChunkFailed) and is returned to the
	// prefill. It runs on the control plane's actor: keep it short.
	Verify func(*Session, Chunk) error
	// Group, when set, makes every room the work of a context-parallel
	// group's ranks, one prefill session each (the rank in the session's
	// metadata, RankKey): a room completes only when every rank owning
	// pages of each of its chunks reported it successful with exactly its
	// pages and Verify accepted them. Without it a room is a group of
	// one: the one session that reports it.
	Group *Group
	// RoomTimeout, if positive, fails a room not complete this long after
	// it was Expected or its first notice arrived: a rank that never
	// reports (a partition that does not end its session) cannot keep it
	// waiting for ever. Its writers may still be writing: the error is
	// marked ErrNotQuiesced.
	RoomTimeout time.Duration
	// MaxRoomsPerSession bounds the rooms one session reports in that have
	// not ended, with those nobody Expected that ended but whose pages wait
	// for the session's revocation (default 4096, at most
	// MaxRoomsPerSessionLimit): a notice that would open one more is
	// refused.
	MaxRoomsPerSession int
	// MaxChunksPerRoom bounds the distinct chunks one room holds (default
	// 8192, at most MaxChunksPerRoomLimit): the notice of one more is
	// refused and fails the room. It caps the records a peer can make the
	// server keep for one room. Real
	// rooms are far below it: a 1M-token prompt prefilled in chunks of 512
	// tokens is 2048 chunks.
	MaxChunksPerRoom int
	// RevokeTimeout bounds how long a session's end waits for the
	// transport to cut its peer off (default 10 s); past it, the pages
	// that peer may write are treated as not quiesced.
	RevokeTimeout time.Duration
	// Observer, if set, is told of sessions, rooms, refusals and verified
	// bytes (NewMetrics gives one for Prometheus).
	Observer Observer
	// OnRoomEnd, if set, is called once per room when it completes or
	// fails (err says why, as Wait would), on a goroutine of its own: a
	// process serving rooms it did not Expect learns of them here. A room
	// Released while its failure waited for a lost prefill's access to be
	// revoked is reported once that revocation ended, which may be after
	// its id was Expected again: its Room is the released one's (its
	// pages), and the newer room's end is reported on its own.
	OnRoomEnd func(r Room, err error)
	// MaxSessions bounds the live prefill sessions (default 64, at most
	// MaxSessionsLimit).
	MaxSessions int
	// ByeGrace bounds how long a session whose Bye was answered waits for
	// the prefill to leave before it reports its end (default 10 s). The
	// prefill's access was revoked before the answer; the prefill leaving
	// first keeps the answer from being torn down with a node that stops
	// right after.
	ByeGrace time.Duration
	// DepartedGrace, when positive, ends a session whose prefill actor was
	// reported gone (a Terminated) and that said nothing since (no notice,
	// cancel or Hello) once it passed, as lost (its access revoked first):
	// a Dial that gave up on a late answer otherwise leaves its session,
	// its MaxSessions place, its identity and its access point open while
	// the prefill's node answers heartbeats, until that node says Hello
	// again or the process exits. Off by default (0: the heartbeats
	// decide): a Terminated also comes on a connection that broke and came
	// back (protoactor's AddressTerminated), and anyone holding a
	// certificate for the prefill's host (anyone, in the clear) can send
	// one, so an idle session could be ended that way. Negative is
	// ErrBadInput.
	DepartedGrace time.Duration
	// Log receives failures at WARN, a line per session opened and ended
	// and per drain started and ended at INFO (never per room), the rest at
	// DEBUG (default: none).
	Log *zap.Logger
	// TracePath, when set, records the Server's message trace: every
	// message its core takes (from the network, the heartbeats, timers,
	// revocations, the serving stack's calls, and the results of its
	// Calls) with the effects the core returned, in a bounded ring of
	// TraceCapacity records, written to this file at Close (DumpTrace
	// writes it any time). kvstream replay replays it (docs/TRACES.md,
	// "Decode traces"). A Server with a Name writes to the path with
	// "-Name" appended, and a path another Server of this process already
	// writes gets ".2", ".3", ... appended: no two Servers share a file.
	// Without TracePath and Trace, EnvTrace (KVSTREAM_TRACE=path) turns
	// recording on, to path plus TraceSuffix. Recording costs an encoding
	// per message on the Server's actor: turn it on to investigate. A file
	// that cannot be created is an error of New marked ErrBadInput.
	TracePath string
	// Trace, when set, receives the message trace at Close instead of a
	// file (set TracePath or Trace, not both).
	Trace io.Writer
	// TraceCapacity bounds the records a trace keeps, the last ones
	// (default trace.DefaultCapacity): a long run cannot fill a disk.
	TraceCapacity int
}

// Chunk is one chunk notice the prefill sent for a room, once its bytes
// landed: Room; Start and End, its tokens [Start, End) of the request; Last,
// whether it is the room's last chunk; Status (a ChunkStatus), what its
// Finish (or Drop) returned, with Err, the prefill's error text when it did
// not succeed, and NotQuiesced, when the prefill could not guarantee that
// the failed chunk's writes stopped; Bytes; Positions, the request positions
// (pages of the request) it wrote, and DstPages their decode pages, in the
// same order.
type Chunk = core.Chunk

// Room is what Wait reports: ID; Pages, the room's pages as Expected (nil
// for a room created by AcceptUnknownRooms); Chunks, the chunks the prefill
// reported, in order; Complete, whether the last chunk succeeded, and every
// chunk before it.
type Room = core.Room

// SessionReport is how a prefill session ended (Session.Wait): Prefill,
// the prefill's name; Chunks, the notices accepted, and Failed, those not
// successful, refused or rejected by Verify; Rooms, the rooms the session
// completed; Complete, whether the prefill said goodbye having sent all it
// meant to, every notice it sent arrived and succeeded, every room it
// started completed, and it reported at least one chunk; Empty, whether it
// reported nothing (a Hello and a goodbye): it completed nothing and
// verified nothing.
type SessionReport = core.SessionReport

// State is what a Server holds now (Server.State), for readiness checks
// and metrics: Sessions, the open sessions; Rooms, the rooms not released;
// Pooled, whether the pool is registered; Draining, Closed; Quarantined,
// the pages kept out of rooms for good; Tainted, whether a prefill's
// access could not be confirmed revoked (the pool is then never
// released).
type State = core.State

// Notice is what a prefill tells the decode server about one chunk, after
// its Finish (or Drop) returned: Result as returned, whether it was the
// room's last chunk, and which decode pages it wrote.
type Notice struct {
	Result messages.Result
	Last   bool
	// Positions are the request positions this prefill (this CP rank) sent,
	// DstPages their decode pages (DecodeInfo.DstPages[position]).
	Positions, DstPages []int
}
