package launch

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names of the cluster's processes (docs/OBSERVABILITY.md, "The
// cluster's processes"). Every series of a known label value exists from
// the start at 0.
const (
	MetricUpBatches           = "kvstream_up_batches_total"
	MetricUpBatchesInFlight   = "kvstream_up_batches_in_flight"
	MetricUpNodes             = "kvstream_up_nodes"
	MetricUpRestarts          = "kvstream_up_node_restarts_total"
	MetricNodeRegistered      = "kvstream_node_registered"
	MetricNodeRooms           = "kvstream_node_rooms_total"
	MetricNodePagesVerified   = "kvstream_node_pages_verified_total"
	MetricNodeSessions        = "kvstream_node_sessions"
	MetricNodeBatches         = "kvstream_node_batches_total"
	MetricNodeBatchesInFlight = "kvstream_node_batches_in_flight"
)

// register registers cs in reg (nil: nowhere; the collectors still count,
// for the node's row).
func register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// upMetrics are the launcher's.
type upMetrics struct {
	batches          *prometheus.CounterVec
	complete, failed prometheus.Counter
	inFlight         prometheus.Gauge
	nodes            *prometheus.GaugeVec
	restarts         prometheus.Counter
}

func newUpMetrics(reg prometheus.Registerer) (*upMetrics, error) {
	m := &upMetrics{
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricUpBatches,
			Help: "Batches ended, by outcome (complete: every rank and room succeeded with every byte equal; failed)."}, []string{"outcome"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricUpBatchesInFlight, Help: "Batches started and not ended."}),
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricUpNodes,
			Help: "Node processes running, by role (decode, prefill)."}, []string{"role"}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricUpRestarts, Help: "Node processes restarted under their id (kill-decode, rolling-restart), counted once the restart started."}),
	}
	m.complete, m.failed = m.batches.WithLabelValues("complete"), m.batches.WithLabelValues("failed")
	m.nodes.WithLabelValues("decode")
	m.nodes.WithLabelValues("prefill")
	return m, register(reg, m.batches, m.inFlight, m.nodes, m.restarts)
}

// decodeMetrics are a decode instance's.
type decodeMetrics struct {
	registered               prometheus.Gauge
	rooms                    *prometheus.CounterVec
	roomsComplete, roomsFail prometheus.Counter
	sessions                 prometheus.Gauge
	pages                    prometheus.CounterFunc
}

func newDecodeMetrics(reg prometheus.Registerer, verified func() float64) (*decodeMetrics, error) {
	m := &decodeMetrics{
		registered: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricNodeRegistered,
			Help: "1 while the node's member record is registered on etcd, 0 before and once it deregistered to drain."}),
		rooms: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricNodeRooms,
			Help: "Rooms ended on this decode instance, by outcome (complete, failed)."}, []string{"outcome"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricNodeSessions, Help: "Prefill sessions open on this decode instance."}),
		pages: prometheus.NewCounterFunc(prometheus.CounterOpts{Name: MetricNodePagesVerified,
			Help: "Decode pages (one page of one buffer) checked equal to the model's bytes."}, verified),
	}
	m.roomsComplete, m.roomsFail = m.rooms.WithLabelValues("complete"), m.rooms.WithLabelValues("failed")
	return m, register(reg, m.registered, m.rooms, m.sessions, m.pages)
}

// rankMetrics are a prefill rank's (besides its engines' kvstream_*).
type rankMetrics struct {
	registered       prometheus.Gauge
	batches          *prometheus.CounterVec
	batchOK, batchNo prometheus.Counter
	inFlight         prometheus.Gauge
}

func newRankMetrics(reg prometheus.Registerer) (*rankMetrics, error) {
	m := &rankMetrics{
		registered: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricNodeRegistered,
			Help: "1 while the node's member record is registered on etcd, 0 before and once it deregistered to drain."}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricNodeBatches,
			Help: "Batches this prefill rank ran, by outcome (ok: every chunk succeeded and the decode instance accepted every notice; failed)."}, []string{"outcome"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricNodeBatchesInFlight, Help: "Batches this prefill rank is running."}),
	}
	m.batchOK, m.batchNo = m.batches.WithLabelValues("ok"), m.batches.WithLabelValues("failed")
	return m, register(reg, m.registered, m.batches, m.inFlight)
}
