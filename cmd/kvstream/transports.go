package main

import (
	"net"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
)

// transportFactory opens one side of a transport by name. loopback is
// always built in; ucx registers itself when the binary is built with
// -tags ucx (it needs cgo and libucx).
type transportFactory func(name string, o transportOpts) (rdma.Transport, error)

// transportOpts are what the commands' flags say about a transport.
type transportOpts struct {
	// dataHost is the IP address whose interface a network transport may
	// use ("" for any).
	dataHost string
	// writes is UCX's write mode (--ucx-writes): "messages" ("" too) or
	// "rma".
	writes string
}

// writeModes are --ucx-writes's choices.
var writeModes = []string{"messages", "rma"}

// checkWrites checks --ucx-writes ("" is the default, messages).
func checkWrites(v string) error {
	if v == "" {
		return nil
	}
	for _, m := range writeModes {
		if v == m {
			return nil
		}
	}
	return errors.Newf("--ucx-writes %q: want %s", v, strings.Join(writeModes, " or "))
}

var transports = map[string]transportFactory{
	"loopback": func(name string, _ transportOpts) (rdma.Transport, error) {
		return loopback.Default().NewTransport(name)
	},
}

// openTransport opens a transport of the given kind, or says which kinds
// this binary has.
func openTransport(kind, name string, o transportOpts) (rdma.Transport, error) {
	f, ok := transports[kind]
	if !ok {
		var have []string
		for k := range transports {
			have = append(have, k)
		}
		sort.Strings(have)
		hint := ""
		if kind == "ucx" {
			hint = " (this binary was built without UCX: go build -tags ucx ./cmd/kvstream, with libucx-dev installed)"
		}
		return nil, errors.Newf("--transport %q: this binary has %s%s", kind, strings.Join(have, ", "), hint)
	}
	return f(name, o)
}

// interfaceOf is the network interface that carries ip: the one with that
// address, or for a loopback address the loopback interface whose network
// contains it (127.0.0.2 is lo's, though lo lists 127.0.0.1/8).
func interfaceOf(ip net.IP) (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", errors.Wrap(err, "list network interfaces")
	}
	contains := ""
	for _, ifc := range ifaces {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			switch {
			case !ok:
			case ipn.IP.Equal(ip):
				return ifc.Name, nil
			case contains == "" && ip.IsLoopback() && ifc.Flags&net.FlagLoopback != 0 && ipn.Contains(ip):
				contains = ifc.Name
			}
		}
	}
	if contains != "" {
		return contains, nil
	}
	return "", errors.Newf("no network interface of this host has the address %s", ip)
}

// interfaceAddr is the network interface that carries ip (interfaceOf)
// and the address UCX's tcp transport listens on there: the interface's
// first IPv4 address (UCX asks the kernel for the interface's address,
// SIOCGIFADDR, and prefers IPv4), else its first IPv6 one.
func interfaceAddr(ip net.IP) (string, net.IP, error) {
	name, err := interfaceOf(ip)
	if err != nil {
		return "", nil, err
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return "", nil, errors.Wrapf(err, "interface %s", name)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", nil, errors.Wrapf(err, "addresses of %s", name)
	}
	var v6 net.IP
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		switch {
		case !ok:
		case ipn.IP.To4() != nil:
			return name, ipn.IP, nil
		case v6 == nil:
			v6 = ipn.IP
		}
	}
	if v6 == nil {
		return "", nil, errors.Newf("interface %s has no address", name)
	}
	return name, v6, nil
}

// netDevices is the UCX_NET_DEVICES value that keeps UCX's network
// transports on the interface of host: that interface for tcp, and every
// RDMA port (whose remote keys the NIC enforces; their addresses are not
// IP listeners).
func netDevices(host string) (string, error) {
	ip := net.ParseIP(strings.Trim(host, "[]"))
	if ip == nil {
		ips, err := net.LookupIP(host)
		if err != nil || len(ips) == 0 {
			return "", errors.Newf("data plane host %q: not an IP address, and it does not resolve", host)
		}
		ip = ips[0]
	}
	if ip.IsUnspecified() {
		return "", errors.Newf("data plane host %q: give the address of one interface (--data-addr)", host)
	}
	ifc, err := interfaceOf(ip)
	if err != nil {
		return "", errors.Wrap(err, "the data plane's interface (--data-addr)")
	}
	devs := []string{ifc}
	ib, _ := filepath.Glob("/sys/class/infiniband/*/ports/*")
	for _, p := range ib {
		devs = append(devs, filepath.Base(filepath.Dir(filepath.Dir(p)))+":"+filepath.Base(p))
	}
	return strings.Join(devs, ","), nil
}
