package decode

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Observer is told what a Server decided, from its actor: keep each call
// short and non-blocking. Outcomes and reasons are the labels listed in
// SessionOutcomes, RoomOutcomes and Refusals.
type Observer interface {
	// SessionEnded: a session ended, its access revoked.
	SessionEnded(outcome string)
	// RoomEnded: a room completed or failed.
	RoomEnded(outcome string)
	// Refused: a message ("hello", "notice", "bye") was refused.
	Refused(message, reason string)
	// Verified: a chunk's bytes passed Config.Verify.
	Verified(bytes uint64)
	// Quarantined: pages kept out of every room for good.
	Quarantined(pages int)
}

// The label values an Observer sees, each a closed list.
var (
	// SessionOutcomes: complete (said goodbye, every room complete),
	// empty (reported nothing), aborted (stopped early, or left rooms
	// unfinished), failed (a chunk failed or was refused), lost (its node
	// stopped answering heartbeats), closed (the server closed first).
	SessionOutcomes = []string{"complete", "empty", "aborted", "failed", "lost", "closed"}
	// RoomOutcomes: complete; failed (a chunk failed on the prefill);
	// dropped (a chunk was dropped); verify (Config.Verify rejected its
	// bytes); bad_input (a notice named what is not the room's); aborted
	// (its prefill said goodbye first); lost (a prefill it needed was
	// lost); timeout (Config.RoomTimeout); released (released in
	// progress); closed (the server closed); cancelled (Server.Cancel, or
	// the prefill's Cancel).
	RoomOutcomes = []string{"complete", "failed", "dropped", "verify", "bad_input", "aborted", "lost", "timeout", "released", "closed", "cancelled"}
	// Refusals, by message. Hello: version, bad_input, identity (not a
	// prefill this server serves), identity_busy (it already has a live
	// session), geometry, admit (Config.Admit), closed, draining, limit
	// (MaxSessions), busy, transport (no access point). Notice:
	// not_session, bad_input, unknown_room, not_owner (another prefill's
	// room), room_ended, room_limit (MaxRoomsPerSession), chunk_limit
	// (MaxChunksPerRoom). Bye:
	// not_session. Cancel: not_session, bad_input, not_owner.
	Refusals = map[string][]string{
		"hello":  {"version", "bad_input", "identity", "identity_busy", "geometry", "admit", "closed", "draining", "limit", "busy", "transport"},
		"notice": {"not_session", "bad_input", "unknown_room", "not_owner", "room_ended", "room_limit", "chunk_limit"},
		"bye":    {"not_session"},
		"cancel": {"not_session", "bad_input", "not_owner"},
	}
	// CancelDirections: who cancelled a room: decode (Server.Cancel) or
	// prefill (its Cancel).
	CancelDirections = []string{"decode", "prefill"}
)

type nopObserver struct{}

func (nopObserver) SessionEnded(string)    {}
func (nopObserver) RoomEnded(string)       {}
func (nopObserver) Refused(string, string) {}
func (nopObserver) Verified(uint64)        {}
func (nopObserver) Quarantined(int)        {}

// StateObserver is an Observer that also wants the server's State after
// each message its actor handled (gauges). server names the Server among
// those that share the observer: its node's address and its name.
type StateObserver interface {
	Observer
	ServerState(server string, s State)
}

// DrainObserver is an Observer that also counts the sessions a draining
// server told so (wire.Drain).
type DrainObserver interface {
	Observer
	DrainTold()
}

// CancelObserver is an Observer that also counts the rooms cancelled, by
// direction (CancelDirections), and how long a Server.Cancel took from the
// call to the room's pages back in the pool.
type CancelObserver interface {
	Observer
	Cancelled(direction string)
	CancelSettled(d time.Duration)
}

var (
	_ StateObserver  = (*Metrics)(nil)
	_ DrainObserver  = (*Metrics)(nil)
	_ CancelObserver = (*Metrics)(nil)
)

// Metrics is an Observer that counts into Prometheus (docs/OBSERVABILITY.md
// lists them): every label value is present from the start, at 0. Its
// gauges sum the servers that share it.
type Metrics struct {
	sessions    *prometheus.CounterVec
	rooms       *prometheus.CounterVec
	refused     *prometheus.CounterVec
	verified    prometheus.Counter
	quarantined prometheus.Counter
	drainTold   prometheus.Counter
	cancels     *prometheus.CounterVec
	cancelTime  prometheus.Histogram
	gauges      *serverGauges
}

// serverGauges is the collector of the gauges: one collector over the
// servers' last States rather than gauges set one by one, so that servers
// sharing a registry sum and a closed server leaves them.
type serverGauges struct {
	descs [len(gaugeNames)]*prometheus.Desc

	mu     sync.Mutex
	states map[string]State
}

var gaugeNames = [...][2]string{
	{"kvstream_decode_sessions_open", "Prefill sessions open (said Hello, not yet ended)."},
	{"kvstream_decode_rooms_in_flight", "Rooms neither released nor ended (complete or failed)."},
	{"kvstream_decode_pages_held", "Decode pages rooms hold (a page of every buffer each)."},
	{"kvstream_decode_pages_awaiting_revocation", "Decode pages held by rooms that are over (ended or released) while a prefill that may still write them is being cut off."},
	{"kvstream_decode_pages_kept_out", "Decode pages kept out of every room for good: a prefill that may still write them could not be cut off."},
	{"kvstream_decode_pool_bytes", "Bytes of the decode pool registered with the transport (0 while none is)."},
	{"kvstream_decode_draining", "Decode servers draining: taking no new session while the open ones end."},
}

func newServerGauges() *serverGauges {
	g := &serverGauges{states: map[string]State{}}
	for i, n := range gaugeNames {
		g.descs[i] = prometheus.NewDesc(n[0], n[1], nil, nil)
	}
	return g
}

// Describe implements prometheus.Collector.
func (g *serverGauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range g.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (g *serverGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	var v [len(gaugeNames)]float64
	for _, s := range g.states {
		v[0] += float64(s.Sessions)
		v[1] += float64(s.RoomsInFlight)
		v[2] += float64(s.PagesHeld)
		v[3] += float64(s.PagesAwaitingRevocation)
		v[4] += float64(s.Quarantined)
		v[5] += float64(s.PoolBytes)
		if s.Draining {
			v[6]++
		}
	}
	g.mu.Unlock()
	for i, d := range g.descs {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v[i])
	}
}

// NewMetrics registers the decode server's metrics with reg (nil: they
// count, unexported). Servers that share a process may share one Metrics.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvstream_decode_sessions_total",
			Help: "Prefill sessions ended, by outcome."}, []string{"outcome"}),
		rooms: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvstream_decode_rooms_total",
			Help: "Rooms that completed or failed, by outcome."}, []string{"outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvstream_decode_refused_total",
			Help: "Control messages refused, by message and reason."}, []string{"message", "reason"}),
		verified: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvstream_decode_verified_bytes_total",
			Help: "Bytes of chunks whose pages passed the decode side's verification."}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvstream_decode_quarantined_pages_total",
			Help: "Decode pages kept out of every room for good: a prefill that may still write them could not be cut off."}),
		drainTold: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvstream_decode_drain_told_total",
			Help: "Prefill sessions a draining decode server told so (wire.Drain): each winds down and says goodbye."}),
		cancels: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvstream_decode_cancels_total",
			Help: "Rooms cancelled, by who cancelled them: decode (Server.Cancel) or prefill (its Cancel)."}, []string{"direction"}),
		cancelTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvstream_decode_cancel_seconds",
			Help:    "Server.Cancel from the call to the room's pages back in the pool (every prefill that could write it answered, or was cut off).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}),
		gauges: newServerGauges(),
	}
	for _, d := range CancelDirections {
		m.cancels.WithLabelValues(d)
	}
	for _, o := range SessionOutcomes {
		m.sessions.WithLabelValues(o)
	}
	for _, o := range RoomOutcomes {
		m.rooms.WithLabelValues(o)
	}
	for msg, reasons := range Refusals {
		for _, r := range reasons {
			m.refused.WithLabelValues(msg, r)
		}
	}
	for _, c := range []prometheus.Collector{m.sessions, m.rooms, m.refused, m.verified, m.quarantined, m.drainTold, m.cancels, m.cancelTime, m.gauges} {
		if reg == nil {
			break
		}
		if err := reg.Register(c); err != nil {
			return nil, public(err)
		}
	}
	return m, nil
}

// SessionEnded implements Observer.
func (m *Metrics) SessionEnded(outcome string) { m.sessions.WithLabelValues(outcome).Inc() }

// RoomEnded implements Observer.
func (m *Metrics) RoomEnded(outcome string) { m.rooms.WithLabelValues(outcome).Inc() }

// Refused implements Observer.
func (m *Metrics) Refused(message, reason string) { m.refused.WithLabelValues(message, reason).Inc() }

// Verified implements Observer.
func (m *Metrics) Verified(bytes uint64) { m.verified.Add(float64(bytes)) }

// Quarantined implements Observer.
func (m *Metrics) Quarantined(pages int) { m.quarantined.Add(float64(pages)) }

// Cancelled implements CancelObserver.
func (m *Metrics) Cancelled(direction string) { m.cancels.WithLabelValues(direction).Inc() }

// CancelSettled implements CancelObserver.
func (m *Metrics) CancelSettled(d time.Duration) { m.cancelTime.Observe(d.Seconds()) }

// DrainTold implements DrainObserver.
func (m *Metrics) DrainTold() { m.drainTold.Inc() }

// ServerState implements StateObserver: the gauges' view of one server. A
// closed server's state leaves them.
func (m *Metrics) ServerState(server string, s State) {
	m.gauges.mu.Lock()
	defer m.gauges.mu.Unlock()
	if s.Closed && s.Sessions == 0 && !s.Pooled {
		delete(m.gauges.states, server)
		return
	}
	m.gauges.states[server] = s
}
