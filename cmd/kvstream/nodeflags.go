package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cluster/etcdproc"
	"github.com/kvstream/kvstream/lab/buildinfo"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

// clusterFlags are a node's discovery flags: where etcd is, and how to
// reach it as operators run it (client TLS).
type clusterFlags struct {
	etcd, prefix              string
	ttl                       time.Duration
	etcdCA, etcdCert, etcdKey string
	etcdTLSDir                string
}

// Files of --etcd-tls-dir: the CA, the client's certificate and key (and,
// for the etcd kvstream up starts itself, etcd's own). `kvstream certs DIR
// --nodes etcd,etcd-client` writes them.
const (
	etcdClientName = "etcd-client"
	etcdServerName = "etcd"
)

func (f *clusterFlags) add(fl *pflag.FlagSet, launcher bool) {
	etcdHelp := "etcd client `URLs`, comma-separated (https://10.0.0.5:2379)"
	if launcher {
		etcdHelp += "; empty: up starts one (with client TLS when --etcd-tls-dir also holds etcd.pem and etcd.key)"
	}
	fl.StringVar(&f.etcd, "etcd", "", etcdHelp)
	fl.StringVar(&f.etcdTLSDir, "etcd-tls-dir", "", "etcd client TLS from the files in `DIR`: "+netsecCA+", "+etcdClientName+".pem and "+etcdClientName+".key (kvstream certs DIR --nodes etcd,etcd-client writes them)")
	fl.StringVar(&f.etcdCA, "etcd-ca", "", "etcd client TLS: the CA that signed etcd's certificate (PEM `FILE`)")
	fl.StringVar(&f.etcdCert, "etcd-cert", "", "etcd client TLS: this node's client certificate (PEM `FILE`), for etcd's --client-cert-auth")
	fl.StringVar(&f.etcdKey, "etcd-key", "", "etcd client TLS: this node's client key (PEM `FILE`)")
	if !launcher {
		fl.StringVar(&f.prefix, "cluster-prefix", cluster.DefaultPrefix, "root of this cluster's keys in etcd")
		fl.DurationVar(&f.ttl, "member-ttl", 0, "how long a member that stopped keeping alive stays visible (0: cluster.DefaultTTL)")
	}
}

// netsecCA is the CA file name of a TLS directory.
const netsecCA = "ca.pem"

// files are the etcd client TLS files the flags name.
func (f *clusterFlags) files() (cluster.TLSFiles, error) {
	files := cluster.TLSFiles{CA: f.etcdCA, Cert: f.etcdCert, Key: f.etcdKey}
	switch {
	case f.etcdTLSDir != "" && files.Given():
		return files, errors.New("--etcd-tls-dir and --etcd-ca/--etcd-cert/--etcd-key: give one or the other")
	case f.etcdTLSDir != "":
		files = cluster.TLSFiles{CA: filepath.Join(f.etcdTLSDir, netsecCA), Cert: filepath.Join(f.etcdTLSDir, etcdClientName+".pem"),
			Key: filepath.Join(f.etcdTLSDir, etcdClientName+".key")}
	}
	return files, nil
}

// tls is the etcd client TLS (nil without TLS flags) and, for a launcher
// that starts etcd itself (own), etcd's server TLS from --etcd-tls-dir.
func (f *clusterFlags) tls(own bool) (*tls.Config, *etcdproc.TLS, error) {
	files, err := f.files()
	if err != nil || !files.Given() {
		return nil, nil, err
	}
	// Each file's error names the flag that gave it.
	flags := map[string]string{files.CA: "--etcd-ca", files.Cert: "--etcd-cert", files.Key: "--etcd-key"}
	if f.etcdTLSDir != "" {
		flags = map[string]string{files.CA: "--etcd-tls-dir", files.Cert: "--etcd-tls-dir", files.Key: "--etcd-tls-dir"}
	}
	if (files.Cert == "") != (files.Key == "") {
		return nil, nil, errors.Newf("--etcd-cert %q, --etcd-key %q: they go together", files.Cert, files.Key)
	}
	for _, path := range []string{files.CA, files.Cert, files.Key} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			return nil, nil, errors.Wrapf(err, "%s: %s", flags[path], path)
		}
	}
	c, err := files.Config()
	switch {
	case err == nil:
	case f.etcdTLSDir != "":
		return nil, nil, errors.Wrapf(err, "--etcd-tls-dir %s", f.etcdTLSDir)
	case strings.Contains(err.Error(), "CA file"):
		return nil, nil, errors.Wrapf(err, "--etcd-ca %s", files.CA)
	case strings.Contains(err.Error(), "etcd TLS: certificate file"):
		return nil, nil, errors.Wrapf(err, "--etcd-cert %s", files.Cert)
	case strings.Contains(err.Error(), "etcd TLS: key file"):
		return nil, nil, errors.Wrapf(err, "--etcd-key %s", files.Key)
	default:
		return nil, nil, errors.Wrapf(err, "--etcd-cert %s, --etcd-key %s", files.Cert, files.Key)
	}
	if !own {
		return c, nil, nil
	}
	if f.etcdTLSDir == "" {
		return nil, nil, errors.New("the etcd up starts serves TLS from --etcd-tls-dir (etcd.pem, etcd.key besides the client's); --etcd-ca/--etcd-cert/--etcd-key are for an --etcd of yours")
	}
	return c, &etcdproc.TLS{CertFile: filepath.Join(f.etcdTLSDir, etcdServerName+".pem"), KeyFile: filepath.Join(f.etcdTLSDir, etcdServerName+".key"),
		CAFile: files.CA, ClientCertFile: files.Cert, ClientKeyFile: files.Key}, nil
}

// endpoints are --etcd's URLs (nil when empty).
func (f *clusterFlags) endpoints() []string {
	if f.etcd == "" {
		return nil
	}
	return strings.Split(f.etcd, ",")
}

// args are the etcd TLS flags to pass on to the nodes.
func (f *clusterFlags) args() []string {
	var out []string
	for _, a := range [][2]string{{"etcd-tls-dir", f.etcdTLSDir}, {"etcd-ca", f.etcdCA}, {"etcd-cert", f.etcdCert}, {"etcd-key", f.etcdKey}} {
		if a[1] != "" {
			out = append(out, "--"+a[0], a[1])
		}
	}
	return out
}

// maxMemberTTL bounds --member-ttl: a member killed stays listed this long.
const maxMemberTTL = time.Hour

// checkMemberTTL refuses a --member-ttl etcd would not keep as given: it
// counts a lease's TTL in whole seconds (a shorter one was raised to 1 s
// in silence). zeroOK: 0 means cluster.DefaultTTL.
func checkMemberTTL(d time.Duration, zeroOK bool) error {
	if d == 0 && zeroOK {
		return nil
	}
	if d < time.Second || d > maxMemberTTL || d%time.Second != 0 {
		return errors.Newf("--member-ttl %v: want whole seconds from 1s to %v (etcd counts a lease's TTL in seconds)", d, maxMemberTTL)
	}
	return nil
}

// check refuses flags that cannot reach etcd and loads the client TLS
// (nil without it), before the command opens anything.
func (f *clusterFlags) check() (*tls.Config, error) {
	if f.etcd == "" {
		return nil, errors.New("--etcd is required: a node finds its peers on etcd (kvstream up starts one)")
	}
	if err := checkMemberTTL(f.ttl, true); err != nil {
		return nil, err
	}
	tlsc, _, err := f.tls(false)
	return tlsc, err
}

// open connects to etcd with the client TLS check returned.
func (f *clusterFlags) open(log *zap.Logger, tlsc *tls.Config) (cluster.Provider, error) {
	p, err := cluster.Open(cluster.Config{Endpoints: f.endpoints(), Prefix: f.prefix, TTL: f.ttl, TLS: tlsc, Logger: log})
	return p, errors.Wrap(err, "--etcd")
}

// opsFlags are a long-running command's operations flags.
type opsFlags struct {
	addr  string
	drain time.Duration
}

func (o *opsFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&o.addr, "metrics-addr", "", "serve /metrics, /healthz and /readyz at `HOST:PORT` (port 0 picks one; empty: none)")
	fl.DurationVar(&o.drain, "drain-timeout", service.DefaultDrainTimeout, "on SIGTERM, how long the work in flight may take to finish before it is cut (a second signal cuts at once)")
}

// start serves the operations endpoint (nothing without --metrics-addr)
// and says where on stderr.
func (o *opsFlags) start(cmd *cobra.Command, log *zap.Logger) (*service.Ops, error) {
	if o.drain <= 0 {
		return nil, errors.Newf("--drain-timeout %v: must be positive", o.drain)
	}
	ops, err := service.Start(service.Config{Addr: o.addr, Log: log})
	if err != nil {
		return nil, err
	}
	if err := ops.Registry().Register(buildinfo.Read().Collector()); err != nil {
		return nil, errors.CombineErrors(errors.Wrap(err, "register kvstream_build_info"), ops.Close(context.Background()))
	}
	if ops.Addr() != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "kvstream: serving metrics at http://%s/metrics (also /healthz, /readyz)\n", ops.Addr())
	}
	return ops, nil
}

// newShutdown starts the signal handling of a long-running command.
func newShutdown() *service.Shutdown { return service.OnSignals() }
