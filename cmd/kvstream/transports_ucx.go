//go:build ucx

package main

import (
	"net"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/ucx"
)

// accessHost is the IP UCX access points listen on: the address UCX's
// tcp transport binds on the data plane's interface (interfaceAddr), since
// UCX sets a client-server connection's tcp lanes up to the IP the
// connection came in to; the loopback where the host is unset or
// unspecified (a node listening on every interface advertises no one
// address peers reach).
func accessHost(dataHost string) string {
	ip := net.ParseIP(strings.Trim(dataHost, "[]"))
	if dataHost == "" || (ip != nil && ip.IsUnspecified()) {
		return ""
	}
	if ip == nil {
		ips, err := net.LookupIP(dataHost)
		if err != nil || len(ips) == 0 {
			return dataHost // ucx.New says what is wrong with it
		}
		ip = ips[0]
	}
	if _, bound, err := interfaceAddr(ip); err == nil {
		return bound.String()
	}
	return ip.String()
}

func init() {
	transports["ucx"] = func(name string, o transportOpts) (rdma.Transport, error) {
		// UCX's tcp transport listens on every interface it may use: keep
		// it on the control plane's (or --data-addr's).
		// Access points listen for their peer on the data plane's host
		// (hw/rdma/ucx, "Connection setup").
		opts := ucx.Options{Name: name, CloseDrain: time.Second, AccessHost: accessHost(o.dataHost)}
		if o.writes != "" {
			w, err := ucx.ParseWriteMode(o.writes)
			if err != nil {
				return nil, errors.Wrap(err, "--ucx-writes")
			}
			opts.Writes = w
		}
		if o.dataHost != "" {
			devs, err := netDevices(o.dataHost)
			if err != nil {
				return nil, err
			}
			opts.Config = map[string]string{"NET_DEVICES": devs}
		}
		// The drain bound fits inside the engine's teardown reserve (a tenth
		// of the finish timeout, at most 1 s).
		return ucx.New(opts)
	}
}
