package launch

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
)

// A cluster node (decode-instance, prefill-rank) speaks to whoever started
// it (Up, or an operator's supervisor) in JSON lines: events on stdout,
// commands on stdin. Closing its stdin, or SIGTERM, drains and ends it.

// Event kinds.
const (
	// EventReady: the node serves and is registered (Addr, Pid).
	EventReady = "ready"
	// EventWaiting: the node waits for something it names (What); sent
	// when a wait begins and, while it lasts, every few seconds.
	EventWaiting = "waiting"
	// EventRoom: a room ended on a decode instance.
	EventRoom = "room"
	// EventForward: a rank finished a forward of a batch.
	EventForward = "forward"
	// EventBatch: a rank's run of a batch ended.
	EventBatch = "batch"
	// EventDrain: the node drained (Drain says how).
	EventDrain = "drain"
	// EventNode: the node's row, its last event.
	EventNode = "node"
)

// Event is one stdout line of a cluster node.
type Event struct {
	Event string `json:"event"`
	ID    string `json:"id,omitempty"`
	Addr  string `json:"addr,omitempty"`
	Pid   int    `json:"pid,omitempty"`
	// Metrics is where the node serves /metrics, /healthz and /readyz
	// ("ready"; empty when it serves none).
	Metrics string `json:"metrics,omitempty"`
	// What a waiting node waits for.
	What string `json:"what,omitempty"`
	// room: a room's end on a decode instance; batch: a rank's run of a
	// batch; forward: a rank's progress in one.
	Batch    int     `json:"batch"`
	Room     uint64  `json:"room,omitempty"`
	Complete bool    `json:"complete,omitempty"`
	Decode   string  `json:"decode,omitempty"`
	Rank     int     `json:"rank"`
	OK       bool    `json:"ok,omitempty"`
	Failed   int     `json:"failed_chunks,omitempty"`
	Bytes    uint64  `json:"bytes,omitempty"`
	Seconds  float64 `json:"seconds,omitempty"`
	// FirstFailureUnixMs is when the rank's first chunk of the batch
	// failed (wall clock, shared by the processes of one host).
	FirstFailureUnixMs int64  `json:"first_failure_unix_ms,omitempty"`
	Error              string `json:"error,omitempty"`
	// Drain is the node's drain report (EventDrain).
	Drain string `json:"drain,omitempty"`
	Row   *Row   `json:"row,omitempty"`
}

// Row is a node's summary, printed when it ends: Up prints one per node.
type Row struct {
	ID            string `json:"id"`
	Role          string `json:"role"`
	Addr          string `json:"addr"`
	Metrics       string `json:"metrics,omitempty"`
	Rank          int    `json:"rank,omitempty"`
	RoomsComplete int    `json:"rooms_complete,omitempty"`
	RoomsFailed   int    `json:"rooms_failed,omitempty"`
	PagesVerified uint64 `json:"pages_verified,omitempty"`
	Mismatch      string `json:"mismatch,omitempty"`
	Batches       int    `json:"batches,omitempty"`
	FailedChunks  int    `json:"failed_chunks"`
	Bytes         uint64 `json:"bytes,omitempty"`
	// Lookups counts this node's calls to the membership provider
	// (lookups, listings, watches): per session at most, never per
	// request or forward. Sessions counts the decode sessions it dialled.
	Lookups  int64 `json:"lookups"`
	Sessions int64 `json:"sessions,omitempty"`
	// Drained: the node ended by a drain that lost nothing in flight.
	Drained bool `json:"drained,omitempty"`
}

// Emitter writes events as JSON lines, one writer at a time.
type Emitter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

// NewEmitter writes events to w.
func NewEmitter(w io.Writer) *Emitter { return &Emitter{enc: json.NewEncoder(w)} }

// Emit writes one event line.
func (o *Emitter) Emit(e Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_ = o.enc.Encode(e)
}

// Command is one stdin line of a prefill rank: run batch Batch into the
// decode instance Decode.
type Command struct {
	Batch  int
	Decode string
}

func (c Command) String() string { return fmt.Sprintf("run %d %s", c.Batch, c.Decode) }

// ParseCommand reads a command line, naming what is wrong with it.
func ParseCommand(line string) (Command, error) {
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "run" {
		return Command{}, errors.Newf("command %q: want \"run BATCH DECODE-ID\"", line)
	}
	var c Command
	if _, err := fmt.Sscanf(f[1], "%d", &c.Batch); err != nil || c.Batch < 0 || fmt.Sprint(c.Batch) != f[1] {
		return Command{}, errors.Newf("command %q: batch %q is not a number >= 0", line, f[1])
	}
	if err := cluster.ValidateID(f[2]); err != nil {
		return Command{}, errors.Wrapf(err, "command %q", line)
	}
	c.Decode = f[2]
	return c, nil
}

// maxEventLine bounds one event line from a node.
const maxEventLine = 1 << 20

// ReadEvents calls f with each event line of r until r ends; a line that
// is not an event is given to other (nil: dropped). It returns r's error,
// nil at EOF.
func ReadEvents(r io.Reader, f func(Event), other func(string)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxEventLine)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Event == "" {
			if other != nil {
				other(sc.Text())
			}
			continue
		}
		f(e)
	}
	return sc.Err()
}
