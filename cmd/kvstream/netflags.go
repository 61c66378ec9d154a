package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/netsec"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

// netFlags are the control and data plane flags of `kvstream decode` and
// `kvstream prefill`.
type netFlags struct {
	listen, advertise, dataAddr string
	ucxWrites                   string
	tlsCA, tlsCert, tlsKey      string
	tlsDir                      string
	heartbeat, hbInterval       time.Duration
}

// maxHeartbeat bounds --heartbeat: a peer silent that long is long gone.
const maxHeartbeat = 10 * time.Minute

// defaultHeartbeat is --heartbeat's default: long enough that a peer
// starved of CPU on a saturated machine (two busy loops on two cores,
// under the race detector) is not declared lost, short enough that a hung
// one is within seconds (docs/RELIABILITY.md, "Under load").
const defaultHeartbeat = 10 * time.Second

// netGroups are the help's groups of the network flags.
var netGroups = []flagGroup{
	{groupTransport, []string{"listen", "advertise", "data-addr", "transport", "ucx-writes", "heartbeat", "heartbeat-interval"}},
	{groupTLS, []string{"tls-dir", "tls-ca", "tls-cert", "tls-key", "decode-name", "prefill-name"}},
}

func addNetFlags(fl *pflag.FlagSet, n *netFlags, node, listenDefault string) {
	fl.StringVar(&n.listen, "listen", listenDefault, "control-plane address (host:port; port 0 picks one); anything but loopback needs TLS")
	fl.StringVar(&n.advertise, "advertise", "", "the address peers reach this node on (host[:port]); default: the listen address, or a routable address of this host when listening on all interfaces")
	fl.StringVar(&n.dataAddr, "data-addr", "", "the `IP` the UCX data plane listens on: an interface's own address, which UCX's tcp transport binds (default: the interface of the advertised or listen host)")
	addWritesFlag(fl, &n.ucxWrites)
	fl.StringVar(&n.tlsCA, "tls-ca", "", "mutual TLS: the CA certificate every peer's certificate must chain to (PEM `FILE`)")
	fl.StringVar(&n.tlsCert, "tls-cert", "", "mutual TLS: this node's certificate (PEM `FILE`)")
	fl.StringVar(&n.tlsKey, "tls-key", "", "mutual TLS: this node's private key (PEM `FILE`)")
	fl.StringVar(&n.tlsDir, "tls-dir", "", "mutual TLS from the files in `DIR` (kvstream certs DIR writes them): "+netsec.CAFile+", "+node+".pem and "+node+".key")
	fl.DurationVar(&n.heartbeat, "heartbeat", defaultHeartbeat, "declare a peer lost when it answered no heartbeat for this long (0: off; a hung process is then never declared lost)")
	fl.DurationVar(&n.hbInterval, "heartbeat-interval", 0, "time between heartbeats (0: a seventh of --heartbeat); the peer is lost after --heartbeat / --heartbeat-interval - 1 unanswered in a row")
}

// addWritesFlag adds --ucx-writes.
func addWritesFlag(fl *pflag.FlagSet, v *string) {
	fl.StringVar(v, "ucx-writes", "messages", "how a UCX peer writes this process's memory: messages (checked and applied by the receiver, revocable on every UCX transport) or rma (UCX puts: RDMA NICs and GPUs, between trusted peers; both sides must agree)")
}

// maxHeartbeatMisses bounds the unanswered heartbeats before a loss
// (--heartbeat / --heartbeat-interval - 1), as decode.ListenConfig and
// netsec.HeartbeatConfig do: checked with the flags, it names them before
// anything starts.
const maxHeartbeatMisses = 1000

// heartbeatConfig is the heartbeat pacing the flags ask for: Misses < 0
// when off.
func (n *netFlags) heartbeatConfig() (netsec.HeartbeatConfig, error) {
	switch {
	case n.heartbeat == 0:
		return netsec.HeartbeatConfig{Misses: -1}, nil
	case n.heartbeat < 0 || n.heartbeat > maxHeartbeat || n.heartbeat < 70*time.Millisecond:
		return netsec.HeartbeatConfig{}, errors.Newf("--heartbeat %v: want 0 (off) or 70ms to %v", n.heartbeat, maxHeartbeat)
	case n.hbInterval == 0:
		return decode.HeartbeatWithin(n.heartbeat), nil
	case n.hbInterval < 10*time.Millisecond || n.hbInterval > n.heartbeat/2:
		return netsec.HeartbeatConfig{}, errors.Newf("--heartbeat-interval %v: want 10ms to half of --heartbeat %v (at least one unanswered heartbeat before a loss)", n.hbInterval, n.heartbeat)
	}
	misses := int(n.heartbeat/n.hbInterval) - 1
	if misses > maxHeartbeatMisses {
		return netsec.HeartbeatConfig{}, errors.Newf("--heartbeat %v, --heartbeat-interval %v: %d unanswered heartbeats before a loss (--heartbeat / --heartbeat-interval - 1), want at most %d: a longer interval or a shorter --heartbeat",
			n.heartbeat, n.hbInterval, misses, maxHeartbeatMisses)
	}
	return netsec.HeartbeatConfig{Interval: n.hbInterval, Misses: misses}, nil
}

// check validates the flags; node names this node's files in --tls-dir.
func (n *netFlags) check(node string) (*netsec.TLS, error) {
	if err := checkHostPort("--listen", n.listen, true); err != nil {
		return nil, err
	}
	if n.advertise != "" {
		a := n.advertise
		if _, _, err := net.SplitHostPort(a); err != nil {
			a = net.JoinHostPort(strings.Trim(a, "[]"), "0")
		}
		if err := checkHostPort("--advertise", a, false); err != nil {
			return nil, err
		}
	}
	if n.dataAddr != "" {
		if err := checkDataAddr(n.dataAddr); err != nil {
			return nil, err
		}
	}
	if err := checkWrites(n.ucxWrites); err != nil {
		return nil, err
	}
	if _, err := n.heartbeatConfig(); err != nil {
		return nil, err
	}
	files := netsec.Files{CA: n.tlsCA, Cert: n.tlsCert, Key: n.tlsKey}
	given := files.CA != "" || files.Cert != "" || files.Key != ""
	// Each file's error names the flag that gave it.
	caFlag, certFlag, keyFlag := "--tls-ca", "--tls-cert", "--tls-key"
	switch {
	case n.tlsDir != "" && given:
		return nil, errors.New("--tls-dir and --tls-ca/--tls-cert/--tls-key: give one or the other")
	case n.tlsDir != "":
		files = netsec.Files{CA: filepath.Join(n.tlsDir, netsec.CAFile), Cert: filepath.Join(n.tlsDir, node+".pem"), Key: filepath.Join(n.tlsDir, node+".key")}
		caFlag, certFlag, keyFlag = "--tls-dir", "--tls-dir", "--tls-dir"
	case given && (files.CA == "" || files.Cert == "" || files.Key == ""):
		return nil, errors.Newf("--tls-ca %q, --tls-cert %q, --tls-key %q: give all three", files.CA, files.Cert, files.Key)
	case !given:
		return nil, nil
	}
	for _, f := range []struct{ flag, path string }{{caFlag, files.CA}, {certFlag, files.Cert}, {keyFlag, files.Key}} {
		if _, err := os.Stat(f.path); err != nil {
			return nil, errors.Wrapf(err, "%s: %s", f.flag, f.path)
		}
	}
	tlsm, err := netsec.LoadTLS(files)
	switch {
	case err == nil:
		return tlsm, nil
	case strings.Contains(err.Error(), "CA file"):
		return nil, errors.Wrapf(err, "%s %s", caFlag, files.CA)
	case caFlag == "--tls-dir":
		return nil, errors.Wrapf(err, "--tls-dir %s", n.tlsDir)
	case strings.Contains(err.Error(), "tls: certificate file"):
		return nil, errors.Wrapf(err, "--tls-cert %s", files.Cert)
	case strings.Contains(err.Error(), "tls: key file"):
		return nil, errors.Wrapf(err, "--tls-key %s", files.Key)
	}
	return nil, errors.Wrapf(err, "--tls-cert %s, --tls-key %s", files.Cert, files.Key)
}

// checkDataAddr checks --data-addr: an IP address that is the address
// UCX's tcp transport listens on for its interface. UCX binds an
// interface's own (first) address, whatever address of that interface it
// was pointed at: given 127.0.0.3, which lo carries only as part of
// 127.0.0.0/8, it listened on 127.0.0.1. An address it would not bind is
// refused, naming the one it would.
func checkDataAddr(v string) error {
	ip := net.ParseIP(v)
	if ip == nil {
		return errors.Newf("--data-addr %q: want an IP address of this host", v)
	}
	ifc, bound, err := interfaceAddr(ip)
	if err != nil {
		return errors.Wrapf(err, "--data-addr %s", v)
	}
	if !bound.Equal(ip) {
		return errors.Newf("--data-addr %s: the UCX data plane would listen on %s, the address of %s (UCX's tcp transport binds an interface's own address): give --data-addr %s, or an address that is its interface's own",
			v, bound, ifc, bound)
	}
	return nil
}

// checkHostPort validates a host:port flag.
func checkHostPort(flag, v string, listen bool) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return errors.Wrapf(err, "%s %q: want host:port", flag, v)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return errors.Newf("%s %q: port %q is not a number in [0, 65535]", flag, v, port)
	}
	if !listen && (host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified()) {
		return errors.Newf("%s %q: peers cannot dial an unspecified host", flag, v)
	}
	return nil
}

// node starts this process's control plane.
func (n *netFlags) node(tlsm *netsec.TLS, log *zap.Logger) (*decode.Node, error) {
	hb, err := n.heartbeatConfig()
	if err != nil {
		return nil, err
	}
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: n.listen, Advertise: n.advertise, TLS: tlsm, Heartbeat: hb, Log: log})
	if err != nil {
		return nil, errors.Wrap(err, "--listen/--advertise")
	}
	return node, nil
}

// planes are a command's control plane (its protoactor node) and data plane
// (its transport, on the node's interface).
type planes struct {
	node *decode.Node
	tr   rdma.Transport
}

// open starts the node, then the transport named name on the node's
// interface; when the transport fails, the node is closed again.
func (n *netFlags) open(tlsm *netsec.TLS, log *zap.Logger, transport, name string) (*planes, error) {
	node, err := n.node(tlsm, log)
	if err != nil {
		return nil, err
	}
	tr, err := openTransport(transport, name, transportOpts{dataHost: n.dataHost(node), writes: n.ucxWrites})
	if err != nil {
		service.CloseWithin("the control plane", node.Close, &err)
		return nil, err
	}
	return &planes{node: node, tr: tr}, nil
}

// close closes the data plane, then the control plane, and adds their
// errors to *err: a failed Close fails the command.
func (p *planes) close(err *error) {
	if cerr := p.tr.Close(); cerr != nil {
		*err = errors.CombineErrors(*err, errors.Wrap(cerr, "close the transport"))
	}
	service.CloseWithin("the control plane", p.node.Close, err)
}

// dataHost is the host whose interface the data plane uses: --data-addr,
// else the host of the node's advertised address.
func (n *netFlags) dataHost(node *decode.Node) string {
	if n.dataAddr != "" {
		return n.dataAddr
	}
	host, _, _ := net.SplitHostPort(node.Addr())
	return host
}
